"""The abstract arena: frontiers and counts, and each operation as a relation.

An abstract state keeps, for every pool of the chain (low bytes first:
up END, floats, down END), its span ``[lo, hi)`` in pages of its own grid,
its ``live`` count and its ``holes`` count, plus the layout numbers
(``epp``, ``num_pages``, ``min_page``, ``lazy``) and ``total_bytes``/``sink``.

Everything here is written over the shim of ``kvarena.spec.arith`` (and the
small boolean helpers below), so one function runs on Python ints -- where
the Hypothesis fidelity tests compare it with the real ``spec.Arena`` -- and
on z3 terms, where the obligations quantify over it.  The capacity, region,
gap and policy arithmetic is *called* from the spec, never copied.

Each operation is a relation ``rel(s, t, ...)``: "``t`` is a state the spec
can reach from ``s`` by this operation with these arguments, and the
operation's precondition holds".  Where the spec's outcome depends on where
the holes sit (which counts do not record) the relation is the set of all
outcomes that any hole placement allows; the fidelity tests check that the
spec's real outcome always lies in it.
"""

from dataclasses import dataclass, replace

from kvarena.spec import arith
from kvarena.spec.arith import ite, max_, min_, fdiv

# ------------------------------------------------------------ bool shim

and_, or_, not_ = arith.and_, arith.or_, arith.not_  # one source: the spec's shim


def implies(a, b):
    return or_(not_(a), b)


def eq(a, b):
    r = a == b
    return r


# ------------------------------------------------------------ the state


@dataclass
class PoolLayout:
    grow: str  # "up" | "down" | "float"
    epp: object
    num_pages: object
    min_page: object
    lazy: object = False  # bool or z3 Bool; always False for a float


@dataclass
class BandState:
    lo: object
    hi: object
    live: object
    holes: object


@dataclass
class AState:
    total: object
    sink: object
    pools: list  # PoolLayout, chain order
    bands: list  # BandState, chain order

    @property
    def n(self):
        return len(self.pools)

    def with_band(self, i, band):
        bands = list(self.bands)
        bands[i] = band
        return replace(self, bands=bands)


def opaque(s, i):
    p = s.pools[i]
    if p.grow != "float":
        return True
    return s.bands[i].live > 0


def low_f(s, i):
    return s.bands[i].lo * s.pools[i].epp


def high_f(s, i):
    return s.bands[i].hi * s.pools[i].epp


def above(s, i):
    """Low frontier of the first opaque band above ``i``, or ``total``."""
    r = s.total
    for j in reversed(range(i + 1, s.n)):
        r = ite(opaque(s, j), low_f(s, j), r)
    return r


def below(s, i):
    """High frontier of the first opaque band below ``i``, or 0."""
    r = 0
    for j in range(0, i):
        r = ite(opaque(s, j), high_f(s, j), r)
    return r


def region(s, i):
    p = s.pools[i]
    return arith.float_region(below(s, i), above(s, i), p.epp, p.min_page, p.num_pages)


def gap(s, i):
    p = s.pools[i]
    if p.grow == "up":
        return arith.up_gap(above(s, i), high_f(s, i))
    if p.grow == "down":
        return arith.down_gap(low_f(s, i), below(s, i))
    raise ValueError("gap of an END only")


def index_room(s, i):
    p, b = s.pools[i], s.bands[i]
    return p.num_pages - p.min_page - b.live


def available(s, i):
    """``Arena.available_pages`` over the abstract state (same arith calls)."""
    p, b = s.pools[i], s.bands[i]
    if p.grow != "float":
        room = p.num_pages - p.min_page - (b.hi - b.lo)
        return arith.end_available(gap(s, i), p.epp, room, b.holes)
    lo, hi = region(s, i)
    return arith.float_available(not_(opaque(s, i)), lo, hi, b.lo, b.hi, b.holes, index_room(s, i))


# ------------------------------------------------------------ invariants


