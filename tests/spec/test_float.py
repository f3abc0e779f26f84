"""Float bands: parking, growth, holes, free/park, flush, make_room, compact_holes."""

import copy

import pytest

from kvarena import impl, spec
from kvarena.spec import Arena, SubPool, arith
from tests.support import check_all, ints, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

U = SubPool("u", 16, 1, "up")
F = SubPool("f", 16, 1, "float")
D = SubPool("d", 16, 1, "down")


def mk():
    """All grids 16 bytes a page, 100 pages, min_page 1: a parked float's region is [1, 100)."""
    a = Arena(1600, [U, F, D])
    assert a.region("f") == (1, 100)
    return a


def pages(a, name, ids):
    v2p = a.v2p(name)
    return [v2p[v] for v in ids]


# ---------------------------------------------------------------- parking


def test_parked_float_reports_num_pages_frontiers_and_is_transparent():
    a = mk()
    assert a.frontiers("f") == (1600, 1600)
    assert a.gap_bytes("u") == a.gap_bytes("d") == 1600 - 16
    ids = a.alloc("f", 4)
    a.free("f", ids)
    assert a.frontiers("f") == (1600, 1600) and a.holes("f") == []
    assert a.gap_bytes("u") == 1600 - 16
    check_all(a)


def test_midpoint_parking():
    a = mk()
    assert a.alloc("f", 10) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # start = lo + (hi - lo - n) // 2 = 1 + 89 // 2 = 45 (floor)
    assert a.frontiers("f") == (45 * 16, 55 * 16)
    assert pages(a, "f", range(1, 11)) == list(range(45, 55))
    b = mk()
    b.alloc("f", 9)  # 1 + 90 // 2 = 46
    assert b.frontiers("f") == (46 * 16, 55 * 16)
    check_all(a)


