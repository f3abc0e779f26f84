"""Helpers shared by the tests of every folder (``from tests.support import ...``)."""

import contextlib
import json
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
