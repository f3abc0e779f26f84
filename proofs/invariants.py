"""Inductive invariants: for each operation and each invariant,
(layout facts and every invariant and the operation's precondition)
implies the invariant afterwards.

Each is registered with ``tautology="none"``: no conjunct of an invariant
may hold with no hypotheses at all (the runner checks it), so every
conjunct is something an operation could get wrong.

The state is a chain of 2, 3 or 4 pools (``up, [f1, [f2,]] down``) with
every frontier, count, ``epp``, ``num_pages``, ``min_page``, ``lazy`` flag
and ``total`` symbolic: ``inv.OP.INV`` is the 4-pool obligation,
``inv.OP.INV.n3`` and ``.n2`` the shorter chains (floats-only operations
have no 2-pool form).  An operation on "a float" covers every float (so both walk
directions through a neighbouring float), an operation on "an END" both
ENDs, and ``make_room``/``compact_holes`` both sides: each variant is a
disjunct, and each must be satisfiable on its own (the vacuity witnesses).
"""

from kvarena.spec import arith

from . import abstract as A
from .core import Built, Fresh, add

# The slowest inv.* query (compact_holes.conservation, 4 pools) takes about
# 20 s on an idle 2-core machine since the byte equation counts pages: a
# 60 s limit keeps a loaded CI machine from turning it into "unknown".
INV_TIMEOUT_S = 60.0


def _variants(op, s, t, f):
    N = s.n
    FLOATS = tuple(range(1, N - 1))
    ENDS = (0, N - 1)
    n, k, mb = f.int("n"), f.int("k"), f.int("min_bytes")
    side = f.bool("side_is_low")
    if op == "alloc_up":
        return [A.rel_alloc_end(s, t, 0, n)]
    if op == "alloc_down":
        return [A.rel_alloc_end(s, t, N - 1, n)]
    float_alloc = {
        "alloc_float_holes": A.rel_alloc_float_holes,
        "alloc_float_parked": A.rel_alloc_float_parked,
        "alloc_float_extend_low": A.rel_alloc_float_extend_low,
        "alloc_float_extend_high": A.rel_alloc_float_extend_high,
    }
    if op in float_alloc:
        return [float_alloc[op](s, t, i, n) for i in FLOATS]
    end_free = {"free_eager": A.rel_free_eager, "free_lazy": A.rel_free_lazy}
    if op in end_free:
        return [end_free[op](s, t, i, k) for i in ENDS]
    # a transition that branches inside (parks, or leaves a transparent float
    # alone) is split on that branch: one query each, which z3 finds far easier
    if op == "free_float":
        return [
            A.and_(c, A.rel_free_float(s, t, i, k))
            for i in FLOATS
            for c in (s.bands[i].live == k, s.bands[i].live != k)
        ]
    if op == "flush":
        return [A.rel_flush_end(s, t, i) for i in ENDS] + [
            A.and_(c, A.rel_flush_float(s, t, i)) for i in FLOATS for c in (A.opaque(s, i), A.parked(s, i))
        ]
    make_room = {"make_room_boundary": A.rel_make_room_boundary, "make_room_leapfrog": A.rel_make_room_leapfrog}
    if op in make_room:
        return [A.and_(side == v, make_room[op](s, t, i, side, mb)) for i in FLOATS for v in (True, False)]
    if op == "compact_holes":
        return [
            A.and_(side == v, c, A.rel_compact_holes(s, t, i, side))
            for i in FLOATS
            for v in (True, False)
            for c in (A.opaque(s, i), A.parked(s, i))
        ]
    raise KeyError(op)


OPERATIONS = {
    "alloc_up": "alloc on the up END (lazy holes first, then extend at wm)",
    "alloc_down": "alloc on the down END (lazy holes first, then extend below its low frontier)",
    "alloc_float_holes": "alloc on an opaque float that its holes cover",
    "alloc_float_parked": "alloc on a parked float: a span at park_start of its region",
    "alloc_float_extend_low": "alloc on a float that extends its low frontier",
    "alloc_float_extend_high": "alloc on a float that extends its high frontier",
    "free_eager": "free on an eager END (frontier retreats by k, survivors compact)",
    "free_lazy": "free on a lazy END (k holes, nothing moves)",
    "free_float": "free on a float (holes; parks when no live page is left)",
    "flush": "flush of either END (any max_moves) or a float (refit)",
    "make_room_boundary": "make_room with need < live (edge pages move) on either side",
    "make_room_leapfrog": "make_room with need >= live (pack against the far edge)",
    "compact_holes": "compact_holes toward either side",
}

STATEMENTS = {
    "order": "frontier order along the chain; opaque bands disjoint and within [sink, total]",
    "conservation": "span = live + holes, eager END hole-free, live <= ids, and verify()'s byte equation: "
    "sink + per opaque band (gap since the previous high, clamped at 0, + (live+holes)*epp) "
    "+ tail clamped at 0 = total",
    "grid": "page-aligned spans on each grid, no page below min_page, ENDs anchored, empty float parked",
}


END_ONLY = ("alloc_up", "alloc_down", "free_eager", "free_lazy", "flush")


