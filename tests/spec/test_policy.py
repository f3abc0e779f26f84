"""open_short_side, the demand-vector policy, in each of its branches."""

import pytest

from kvarena.spec import Arena, SubPool, short_side_decision
from tests.support import check_all, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

U = SubPool("u", 16, 1, "up")
F = SubPool("f", 16, 1, "float")
D = SubPool("d", 16, 1, "down")


def mk(u=0, d=0, lazy=False):
    """All grids 16 bytes, 100 pages.  The float holds [45, 55) (10 live pages).

    band_low = (45 - 1 - u) * 16, band_high = (45 - d) * 16.
    """
    a = Arena(1600, [U, F, D], lazy=lazy)
    a.alloc("f", 10)
    assert a.frontiers("f") == (45 * 16, 55 * 16)
    assert a.alloc("u", u) is not None and a.alloc("d", d) is not None
    return a


def recording(a):
    """Record every make_room call; still perform it."""
    calls, real = [], a.make_room

    def make_room(name, side, min_bytes):
        calls.append((name, side, min_bytes))
        return real(name, side, min_bytes)

    a.make_room = make_room
    return calls


def bands(a):
    low, high = a.frontiers("f")
    return low - a.below("f"), a.above("f") - high


# -------------------------------------------------------------- skip branches


def test_skip_transparent_float():
    a = Arena(1600, [U, F, D])
    a.alloc("u", 90)
    calls = recording(a)
    with unchanged(a):
        assert a.open_short_side("f", {"u": 9}) == 0
    assert calls == []


@pytest.mark.parametrize("demand", [{}, {"u": 0}, {"u": 0, "f": 0, "d": 0}])
def test_skip_nothing_demanded(demand):
    a = mk(u=40)
    calls = recording(a)
    with unchanged(a):
        assert a.open_short_side("f", demand) == 0
    assert calls == []


def test_skip_when_index_space_lacks_and_act_just_inside_it():
    a = mk(u=40)  # u index room: 99 - 40 = 59
    calls = recording(a)
    with unchanged(a):
        assert a.open_short_side("f", {"u": 60}) == 0
        assert a.open_short_side("f", {"u": 5, "d": 100}) == 0  # any demanded pool lacking ids
    assert calls == []
    a.open_short_side("f", {"u": 59})
    assert calls == [("f", "low", 59 * 16 + 16)]


def test_no_move_when_both_sides_short():
    a = mk(u=40, d=40)
    assert bands(a) == (64, 80)
    calls = recording(a)
    with unchanged(a):
        assert a.open_short_side("f", {"u": 10, "d": 10}) == 0
    assert calls == []


def test_no_move_when_nobody_is_short():
    a = mk(u=10, d=10)
    calls = recording(a)
    with unchanged(a):
        assert a.open_short_side("f", {"u": 5, "d": 5, "f": 10}) == 0
    assert calls == []


# ------------------------------------------------------------ one side short


def test_one_side_short_low_opens_to_target_and_meets_demand():
    a = mk(u=40)
    assert bands(a) == (64, 720)
    assert a.available_pages("u") == 4
    calls = recording(a)
    # target = sides_low 160 + max(0, 0 - 720) + slack 16
    assert a.open_short_side("f", {"u": 10}) == 7  # need = ceil((176 - 64) / 16)
    assert calls == [("f", "low", 176)]
    assert a.frontiers("f") == (52 * 16, 62 * 16)
    assert a.available_pages("u") == 11 >= 10
    check_all(a)


def test_one_side_short_high():
    a = mk(d=40)
    assert bands(a) == (704, 80)
    calls = recording(a)
    assert a.open_short_side("f", {"d": 10}) == 6
    assert calls == [("f", "high", 176)]
    assert a.available_pages("d") >= 10
    check_all(a)


def test_one_side_short_target_adds_what_the_far_side_cannot_give_the_float():
    a = mk(u=40, d=30)
    assert bands(a) == (64, 240)
    calls = recording(a)
    a.open_short_side("f", {"u": 10, "f": 30})
    # sides_low 160; Fb 480; surplus_high 240: 160 + (480 - 240) + 16
    assert calls == [("f", "low", 416)]


def test_one_side_short_counts_lazy_holes_of_the_end():
    a = mk(u=40, lazy={"u"})
    a.free("u", [5, 9, 13])  # three holes: u needs only 7 more pages of bytes
    assert bands(a) == (64, 720)
    calls = recording(a)
    a.open_short_side("f", {"u": 10})
    assert calls == [("f", "low", 7 * 16 + 16)]


