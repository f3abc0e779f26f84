"""Every public class and function of ``spec/`` and ``impl/`` documents itself.

The API reference (``docs/reference/``) is generated from these docstrings
(mkdocstrings, Google style), so this is where the rules live:

- every public module, class, function, method and property has a docstring;
- each cites the design section it implements (``docs/design.md §N`` or
  ``docs/anchor.md §N``; ``tests/repo/test_docs.py`` checks that the section
  exists);
- a function or method lists every parameter under ``Args:``, has a
  ``Returns:`` (or ``Yields:``) section when it returns a value, and a
  ``Raises:`` section naming each exception its own body raises;
- a class with an ``__init__`` of its own lists its parameters under ``Args:``
  in its docstring or in ``__init__``'s.

Public means: a name without a leading underscore in a module without one,
and the public methods of a private base class (the composites inherit
theirs from ``_Composite``).
Each rule is first shown to catch a planted violation.
"""

import ast
import re
from pathlib import Path

import pytest

from tests.support import ROOT

FOLDERS = (ROOT / "spec", ROOT / "impl")
CITATION = re.compile(r"docs/(design|anchor)\.md\s+§")


def _section(doc: str, names: tuple[str, ...]) -> str | None:
    """The indented body of the first Google-style section titled one of ``names``."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() in {f"{n}:" for n in names}:
            indent = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            return "\n".join(body)
    return None


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return [n for n in names if n not in ("self", "cls")]


def _own_raises(fn: ast.FunctionDef) -> set[str]:
    """Exception names raised by ``fn``'s own body (not by nested functions or classes)."""
    found: set[str] = set()
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id[:1].isupper():
                found.add(exc.id)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _decorators(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d).split("(")[0].split(".")[-1] for d in fn.decorator_list}


def _returns_value(fn: ast.FunctionDef) -> bool:
    return fn.returns is not None and ast.unparse(fn.returns) not in ("None", "NoReturn")


def function_problems(fn: ast.FunctionDef, where: str) -> list[str]:
    """What ``fn``'s docstring lacks, as messages naming ``where``."""
    doc = ast.get_docstring(fn)
    if not doc:
        return [f"{where}: no docstring"]
    problems = [] if CITATION.search(doc) else [f"{where}: cites no docs/design.md or docs/anchor.md section"]
    decorators = _decorators(fn)
    if "overload" in decorators:
        return []
    if decorators & {"property", "cached_property"}:
        return problems  # a property reads as an attribute: its summary is its description
    params = _params(fn)
    if params:
        args = _section(doc, ("Args", "Arguments")) or ""
        missing = [p for p in params if not re.search(rf"^\s*\**{re.escape(p)}\b[^:\n]*:", args, re.M)]
        if missing:
            problems.append(f"{where}: Args: lacks {', '.join(missing)}")
    if fn.name != "__init__" and _returns_value(fn) and _section(doc, ("Returns", "Yields")) is None:
        problems.append(f"{where}: no Returns: section")
    raises = _own_raises(fn)
    if raises:
        section = _section(doc, ("Raises",)) or ""
        missing = [e for e in sorted(raises) if not re.search(rf"^\s*{e}\b", section, re.M)]
        if missing:
            problems.append(f"{where}: Raises: lacks {', '.join(missing)}")
    return problems


def class_problems(cls: ast.ClassDef, where: str) -> list[str]:
    """What ``cls`` and its public methods lack."""
    doc = ast.get_docstring(cls)
    if not doc:
        return [f"{where}: no docstring"]
    problems = [] if CITATION.search(doc) else [f"{where}: cites no docs/design.md or docs/anchor.md section"]
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        if node.name == "__init__":
            params = _params(node)
            init_doc = ast.get_docstring(node) or ""
            args = (_section(doc, ("Args", "Arguments")) or "") + "\n" + (_section(init_doc, ("Args",)) or "")
            missing = [p for p in params if not re.search(rf"^\s*\**{re.escape(p)}\b[^:\n]*:", args, re.M)]
            if missing:
                problems.append(f"{where}.__init__: Args: lacks {', '.join(missing)}")
            raises = _own_raises(node)
            section = (_section(doc, ("Raises",)) or "") + "\n" + (_section(init_doc, ("Raises",)) or "")
            missing = [e for e in sorted(raises) if not re.search(rf"^\s*{e}\b", section, re.M)]
            if missing:
                problems.append(f"{where}.__init__: Raises: lacks {', '.join(missing)}")
        elif not node.name.startswith("_"):
            problems += function_problems(node, f"{where}.{node.name}")
    return problems


def module_problems(source: str, where: str) -> list[str]:
    """Every docstring problem of one module's public surface."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    problems = [] if doc else [f"{where}: no module docstring"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            problems += function_problems(node, f"{where}:{node.name}")
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            problems += class_problems(node, f"{where}:{node.name}")
        elif isinstance(node, ast.ClassDef):  # a private base: its public methods are its public subclasses'
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and not method.name.startswith("_"):
                    problems += function_problems(method, f"{where}:{node.name}.{method.name}")
    return problems


def public_modules() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]


@pytest.mark.parametrize("path", public_modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_public_surface_is_documented(path):
    problems = module_problems(path.read_text(), f"{path.parent.name}/{path.name}")
    assert not problems, "\n".join(problems)


GOOD = '''"""A module."""

def grow(pool: str, n: int) -> int:
    """Grow ``pool`` by ``n`` pages (docs/design.md §4).

    Args:
        pool: the pool's name.
        n: pages wanted.

    Returns:
        Pages granted.

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError(pool)
    return n
'''


def test_the_rules_pass_a_documented_function():
    assert module_problems(GOOD, "m") == []


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        (("        n: pages wanted.\n", ""), "Args: lacks n"),
        (("    Returns:\n        Pages granted.\n\n", ""), "no Returns: section"),
        (("        ValueError: ``n`` is negative.\n", "        KeyError: never.\n"), "Raises: lacks ValueError"),
        (("(docs/design.md §4)", ""), "cites no docs/design.md"),
    ],
)
def test_each_rule_catches_its_planted_violation(plant, message):
    problems = module_problems(GOOD.replace(*plant), "m")
    assert any(message in p for p in problems), problems


def test_a_function_without_a_docstring_is_caught():
    assert module_problems('"""m"""\ndef f() -> None:\n    pass\n', "m") == ["m:f: no docstring"]


def test_a_private_base_class_methods_are_checked():
    source = '"""m"""\nclass _Base:\n    def grow(self, n: int) -> int:\n        """Grow (docs/design.md §4)."""\n'
    assert module_problems(source, "m") == ["m:_Base.grow: Args: lacks n", "m:_Base.grow: no Returns: section"]


def test_a_class_constructor_must_list_its_arguments():
    source = (
        '"""m"""\nclass A:\n    """A thing (docs/design.md §3)."""\n'
        "    def __init__(self, size: int) -> None:\n        pass\n"
    )
    assert module_problems(source, "m") == ["m:A.__init__: Args: lacks size"]
    fixed = source.replace("§3).", "§3).\n\n    Args:\n        size: bytes.\n    ")
    assert module_problems(fixed, "m") == []
