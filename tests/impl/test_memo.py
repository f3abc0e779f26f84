"""The impl's capacity memo: epoch fields, hits, invalidation, and bypass detection."""

import pytest

from kvarena.impl import AccountingError, Arena, SubPool
from kvarena.impl.arena import VIEWS
from kvarena.impl.memo import CapField

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def arena(lazy=False):
    pools = [SubPool("U", 3, 2, "up"), SubPool("F", 5, 1, "float"), SubPool("D", 4, 4, "down")]
    return Arena(2000, pools, lazy=lazy)


def test_bypass_write_is_reported_as_stale_memo():
    a = arena()
    a.alloc("U", 3)
    before = a.available_pages("U")  # fills the memo
    b = a.bands["U"]
    b.__dict__["hi"] = b.hi + 2  # around the descriptor: no epoch bump
    assert a.available_pages("U") == before  # the memo cannot see it ...
    with pytest.raises(AccountingError, match="stale memo") as err:
        a.verify()  # ... verify does
    assert err.value.pool == "U"


def test_bypass_on_a_neighbour_is_caught_in_the_reader():
    a = arena()
    a.alloc("D", 2)
    a.gap_bytes("U")
    a.bands["D"].__dict__["lo"] = a.bands["D"].lo - 3  # D's frontier bounds U's gap
    with pytest.raises(AccountingError, match="stale memo"):
        a.verify()


def test_descriptor_rebind_keeps_memo_fresh():
    a = arena()
    a.available_pages("U")
    b = a.bands["U"]
    b.hi = b.hi + 2  # through the descriptor: epoch bumps, memo recomputes
    assert a.available_pages("U") == a.fresh_view("available_pages", "U")
    with pytest.raises(AccountingError) as err:  # state is still inconsistent ...
        a.verify()
    assert err.value.rule != "stale memo"  # ... but the memo is not the problem


def test_every_rebind_bumps_the_epoch():
    a = arena()
    b = a.bands["F"]
    e = b.epoch
    b.lo = b.lo  # same value: still a rebind
    assert b.epoch == e + 1
    for field in ("lo", "hi", "live", "holes"):
        assert isinstance(type(b).__dict__[field], CapField)


def spy_fresh(a):
    """Record every view ``a`` computes (a memo miss) as ``(view, pool)``."""
    computed = []

    def counting(view, fn):
        def compute(arena, b):
            computed.append((view, b.name))
            return fn(arena, b)

        return compute

    a._FRESH = {v: counting(v, fn) for v, fn in type(a)._FRESH.items()}
    return computed


def test_memo_hits_until_any_band_changes():
    a = arena()
    computed = spy_fresh(a)
    misses = a._memo.misses
    want = a.available_pages("U")
    assert computed == [("available_pages", "U")] and a._memo.misses == misses + 1
    for _ in range(5):
        assert a.available_pages("U") == want
    assert computed == [("available_pages", "U")] and a._memo.misses == misses + 1  # five hits, no compute
    a.alloc("D", 1)  # another band: the arena-wide clock ticks and empties the memo
    del computed[:]
    before = a._memo.misses  # the alloc's own reads missed too
    a.available_pages("U")
    a.available_pages("U")
    assert computed == [("available_pages", "U")] and a._memo.misses == before + 1 > 1


def test_an_unknown_pool_is_still_a_value_error():
    """The hit path is one dict lookup; a pool no arena has still raises
    ValueError naming it (hashable or not), and is never memoised."""
    a = arena()
    a.available_pages("U")
    for bad in ("X", ["U"], None, 3):
        with pytest.raises(ValueError, match="unknown pool"):
            a.available_pages(bad)
    assert {p for _, p, _ in a._memo.entries()} == {"U"}


def test_memo_tracks_neighbour_changes():
    a = arena()
    before = a.available_pages("U")
    a.alloc("F", 1)  # a parked float becomes opaque mid-region: U's gap shrinks
    after = a.available_pages("U")
    assert after < before
    assert after == a.fresh_view("available_pages", "U")
    a.verify()


def test_hole_tensor_is_rebound_not_mutated():
    a = arena(lazy=True)
    ids = a.alloc("U", 4)
    holes = a.bands["U"].holes
    e = a.bands["U"].epoch
    a.free("U", ids[:2])
    assert a.bands["U"].holes is not holes and holes.numel() == 0
    assert a.bands["U"].epoch > e
    assert a.available_pages("U") == a.fresh_view("available_pages", "U")


def test_verify_compares_every_view_after_ops():
    a = arena(lazy=True)
    for n in a.chain:
        a.alloc(n, 3)
    a.free("U", a.alloc("U", 2))
    for n in a.chain:
        for v in VIEWS:
            assert a._view(v, n) == a.fresh_view(v, n)
    a.verify()


def test_a_deep_copy_keys_its_memo_on_its_own_bands():
    """The memo key used to be a lambda over the original arena's bands, so a
    deep copy read stale views after its first change (found by the
    composites' work, which deep-copies arenas)."""
    import copy

    a = arena()
    before = a.available_pages("U")  # fills the memo
    b = copy.deepcopy(a)
    b.alloc("U", 3)
    b.verify()  # no "stale memo"
    a.verify()
    assert a.available_pages("U") == before and b.available_pages("U") == before - 3


def test_an_alloc_from_holes_alone_keeps_the_memo_fresh():
    """An alloc served wholly from lazy holes moves no frontier: only the
    ``holes`` and ``live`` rebinds tick the clock, so a write around their
    descriptors would leave the memo stale (the planted bug
    ``memo-field-mutated-in-place``)."""
    a = arena(lazy=True)
    ids = a.alloc("U", 4)
    a.free("U", ids[:2])
    before = a.available_pages("U")  # fills the memo
    a.alloc("U", 2)  # from the two holes
    assert a.bands["U"].n_holes == 0
    assert a.available_pages("U") == a.fresh_view("available_pages", "U") == before - 2
    a.verify()


def test_fresh_view_names_a_bad_view_or_pool():
    a = arena()
    with pytest.raises(ValueError, match="fresh_view: unknown view 'nope'"):
        a.fresh_view("nope", "U")
    with pytest.raises(ValueError, match="pool 'zz': unknown pool"):
        a.fresh_view("available_pages", "zz")
