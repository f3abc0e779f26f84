"""Loose ends a review named (issue 42, item 4), each pinned here."""

import ast

import pytest

from kvarena.impl import capacity as icap
from kvarena.spec import arith
from tests.support import ROOT


def test_no_spec_function_takes_a_parameter_it_never_reads():
    """A parameter a function ignores misleads every caller and every proof
    that passes it (``transitions.float_extends_high`` took the pages to
    bind and never read them).  Names starting with ``_`` are exempt, and
    so is a stub whose body is ``...`` (a ``Protocol``'s signature)."""
    unread = []
    for path in sorted((ROOT / "spec").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            stub = isinstance(node, ast.FunctionDef) and [ast.dump(b) for b in node.body] == [
                ast.dump(ast.Expr(ast.Constant(...)))
            ]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not stub:
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                unread += [
                    f"{path.name}: {node.name}({a.arg})"
                    for a in args
                    if a.arg not in read and a.arg not in ("self", "cls") and not a.arg.startswith("_")
                ]
    assert unread == []


@pytest.mark.parametrize("fn", [arith.two_end_uneven_fits, icap.two_end_uneven_fits], ids=["spec", "impl"])
@pytest.mark.parametrize("pages", [(-1, 0), (0, -1), (-5, -5), (-3, 2)])
def test_two_end_uneven_fits_rejects_a_negative_page_count(fn, pages):
    """A negative page count is no bind; it passed as one of 0 pages (True)."""
    size = (100, 4, 0, 10, 4, 0, 10)  # gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b
    assert fn(0, 0, *size) and fn(2, 1, *size)
    with pytest.raises(ValueError, match="two_end_uneven_fits"):
        fn(*pages, *size)
