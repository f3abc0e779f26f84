"""Regression tests for the anchor's bugs (docs/design.md §9) against the impl.

Each test runs the correct code, then plants the bug (monkeypatch) and shows
that the same check fails, so none of them can pass vacuously.

Bug 8 (deferred frees sharing one fence overwrote each other) does not apply:
the impl never defers reuse behind a fence or event.  ``free`` unbinds and
queues ids at once, in stream order, so there is no deferred list to lose.
"""

import pytest
import torch

from kvarena.impl import AccountingError, Arena, SubPool, capacity
from kvarena.impl import arena as arena_mod

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def stamp(a, name, ids, seed):
    epp = a.geometry(name).epp
    data = (torch.arange(len(ids) * epp).reshape(len(ids), epp) * 7 + seed) % 251
    a.write_pages(name, ids, data.to(torch.uint8))
    return data.to(torch.uint8)


# ------------------------------------------------------------------ bug 1


def float_first_alloc():
    """Off-grid neighbours: U's high frontier is 15 (float grid 4), D's low is 95."""
    a = Arena(98, [SubPool("U", 3, 1, "up"), SubPool("F", 4, 1, "float"), SubPool("D", 5, 1, "down")])
    a.alloc("U", 3)
    ids = a.alloc("F", a.available_pages("F"))
    assert ids is not None, "alloc(available) failed"
    a.verify()
    return a


def test_bug1_float_region_rounds_inward():
    a = float_first_alloc()
    assert a.region("F") == (4, 23)  # ceil(15/4), floor(95/4)


def test_bug1_planted_raw_byte_region_is_caught(monkeypatch):
    def raw(below, above, epp, lowest, num_pages):  # rounds outward: the anchor's bug
        return max(below // epp, lowest), min(-(-above // epp), num_pages)

    monkeypatch.setattr(capacity, "float_region", raw)
    with pytest.raises(AccountingError, match="overlap"):
        float_first_alloc()


# ------------------------------------------------------------------ bug 4


def relocations_keep_bytes(kind):
    """A state END compacts on free; a KV float slides: bytes must follow."""
    a = Arena(4000, [SubPool("S", 8, 1, "up", kind), SubPool("F", 6, 2, "float"), SubPool("D", 4, 4, "down")])
    s = a.alloc("S", 6)
    s_data = stamp(a, "S", s.tolist(), 1)
    f = a.alloc("F", 5)
    f_data = stamp(a, "F", f.tolist(), 2)
    a.free("S", s[:2])  # compaction moves survivors down into the holes
    assert torch.equal(a.read_pages("S", s[2:]), s_data[2:])
    assert a.make_room("F", "low", a.frontiers("F")[0] - a.below("F") + 40) > 0
    assert torch.equal(a.read_pages("F", f), f_data)
    a.verify()


@pytest.mark.parametrize("kind", ["state", "kv"])
def test_bug4_move_contract_is_dst_first_for_every_kind(kind):
    relocations_keep_bytes(kind)


def test_bug4_planted_reversed_order_for_state_is_caught(monkeypatch):
    real = arena_mod.Arena._move

    def reversed_for_state(self, b, dst, src, *rest):
        if b.pool.kind == "state":
            dst, src = src, dst
        return real(self, b, dst, src, *rest)

    monkeypatch.setattr(arena_mod.Arena, "_move", reversed_for_state)
    relocations_keep_bytes("kv")  # kv pools untouched by the plant
    with pytest.raises((AssertionError, AccountingError)):
        relocations_keep_bytes("state")


# ------------------------------------------------------------------ bug 5


def down_fills_to_off_grid_neighbour():
    a = Arena(1000, [SubPool("U", 3, 1, "up"), SubPool("D", 4, 2, "down")])
    u = a.alloc("U", 100)  # U's high frontier (3 + 100) * 3 = 309, off D's 8-byte grid
    u_data = stamp(a, "U", u.tolist(), 3)
    d = a.alloc("D", a.available_pages("D"))
    assert d is not None
    stamp(a, "D", d.tolist(), 4)
    a.verify()
    assert torch.equal(a.read_pages("U", u), u_data), "D's pages overwrote U's"
    assert a.frontiers("D")[0] >= a.frontiers("U")[1]
    return a


def test_bug5_down_extension_rounds_toward_itself():
    a = down_fills_to_off_grid_neighbour()
    assert a.frontiers("U")[1] == 309
    assert a.frontiers("D")[0] == 312  # ceil(309/8)*8: the partly covered page stays free


def test_bug5_planted_floor_on_neighbour_frontier_is_caught(monkeypatch):
    real = arena_mod.Arena._gap

    def floor_gap(self, b):
        if b.grow == "down":  # pages from floor(below/epp): one page too many off-grid
            epp = b.geom.epp
            return max(0, (b.lo - self.below(b.name) // epp) * epp)
        return real(self, b)

    monkeypatch.setattr(arena_mod.Arena, "_gap", floor_gap)
    with pytest.raises((AssertionError, AccountingError)):
        down_fills_to_off_grid_neighbour()


# ------------------------------------------------------------- bugs 9, 10


def ends(lazy):
    return Arena(600, [SubPool("U", 2, 2, "up"), SubPool("F", 3, 1, "float"), SubPool("D", 5, 1, "down")], lazy=lazy)


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name", ["U", "F", "D"])
@pytest.mark.parametrize("bad", [[-1], [0], "tensor-1", "tensor0"])
def test_bug9_bug10_sentinel_and_sink_never_freed(lazy, name, bad):
    a = ends(lazy)
    a.alloc(name, 3)
    if isinstance(bad, str):
        bad = torch.tensor([-1 if bad == "tensor-1" else 0])
    before = a.snapshot()
    with pytest.raises(ValueError, match=name):
        a.free(name, bad)
    assert a.snapshot() == before
    a.verify()
    q = a.free_ids(name).tolist()
    assert -1 not in q and 0 not in q
    assert a.translate(name, [-1, 0]).tolist() == [0, 0]  # both land on the sink


@pytest.mark.parametrize("bad", [-1, 0])
@pytest.mark.parametrize("name", ["U", "F", "D"])
def test_bug9_bug10_planted_missing_validation_is_caught(monkeypatch, name, bad):
    monkeypatch.setattr(arena_mod.Arena, "_checked", lambda self, b, ids, bound, freeing=False: self._as_tensor(b, ids))
    a = ends(False)
    a.alloc(name, 3)
    # The plant lets the id through: either the table gather rejects it
    # (-1 cannot index a table) or verify sees the sink in the tables/FIFO.
    with pytest.raises((AccountingError, IndexError, RuntimeError)):
        a.free(name, [bad])
        a.verify()


def test_bug10_sink_is_never_handed_out_and_stays_pinned():
    a = ends(True)
    for _ in range(5):
        for n in a.chain:
            ids = a.alloc(n, a.available_pages(n))
            assert 0 not in ids.tolist()
            a.free(n, ids[::2])
            a.flush(n)
    for n in a.chain:
        assert a.v2p(n)[0] == 0 and a.p2v(n)[0] == 0
    a.verify()
