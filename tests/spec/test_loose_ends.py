"""Loose ends a review named (issue 42, item 4), each pinned here."""

import ast
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvarena.impl import capacity as icap
from kvarena.spec import Arena, SubPool, arith, contracts
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


def test_a_refused_call_that_rewrites_only_bytes_breaks_its_postcondition(monkeypatch):
    """The "nothing changed" postconditions compare the content model too
    (``Arena._whole``): a refused alloc that rewrites a page's bytes and
    nothing else leaves ``snapshot()`` equal, and is caught."""
    real = Arena.alloc

    @functools.wraps(real)
    def scribbling(self, name, n, ids=None):
        out = real(self, name, n, ids)
        if out is None:  # the planted bug: a refusal that writes a live page
            b = self.bands[name]
            b.content[min(b.content)] = -7
        return out

    monkeypatch.setattr(Arena, "alloc", scribbling)
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")])
    a.alloc("u", 2)
    before = a.snapshot()
    with contracts.checking(), pytest.raises(contracts.ContractError, match="_whole"):
        a.alloc("u", 10**4)
    assert a.snapshot() == before  # what the old postcondition compared: blind to it


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_an_ends_region_is_its_pages_and_its_gap(data):
    """``region`` of an END (the float formula, with the buffer's end as
    its outer neighbour) is the pages it holds up to its frontier plus the
    whole pages of its gap, computed apart by ``gap_bytes``."""
    epp = data.draw(st.sampled_from([8, 16, 24]))
    pools = [SubPool("u", epp, 1, "up"), SubPool("f", 8, 1, "float"), SubPool("d", 16, 1, "down")]
    a = Arena(data.draw(st.integers(200, 900)), pools)
    for _ in range(data.draw(st.integers(0, 8))):
        name = data.draw(st.sampled_from(a.chain))
        a.alloc(name, data.draw(st.integers(1, 4)))  # None when short: a state all the same
    lo, hi = a.region("u")
    low, high = a.frontiers("u")
    assert lo == low // epp == a.geometry("u").min_page and hi - high // epp == a.gap_bytes("u") // epp
    lo, hi = a.region("d")
    low, high = a.frontiers("d")
    assert hi == a.geometry("d").num_pages and low // 16 - lo == a.gap_bytes("d") // 16
