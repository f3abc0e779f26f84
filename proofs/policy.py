"""The demand-vector policy (``spec.policy.short_side_decision``) and make_room.

``decision`` gathers the integers exactly as ``Arena.open_short_side`` does
and calls the spec's ``short_side_decision`` on z3 terms.  The effect of the
resulting ``make_room`` is the abstract relation of ``abstract`` (boundary
or leapfrog).

The far side's surplus, stated precisely:

- REFUTED: "a far side that is not short before the move is not short
  after it" (``policy.far_side_kept``) -- the policy reserves nothing for the
  far END's demand, and a leapfrog packs the float against the far edge;
- PROVED: in the boundary case the far band loses at most ``need`` pages
  (``policy.far_side_loss_boundary``), and a leapfrog leaves the far band
  less than one float page (``policy.far_side_leapfrog_takes_all``).
"""

import z3

from kvarena.spec import arith
from kvarena.spec import transitions as T
from kvarena.spec.chain import demand_skipped, short_side_inputs
from kvarena.spec.policy import short_side_decision

from . import abstract as A
from .core import Built, Fresh, add


def decision(s, i, d):
    """(skip, act, side_is_low, target, inputs) of ``open_short_side(float i, d)``:
    the spec's own ``chain.demand_skipped`` and ``chain.short_side_inputs``,
    then ``short_side_decision``, as ``Arena.open_short_side`` calls them."""
    skip = demand_skipped(s, i, d)
    inputs = short_side_inputs(s, i, d)
    act, side_is_low, target = short_side_decision(**inputs)
    return skip, act, side_is_low, target, inputs


def _setup(n=3, floats=(1,)):
    f = Fresh()
    s = A.symbolic_state(f, "s_", n=n)
    t = A.symbolic_state(f, "t_", like=s)
    d = [f.int(f"demand{j}") for j in range(n)]
    hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s)] + [dj >= 0 for dj in d]
    return f, s, t, d, hyps


def _moves(s, t, i, side, target):
    """The two ways make_room(float i, side, target) can move pages."""
    return [A.rel_make_room_boundary(s, t, i, side, target), A.rel_make_room_leapfrog(s, t, i, side, target)]


# ------------------------------------------------------- pure decision facts


def _pure(goal_fn):
    def build():
        f = Fresh()
        sl, sh, bl, bh, fb, sk = (
            f.int(x) for x in ("sides_low", "sides_high", "band_low", "band_high", "float_bytes", "slack")
        )
        hyps = [sl >= 0, sh >= 0, bl >= 0, bh >= 0, fb >= 0, sk >= 0]
        act, low, target = short_side_decision(sl, sh, bl, bh, fb, sk)
        goal, extra = goal_fn(sl, sh, bl, bh, fb, sk, act, low, target)
        return Built(hyps + extra, goal)

    return build


add(
    "policy.pure.no_move_both_short",
    "policy",
    "short_side_decision: both sides short (sides > band on each) => no move",
    _pure(lambda sl, sh, bl, bh, fb, sk, act, low, t: (z3.Not(act), [sl > bl, sh > bh])),
    timeout_s=10.0,
)
add(
    "policy.pure.target_beyond_band",
    "policy",
    "short_side_decision: when it acts, the target exceeds the band on the chosen side (make_room works)",
    _pure(lambda sl, sh, bl, bh, fb, sk, act, low, t: (t > z3.If(low, bl, bh), [act])),
    timeout_s=10.0,
)
add(
    "policy.pure.opens_the_short_side",
    "policy",
    "short_side_decision: exactly one side short => it acts iff target > that band, and opens that side",
    _pure(
        lambda sl, sh, bl, bh, fb, sk, act, low, t: (
            z3.And(low == (sl > bl), act == (t > z3.If(sl > bl, bl, bh))),
            [(sl > bl) != (sh > bh)],
        )
    ),
    timeout_s=10.0,
)
add(
    "policy.pure.target_covers_demand",
    "policy",
    "short_side_decision: the target covers the opened side's END demand plus slack",
    _pure(lambda sl, sh, bl, bh, fb, sk, act, low, t: (t >= z3.If(low, sl, sh) + sk, [act])),
    timeout_s=10.0,
)