def inv_grid(s):
    """Bounds and alignment: every span lies on its own grid, above min_page."""
    cs = []
    for p, b in zip(s.pools, s.bands):
        cs += [p.min_page <= b.lo, b.lo <= b.hi, b.hi <= p.num_pages]
        if p.grow == "up":
            cs.append(eq(b.lo, p.min_page))
        elif p.grow == "down":
            cs.append(eq(b.hi, p.num_pages))
        else:
            cs.append(implies(b.live <= 0, and_(eq(b.lo, p.num_pages), eq(b.hi, p.num_pages))))
    return and_(*cs)


def counted_bytes(s):
    """``Arena._conservation``'s sum, term for term: the sink; for every opaque
    band in chain order the free bytes since the previous high frontier
    (starting at the sink), clamped at 0, plus its pages *counted*,
    ``(live + holes) * epp``; then the free bytes after the last high
    frontier, clamped at 0.

    Each band enters by its counts, not by ``high - low``: the sum does not
    telescope, so it can fail (``test_proofs.test_conservation_goal_is_not_a_tautology``
    and the runner's tautology check).  The old sum, ``gap + (high - low)`` per
    band, was identically ``total`` -- a conservation that no state could break.
    """
    prev = s.sink
    covered = s.sink
    for i in range(s.n):
        o = opaque(s, i)
        b = s.bands[i]
        covered = ite(o, covered + max_(0, low_f(s, i) - prev) + (b.live + b.holes) * s.pools[i].epp, covered)
        prev = ite(o, high_f(s, i), prev)
    return covered + max_(0, s.total - prev)


def cons_bytes(s):
    """The byte equation of conservation: ``counted_bytes(s) == total``."""
    return eq(counted_bytes(s), s.total)


def inv_cons(s):
    """Conservation: counts are non-negative, an eager END has no holes, the
    ids suffice for the live pages, every band's span is its count
    (``hi - lo == live + holes``), and the byte equation of
    ``Arena._conservation`` (``cons_bytes``) holds.

    Why ``span == live + holes`` stays a conjunct of its own: with the order
    invariant every clamped gap is its plain difference, and the byte
    equation reduces to ``sum over opaque bands of epp * (live + holes - span)
    == 0``.  That pins a *single* drifted band (``inv.conservation.single_drift_detected``,
    proved) but not two drifts that cancel in bytes, nor a transparent float,
    which the sum skips (``inv.conservation.bytes_localize_drift``, refuted: a
    documented finding).  So the byte equation does not imply the per-band
    rule, and dropping it would weaken the invariant.  Both are kept; the
    byte equation is what ``verify()`` checks, the per-band rule is what the
    operations preserve band by band.
    """
    cs = []
    for p, b in zip(s.pools, s.bands):
        cs += [b.live >= 0, b.holes >= 0, eq(b.hi - b.lo, b.live + b.holes),
               b.live <= p.num_pages - p.min_page]
        if p.grow != "float":
            cs.append(implies(not_(p.lazy), eq(b.holes, 0)))
    cs.append(cons_bytes(s))
    return and_(*cs)


def inv_order(s):
    """Frontier order along the chain; opaque bands disjoint; inside [sink, total]."""
    cs = []
    for i in range(s.n):
        cs.append(implies(opaque(s, i), and_(low_f(s, i) >= s.sink, high_f(s, i) <= s.total)))
        for j in range(i + 1, s.n):
            cs.append(implies(and_(opaque(s, i), opaque(s, j)), high_f(s, i) <= low_f(s, j)))
    return and_(*cs)


INVARIANTS = {"order": inv_order, "conservation": inv_cons, "grid": inv_grid}


def inv_all(s):
    return and_(inv_grid(s), inv_cons(s), inv_order(s))


def grids(s):
    """``[(epp, num_pages, min_page)]`` in chain order: ``arith.first_pages``'s input."""
    return [(p.epp, p.num_pages, p.min_page) for p in s.pools]


