"""Every difference between the spec and the anchor ends classified.

A difference is a step after which the two sides' results or observations
(``observe.py``) differ.  ``classify`` names the classes that explain it;
each class states one rule of the anchor and checks that the anchor did
*exactly* that: the view-level ones recompute the anchor's value from the
spec's formulas on the anchor's state; the others rebuild the anchor's
result on a copy of the spec's pre-state with the spec's own operations
under the anchor's rules (``emulate``: its ladder, its ``make_room``
measure and placement, its policy's index test) and require the anchor's
state to match, up to which virtual id sits on which page where the class
is about placement.

``CLASSES`` is the register: name -> (kind, what it is).  ``kind`` is
``"design"`` (deliberate, documented in docs/results/conformance.md; the walk adopts the
anchor's state and goes on), ``"anchor-bug"`` (a minimal case is kept in
``tests/anchor_cases/``) or ``"deviation"`` (kvarena is wrong: a failing
test in ``tests/anchor/test_deviations.py``).  A difference no class
explains is ``"unclassified"``, and the campaign fails on it.
"""

import copy
import itertools
from collections import namedtuple

from kvarena.spec import arith

from .observe import adopt_anchor_state, observe_spec

CLASSES = {
    "hole-reuse-order": (
        "design",
        "lazy ENDs and floats reuse holes in another order: the anchor takes the holes "
        "nearest the END's own end (a float: one end of its sorted holes, alternating "
        "per call), kvarena the oldest first",
    ),
    "move-pairing": (
        "design",
        "the same physical pages end up live, but ids pair with them in another order "
        "(the anchor pairs the topmost survivor with the lowest hole, and binds a lazy "
        "down END's extension descending; kvarena pairs both lists ascending)",
    ),
    "free-order": (
        "design",
        "one batch of freed ids joins the FIFO in another order: the anchor's free() recovers "
        "pages with torch.unique (sorted) unless it is handed pages (free_segment, or page size "
        "1 on a lazy END or a float, where it keeps the caller's order); kvarena's arena keeps "
        "the caller's order and its composites free pages ascending",
    ),
    "capped-flush-lag": (
        "design",
        "a capped (opportunistic) anchor flush leaves the pages it vacated as holes "
        "at the frontier until the next flush; kvarena retreats over them at once",
    ),
    "float-schedulable-credit": (
        "design",
        "the anchor's float schedulable view credits a lazy END neighbour's "
        "holes on each side; kvarena's float schedulable view is its available view",
    ),
    "relieve-flushes-first": (
        "design",
        "the anchor's ladder flushes before it checks the need (its callers call it "
        "only when short); kvarena's relieve returns at once when the need fits",
    ),
    "float-own-ladder": (
        "anchor-bug",
        "a float short on its own alloc flushes only the band below it and slides "
        "nothing (the base class's growth side of a float is its low neighbour), while "
        "its schedulable view credits the band above too; kvarena flushes both "
        "neighbours and offers the float's own demand to the policy",
    ),
    "make-room-placement": (
        "design",
        "make_room moves the `need` live pages nearest the side into the holes furthest "
        "from it; kvarena moves only the live pages among the `need` edge pages, into "
        "the nearest holes beyond them (the anchor can copy more pages and retreat further)",
    ),
    "policy-index-counts-holes": (
        "anchor-bug",
        "the float policy's first test (does every demanded pool have the index "
        "room?) counts a lazy END's holes as allocated, while its next step lets "
        "those holes cover the demand: a demand the END's holes nearly cover is "
        "refused as 'index space binds', nothing slides, and the allocation fails",
    ),
    "make-room-on-grid": (
        "anchor-bug",
        "make_room measures the side's free bytes on the float's own page grid, while "
        "the policy's target is raw bytes between frontiers: with the neighbour's "
        "frontier off the float's grid it moves a page more than needed, or refuses a "
        "slide the raw bytes allow",
    ),
}


def _labels_free(obs):
    """An observation up to which id sits on which page: per pool, the live
    ids, the occupied pages, holes, frontiers, FIFO and views."""
    out = {}
    for n, o in obs.items():
        out[n] = {k: v for k, v in o.items() if k not in ("pages", "misplaced")}
        out[n]["ids"] = sorted(o["pages"])
        out[n]["occupied"] = sorted(o["pages"].values())
        out[n]["misplaced"] = bool(o["misplaced"])
    return out


def same_up_to_labels(a, b):
    return _labels_free(a) == _labels_free(b)


def same_up_to_placement(a, b):
    """Equal but for which live pages and holes sit where inside each band:
    frontiers, live ids, the set of pages a band spans with live data or
    holes, the hole count, FIFO and views must all agree."""

    def shape(obs):
        out = {}
        for n, o in _labels_free(obs).items():
            out[n] = dict(o, used=sorted(set(o.pop("occupied")) | set(o["holes"])), holes=len(o["holes"]))
        return out

    return shape(a) == shape(b)


