"""The chain planner (``spec.planner``): completeness, soundness, movement, order.

One source: ``inputs`` (``chain.planner_inputs``) gathers the planner's
integers as ``Arena.plan_floats`` does, every obligation calls the spec's
own ``plan_chain`` and ``move_rank`` on z3 terms, and ``planned``
(``transitions.planned``) is the state the arena leaves, which
``Arena.plan_floats`` asserts: a float the plan moves is packed at its
start with no hole; every other band is as it was.
Capacity after the plan is ``abstract.available``, the same ``arith``
calls as ``Arena.available_pages``.

Chains of 3 and 4 pools (1 and 2 floats), every size symbolic:

- ``planner.complete``: a packed placement of the floats in which pool
  ``j`` has its demand => the plan is feasible (no false OOM);
- ``planner.sound``: a feasible plan leaves every invariant holding and
  every demanded pool with its demand, for any demand vector;
- ``planner.stays``: a demand that already fits (a single pool, or a
  vector that fits jointly in place) moves nothing; hence no ping-pong;
- the movement bound: a float the plan does not move keeps its band (by
  ``planned``'s construction, so not an obligation), and a repack
  (``moves.pack_plan``) moves exactly the live pages outside its target,
  so pages moved <= live pages of the movers (``tests/spec/test_planner.py``);
- ``planner.order_safe``: repacking in ``move_rank`` order never writes over
  a float that has not moved yet.
"""

import z3

from kvarena.spec import arith
from kvarena.spec import transitions as T
from kvarena.spec.chain import planner_inputs
from kvarena.spec.planner import move_rank, plan_chain

from . import abstract as A
from .core import Built, Fresh, add

inputs = planner_inputs  # (up, floats, down) for demand d: the spec's, as Arena.plan_floats gathers them
planned = T.planned  # the chain after the repacks: the spec's, which Arena.plan_floats asserts it reaches


def _setup(n):
    """A symbolic state satisfying the invariants, and a demand per pool.

    The hypotheses are the invariants without conservation's byte equation
    (``inv_grid``, ``inv_order`` and the per-band conjuncts of ``inv_cons``),
    which follows from them: fewer hypotheses, a stronger statement, and z3
    finishes sooner.
    """
    f = Fresh()
    s = A.symbolic_state(f, "s_", n=n)
    d = [f.int(f"demand{j}") for j in range(n)]
    counts = []
    for p, b in zip(s.pools, s.bands):
        counts += [b.live >= 0, b.holes >= 0, b.hi - b.lo == b.live + b.holes, b.live <= p.num_pages - p.min_page]
        if p.grow != "float":
            counts.append(A.implies(A.not_(p.lazy), b.holes == 0))
    hyps = [A.layout_ok(s, first_pages=False), A.inv_grid(s), A.inv_order(s)] + counts + [dj >= 0 for dj in d]
    return f, s, d, hyps


def _cases(s, plan, with_moves=True):
    """One query per shape of the plan: each float parked, or opaque and
    then (with ``with_moves``) repacked, staying with its room below, or
    staying with its room above.  z3 proves each shape in seconds where the
    whole disjunction times out."""
    shapes = [[]]
    for k, i in enumerate(range(1, s.n - 1)):
        live = s.bands[i].live
        options = [[live == 0]]
        if with_moves:
            options += [
                [live > 0, plan.moves[k]],
                [live > 0, z3.Not(plan.moves[k]), plan.room_below[k]],
                [live > 0, z3.Not(plan.moves[k]), z3.Not(plan.room_below[k])],
            ]
        else:
            options += [[live > 0]]
        shapes = [sh + o for sh in shapes for o in options]
    return shapes


def _single(d, j):
    """Only pool ``j`` is demanded (the arena ladder's demand vector)."""
    return [dk == 0 for k, dk in enumerate(d) if k != j]


def _placement(f, s):
    """A packed placement of the floats: each opaque float at a symbolic
    start with no hole; parked floats and the ENDs as they are.  Its
    constraints are the grid and order invariants on the placed state (its
    counts hold by construction; conservation's byte equation follows)."""
    bands = list(s.bands)
    for i in range(1, s.n - 1):
        b = s.bands[i]
        x = f.int(f"place{i}")
        bands[i] = A.BandState(
            arith.ite(b.live > 0, x, b.lo),
            arith.ite(b.live > 0, x + b.live, b.hi),
            b.live,
            arith.ite(b.live > 0, 0, b.holes),
        )
    w = A.AState(s.total, s.sink, s.pools, bands)
    return w, [A.inv_grid(w), A.inv_order(w)]  # spans and counts hold by construction


# ------------------------------------------------------------ completeness