def layout_ok(s, first_pages=True):
    """What make_layout guarantees about the numbers (proved in ``layout``):
    sink = max epp, each grid and min_page from the spec's formulas, a page
    above the sink for everyone, and every ``fits`` of ``arith.first_pages``
    (one page of every pool packs from byte 0 up, each on its own grid) --
    the same call make_layout makes.

    ``first_pages=False`` leaves the packing out.  The obligations that do
    not need it (the invariants, capacity, golden, policy: none of them
    argues from the boot layout) pass it, and so hold for *every* layout
    whose grids each have a page above the sink, which is the stronger
    statement; the packing's nonlinear ceiling divisions over symbolic
    ``epp`` also made those queries 2-3x slower and pushed two past their
    limits.  ``layout.every_pool_allocates`` is the obligation that needs
    (and assumes) the packing."""
    cs = [s.total > 0]
    sink = s.pools[0].epp
    for p in s.pools[1:]:
        sink = max_(sink, p.epp)
    cs.append(eq(s.sink, sink))
    for p in s.pools:
        cs += [p.epp >= 1, eq(p.min_page, arith.min_page(s.sink, p.epp)),
               eq(p.num_pages, fdiv(s.total, p.epp)), p.num_pages > p.min_page]
        if p.grow == "float":
            cs.append(not_(p.lazy))
    if first_pages:
        cs += [fits for _, fits in arith.first_pages(grids(s))]
    return and_(*cs)


def boot_state(s):
    """``s``'s layout with every band as ``Arena.__init__`` leaves it: the up
    END's span empty at min_page, floats parked at num_pages, the down END's
    span empty at num_pages; no live page, no hole."""
    bands = []
    for p in s.pools:
        at = p.min_page if p.grow == "up" else p.num_pages
        bands.append(BandState(at, at, 0, 0))
    return replace(s, bands=bands)


# ------------------------------------------------------------ transitions


def frame(s, t, i):
    """Every band but ``i`` is unchanged."""
    cs = []
    for j in range(s.n):
        if j == i:
            continue
        a, b = s.bands[j], t.bands[j]
        cs += [eq(a.lo, b.lo), eq(a.hi, b.hi), eq(a.live, b.live), eq(a.holes, b.holes)]
    return and_(*cs)


def _same(a, b, lo=None, hi=None, live=None, holes=None):
    return and_(eq(b.lo, a.lo if lo is None else lo), eq(b.hi, a.hi if hi is None else hi),
                eq(b.live, a.live if live is None else live),
                eq(b.holes, a.holes if holes is None else holes))


def rel_alloc_end(s, t, i, n):
    """alloc(END, n) with 1 <= n <= available: holes first, then extend."""
    p, a, b = s.pools[i], s.bands[i], t.bands[i]
    assert p.grow != "float"
    k = min_(n, a.holes)
    m = n - k
    if p.grow == "up":
        post = _same(a, b, hi=a.hi + m, live=a.live + n, holes=a.holes - k)
    else:
        post = _same(a, b, lo=a.lo - m, live=a.live + n, holes=a.holes - k)
    return and_(n >= 1, n <= available(s, i), post, frame(s, t, i))


def _float_pre(s, i, n):
    return and_(n >= 1, n <= available(s, i))


def rel_alloc_float_holes(s, t, i, n):
    a, b = s.bands[i], t.bands[i]
    return and_(_float_pre(s, i, n), opaque(s, i), n <= a.holes,
                _same(a, b, live=a.live + n, holes=a.holes - n), frame(s, t, i))


def rel_alloc_float_parked(s, t, i, n):
    a, b = s.bands[i], t.bands[i]
    lo, hi = region(s, i)
    start = arith.park_start(lo, hi, n)
    return and_(_float_pre(s, i, n), not_(opaque(s, i)),
                _same(a, b, lo=start, hi=start + n, live=n, holes=0), frame(s, t, i))