# ------------------------------------------------------- state-level facts


def _no_move_both_short():
    _f, s, _t, d, hyps = _setup(n=4)
    cases, goals = [], []
    for i in (1, 2):
        skip, act, _low, _target, x = decision(s, i, d)
        cases.append([z3.Not(skip), x["sides_low"] > x["band_low"], x["sides_high"] > x["band_high"]])
        goals.append(z3.Not(act))
    return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))


add(
    "policy.no_move_both_short",
    "policy",
    "open_short_side on either float of a 4-pool chain: both sides short => no move (zero-sum)",
    _no_move_both_short,
    timeout_s=30.0,
)


def _fits_after(n):
    def build():
        _f, s, t, d, hyps = _setup(n=n)
        i = 1 if n == 3 else 2  # n = 4: the float NOT adjacent to the up END
        skip, act, low, target, x = decision(s, i, d)
        low_short = x["sides_low"] > x["band_low"]
        high_short = x["sides_high"] > x["band_high"]
        pre = [z3.Not(skip), act, low_short != high_short]
        cases, goals = [], []
        for e, short in ((0, low_short), (n - 1, high_short)):
            for mv in _moves(s, t, i, low, target):
                cases.append(pre + [short, mv])
                goals.append(A.available(t, e) >= d[e])
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))

    return build


add(
    "policy.short_side_fits_after.n3",
    "policy",
    "3 pools: one side short, policy acts and make_room moves (boundary or leapfrog) => the short END's "
    "demand fits (available_pages >= demand) afterwards",
    _fits_after(3),
    timeout_s=60.0,
)
add(
    "policy.short_side_fits_after.n4_far_float",
    "policy",
    "REFUTED (finding): 4 pools, policy acts on the float not adjacent to the short END => that END's demand "
    "fits afterwards",
    _fits_after(4),
    timeout_s=60.0,
    expect="counterexample",
)


def _float_fits_after():
    _f, s, t, d, hyps = _setup(n=3)
    i = 1
    skip, act, low, target, x = decision(s, i, d)
    pre = [z3.Not(skip), act, x["sides_low"] <= x["band_low"], x["sides_high"] <= x["band_high"]]
    cases = [pre + [mv] for mv in _moves(s, t, i, low, target)]
    return Built(hyps, A.available(t, i) >= d[i], cases=cases, hints=A.layout_hint(s))


add(
    "policy.float_short_fits_after",
    "policy",
    "REFUTED (finding): 3 pools, only the float short, policy acts and make_room moves => the float's "
    "demand fits afterwards",
    _float_fits_after,
    timeout_s=60.0,
    expect="counterexample",
)


def _cost_bound():
    """The pages moved are the spec's ``transitions.make_room_moved``, the
    count ``Arena.make_room`` asserts its moves equal; ``spared`` is the
    page-level fact it reads (pages already in place, or holes among the
    cleared ones), bounded by the guard the arena also asserts."""
    f, s, _t, d, hyps = _setup(n=3)
    i = 1
    a, p = s.bands[i], s.pools[i]
    skip, act, low, target, x = decision(s, i, d)
    _band_side, _feasible, need = A.make_room_terms(s, i, low, target)
    spared = f.int("spared")
    moved = T.make_room_moved(s, i, low, target, spared)
    pre = [z3.Not(skip), act, A.make_room_moves(s, i, low, target), T.make_room_moved_ok(s, i, low, target, spared)]
    short_by = z3.If(low, x["sides_low"] - x["band_low"], x["sides_high"] - x["band_high"])
    one_short = (x["sides_low"] > x["band_low"]) != (x["sides_high"] > x["band_high"])
    goal = z3.And(
        need >= 1,
        moved >= 0,
        moved <= arith.min_(a.live, need),
        # the cost is driven by the deficit: need pages cover at most the
        # short side's deficit, the float's uncovered need and the slack
        z3.Implies(one_short, (need - 1) * p.epp < short_by + x["float_bytes"] + x["slack"]),
    )
    return Built(hyps + pre, goal, hints=A.layout_hint(s))


