"""The impl's capacity memo: epoch fields, hits, invalidation, and bypass detection."""

import pytest

from kvarena.impl import AccountingError, Arena, SubPool
from kvarena.impl.arena import VIEWS
from kvarena.impl.memo import CapField


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


def test_memo_hits_until_any_band_changes():
    a = arena()
    memo = a._memo
    a.available_pages("U")
    misses, hits = memo.misses, memo.hits
    for _ in range(5):
        a.available_pages("U")
    assert memo.hits == hits + 5 and memo.misses == misses
    a.alloc("D", 1)  # another band: the key is the chain's epoch sum
    misses = memo.misses
    a.available_pages("U")
    assert memo.misses == misses + 1
    a.available_pages("U")
    assert memo.misses == misses + 1


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