# ---------------------------------------------------------- the anchor's rules on a spec copy


def _make_room(arena, name, side, want, grid, placement):
    """``make_room`` on the spec, under the anchor's rules where asked.

    ``grid``: the anchor measures the side's free bytes as its gap in whole
    pages of the float's grid and calls the slide feasible when
    ``(hi - lo - live) * epp >= want``; the spec measures raw bytes between
    the frontiers and packs against the far edge to judge feasibility.

    ``placement``: the anchor moves the ``need`` live pages nearest the side
    (not the live pages among the ``need`` edge pages) into the holes beyond
    every source, those furthest from the side first, then the far gap next
    to the span; with ``need >= live`` it packs every live page against the
    far edge of the region, as the spec's leapfrog does."""
    if not (grid or placement):
        return arena.make_room(name, side, want)
    b = arena.bands[name]
    if not b.opaque:
        return 0
    epp = b.geom.epp
    lo, hi = arena.region(name)
    gap_pages = {"low": b.lo - lo, "high": hi - b.hi}
    have = gap_pages[side] * epp if grid else arena.band_bytes(name, side)
    if have >= want:
        return 0
    if grid:
        feasible = (hi - lo - b.live) * epp >= want
    else:
        feasible = arith.make_room_feasible(
            side == "low", arena.below(name), arena.above(name), lo, hi, b.live, epp, want
        )
    if not feasible:
        return 0
    need = -(-(want - have) // epp)
    if not placement:  # the spec's placement with the anchor's need
        return arena.make_room(name, side, arena.band_bytes(name, side) + (need - 1) * epp + 1)
    live = b.occupied_pages()
    if need >= len(live):
        final = list(range(lo, lo + len(live))) if side == "high" else list(range(hi - len(live), hi))
        pairs = [(s, d) for s, d in zip(live, final) if s != d]
    else:
        srcs = live[::-1][:need] if side == "high" else live[:need]
        if side == "high":
            dsts = sorted(h for h in b.holes if h < min(srcs))
        else:
            dsts = sorted((h for h in b.holes if h > max(srcs)), reverse=True)
        dsts = dsts[: len(srcs)]
        fresh = len(srcs) - len(dsts)
        far = "low" if side == "high" else "high"
        if fresh > gap_pages[far]:
            return 0
        if side == "high":
            dsts += list(range(b.lo - 1, b.lo - 1 - fresh, -1))
        else:
            dsts += list(range(b.hi, b.hi + fresh))
        pairs = list(zip(srcs, dsts))
    if pairs:
        b.move([d for _, d in pairs], [s for s, _ in pairs])
    arena._refit(name)
    return len(pairs)


def _open_short_side(arena, name, demand, rules):
    """``Arena.open_short_side`` with ``_make_room(rules)`` in its last step."""
    from kvarena.spec import policy

    if not (rules.grid or rules.placement or rules.index_span):
        return arena.open_short_side(name, demand)
    b = arena.bands[name]
    if not b.opaque or not any(demand.values()):
        return 0

    def index_room(n):
        """With ``index_span``, as the anchor counts it: ``num_pages - min_page
        - _allocated_pages()``, which for an END is its span, holes included."""
        o = arena.bands[n]
        used = o.span if rules.index_span and o.is_end else o.live
        return o.geom.num_pages - o.geom.min_page - used

    if any(d > index_room(n) for n, d in demand.items()):
        return 0

    def end_bytes(end):
        e = arena.bands[end]
        return max(0, demand.get(end, 0) - len(e.holes)) * e.geom.epp

    low, high = arena.band_bytes(name, "low"), arena.band_bytes(name, "high")
    fb = max(0, demand.get(name, 0) - len(b.holes)) * b.geom.epp
    slack = max(arena.bands[n].geom.epp for n, d in demand.items() if d)
    act, side_is_low, target = policy.short_side_decision(
        end_bytes(arena.chain[0]), end_bytes(arena.chain[-1]), low, high, fb, slack
    )
    if not act:
        return 0
    return _make_room(arena, name, "low" if side_is_low else "high", target, rules.grid, rules.placement)


def _ladder(arena, name, need_pages, rules):
    """One band's shortfall ladder on the spec.

    ``rules.ladder``: the anchor's ``_relieve_for_alloc``: urgent-flush the
    flush target (an END's growth-side neighbour; a float's low neighbour,
    the base class's growth side), recheck, then ask the growth-side
    neighbour, if it is a float, to open the side facing it.  Otherwise the
    spec's ``relieve`` without eviction: return at once if the need fits,
    flush every flush target, then offer the demand to each float."""

    def fits():
        return need_pages <= arena.available_pages(name)

    if rules.ladder:
        target = arena._neighbour(name, arena.bands[name].grow == "up")
        if target is not None:
            arena.flush(target.name)
        if fits():
            return True
        if target is not None and not target.is_end:
            _open_short_side(arena, target.name, {name: need_pages}, rules)
        return fits()
    if fits():
        return True
    arena.urgent_flush(name)
    if fits():
        return True
    for f in arena.chain[1:-1]:
        _open_short_side(arena, f, {name: need_pages}, rules)
        if fits():
            return True
    return False


def emulate(pre, op, args, rules):
    """``(result, arena)``: ``op`` on a copy of ``pre`` under ``rules``, or
    ``(None, None)`` for a call these rules do not touch."""
    c = copy.deepcopy(pre)
    name = args["name"]
    if op == "relieve":
        return _ladder(c, name, args["need_pages"], rules), c
    if op == "alloc":
        out = c.alloc(name, args["n"], ids=args.get("ids"))
        if out is None and not c.bands[name].lender and _ladder(c, name, args["n"], rules):
            out = c.alloc(name, args["n"])
        return out, c
    if op == "open_short_side":
        return _open_short_side(c, name, args["demand"], rules), c
    if op == "make_room":
        return _make_room(c, name, args["side"], args["min_bytes"], rules.grid, rules.placement), c
    return None, None


def _anchor_float_schedulable(pre_arena, name):
    """The anchor's float schedulable view, from spec state: each side's gap
    (on the float's grid) plus, when the opaque neighbour on that side is a
    lazy END, its holes in bytes over the float's epp; the larger side,
    capped by index room, plus the float's holes."""
    a = pre_arena
    b = a.bands[name]
    g = b.geom
    lo, hi = a.region(name)
    if b.opaque:
        gaps = {"low": max(0, b.lo - lo), "high": max(0, hi - b.hi)}
    else:
        gaps = {"low": max(0, hi - lo), "high": max(0, hi - lo)}
    for side, upward in (("low", False), ("high", True)):
        nb = a._neighbour(name, upward)
        if nb is not None and nb.is_end and nb.lazy:
            gaps[side] += len(nb.holes) * nb.geom.epp // g.epp
    extend = min(max(gaps.values()), g.num_pages - g.min_page - b.live)
    return (extend + len(b.holes)) * b.pool.page_size


# ------------------------------------------------------------------ classifiers
#
# A step may show several differences at once (a lazy END reusing other
# holes *and* a float's schedulable view crediting them).  The view-level
# classes are therefore normalisers: each checks the anchor's value is
# exactly what its rule gives, and if so replaces it with the spec's, so
# that what is left can be explained by the next.  Placement and the
# ladder/grid rules then judge what remains.


def _free_order(ctx, obs_a):
    """The anchor dedups freed tokens with torch.unique (sorting them)
    unless it is handed pages: eager ENDs always (page size 1 included,
    where free_segment is plain free), others for page sizes above 1 unless
    freed by free_segment."""
    if ctx.op != "free":
        return False
    name = ctx.args["name"]
    b = ctx.pre.bands[name]
    if b.lender:
        return False
    sorts = (b.is_end and not b.lazy) if b.pool.page_size == 1 else not ctx.args["segment"]
    s, a = ctx.obs_spec[name]["free_ids"], obs_a[name]["free_ids"]
    k, ids = len(ctx.args["ids"]), list(ctx.args["ids"])
    if not sorts or s == a or s[:-k] != a[:-k] or s[-k:] != ids or a[-k:] != sorted(ids):
        return False
    obs_a[name]["free_ids"] = list(s)
    return True


def _capped_flush_lag(ctx, obs_a):
    if ctx.op != "flush" or ctx.args["max_moves"] is None:
        return False
    name = ctx.args["name"]
    b = ctx.spec.bands[name]
    if not (b.is_end and b.lazy):
        return False
    s, a = ctx.obs_spec[name], obs_a[name]
    extra = sorted(set(a["holes"]) - set(s["holes"]))
    if not extra or set(s["holes"]) - set(a["holes"]):
        return False
    epp = b.geom.epp
    if b.grow == "up":
        ok = extra == list(range(s["frontiers"][1] // epp, a["frontiers"][1] // epp))
    else:
        ok = extra == list(range(a["frontiers"][0] // epp, s["frontiers"][0] // epp))
    if not ok:
        return False
    # The pages it has not absorbed yet lag its frontier, holes and gap, and the
    # views of the band it faces.  Those views must be what the spec reports
    # from the anchor's state (a state the spec accepts: holes at a frontier).
    obs_lag = observe_spec(ctx.adopted())
    views = ("frontiers", "holes", "gap_bytes", "available_size", "schedulable_available_size")
    for n in ctx.obs_spec:
        for k in views:
            if k in obs_a[n] and obs_lag[n][k] != obs_a[n][k]:
                return False
    for n in ctx.obs_spec:
        for k in views:
            if k in obs_a[n]:
                obs_a[n][k] = copy.deepcopy(ctx.obs_spec[n][k])
    return True


def _float_schedulable_credit(ctx, obs_a):
    hit = False
    for n in ctx.obs_spec:
        if ctx.spec.bands[n].is_end:
            continue
        a = obs_a[n]
        spec_rule = ctx.adopted().schedulable_available_size(n)
        if a["schedulable_available_size"] != spec_rule and a[
            "schedulable_available_size"
        ] == _anchor_float_schedulable(ctx.adopted(), n):
            a["schedulable_available_size"] = spec_rule  # the spec's rule, on the anchor's state
            hit = True
    return hit


NORMALISERS = (
    ("free-order", _free_order),
    ("float-schedulable-credit", _float_schedulable_credit),  # before the lag: it judges the anchor's state
    ("capped-flush-lag", _capped_flush_lag),
)


def _placement(ctx, obs_a):
    """``move-pairing`` or ``hole-reuse-order`` when only placement is left."""
    if ctx.r_spec != ctx.r_anchor:
        return []
    if same_up_to_labels(ctx.obs_spec, obs_a):
        return ["move-pairing"]
    if ctx.op == "alloc" and same_up_to_placement(ctx.obs_spec, obs_a):
        return ["hole-reuse-order"]
    return []


Rules = namedtuple("Rules", "ladder grid placement index_span")
RULE_SETS = [Rules(*r) for r in itertools.product((False, True), repeat=4) if any(r)]
RULE_SETS.sort(key=sum)  # the fewest rules that explain a step


def _ladder_and_grid(ctx, obs_a):
    """The classes whose rules, applied to the spec's pre-state, rebuild the
    anchor's result and state; ``[]`` when no combination does."""
    if ctx.op not in ("relieve", "alloc", "open_short_side", "make_room"):
        return []
    # Match exactly up to labels first; up to placement only after (a rule
    # followed by a hole reuse in another order).
    for same in (same_up_to_labels, same_up_to_placement):
        classes = _rules_that_rebuild(ctx, obs_a, same)
        if classes:
            return classes
    return []


def _rules_that_rebuild(ctx, obs_a, same):
    name = ctx.args["name"]
    for rules in RULE_SETS:
        if (rules.ladder and ctx.op not in ("relieve", "alloc")) or (rules.index_span and ctx.op == "make_room"):
            continue  # a rule this call never reaches
        result, c = emulate(ctx.pre, ctx.op, ctx.args, rules)
        obs_c = observe_spec(c)
        if result != ctx.r_anchor or not same(obs_c, obs_a):
            continue
        if result == ctx.r_spec and same_up_to_labels(obs_c, ctx.obs_spec):
            continue  # these rules changed nothing here: they explain nothing
        classes = []
        if rules.ladder:
            if not ctx.pre.bands[name].is_end:
                classes.append("float-own-ladder")
            elif ctx.op == "relieve" and ctx.args["need_pages"] <= ctx.pre.available_pages(name):
                classes.append("relieve-flushes-first")
            else:
                continue  # an END's ladder differs from the spec's in nothing else
        if rules.grid:
            classes.append("make-room-on-grid")
        if rules.placement:
            classes.append("make-room-placement")
        if rules.index_span:
            classes.append("policy-index-counts-holes")
        return classes
    return []


class Step:
    """What a classifier sees: the spec's pre-state (a copy), the call, both
    results, both observations after it, and both arenas after it."""

    def __init__(self, pre, op, args, r_spec, r_anchor, obs_spec, obs_anchor, spec, anchor):
        self.pre, self.op, self.args, self.anchor = pre, op, args, anchor
        self.r_spec, self.r_anchor = r_spec, r_anchor
        self.obs_spec, self.obs_anchor, self.spec = obs_spec, obs_anchor, spec
        self._adopted = None

    def adopted(self):
        """A copy of the spec arena holding the anchor's state (its views are
        the spec's formulas on the anchor's state)."""
        if self._adopted is None:
            self._adopted = copy.deepcopy(self.spec)
            adopt_anchor_state(self._adopted, self.anchor)
        return self._adopted


def classify(step):
    """The classes that explain this step's difference (``[]``: none does).

    The normalisers run first; then, if the results and observations agree,
    those are the classes; else placement, else the ladder/grid rules must
    explain what is left, or nothing does."""
    obs_a = copy.deepcopy(step.obs_anchor)
    classes = [name for name, norm in NORMALISERS if norm(step, obs_a)]
    if step.r_spec == step.r_anchor and step.obs_spec == obs_a:
        return classes
    rest = _placement(step, obs_a) or _ladder_and_grid(step, obs_a)
    return classes + rest if rest else []