add(
    "policy.cost_bound",
    "policy",
    "policy-driven make_room: need >= 1, 0 <= pages moved (transitions.make_room_moved) <= min(live, need), "
    "and (one side short) "
    "(need-1)*epp < deficit + float bytes + slack",
    _cost_bound,
    timeout_s=30.0,
)


def _far(kind):
    def build():
        _f, s, t, d, hyps = _setup(n=3)
        i = 1
        p = s.pools[i]
        skip, act, low, target, x = decision(s, i, d)
        low_short = x["sides_low"] > x["band_low"]
        high_short = x["sides_high"] > x["band_high"]
        band_low_t = A.low_f(t, i) - A.below(t, i)
        band_high_t = A.above(t, i) - A.high_f(t, i)
        far_after = z3.If(low, band_high_t, band_low_t)
        far_before = z3.If(low, x["band_high"], x["band_low"])
        far_sides = z3.If(low, x["sides_high"], x["sides_low"])
        _, _, need = A.make_room_terms(s, i, low, target)
        base = [z3.Not(skip), act]
        boundary, leap = _moves(s, t, i, low, target)
        if kind == "kept":
            return Built(
                hyps + base + [low_short != high_short, far_before >= far_sides],
                far_after >= far_sides,
                cases=[[boundary], [leap]],
                hints=A.layout_hint(s),
            )
        if kind == "loss_boundary":
            return Built(hyps + base + [boundary], far_after >= far_before - need * p.epp, hints=A.layout_hint(s))
        return Built(hyps + base + [leap], z3.And(far_after >= 0, far_after < p.epp), hints=A.layout_hint(s))

    return build


add(
    "policy.far_side_kept",
    "policy",
    "REFUTED (finding): one side short, policy acts => a far side that was not short stays not short",
    _far("kept"),
    timeout_s=30.0,
    expect="counterexample",
)
add(
    "policy.far_side_loss_boundary",
    "policy",
    "policy acts, make_room boundary case => the far band loses at most need float pages",
    _far("loss_boundary"),
    timeout_s=30.0,
)
add(
    "policy.far_side_leapfrog_takes_all",
    "policy",
    "policy acts, make_room leapfrog => the far band is left with 0 <= bytes < one float page",
    _far("leapfrog"),
    timeout_s=40.0,
)


# ------------------------------------------------------- make_room itself


def _mr(kind):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=4)
        t = A.symbolic_state(f, "t_", like=s)
        mb, side = f.int("min_bytes"), f.bool("side_is_low")
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s)]
        cases, goals = [], []
        for i in (1, 2):
            a = s.bands[i]
            lo, hi = A.region(s, i)
            _band_side, _feasible, need = A.make_room_terms(s, i, side, mb)
            moves = A.make_room_moves(s, i, side, mb)
            if kind == "room":
                for v in (True, False):
                    cases.append([moves, need < a.live, side == v])
                    # destinations in [edge, region end) not taken by staying live pages
                    goals.append(z3.If(side, hi - (a.lo + need), (a.hi - need) - lo) >= a.live)
            else:
                for mv in (A.rel_make_room_boundary(s, t, i, side, mb), A.rel_make_room_leapfrog(s, t, i, side, mb)):
                    cases.append([mv])
                    after = z3.If(side, A.low_f(t, i) - A.below(t, i), A.above(t, i) - A.high_f(t, i))
                    goals.append(after >= mb)
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))

    return build


add(
    "make_room.destinations_suffice",
    "policy",
    "make_room boundary case (need < live): the free pages beyond the cleared edge hold every source",
    _mr("room"),
    timeout_s=30.0,
)
add(
    "make_room.reaches_target",
    "policy",
    "make_room that moves (boundary or leapfrog, either side, either float) leaves >= min_bytes on that side",
    _mr("reach"),
    timeout_s=40.0,
)