def _complete(n, j):
    def build():
        f, s, d, hyps = _setup(n)
        w, placed = _placement(f, s)
        plan = plan_chain(*inputs(s, d))
        pre = _single(d, j) + placed + [A.available(w, j) >= d[j]]
        cases = _cases(s, plan, with_moves=False)
        if 0 < j < n - 1:  # a float's demand: split on the side of its larger gap in the placement
            lo, hi = A.region(w, j)  # (only when it is opaque: a parked float has no side)
            low_larger = w.bands[j].lo - lo >= hi - w.bands[j].hi
            opaque = s.bands[j].live > 0
            cases = [
                c + [side]
                for c in cases
                for side in (low_larger, z3.Not(low_larger))
                if any(z3.eq(x, opaque) for x in c)
            ] + [c for c in cases if not any(z3.eq(x, opaque) for x in c)]
        return Built(
            hyps + pre,
            plan.feasible,
            cases=cases,
            witnesses=[[arith.or_(*plan.moves)], [A.available(s, j) < d[j]]],
            hints=A.layout_hint(s),
            lemmas="floor",
        )

    return build


for _n in (3, 4):
    for _j in range(_n):
        role = "up END" if _j == 0 else ("down END" if _j == _n - 1 else f"float {_j}")
        add(
            f"planner.complete.n{_n}.pool{_j}",
            "planner",
            f"{_n} pools, demand on the {role}: some packed placement of the floats meets it => the plan is "
            "feasible (no false OOM)",
            _complete(_n, _j),
            timeout_s=90.0 * (_n - 2),
        )


# --------------------------------------------------------------- soundness


def _sound(n, j=None):
    """A feasible plan leaves every invariant holding (``j`` None), or gives pool ``j`` its demand."""

    def build():
        _f, s, d, hyps = _setup(n)
        plan = plan_chain(*inputs(s, d))
        t = planned(s, plan)
        return Built(
            hyps + [plan.feasible],
            A.inv_all(t) if j is None else A.available(t, j) >= d[j],
            cases=_cases(s, plan),
            witnesses=[[arith.or_(*plan.moves)] + ([] if j is None else [d[j] > 0])],
            hints=A.layout_hint(s),
            lemmas=True,
        )

    return build


for _n in (3, 4):
    add(
        f"planner.sound.inv.n{_n}",
        "planner",
        f"{_n} pools, any demand vector: a feasible plan leaves every invariant holding (grid, conservation, order)",
        _sound(_n),
        timeout_s=30.0 * (_n - 2),
        tautology="none",
    )
    for _j in range(_n):
        add(
            f"planner.sound.meets.n{_n}.pool{_j}",
            "planner",
            f"{_n} pools, any demand vector: a feasible plan gives pool {_j} its demand "
            "(available_pages >= demand afterwards)",
            _sound(_n, _j),
            timeout_s=30.0 * (_n - 2),
        )


# -------------------------------------------------- movement and ping-pong


def _stays(n, j):
    def build():
        _f, s, d, hyps = _setup(n)
        plan = plan_chain(*inputs(s, d))
        pre = _single(d, j) + [A.available(s, j) >= d[j]]
        return Built(
            hyps + pre,
            z3.And(*[z3.Not(m) for m in plan.moves]),
            cases=_cases(s, plan, with_moves=False),
            witnesses=[[d[j] > 0]],
            hints=A.layout_hint(s),
            lemmas=True,
        )

    return build


for _n in (3, 4):
    for _j in range(_n):
        add(
            f"planner.stays.n{_n}.pool{_j}",
            "planner",
            f"{_n} pools, demand on pool {_j} that already fits (available_pages >= demand) => no float moves "
            "(0 pages moved; two demands that both fit never ping-pong)",
            _stays(_n, _j),
            timeout_s=30.0 * (_n - 2),
        )


# ------------------------------------------------------------------ order


def _order_safe():
    _f, s, d, hyps = _setup(4)
    up, floats, down = inputs(s, d)
    plan = plan_chain(up, floats, down)
    cases, goals = [], []
    for a, b in ((0, 1), (1, 0)):
        i, j = a + 1, b + 1  # chain indices
        first = move_rank(floats, plan, a) < move_rank(floats, plan, b)
        ei, ej = s.pools[i].epp, s.pools[j].epp
        lo_t, hi_t = plan.starts[a] * ei, (plan.starts[a] + s.bands[i].live) * ei
        lo_j, hi_j = s.bands[j].lo * ej, s.bands[j].hi * ej
        # float a's repack runs while b still sits at its old span: b never
        # moves, or moves later (one query each)
        for b_unmoved in ([z3.Not(plan.moves[b])], [plan.moves[b], first]):
            cases.append([plan.moves[a], s.bands[j].live > 0] + b_unmoved)
            goals.append(z3.Or(hi_t <= lo_j, hi_j <= lo_t))
    return Built(
        hyps,
        None,
        cases=cases,
        case_goals=goals,
        witnesses=[[plan.moves[0], plan.moves[1]]],
        hints=A.layout_hint(s),
        lemmas=True,
    )


add(
    "planner.order_safe",
    "planner",
    "4 pools: repacking in move_rank order, no float's target overlaps a float that has not moved yet",
    _order_safe,
    timeout_s=60.0,
)