def test_midpoint_parking_off_grid_region():
    a = Arena(10000, [SubPool("s", 24, 1, "up", "state"), SubPool("w", 8, 2, "float"), SubPool("full", 16, 4, "down")])
    assert a.region("w") == (5, 624)  # ceil(72 / 16), floor(9984 / 16)
    a.alloc("w", 3)
    assert a.frontiers("w") == ((5 + (619 - 3) // 2) * 16, (5 + 308 + 3) * 16)
    assert arith.park_start(5, 624, 3) == 313
    check_all(a)


def test_midpoint_parking_uses_current_neighbours():
    a = mk()
    a.alloc("u", 20)  # up high frontier at page 21
    a.alloc("d", 10)  # down low frontier at page 90
    assert a.region("f") == (21, 90)
    a.alloc("f", 7)
    assert a.frontiers("f") == ((21 + (69 - 7) // 2) * 16, (21 + 31 + 7) * 16)


def test_growth_toward_larger_gap_high_wins_ties():
    a = mk()
    a.alloc("f", 10)  # [45, 55): gap low 44, gap high 45
    assert a.alloc("f", 2) == [11, 12]
    assert pages(a, "f", [11, 12]) == [55, 56]  # high is larger
    # now gap low 44, gap high 43
    assert a.alloc("f", 1) == [13]
    assert pages(a, "f", [13]) == [44]  # low is larger
    # now 43 and 43: a tie goes high
    assert a.alloc("f", 1) == [14]
    assert pages(a, "f", [14]) == [57]
    assert a.frontiers("f") == (44 * 16, 58 * 16)
    check_all(a)


def test_float_alloc_takes_whole_larger_gap_and_refuses_more():
    a = mk()
    a.alloc("f", 10)  # gaps 44 / 45
    assert a.available_pages("f") == 45
    with unchanged(a):
        assert a.alloc("f", 46) is None
    assert a.alloc("f", 45) is not None
    assert a.frontiers("f") == (45 * 16, 100 * 16)
    assert a.available_pages("f") == 44
    assert a.alloc("f", 44) is not None
    assert a.frontiers("f") == (1 * 16, 100 * 16)
    check_all(a)


def test_holes_first_reuse_with_zero_moves():
    a = mk()
    a.alloc("f", 10)  # ids 1..10 on pages 45..54
    a.free("f", [6, 3])  # holes made at 50, then 47
    assert a.holes("f") == [47, 50]
    v2p, content, front = a.v2p("f"), a.content("f"), a.frontiers("f")
    assert a.alloc("f", 1) == [11]
    assert pages(a, "f", [11]) == [50]  # the oldest hole
    assert a.frontiers("f") == front
    after_v2p, after_content = a.v2p("f"), a.content("f")
    for v in live_ids(a, "f"):
        if v != 11:
            assert after_v2p[v] == v2p[v]
            assert after_content[v2p[v]] == content[v2p[v]] == v
    assert a.alloc("f", 2) == [12, 13]
    assert pages(a, "f", [12, 13]) == [47, 55]  # last hole, then the larger gap (high)
    check_all(a)


def test_free_keeps_boundary_holes_until_flush_and_flush_never_moves():
    a = mk()
    a.alloc("f", 10)  # 45..54
    a.free("f", [1, 2, 10, 5])  # pages 45, 46, 54 (boundary), 49 (interior)
    assert a.frontiers("f") == (45 * 16, 55 * 16)
    v2p = a.v2p("f")
    assert a.flush("f") == 0
    assert a.v2p("f") == v2p
    assert a.frontiers("f") == (47 * 16, 54 * 16)
    assert a.holes("f") == [49]
    check_all(a)


def test_float_free_all_parks():
    a = mk()
    ids = a.alloc("f", 10)
    a.free("f", ids[:4])
    a.free("f", ids[4:])
    assert a.frontiers("f") == (1600, 1600) and a.holes("f") == [] and a.live_pages("f") == 0
    # transparent again: a new span parks at the middle of the (new) region
    a.alloc("u", 10)
    a.alloc("f", 5)
    assert a.frontiers("f")[0] == (11 + (89 - 5) // 2) * 16
    check_all(a)


# -------------------------------------------------------------- make_room


def side_band(a, name, side):
    low, high = a.frontiers(name)
    return low - a.below(name) if side == "low" else a.above(name) - high


def test_make_room_boundary_moves_exactly_need_when_edge_pages_live():
    for need in range(1, 10):
        a = mk()
        a.alloc("f", 10)  # [45, 55), all live
        assert side_band(a, "f", "low") == 44 * 16
        target = 44 * 16 + (need - 1) * 16 + 1  # need = ceil((target - band) / 16)
        assert arith.make_room_need(44 * 16, target, 16) == need
        assert a.make_room("f", "low", target) == need
        assert a.frontiers("f") == ((45 + need) * 16, (55 + need) * 16)
        # the edge pages went, ascending, into the far gap
        assert pages(a, "f", range(1, need + 1)) == list(range(55, 55 + need))
        assert pages(a, "f", range(need + 1, 11)) == list(range(45 + need, 55))
        assert side_band(a, "f", "low") >= target
        check_all(a)


def test_make_room_high_boundary():
    a = mk()
    a.alloc("f", 10)  # [45, 55)
    assert a.make_room("f", "high", 45 * 16 + 3 * 16) == 3
    assert pages(a, "f", [8, 9, 10]) == [42, 43, 44]
    assert a.frontiers("f") == (42 * 16, 52 * 16)
    check_all(a)


def _holey_float():
    a = mk()
    a.alloc("f", 20)  # ids 1..20 on [40, 60)
    assert a.frontiers("f") == (40 * 16, 60 * 16)
    return a


def test_make_room_moves_only_live_edge_pages_into_holes_beyond_then_far_gap():
    a = _holey_float()
    a.free("f", [2, 6])  # holes 41 (inside the cleared edge) and 45 (beyond it)
    band = side_band(a, "f", "low")
    moved = a.make_room("f", "low", band + 3 * 16)  # need 3: clear [40, 43)
    assert moved == 2  # pages 40 and 42; 41 is a hole
    assert pages(a, "f", [1, 3]) == [45, 60]  # hole beyond every source first, then the far gap
    assert a.frontiers("f") == (43 * 16, 61 * 16)
    assert a.holes("f") == []
    check_all(a)


def test_make_room_high_side_fills_holes_below_the_edge_nearest_first():
    a = _holey_float()
    a.free("f", [11, 16])  # holes 50, 55
    band = side_band(a, "f", "high")
    assert a.make_room("f", "high", band + 3 * 16) == 3  # clear [57, 60)
    # room, nearest first: 55, 50, then 39, 38, ...: takes 55, 50, 39; paired ascending
    assert pages(a, "f", [18, 19, 20]) == [39, 50, 55]
    assert a.frontiers("f") == (39 * 16, 57 * 16)
    check_all(a)


def test_leapfrog_moves_exactly_the_live_pages():
    a = mk()
    a.alloc("f", 10)  # [45, 55)
    band = side_band(a, "f", "low")
    assert a.make_room("f", "low", band + 10 * 16) == 10  # need 10 >= live 10
    assert a.frontiers("f") == (90 * 16, 100 * 16)  # packed against the far edge of the region
    assert pages(a, "f", range(1, 11)) == list(range(90, 100))
    check_all(a)


def test_leapfrog_with_holes_leaves_pages_already_in_place():
    a = _holey_float()
    a.free("f", list(range(2, 12)))  # holes 41..50; live 40, 51..59 (10 pages)
    a.alloc("u", 35)  # up at page 36: region lo 36
    assert a.region("f") == (36, 100)
    band = side_band(a, "f", "high")
    assert band == 40 * 16
    assert a.make_room("f", "high", band + 10 * 16) == 9  # target [36, 46); page 40 stays
    assert pages(a, "f", [1]) == [40]
    assert pages(a, "f", range(12, 21)) == [36, 37, 38, 39, 41, 42, 43, 44, 45]
    assert a.frontiers("f") == (36 * 16, 46 * 16)
    check_all(a)


def test_make_room_noop_cases_leave_state_unchanged():
    a = mk()
    a.alloc("f", 10)
    a.alloc("u", 5)
    with unchanged(a):
        assert a.make_room("f", "low", 0) == 0
        assert a.make_room("f", "low", side_band(a, "f", "low")) == 0  # side already has it
        assert a.make_room("f", "high", side_band(a, "f", "high")) == 0
        # infeasible: a full leapfrog reaches (100 - 10) * 16 - 6 * 16 on the low side
        assert a.make_room("f", "low", 84 * 16 + 1) == 0
        assert a.make_room("f", "high", (100 - 16) * 16 + 1) == 0
    b = mk()
    with unchanged(b):  # transparent
        assert b.make_room("f", "low", 10**6) == 0
        assert b.make_room("f", "high", 1) == 0
    assert a.make_room("f", "low", 84 * 16) == 10  # exactly feasible: a leapfrog


def test_make_room_sweep_reaches_target_within_cost_bound():
    base = _holey_float()
    base.free("f", [3, 7, 8, 15, 19])
    base.alloc("u", 12)
    base.alloc("d", 9)
    for side in ("low", "high"):
        for target in range(0, 1700, 5):
            a = copy.deepcopy(base)
            band = side_band(a, "f", side)
            live = a.live_pages("f")
            before = a.snapshot()
            moved = a.make_room("f", side, target)
            if band >= target:
                assert moved == 0 and a.snapshot() == before
            elif moved == 0:
                assert a.snapshot() == before
                lo, hi = a.region("f")
                far = (hi - live) * 16 - a.below("f") if side == "low" else a.above("f") - (lo + live) * 16
                assert far < target  # refused only when infeasible
            else:
                assert side_band(a, "f", side) >= target
                assert moved <= min(live, -(-(target - band) // 16))
            assert a.live_pages("f") == live
            check_all(a)


# ------------------------------------------------------------ compact_holes


def test_compact_holes_both_ways_keeps_order():
    a = _holey_float()
    a.free("f", list(range(2, 12)))  # live: 40, 51..59
    b = copy.deepcopy(a)
    assert a.compact_holes("f", "low") == 1  # pack toward high: only page 40 -> 50
    assert pages(a, "f", [1] + list(range(12, 21))) == list(range(50, 60))
    assert a.frontiers("f") == (50 * 16, 60 * 16) and a.holes("f") == []
    check_all(a)
    assert b.compact_holes("f", "high") == 9  # pack toward low: 51..59 -> 41..49
    assert pages(b, "f", [1] + list(range(12, 21))) == list(range(40, 50))
    assert b.frontiers("f") == (40 * 16, 50 * 16) and b.holes("f") == []
    check_all(b)
    with unchanged(b):
        assert b.compact_holes("f", "high") == 0


def test_compact_holes_on_parked_float_is_a_noop():
    a = mk()
    with unchanged(a):
        assert a.compact_holes("f", "low") == 0


# --------------------------------------------------- pinned policy corners


def test_make_room_over_an_edge_of_holes_moves_nothing_but_absorbs_them():
    """Free leaves boundary holes in place; make_room over them moves 0 pages
    yet the span shrinks (refit).  Pinned so that the implementation mirrors it."""
    a = _holey_float()  # [40, 60)
    a.free("f", [1, 2])  # boundary holes 40, 41: the frontier stays at 40
    assert a.frontiers("f")[0] == 40 * 16
    band = side_band(a, "f", "low")
    v2p = a.v2p("f")
    assert a.make_room("f", "low", band + 2 * 16) == 0
    assert a.v2p("f") == v2p
    assert a.frontiers("f") == (42 * 16, 60 * 16) and a.holes("f") == []
    check_all(a)


def test_leapfrog_moves_every_live_page_even_when_few_sit_at_the_edge():
    """need >= live triggers the leapfrog, whose cost is live (here 4), although
    only one live page sits among the need edge pages.  Pinned policy."""
    a = _holey_float()  # [40, 60)
    a.free("f", list(range(2, 17)))  # live: id 1 on page 40, ids 17..20 on pages 56..59
    assert a.live_pages("f") == 5
    band = side_band(a, "f", "low")
    assert a.make_room("f", "low", band + 5 * 16) == 5  # need 5 >= live 5: all five go to [95, 100)
    assert a.frontiers("f") == (95 * 16, 100 * 16)
    b = _holey_float()
    b.free("f", list(range(2, 17)))
    assert b.make_room("f", "low", band + 4 * 16) == 1  # need 4 < live: only page 40 moves, into hole 44
    assert b.v2p("f")[1] == 44
    check_all(a)
    check_all(b)


# ------------------------------------- in the spec and the implementation

ARENAS = [pytest.param(spec.Arena, id="spec"), pytest.param(impl.Arena, id="impl")]
TRI = [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")]


def _split_float(Arena):
    """A float spanning [47, 95) of a 100-page buffer with live pages only at
    50 and 93: every page between them is a hole."""
    a = Arena(1600, TRI)
    a.alloc("u", 5)
    a.alloc("d", 5)
    ids = ints(a.alloc("f", 6)) + ints(a.alloc("f", 42))
    assert a.frontiers("f") == (47 * 16, 95 * 16) and a.region("f") == (6, 95)
    keep = [v for v in ids if a.v2p("f")[v] in (50, 93)]
    a.free("f", [v for v in ids if v not in keep])
    return a, keep


@pytest.mark.parametrize("Arena", ARENAS)
def test_a_leapfrog_spares_the_page_already_at_its_target(Arena):
    """The low side asks for the whole region but two pages: both live pages
    pack at [93, 95), and the one already at 93 stays.  One page moves."""
    a, (x, y) = _split_float(Arena)
    assert a.make_room("f", "low", (93 - 6) * 16) == 1
    assert sorted(a.v2p("f")[v] for v in (x, y)) == [93, 94]
    assert a.v2p("f")[y if a.v2p("f")[y] == 93 else x] == 93
    assert a.frontiers("f") == (93 * 16, 95 * 16)
    a.verify()


def _six_live_pages(*freed):
    """A float of six live pages at [47, 53), then the pages ``freed`` freed
    in that order; the arena, the float's band and its ids."""
    a = spec.Arena(1600, TRI)
    a.alloc("u", 5)
    a.alloc("d", 5)
    ids = a.alloc("f", 6)
    assert a.frontiers("f") == (47 * 16, 53 * 16)
    at = {a.v2p("f")[v]: v for v in ids}
    a.free("f", [at[p] for p in freed])
    return a, a.bands["f"], ids


def test_refit_shrinks_a_float_to_its_live_pages_after_a_callers_move():
    """``_refit`` (the conformance classifier's replays move pages
    themselves): the span shrinks to the live pages, the old holes inside it
    stay holes, first, and a page the move vacated inside the span joins
    them."""
    a, b, ids = _six_live_pages(50, 49)  # holes 50, 49, in that order
    b.move([49], [47])  # the lowest page moves into a hole: 47 leaves the span
    b.move([50], [51])  # and one inside it: 51 is vacated
    a._refit("f")
    assert a.frontiers("f") == (48 * 16, 53 * 16)
    assert b.holes == [51]
    assert sorted(a.v2p("f")[v] for v in ids if a.v2p("f")[v] >= 0) == [48, 49, 50, 52]
    a.verify()
    b.move([51], [52])  # the top page moves down: the span shrinks from above
    a._refit("f")
    assert a.frontiers("f") == (48 * 16, 52 * 16) and b.holes == []
    a.verify()


def test_refit_keeps_an_old_hole_still_inside_the_span():
    """Page 47 moves into the hole at 49: the span starts at 48, and the old
    hole at 51 is still a hole."""
    a, b, _ = _six_live_pages(51, 49)
    b.move([49], [47])
    a._refit("f")
    assert a.frontiers("f") == (48 * 16, 53 * 16) and b.holes == [51]
    a.verify()


def test_refit_drops_an_old_hole_at_the_new_edge():
    """Page 52 moves into the hole at 49: the span ends at 51, so the old
    hole there is outside it now."""
    a, b, _ = _six_live_pages(51, 49)
    b.move([49], [52])
    a._refit("f")
    assert a.frontiers("f") == (47 * 16, 51 * 16) and b.holes == []
    a.verify()
