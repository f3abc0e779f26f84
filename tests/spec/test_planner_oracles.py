"""``spec/planner.py`` against a brute-force oracle on small chains: every
placement of the blocks is enumerated, so feasibility, which float stays, and
where a repacked float lands (the feasible start nearest its old one) are
checked without the planner's closed-form passes.  Fast enough for the
mutation selection (docs/results/suite-strength.md "Mutation score")."""

import random
import types

import pytest

from kvarena.spec import planner
from kvarena.spec.planner import End, Float

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def _fits_above(floats, i, taken, ceiling):
    """Can floats ``i..`` be placed, each block on its own grid, in chain
    order, above byte ``taken`` and below byte ``ceiling``?"""
    if i == len(floats):
        return taken <= ceiling
    f = floats[i]
    size = f.live + f.demand
    if size == 0:
        return _fits_above(floats, i + 1, taken, ceiling)
    return any(
        _fits_above(floats, i + 1, (s + size) * f.epp, ceiling)
        for s in range(f.min_page, f.num_pages - size + 1)
        if s * f.epp >= taken
    )


def _oracle(up, floats, down):
    """``(feasible, moves, starts, room_below)`` by enumeration."""
    floor = up.frontier + up.ext * up.epp
    ceiling = down.frontier - down.ext * down.epp
    feasible = (
        up.ext <= up.room
        and down.ext <= down.room
        and all(f.demand <= f.index_room for f in floats)
        and _fits_above(floats, 0, floor, ceiling)
    )
    moves, starts, below = [], [], []
    taken = floor
    for i, f in enumerate(floats):
        if not feasible:
            break

        def ok(first, last, i=i, f=f, taken=taken):  # this float at [first, last), the rest above it
            return (
                first >= f.min_page
                and first * f.epp >= taken
                and last <= f.num_pages
                and _fits_above(floats, i + 1, last * f.epp, ceiling)
            )

        need = max(0, f.demand - f.holes)
        if f.live == 0:  # parked: never moves; a demanded one reserves its room lowest
            if f.demand:
                s = next(s for s in range(f.min_page, f.num_pages) if s * f.epp >= taken)
                taken = (s + f.demand) * f.epp
            moves.append(False), starts.append(f.lo), below.append(False)
        elif ok(f.lo - need, f.hi):
            moves.append(False), starts.append(f.lo), below.append(True)
            taken = f.hi * f.epp
        elif ok(f.lo, f.hi + need):
            moves.append(False), starts.append(f.lo), below.append(False)
            taken = (f.hi + need) * f.epp
        else:
            size = f.live + f.demand
            s = min((s for s in range(f.num_pages) if ok(s, s + size)), key=lambda s: abs(s - f.lo))
            moves.append(True), starts.append(s), below.append(False)
            taken = (s + size) * f.epp
    return feasible, moves, starts, below


def _chain(rng):
    """A small arena-like state: the ENDs' frontiers and the floats' spans in
    chain order, disjoint in bytes."""
    total = rng.randint(6, 30)
    up_front = rng.randint(0, total // 3)
    pos, floats = up_front, []
    for _ in range(rng.choice((0, 1, 1, 2, 2, 2, 3))):
        epp = rng.choice((1, 2, 3))
        n, min_page = total // epp, rng.randint(0, 2)
        live, holes = rng.choice((0, 1, 1, 2, 3)), rng.choice((0, 0, 1, 2))
        demand = rng.choice((0, 1, 2, 3))
        if live == 0:
            lo = hi = n
            holes = 0
        else:
            lo = max(-(-pos // epp), min_page) + rng.randint(0, 2)
            hi = lo + live + holes
            if hi > n:
                return None
            pos = hi * epp
        floats.append(
            Float(epp, min_page, n, lo, hi, live, holes, demand, rng.choice((demand, n - min_page - live, 0, 1)))
        )
    if pos > total:
        return None
    up = End(up_front, rng.choice((1, 2, 3)), rng.randint(0, 3), rng.randint(0, 4))
    down = End(rng.randint(pos, total), rng.choice((1, 2, 3)), rng.randint(0, 3), rng.randint(0, 4))
    return up, floats, down


def _chains(n, seed):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        c = _chain(rng)
        if c is not None:
            out.append(c)
    return out


CHAINS = _chains(2500, 11)


def test_plan_chain_is_the_enumerated_plan():
    feasible_seen = moved_seen = 0
    for up, floats, down in CHAINS:
        plan = planner.plan_chain(up, floats, down)
        feasible, moves, starts, below = _oracle(up, floats, down)
        assert plan.feasible is feasible, (up, floats, down)
        if not feasible:
            assert not any(plan.moves) and list(plan.starts) == [f.lo for f in floats], (up, floats, down)
            continue
        feasible_seen += 1
        moved_seen += any(moves)
        assert [bool(m) for m in plan.moves] == moves, (up, floats, down)
        assert list(plan.starts) == starts, (up, floats, down)
        assert [bool(b) for b in plan.room_below] == below, (up, floats, down)
    # the sample reaches both verdicts and real repacks
    assert feasible_seen > 300 and moved_seen > 100 and len(CHAINS) - feasible_seen > 300


def _order_is_safe(floats, plan, order):
    """Repack in ``order``: no float lands on bytes a float that has not
    moved yet still holds."""
    spans = {i: (f.lo * f.epp, f.hi * f.epp) for i, f in enumerate(floats) if f.live}
    for i in order:
        f = floats[i]
        dst = (plan.starts[i] * f.epp, (plan.starts[i] + f.live) * f.epp)
        for j, (a, b) in spans.items():
            if j != i and dst[0] < b and a < dst[1]:
                return False
        spans[i] = dst
    return True


def test_move_order_repacks_without_overwriting():
    multi = naive_unsafe = 0
    for up, floats, down in _chains(20000, 13):
        plan = planner.plan_chain(up, floats, down)
        order = planner.move_order(floats, plan)
        assert sorted(order) == [i for i, m in enumerate(plan.moves) if m]
        if len(order) > 1:
            multi += 1
            assert _order_is_safe(floats, plan, order), (up, floats, down, order)
            naive_unsafe += not (
                _order_is_safe(floats, plan, sorted(order))
                and _order_is_safe(floats, plan, sorted(order, reverse=True))
            )
    # the sample holds repacks where plain chain order, either way, would overwrite
    assert multi > 80 and naive_unsafe > 20


def test_move_order_up_movers_first_highest_first():
    # three floats that all move: 0 and 2 up, 1 down.  Up-movers go highest
    # first (2, then 0), then the rest lowest first.
    P = types.SimpleNamespace(moves=[True, True, True], starts=[5, 8, 30])  # a plan

    fl = [Float(1, 0, 40, lo, lo + 1, 1, 0, 0, 5) for lo in (3, 10, 20)]
    assert planner.move_order(fl, P) == [2, 0, 1]
    P.starts = [1, 12, 18]
    assert planner.move_order(fl, P) == [1, 0, 2]
