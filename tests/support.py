"""Helpers shared by the tests of every folder (``from tests.support import ...``)."""

import contextlib
import dataclasses
import importlib
import inspect
import json
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository


def ints(xs):
    """A list of ints from the spec's lists and the implementation's tensors."""
    return [int(x) for x in xs]


def live_ids(a, name):
    """Virtual ids currently bound in ``name`` (the sink, id 0, excluded)."""
    return [v for v, p in enumerate(a.v2p(name)) if v > 0 and p >= 0]


def check_content(a):
    """The content model: every live id's bytes sit where ``v2p`` says."""
    for name in a.chain:
        content, v2p = a.content(name), a.v2p(name)
        for v in live_ids(a, name):
            assert content.get(v2p[v]) == v, f"{name}: id {v} at page {v2p[v]} holds {content.get(v2p[v])}"


def check_all(a):
    a.verify()
    check_content(a)
    json.dumps(a.snapshot())  # JSON-able


def busy(Arena):
    """A tri-pool arena (any package's ``Arena``) with live pages in every band,
    a hole in the float and a lazy hole in the down END."""
    from kvarena.spec import SubPool

    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")], lazy={"d"})
    a.alloc("u", 5)
    a.alloc("f", 6)
    a.alloc("d", 5)
    a.free("d", [2])
    a.free("f", [3])
    a.verify()
    return a


@contextlib.contextmanager
def unchanged(a):
    """Assert the block leaves ``a`` exactly as it found it."""
    before = a.snapshot()
    yield
    assert a.snapshot() == before
    a.verify()


# ------------------------------------------------- mutants for the solver pool


def mutant_module(module, old, new):
    """Re-execute ``module``'s source with one edit; return the mutant module."""
    src = inspect.getsource(module)
    assert src.count(old) == 1, f"mutation site {old!r} not unique in {module.__name__}"
    m = types.ModuleType(module.__name__ + "_mutant")
    m.__package__ = module.__package__
    exec(compile(src.replace(old, new), module.__name__ + "_mutant", "exec"), m.__dict__)
    return m


@dataclasses.dataclass(frozen=True)
class Patch:
    """``module.attr = value``, applied in a fresh solver process
    (``kvarena.proofs.cli.run_fresh``'s ``patch``).  It crosses to that
    process by pickle: the module goes by name, and ``value`` must be a
    function defined at module level."""

    module: str
    attr: str
    value: object

    def __call__(self):
        setattr(importlib.import_module(self.module), self.attr, self.value)


@dataclasses.dataclass(frozen=True)
class SourcePatch:
    """``target.attr`` set to the ``attr`` of module ``source`` re-executed
    with ``old`` replaced by ``new`` (a one-token source mutation), in a
    fresh solver process."""

    source: str
    old: str
    new: str
    target: str
    attr: str

    def __call__(self):
        m = mutant_module(importlib.import_module(self.source), self.old, self.new)
        setattr(importlib.import_module(self.target), self.attr, getattr(m, self.attr))


def refuted(names, patch):
    """The obligations of ``names`` that ``patch`` refutes (a counterexample;
    a time-out is no verdict), each run in a fresh solver process."""
    from kvarena.proofs import cli

    return [r["name"] for r in cli.run_fresh(names, patch) if r["result"] == "counterexample"]