def test_slack_is_the_largest_epp_among_demanded_pools():
    def case():
        pools = [SubPool("u", 16, 1, "up"), SubPool("f", 32, 1, "float"), SubPool("d", 48, 1, "down")]
        a = Arena(4800, pools)
        a.alloc("f", 10)
        assert a.frontiers("f") == (71 * 32, 81 * 32)
        a.alloc("u", 130)  # band_low = 2272 - 133 * 16 = 144
        return a, recording(a)

    a, calls = case()
    a.open_short_side("f", {"u": 10, "d": 0})  # d not demanded: slack 16
    assert calls == [("f", "low", 160 + 16)]
    a, calls = case()
    a.open_short_side("f", {"u": 10, "f": 1})  # the float demands: slack 32
    assert calls == [("f", "low", 160 + 32)]
    a, calls = case()
    a.open_short_side("f", {"u": 10, "d": 1})  # slack 48 (and d's side needs 48, which it has)
    assert calls == [("f", "low", 160 + 48)]
    assert a.available_pages("u") >= 10
    check_all(a)


# ----------------------------------------------------------- only F short


def test_only_float_short_opens_larger_surplus_side():
    a = mk()
    assert bands(a) == (704, 720)
    assert a.available_pages("f") == 45
    calls = recording(a)
    assert a.open_short_side("f", {"f": 50}) == 6  # need ceil((816 - 720) / 16)
    assert calls == [("f", "high", 0 + 800 + 16)]
    assert a.available_pages("f") >= 50
    assert a.alloc("f", 50) is not None
    check_all(a)


def test_only_float_short_low_wins_ties():
    a = mk(d=1)
    assert bands(a) == (704, 704)
    calls = recording(a)
    a.open_short_side("f", {"f": 50})
    assert calls == [("f", "low", 816)]
    assert a.available_pages("f") >= 50
    check_all(a)


def test_only_float_short_holes_count_for_the_float():
    a = mk()
    a.free("f", [3, 5, 7, 8, 9, 10])  # pages 47, 49 (interior) and 51..54 (boundary)
    a.flush("f")  # absorbs the boundary holes
    assert a.holes("f") == [47, 49] and a.frontiers("f") == (45 * 16, 51 * 16)
    assert bands(a) == (704, 784)
    calls = recording(a)
    a.open_short_side("f", {"f": 60})
    # Fb = (60 - 2 holes) * 16 = 928 > 784: open high to 0 + 928 + 16
    assert calls == [("f", "high", 944)]
    assert a.available_pages("f") >= 60
    check_all(a)


# ------------------------------------------------------ the pure decision


@pytest.mark.parametrize(
    "args,expected",
    [
        # sides_low, sides_high, band_low, band_high, float_bytes, slack
        ((100, 100, 50, 50, 0, 16), (False, None, None)),  # both short
        ((100, 0, 50, 500, 0, 16), (True, True, 116)),  # low short
        ((0, 100, 500, 50, 0, 16), (True, False, 116)),  # high short
        ((100, 0, 50, 500, 600, 16), (True, True, 100 + 100 + 16)),  # low short, float spills
        ((0, 0, 300, 400, 500, 8), (True, False, 508)),  # only F short: high larger
        ((0, 0, 400, 400, 500, 8), (True, True, 508)),  # tie: low
        ((10, 0, 400, 410, 500, 8), (True, False, 508)),  # surplus 390 < 410: high
        ((0, 0, 400, 400, 400, 8), (False, None, None)),  # F exactly fits
        ((0, 0, 0, 0, 0, 0), (False, None, None)),
    ],
)
def test_short_side_decision_table(args, expected):
    act, side_is_low, target = short_side_decision(*args)
    assert act == expected[0]
    if act:
        assert (side_is_low, target) == expected[1:]


def test_short_side_decision_never_moves_when_both_sides_short():
    for sl in range(0, 60, 7):
        for sh in range(0, 60, 7):
            for bl in range(0, 60, 9):
                for bh in range(0, 60, 9):
                    for fb in (0, 16, 50):
                        act, low, target = short_side_decision(sl, sh, bl, bh, fb, 8)
                        if sl > bl and sh > bh:
                            assert not act
                        if act:
                            assert target > 0
                            short = sl > bl or sh > bh
                            if short:  # the short side is the one opened
                                assert low == (sl > bl)