def _extend_choice(s, i, n):
    a = s.bands[i]
    lo, hi = region(s, i)
    m = n - a.holes
    gl, gh = a.lo - lo, hi - a.hi
    high = ite(gh >= gl, m <= gh, and_(m > gl, m <= gh))
    low = ite(gh >= gl, and_(m > gh, m <= gl), m <= gl)
    return m, high, low


def rel_alloc_float_extend_high(s, t, i, n):
    a, b = s.bands[i], t.bands[i]
    m, high, _ = _extend_choice(s, i, n)
    return and_(_float_pre(s, i, n), opaque(s, i), n > a.holes, high,
                _same(a, b, hi=a.hi + m, live=a.live + n, holes=0), frame(s, t, i))


def rel_alloc_float_extend_low(s, t, i, n):
    a, b = s.bands[i], t.bands[i]
    m, _, low = _extend_choice(s, i, n)
    return and_(_float_pre(s, i, n), opaque(s, i), n > a.holes, low,
                _same(a, b, lo=a.lo - m, live=a.live + n, holes=0), frame(s, t, i))


def rel_free_eager(s, t, i, k):
    p, a, b = s.pools[i], s.bands[i], t.bands[i]
    assert p.grow != "float"
    pre = and_(not_(p.lazy), k >= 1, k <= a.live)
    if p.grow == "up":
        post = _same(a, b, hi=a.hi - k, live=a.live - k)
    else:
        post = _same(a, b, lo=a.lo + k, live=a.live - k)
    return and_(pre, post, frame(s, t, i))


def rel_free_lazy(s, t, i, k):
    p, a, b = s.pools[i], s.bands[i], t.bands[i]
    assert p.grow != "float"
    return and_(p.lazy, k >= 1, k <= a.live, _same(a, b, live=a.live - k, holes=a.holes + k),
                frame(s, t, i))


def rel_free_float(s, t, i, k):
    p, a, b = s.pools[i], s.bands[i], t.bands[i]
    np_ = p.num_pages
    post = ite(eq(a.live, k), _same(a, b, lo=np_, hi=np_, live=0, holes=0),
               _same(a, b, live=a.live - k, holes=a.holes + k))
    return and_(k >= 1, k <= a.live, post, frame(s, t, i))


def rel_flush_end(s, t, i):
    """flush(END, max_moves=any): the frontier retreats somewhere between full
    compaction and not at all; live pages stay in the band."""
    p, a, b = s.pools[i], s.bands[i], t.bands[i]
    if p.grow == "up":
        post = and_(eq(b.lo, a.lo), a.lo + a.live <= b.hi, b.hi <= a.hi)
    else:
        post = and_(eq(b.hi, a.hi), a.lo <= b.lo, b.lo <= a.hi - a.live)
    return and_(post, eq(b.live, a.live), eq(b.holes, b.hi - b.lo - a.live), frame(s, t, i))


def rel_flush_float(s, t, i):
    """flush(float): refit to the live pages; transparent floats are untouched."""
    a, b = s.bands[i], t.bands[i]
    refit = and_(a.lo <= b.lo, b.hi <= a.hi, b.hi - b.lo >= a.live, eq(b.live, a.live),
                 eq(b.holes, b.hi - b.lo - a.live))
    return and_(ite(opaque(s, i), refit, _same(a, b)), frame(s, t, i))


def make_room_terms(s, i, side_is_low, min_bytes):
    """(band_side, feasible, need) exactly as ``Arena.make_room`` computes them."""
    p, a = s.pools[i], s.bands[i]
    bl, ab = below(s, i), above(s, i)
    band_side = ite(side_is_low, low_f(s, i) - bl, ab - high_f(s, i))
    lo, hi = region(s, i)
    feasible = arith.make_room_feasible(side_is_low, bl, ab, lo, hi, a.live, p.epp, min_bytes)
    # make_room_need's precondition (band_side < min_bytes) holds wherever it is used
    need = arith.make_room_need(band_side, min_bytes, p.epp)
    return band_side, feasible, need