def _make(op, inv, N):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=N)
        t = A.symbolic_state(f, "t_", like=s)
        vs = _variants(op, s, t, f)
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s)]
        return Built(hyps, A.INVARIANTS[inv](t), cases=[[v] for v in vs], hints=A.layout_hint(s))

    return build


for _n in (4, 3, 2):
    for _op, _what in OPERATIONS.items():
        if _n == 2 and _op not in END_ONLY:
            continue
        for _inv, _st in STATEMENTS.items():
            add(
                f"inv.{_op}.{_inv}" + ("" if _n == 4 else f".n{_n}"),
                "invariants",
                f"{_n} pools: {_what} preserves {_inv}: {_st}",
                _make(_op, _inv, _n),
                timeout_s=INV_TIMEOUT_S,
                tautology="none",
            )


# ------------------------------------------- conservation can fail, and where


def _drift_build(n, single):
    """Order and grid hold, counts are non-negative; ``single``: exactly one
    opaque band drifts (span != live + holes) => the byte equation fails.
    Otherwise (refuted): the byte equation alone implies every band's
    span = live + holes."""

    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        base = [A.layout_ok(s, first_pages=False), A.inv_order(s), A.inv_grid(s)]
        for b in s.bands:
            base += [b.live >= 0, b.holes >= 0]
        drift = [b.hi - b.lo != b.live + b.holes for b in s.bands]
        if not single:
            goal = A.and_(*[A.not_(d) for d in drift])
            return Built(base + [A.cons_bytes(s)], goal, hints=A.layout_hint(s))
        cases = []
        for i in range(n):
            cases.append([A.opaque(s, i), drift[i]] + [A.not_(d) for j, d in enumerate(drift) if j != i])
        return Built(base, A.not_(A.cons_bytes(s)), cases=cases, hints=A.layout_hint(s))

    return build


for _n in (4, 3, 2):
    _sfx = "" if _n == 4 else f".n{_n}"
    add(
        f"inv.conservation.single_drift_detected{_sfx}",
        "invariants",
        f"{_n} pools: order and grid hold and exactly one opaque band's span != live + holes "
        "=> verify()'s byte equation fails (conservation can fail, for each band)",
        _drift_build(_n, True),
        timeout_s=INV_TIMEOUT_S,
    )
add(
    "inv.conservation.bytes_localize_drift",
    "invariants",
    "REFUTED (finding): 2 pools, with order and grid, verify()'s byte equation implies span = live + holes "
    "for both ENDs (two drifts that cancel in bytes pass it)",
    _drift_build(2, False),
    timeout_s=30.0,
    expect="counterexample",
)


# ------------------------------------------------------------- base case


def _init_build(n):
    """``chain.boot`` (what ``Arena.__init__`` leaves) on any valid layout
    satisfies each invariant: one query per invariant."""

    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        boot = A.boot_state(s)
        goals = [A.INVARIANTS[k](boot) for k in STATEMENTS]
        return Built([A.layout_ok(s)], None, cases=[[]] * len(goals), case_goals=goals, hints=A.layout_hint(s))

    return build


for _n in (4, 3, 2):
    add(
        f"inv.init.n{_n}",
        "invariants",
        f"{_n} pools, symbolic layout: the boot state (chain.boot: up END empty at min_page, floats parked, "
        "down END empty at num_pages) satisfies order, conservation and grid: the induction's base case",
        _init_build(_n),
        timeout_s=30.0,
    )


# ------------------------------------------------------------ dead terms


def _dead_build(n, term):
    """A clamp or cap the spec keeps that never binds on a reachable state
    (every invariant holds there)."""

    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s)]
        if term == "golden_clamp":  # golden_gap's max(0, .) argument is never negative
            up, down = s.pools[0], s.pools[-1]
            goal = (s.bands[-1].lo - 1 + 1) * down.epp - s.bands[0].hi * up.epp >= 0
            return Built(hyps, goal, hints=A.layout_hint(s), lemmas="floor")
        # end_available's min_(gap // epp, room): the gap never holds more pages than the room
        cases, goals = [], []
        for i in (0, n - 1):
            gap, e, room = A.gap(s, i), s.pools[i].epp, A.end_room(s, i)
            # the floor's Galois connection at this point (capacity.lemma.fdiv_galois's twin)
            cases.append([A.implies(e > 0, (arith.fdiv(gap, e) <= room) == (gap < room * e + e))])
            goals.append(arith.fdiv(gap, e) <= room)
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s), lemmas="floor")

    return build


for _n in (4, 3, 2):
    add(
        f"dead.golden_clamp.n{_n}",
        "invariants",
        f"{_n} pools: on every state satisfying the invariants, golden_gap's argument (wm_down+1)*epp_down - "
        "wm_up*epp_up is >= 0, so its max(0, .) never binds (kept: it is the closed form's definition)",
        _dead_build(_n, "golden_clamp"),
        timeout_s=30.0,
        tautology="none",
    )
    add(
        f"dead.end_room_cap.n{_n}",
        "invariants",
        f"{_n} pools: on every state satisfying the invariants, an END's gap // epp <= its room on its grid, "
        "so end_available's min(., room) never binds (kept: it is the ids' bound, which the bytes imply)",
        _dead_build(_n, "end_room_cap"),
        timeout_s=30.0,
        tautology="none",
    )
