"""docs/design.md §9: the anchor's bugs that apply to the spec.  Each test is paired with
a planted version of the bug that the test's own check must catch."""

import copy

import pytest

from kvarena.spec import AccountingError, Arena, SubPool, arith
from kvarena.spec.arena import Arena as ArenaClass
from tests.support import check_all, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

# ---------------------------------------------------------------- bug 1
# Float growth priced in raw bytes: the first alloc(available) after boot failed.


def bug1_arena():
    # float epp 32; the down END's boot frontier 138 * 36 = 4968 = 155.25 float pages
    return Arena(
        5000, [SubPool("s", 24, 1, "up", "state"), SubPool("w", 16, 2, "float"), SubPool("full", 9, 4, "down")]
    )


def first_alloc_after_boot_is_clean(a, name):
    avail = a.available_pages(name)
    ids = a.alloc(name, avail)
    assert ids is not None and len(ids) == avail
    a.verify()
    return avail


def test_bug1_first_float_alloc_after_boot():
    a = bug1_arena()
    assert a.above("w") == 4968 and a.region("w") == (2, 155)
    assert first_alloc_after_boot_is_clean(a, "w") == 153
    assert a.frontiers("w")[1] <= a.frontiers("full")[0]
    check_all(a)


def test_bug1_planted_raw_byte_region_is_caught(monkeypatch):
    def raw(below, above, epp, lowest, num_pages):  # rounds outward: the anchor's bug
        return max(below // epp, lowest), min(-(-above // epp), num_pages)

    monkeypatch.setattr(arith, "float_region", raw)
    a = bug1_arena()
    with pytest.raises(AccountingError, match="overlap"):
        first_alloc_after_boot_is_clean(a, "w")


# ---------------------------------------------------------------- bug 5
# The down END's extension used floor division on an off-grid neighbour frontier.


def bug5_arena():
    a = Arena(10000, [SubPool("state", 24, 1, "up", "state"), SubPool("full", 16, 4, "down")])
    a.alloc("state", 8)  # high frontier 11 * 24 = 264 = 4.125 pages of 64
    return a


def fill_down(a):
    got = a.alloc("full", a.available_pages("full"))
    a.verify()
    return len(got)


def test_bug5_down_end_never_overlaps_an_off_grid_neighbour():
    a = bug5_arena()
    assert a.available_pages("full") == (9984 - 264) // 64 == 151
    assert fill_down(a) == 151
    assert a.frontiers("full")[0] == 5 * 64 >= a.frontiers("state")[1]
    with unchanged(a):
        assert a.alloc("full", 1) is None
    check_all(a)


def test_bug5_planted_floor_of_frontier_is_caught(monkeypatch):
    real = ArenaClass.available_pages

    def buggy(self, name):
        b = self.bands[name]
        if b.grow != "down":
            return real(self, name)
        lowest = max(self.below(name) // b.geom.epp, b.geom.min_page)  # floor: one page too low
        return b.lo - lowest + len(b.holes)

    a = bug5_arena()
    monkeypatch.setattr(ArenaClass, "available_pages", buggy)
    with pytest.raises(AccountingError, match="overlap"):
        fill_down(a)


# ---------------------------------------------------------------- bug 6
# A state allocation starved at 35% use: its gap was under one slot and nobody
# asked the float on the other side to give ground.


def bug6_arena():
    a = Arena(
        16000, [SubPool("mamba", 96, 1, "up", "state"), SubPool("swa", 8, 2, "float"), SubPool("full", 16, 4, "down")]
    )
    a.alloc("swa", 40)  # parks mid-buffer
    a.alloc("mamba", a.available_pages("mamba"))
    return a


def no_evict(k):
    raise AssertionError(f"evicted {k} pages although the float could slide")


def test_bug6_state_relieved_by_sliding_the_float_not_by_eviction():
    a = bug6_arena()
    assert 0 < a.gap_bytes("mamba") < 96 and a.available_pages("mamba") == 0
    used = 1 - a.conserved_available_size("mamba") / (a.geometry("mamba").num_pages - a.geometry("mamba").min_page)
    assert used < 0.5  # the dashboard says "half empty"
    before = a.frontiers("swa")
    assert a.relieve("mamba", 1, no_evict) is True
    assert a.frontiers("swa")[0] > before[0]  # the float gave ground
    assert a.alloc("mamba", 1) is not None
    check_all(a)


def bug6_full_arena():
    a = bug6_arena()
    a.alloc("full", 50)
    while a.available_pages("swa"):  # swa fills both its gaps: no surplus anywhere
        a.alloc("swa", a.available_pages("swa"))
    assert a.available_pages("mamba") == a.available_pages("swa") == a.available_pages("full") == 0
    assert a.gap_bytes("mamba") < 96 and a.gap_bytes("full") < 64
    return a


def evicting_full(a, per_round, calls):
    victims = live_ids(a, "full")

    def evict(k):  # eviction frees the *other* side's pages
        calls.append(k)
        a.free("full", victims[:per_round])
        del victims[:per_round]
        return per_round

    return evict


def test_bug6_float_slides_into_ground_freed_on_its_far_side():
    a = bug6_full_arena()
    calls = []
    assert a.relieve("mamba", 2, evicting_full(a, 8, calls)) is True  # 8 * 64 = 512 bytes freed
    assert calls == [2]
    assert a.alloc("mamba", 2) is not None
    check_all(a)


def test_bug6_slack_makes_a_partial_opening_wait_for_another_round():
    """Policy as written: freeing 256 bytes above the float would cover the 192
    the state needs, but the target adds slack (96) and make_room is all or
    nothing, so the first round moves nothing and a second round evicts."""
    a = bug6_full_arena()
    assert a.gap_bytes("mamba") == 0
    calls = []
    assert a.relieve("mamba", 2, evicting_full(a, 4, calls)) is True  # 4 * 64 = 256 bytes a round
    assert calls == [2, 2]
    check_all(a)


def test_bug6_planted_no_slide_starves(monkeypatch):
    monkeypatch.setattr(ArenaClass, "open_short_side", lambda self, name, demand: 0)
    a = bug6_arena()
    with pytest.raises(AssertionError, match="evicted"):
        a.relieve("mamba", 1, no_evict)
    assert a.relieve("mamba", 1) is False


# ---------------------------------------------------------------- bug 7
# Per-component views said 4 and 4 while only 3 were jointly available.  The
# arena's views are per pool; a coupled allocation must be priced jointly.


def joint_pages(a, names):
    """Brute force: the largest n such that n pages of every pool fit together."""
    n = 0
    while True:
        c = copy.deepcopy(a)
        if any(c.alloc(name, n + 1) is None for name in names):
            return n
        n += 1


def test_bug7_per_pool_views_are_not_a_joint_view():
    a = Arena(16 * 20, [SubPool("swa", 16, 1, "up"), SubPool("full", 16, 1, "down")])
    a.alloc("swa", 6)
    a.alloc("full", 6)
    # one shared 7-page gap: each view is 7 on its own ...
    assert a.available_pages("swa") == a.available_pages("full") == 7
    # ... but only 3 pages of each fit together
    assert joint_pages(a, ["swa", "full"]) == 3
    c = copy.deepcopy(a)
    assert c.alloc("swa", 4) is not None and c.alloc("full", 4) is None
    # and each view stays exact after the other pool takes its share
    c = copy.deepcopy(a)
    c.alloc("swa", 3)
    assert c.available_pages("full") == 4


def test_bug7_views_of_a_float_and_an_end_sharing_a_gap():
    a = Arena(
        16 * 40,
        [SubPool("state", 32, 1, "up", "state"), SubPool("swa", 16, 1, "float"), SubPool("full", 16, 1, "down")],
    )
    a.alloc("full", 20)  # low frontier 320
    a.alloc("state", 4)  # high frontier 160
    # the parked float and the down END each see the whole 10-page gap
    assert a.gap_bytes("full") == 160 and a.available_pages("full") == 10
    assert a.region("swa") == (10, 20) and a.available_pages("swa") == 10
    # jointly: 5 if the END goes first; only 3 if the float parks first, mid-gap
    assert joint_pages(a, ["full", "swa"]) == 5
    assert joint_pages(a, ["swa", "full"]) == 3


# ---------------------------------------------------------------- bug 9
# A -1 sentinel was freed into a free list.


def test_bug9_minus_one_never_reaches_a_free_list():
    a = Arena(4096, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")], lazy=True)
    for name in a.chain:
        ids = a.alloc(name, 4)
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.free(name, [-1])
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.free(name, [ids[0], -1])  # nothing freed, not even the good id
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.alloc(name, 1, ids=[-1])
        assert a.translate(name, [-1, ids[1]]) == [0, a.v2p(name)[ids[1]]]
        assert -1 not in a.snapshot()["pools"][name]["free_ids"]


def test_bug9_planted_sentinel_in_free_list_is_caught():
    a = Arena(4096, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")])
    a.bands["d"].free_ids.append(-1)
    with pytest.raises(AccountingError, match=r"'d'.*free ids"):
        a.verify()


# --------------------------------------------------------------- bug 10
# Page 0 was double-freed on a segment free path.


def test_bug10_sink_is_never_freed_and_stays_pinned():
    a = Arena(4096, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")])
    for name in a.chain:
        ids = a.alloc(name, 5)
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.free(name, [0])
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.free(name, ids[:2] + [0])
        a.free(name, ids)
        with unchanged(a), pytest.raises(ValueError, match=repr(name)):
            a.free(name, [0])
        snap = a.snapshot()["pools"][name]
        assert snap["v2p"][0] == 0 and snap["p2v"][0] == 0 and 0 not in snap["free_ids"]
        assert a.translate(name, [0]) == [0]
    check_all(a)


def test_bug10_planted_unchecked_sink_free_is_caught(monkeypatch):
    def ids_without_sink_check(self, b, ids, bound):
        ids = list(ids)
        for v in ids:
            if (b.v2p[v] >= 0) != bound:
                raise ValueError(f"pool {b.name!r}: id {v}")
        return ids

    a = Arena(4096, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")])
    a.alloc("u", 3)
    monkeypatch.setattr(ArenaClass, "_ids", ids_without_sink_check)
    a.free("u", [0])  # the planted bug lets the sink through ...
    with pytest.raises(AccountingError, match="'u'"):
        a.verify()  # ... and verify names the pool