def make_room_moves(s, i, side_is_low, min_bytes):
    """``make_room`` acts (moves something): opaque, short, feasible."""
    band_side, feasible, need = make_room_terms(s, i, side_is_low, min_bytes)
    return and_(opaque(s, i), min_bytes >= 0, band_side < min_bytes, feasible)


def rel_make_room_boundary(s, t, i, side_is_low, min_bytes):
    """need < live: only the live pages among the ``need`` edge pages move,
    into holes beyond every source, then the far gap."""
    a, b = s.bands[i], t.bands[i]
    lo, hi = region(s, i)
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    low = and_(b.lo >= a.lo + need, b.hi <= hi, b.hi <= a.hi + need)
    high = and_(b.hi <= a.hi - need, b.lo >= lo, b.lo >= a.lo - need)
    post = and_(ite(side_is_low, low, high), b.hi - b.lo >= a.live, eq(b.live, a.live),
                eq(b.holes, b.hi - b.lo - a.live))
    return and_(make_room_moves(s, i, side_is_low, min_bytes), need < a.live, post, frame(s, t, i))


def rel_make_room_leapfrog(s, t, i, side_is_low, min_bytes):
    """need >= live: all live pages pack against the far edge of the region."""
    a, b = s.bands[i], t.bands[i]
    lo, hi = region(s, i)
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    post = ite(side_is_low, _same(a, b, lo=hi - a.live, hi=hi, holes=0),
               _same(a, b, lo=lo, hi=lo + a.live, holes=0))
    return and_(make_room_moves(s, i, side_is_low, min_bytes), need >= a.live, post, frame(s, t, i))


def rel_compact_holes(s, t, i, retreat_low):
    a, b = s.bands[i], t.bands[i]
    packed = ite(retreat_low, _same(a, b, lo=a.hi - a.live, holes=0),
                 _same(a, b, hi=a.lo + a.live, holes=0))
    return and_(ite(opaque(s, i), packed, _same(a, b)), frame(s, t, i))


# ------------------------------------------------- concrete: from a spec Arena


def from_arena(arena):
    """The abstract state of a real ``kvarena.spec.Arena`` (Python ints)."""
    pools, bands = [], []
    for name in arena.chain:
        b = arena.bands[name]
        g = b.geom
        pools.append(PoolLayout(b.grow, g.epp, g.num_pages, g.min_page, bool(b.lazy)))
        bands.append(BandState(b.lo, b.hi, b.live, len(b.holes)))
    return AState(arena.total_bytes, arena.sink_bytes, pools, bands)


# ------------------------------------------------- symbolic: z3 constants


def grows(n):
    return ["up"] + ["float"] * (n - 2) + ["down"]


def symbolic_state(fresh, tag="s_", like=None, n=4):
    """A state of ``n`` pools whose every number is a z3 constant.

    ``like`` shares the layout (total, sink, pools) of another state, so a
    post-state ``t`` differs from ``s`` only in its bands.
    """
    if like is None:
        pools = [PoolLayout(g, fresh.int(f"epp{i}"), fresh.int(f"num_pages{i}"), fresh.int(f"min_page{i}"),
                            fresh.bool(f"lazy{i}") if g != "float" else False)
                 for i, g in enumerate(grows(n))]
        total, sink = fresh.int("total"), fresh.int("sink")
    else:
        total, sink, pools = like.total, like.sink, like.pools
        n = len(pools)
    bands = [BandState(fresh.int(f"{tag}lo{i}"), fresh.int(f"{tag}hi{i}"), fresh.int(f"{tag}live{i}"),
                       fresh.int(f"{tag}holes{i}")) for i in range(n)]
    return AState(total, sink, pools, bands)


def layout_hint(s, epps=(4, 6, 10, 8, 12), total=480):
    """Concrete layout numbers (off-grid on purpose: epps that do not divide
    each other) that make a vacuity model linear and quick to find."""
    cs = [eq(s.total, total)]
    for p, e in zip(s.pools, epps):
        cs.append(eq(p.epp, e))
    return cs
