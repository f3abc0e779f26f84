"""Who may import whom, read from the code itself.

Each package's ``__init__.py`` says what lives there and, in a line that
starts ``May import:``, which other kvarena packages its modules may import.
These tests hold the code to those lines, and to three rules of the
layout: the spec is pure Python (the standard library, and z3 only inside
the shim, for z3 terms); the implementation imports from the spec exactly
the names its ``__init__`` lists; and no module imports a private name
(``_x``) from another package.  Each rule is first shown to catch a planted
violation.
"""

import ast
import re
import sys

import pytest

from tests.support import ROOT

PACKAGES = {  # import name -> folder
    "kvarena.spec": ROOT / "spec",
    "kvarena.impl": ROOT / "impl",
    "kvarena.proofs": ROOT / "proofs",
    "kvarena.verification": ROOT / "kvarena" / "verification",
    "kvarena.sim": ROOT / "kvarena" / "sim",
    "kvarena.anchor": ROOT / "kvarena" / "anchor",
    "kvarena.sglang": ROOT / "kvarena" / "sglang",
    "kvarena": ROOT / "kvarena",  # the CLI: the top, which every package is below
}


def package_of(module: str) -> str | None:
    """The kvarena package a dotted module name belongs to (the longest match)."""
    for pkg in sorted(PACKAGES, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def imports(source: str, pkg: str, module: str = "") -> list[tuple[str, str]]:
    """``(module, name)`` for every absolute import in ``source`` (``name`` is
    ``""`` for ``import m``); relative imports resolve against ``pkg``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (pkg + "." + module).split(".")[: -node.level] if module else pkg.split(".")
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # ``from kvarena import spec`` imports a package, not a name
                found.append((sub, "") if package_of(sub) not in (None, package_of(base)) else (base, alias.name))
    return found


def modules(pkg: str):
    folder = PACKAGES[pkg]
    for path in sorted(folder.glob("*.py")):
        yield path.stem, path.read_text()


def allowed(pkg: str) -> set[str]:
    """The packages named on the ``May import:`` line of ``pkg``'s ``__init__`` docstring."""
    doc = ast.get_docstring(ast.parse((PACKAGES[pkg] / "__init__.py").read_text())) or ""
    m = re.search(r"^May import:(.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    assert m, f"{pkg}/__init__.py: its docstring has no 'May import:' line"
    return set(re.findall(r"``(kvarena(?:\.\w+)?)``", m.group(1)))


def crossings(pkg: str, sources) -> list[str]:
    """Imports of another kvarena package that ``pkg``'s ``May import:`` line does not name."""
    ok = allowed(pkg) | {pkg}
    bad = []
    for module, source in sources:
        for target, name in imports(source, pkg, module):
            other = package_of(target)
            if other and other not in ok:
                bad.append(f"{pkg}.{module} imports {target}{'.' + name if name else ''}")
    return bad


def private_imports(pkg: str, sources) -> list[str]:
    bad = []
    for module, source in sources:
        for target, name in imports(source, pkg, module):
            if name.startswith("_") and not name.startswith("__") and package_of(target) not in (None, pkg):
                bad.append(f"{pkg}.{module} imports the private {target}.{name}")
    return bad


SHIPPED = [p for p in PACKAGES if p != "kvarena"]


@pytest.mark.parametrize("pkg", SHIPPED)
def test_each_package_imports_only_what_its_init_names(pkg):
    assert crossings(pkg, modules(pkg)) == []


def test_a_planted_crossing_is_caught():
    planted = [("arena", "from kvarena.impl.arena import Arena\n"), ("chain", "from kvarena import proofs\n")]
    assert crossings("kvarena.spec", planted) == [
        "kvarena.spec.arena imports kvarena.impl.arena.Arena",
        "kvarena.spec.chain imports kvarena.proofs",
    ]


def test_the_cli_is_the_top_nothing_imports_it():
    bad = [
        f"{pkg}.{m}" for pkg in SHIPPED for m, s in modules(pkg) for t, _ in imports(s, pkg, m) if t == "kvarena.cli"
    ]
    assert bad == []


def test_the_layering_has_no_cycle():
    """spec below impl and proofs, below the tooling: the ``May import:`` lines form no cycle."""
    order = []
    graph = {p: allowed(p) - {"kvarena", p} for p in SHIPPED}
    while graph:
        ready = sorted(p for p, deps in graph.items() if not deps - set(order))
        assert ready, f"a cycle among {sorted(graph)}"
        order += ready
        graph = {p: d for p, d in graph.items() if p not in ready}
    assert order[0] == "kvarena.spec"


def spec_third_party(sources) -> list[str]:
    """Imports in the spec other than the standard library, itself, and z3 inside a function (the shim)."""
    bad = []
    for module, source in sources:
        tree = ast.parse(source)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or (isinstance(node, ast.ImportFrom) and node.level):
                continue
            for name in [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]:
                root = name.split(".")[0]
                if root in sys.stdlib_module_names or name.startswith("kvarena.spec"):
                    continue
                if root == "z3" and module == "arith" and id(node) not in top:
                    continue
                bad.append(f"spec.{module} imports {name}")
    return bad


def test_the_spec_is_pure_python():
    assert spec_third_party(modules("kvarena.spec")) == []


def test_a_planted_third_party_import_in_the_spec_is_caught():
    planted = [("chain", "import torch\n"), ("arith", "import z3\n"), ("bands", "def f():\n    import z3\n")]
    assert spec_third_party(planted) == ["spec.chain imports torch", "spec.arith imports z3", "spec.bands imports z3"]


def impl_spec_names() -> set[str]:
    """What impl imports from the spec: ``module`` for a module, ``module.Name`` for a name."""
    used = set()
    for module, source in modules("kvarena.impl"):
        for target, name in imports(source, "kvarena.impl", module):
            if package_of(target) == "kvarena.spec":
                sub = target.removeprefix("kvarena.spec").lstrip(".")
                used.add(f"{sub}.{name}" if name else sub)
    return used


def listed_in_impl_init() -> set[str]:
    """The ``Imports from kvarena.spec:`` paragraph of impl's ``__init__``: ``module`` (``Name``, ...) entries."""
    doc = ast.get_docstring(ast.parse((PACKAGES["kvarena.impl"] / "__init__.py").read_text())) or ""
    m = re.search(r"^Imports from ``kvarena\.spec``:(.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    assert m, "impl/__init__.py: its docstring has no 'Imports from ``kvarena.spec``:' paragraph"
    listed = set()
    for module, names in re.findall(r"``(\w+)``\s*(?:\(([^)]*)\))?", m.group(1)):
        found = re.findall(r"``(\w+)``", names or "")
        listed |= {f"{module}.{n}" for n in found} if found else {module}
    return listed


def test_impl_imports_from_the_spec_exactly_what_its_init_lists():
    assert impl_spec_names() == listed_in_impl_init()


@pytest.mark.parametrize("pkg", list(PACKAGES))
def test_no_module_imports_a_private_name_from_another_package(pkg):
    assert private_imports(pkg, modules(pkg)) == []


def test_a_planted_private_import_is_caught():
    planted = [("composites", "from kvarena.impl.arena import _bind\nfrom .arena import _own\n")]
    assert private_imports("kvarena.impl", planted) == []  # its own package: allowed
    planted = [("bench", "from kvarena.impl.arena import _bind, Arena\n")]
    assert private_imports("kvarena.sim", planted) == ["kvarena.sim.bench imports the private kvarena.impl.arena._bind"]


def test_every_folder_says_what_lives_there():
    for folder in PACKAGES.values():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"{folder.relative_to(ROOT)}/__init__.py needs a docstring"


def test_the_reading_order_lists_every_spec_module_once():
    doc = ast.get_docstring(ast.parse((PACKAGES["kvarena.spec"] / "__init__.py").read_text())) or ""
    order = re.findall(r"^- ``(\w+)``", doc.split("The reading order", 1)[1], re.M)
    assert sorted(order) == sorted(m for m, _ in modules("kvarena.spec") if m != "__init__")
    assert len(order) == len(set(order))
