"""The scalar capacity helpers (``impl/capacity.py`` and their ``spec`` twins)
against independent oracles: pages counted one by one on a small grid, and
the demand-vector policy's decision table (docs/design.md §4, step 7) written
case by case.  They pin corners the arena never reaches on its own (an id
room below the gap's pages, a region edge past the grid) and the policy's
one-byte edges; docs/results/suite-strength.md "Mutation score" lists what they kill."""

import itertools

import pytest

from kvarena.impl import capacity
from kvarena.spec import arith, policy

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

SPEC_IMPL = pytest.mark.parametrize("mod", [arith, capacity], ids=["spec", "impl"])


@SPEC_IMPL
def test_end_available_counts_whole_pages_then_caps_by_ids(mod):
    for gap, epp, room, holes in itertools.product(range(12), (1, 2, 3, 5), range(6), range(3)):
        ext = 0
        while ext < room and (ext + 1) * epp <= gap:
            ext += 1
        assert mod.end_available(gap, epp, room, holes) == ext + holes, (gap, epp, room, holes)


@SPEC_IMPL
def test_float_region_is_the_pages_strictly_between_the_frontiers(mod):
    for below, above, epp, lowest, n in itertools.product(range(10), range(14), (1, 2, 3), range(4), range(6)):
        inside = [p for p in range(lowest, n) if below <= p * epp and (p + 1) * epp <= above]
        lo, hi = mod.float_region(below, above, epp, lowest, n)
        if inside:
            assert (lo, hi) == (inside[0], inside[-1] + 1), (below, above, epp, lowest, n)
        else:
            assert lo >= hi, (below, above, epp, lowest, n)
        # each edge is its own bound: the frontier's page or the grid's limit, whichever binds
        assert lo == max(lowest, next(p for p in itertools.count() if p * epp >= below))
        assert hi == min(n, max(p for p in range(above + 1) if p * epp <= above))


@SPEC_IMPL
def test_float_available_counts_the_free_pages(mod):
    for lo, hi in itertools.product(range(5), range(7)):
        for room in range(6):
            want = min(room, len(range(lo, hi)))
            assert mod.float_available(True, lo, hi, 0, 0, 0, room) == want, (lo, hi, room)
        if lo > hi:
            continue
        for lo_wm, hi_wm in itertools.combinations_with_replacement(range(lo, hi + 1), 2):
            below, above = len(range(lo, lo_wm)), len(range(hi_wm, hi))
            for holes, room in itertools.product(range(3), range(7)):
                want = min(room, max(below, above) + holes)
                got = mod.float_available(False, lo, hi, lo_wm, hi_wm, holes, room)
                assert got == want, (lo, hi, lo_wm, hi_wm, holes, room)


@SPEC_IMPL
def test_float_available_keeps_its_post_on_any_span(mod):
    # the contract's ``0 <= available <= index_room`` for every input its
    # precondition allows, a span sticking out of its region included
    for args in itertools.product((False, True), range(3), range(3), range(-1, 4), range(-1, 4), range(2), range(3)):
        assert 0 <= mod.float_available(*args) <= args[-1], args


# ----------------------------------------------- the demand-vector policy


def _table(sides_low, sides_high, band_low, band_high, float_bytes, slack):
    """docs/design.md §4, step 7, one row at a time: ``(act, side_is_low,
    target)``, with side and target meaningful only when ``act``."""
    short = {"low": sides_low > band_low, "high": sides_high > band_high}
    need = {"low": sides_low, "high": sides_high}
    spare = {"low": band_low - sides_low, "high": band_high - sides_high}
    band = {"low": band_low, "high": band_high}
    if short["low"] and short["high"]:
        return False, None, None
    for side, far in (("low", "high"), ("high", "low")):
        if short[side]:
            uncovered = float_bytes - spare[far] if float_bytes > spare[far] else 0
            target = need[side] + uncovered + slack
            return (True, side == "low", target) if target > band[side] else (False, None, None)
    side = "low" if spare["low"] >= spare["high"] else "high"
    if float_bytes > spare[side]:
        return True, side == "low", need[side] + float_bytes + slack
    return False, None, None


@pytest.mark.parametrize("fn", [policy.short_side_decision, capacity.short_side_decision], ids=["spec", "impl"])
def test_short_side_decision_is_the_table(fn):
    for args in itertools.product(range(4), range(4), range(4), range(4), range(4), range(3)):
        act, side_is_low, target = fn(*args)
        want = _table(*args)
        assert act is want[0], args
        if act:
            assert (side_is_low, target) == want[1:], args


@pytest.mark.parametrize("fn", [policy.short_side_decision, capacity.short_side_decision], ids=["spec", "impl"])
def test_short_side_decision_one_byte_edges(fn):
    # low short by 1; far surplus exactly 0, then 1: the float's 3 bytes are uncovered, then 2 of them
    assert fn(5, 4, 4, 4, 3, 1) == (True, True, 9)
    assert fn(5, 4, 4, 5, 3, 1) == (True, True, 8)
    # nobody short; the float needs exactly the larger surplus (no move), then one byte more
    assert fn(1, 0, 3, 1, 2, 0)[0] is False
    assert fn(1, 0, 3, 1, 3, 0) == (True, True, 4)
    # the high side has the larger surplus: open high, target from the high demand
    assert fn(2, 1, 3, 4, 4, 1) == (True, False, 6)
