"""The arena in numbers, for the proofs: the spec's own state, views and
transitions, and the invariants they must keep.

The state is ``kvarena.spec.chain.Chain``: for every pool of the chain (up
END, floats, down END) its grid and its band's span and counts.  Every
view (walks, regions, gaps, capacity) and every operation's update
(``kvarena.spec.transitions``) is the spec's code, imported here and run
on z3 terms: the obligations are about the functions ``spec.Arena`` calls
on every operation.  What this module adds is what the proofs need and
the arena does not: symbolic states, the invariants (written here, from
docs/design.md §7, independently of ``Arena.verify``), the layout facts
``make_layout`` guarantees, and each operation as a relation ``rel(s, t,
...)``: "``t`` is the state the spec's transition gives from ``s``, and the
operation's precondition holds".  Where the spec's outcome depends on where
the holes lie, the relation reads that page-level fact off ``t`` and
requires the transition's guard (``transitions.*_ok``), which the arena
asserts on every call.
"""

import z3

from kvarena.spec import arith
from kvarena.spec import transitions as T
from kvarena.spec.arith import fdiv, ite, max_
from kvarena.spec.chain import (  # noqa: F401
    Chain,
    Counts,
    Shape,
    above,
    available,
    below,
    counted_bytes,
    end_room,
    gap,
    high_f,
    index_room,
    low_f,
    make_room_acts,
    make_room_terms,
    opaque,
    region,
)

from .core import Built, Fresh

# the proofs' historical names for the spec's records
AState, BandState, PoolLayout = Chain, Counts, Shape

and_, or_, not_ = arith.and_, arith.or_, arith.not_  # one source: the spec's shim


def implies(a, b):
    return or_(not_(a), b)


def eq(a, b):
    return a == b


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


def cons_bytes(s):
    """The byte equation of conservation: ``chain.counted_bytes(s) == total``,
    the sum ``Arena.verify`` checks."""
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
        cs += [b.live >= 0, b.holes >= 0, eq(b.hi - b.lo, b.live + b.holes), b.live <= p.num_pages - p.min_page]
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
        cs += [
            p.epp >= 1,
            eq(p.min_page, arith.min_page(s.sink, p.epp)),
            eq(p.num_pages, fdiv(s.total, p.epp)),
            p.num_pages > p.min_page,
        ]
        if p.grow == "float":
            cs.append(not_(p.lazy))
    if first_pages:
        cs += [fits for _, fits in arith.first_pages(grids(s))]
    return and_(*cs)


def boot_state(s):
    """``s``'s layout with every band as the arena boots it (``chain.boot``)."""
    from kvarena.spec.chain import boot

    return boot(s.total, s.sink, s.pools)


# ------------------------------------------------------------ transitions
#
# Each relation: the operation's precondition, and band ``i`` of ``t`` is
# what ``spec.transitions`` computes from ``s`` (``frame``: every other band
# is unchanged, as the arena installs counts in one band only).


def frame(s, t, i):
    """Every band but ``i`` is unchanged."""
    return and_(*[same(s.bands[j], t.bands[j]) for j in range(s.n) if j != i])


def same(a, b):
    return and_(eq(a.lo, b.lo), eq(a.hi, b.hi), eq(a.live, b.live), eq(a.holes, b.holes))


def becomes(s, t, i, counts):
    """``t`` is ``s`` with band ``i`` replaced by ``counts``."""
    return and_(same(t.bands[i], counts), frame(s, t, i))


def rel_alloc_end(s, t, i, n):
    """alloc(END, n) with 1 <= n <= available: holes first, then extend."""
    assert s.pools[i].grow != "float"
    return and_(T.alloc_ok(s, i, n), becomes(s, t, i, T.alloc(s, i, n)))


def _float_alloc(s, t, i, n, case):
    return and_(T.alloc_ok(s, i, n), case, becomes(s, t, i, T.alloc(s, i, n)))


def rel_alloc_float_holes(s, t, i, n):
    return _float_alloc(s, t, i, n, and_(opaque(s, i), n <= s.bands[i].holes))


def parked(s, i):
    """A transparent float, stated as ``live == 0`` too (counts are >= 0): an
    equation z3's preprocessing substitutes, collapsing the transitions'
    opaque branches."""
    return and_(not_(opaque(s, i)), eq(s.bands[i].live, 0))


def rel_alloc_float_parked(s, t, i, n):
    return _float_alloc(s, t, i, n, parked(s, i))


def rel_alloc_float_extend_high(s, t, i, n):
    return _float_alloc(s, t, i, n, and_(opaque(s, i), n > s.bands[i].holes, T.float_extends_high(s, i)))


def rel_alloc_float_extend_low(s, t, i, n):
    return _float_alloc(s, t, i, n, and_(opaque(s, i), n > s.bands[i].holes, not_(T.float_extends_high(s, i))))


def rel_free_eager(s, t, i, k):
    assert s.pools[i].grow != "float"
    return and_(not_(s.pools[i].lazy), T.free_ok(s, i, k), becomes(s, t, i, T.free(s, i, k)))


def rel_free_lazy(s, t, i, k):
    assert s.pools[i].grow != "float"
    return and_(s.pools[i].lazy, T.free_ok(s, i, k), becomes(s, t, i, T.free(s, i, k)))


def rel_free_float(s, t, i, k):
    return and_(T.free_ok(s, i, k), becomes(s, t, i, T.free(s, i, k)))


def rel_flush_end(s, t, i):
    """flush(END, max_moves=any): the frontier ``edge`` the page logic
    leaves is read off ``t``; the transition's guard bounds it."""
    edge = t.bands[i].hi if s.pools[i].grow == "up" else t.bands[i].lo
    return and_(T.flush_end_ok(s, i, edge), becomes(s, t, i, T.flush_end(s, i, edge)))


def rel_flush_float(s, t, i):
    """flush(float): an opaque float refits to its live pages (their extent
    read off ``t``); a transparent one is untouched."""
    lo, hi = t.bands[i].lo, t.bands[i].hi
    refit = and_(T.refit_ok(s, i, lo, hi), becomes(s, t, i, T.refit(s, i, lo, hi)))
    return ite(opaque(s, i), refit, becomes(s, t, i, s.bands[i]))


def make_room_moves(s, i, side_is_low, min_bytes):
    """``make_room`` acts (moves something): opaque, short, feasible."""
    return and_(min_bytes >= 0, make_room_acts(s, i, side_is_low, min_bytes))


def rel_make_room_boundary(s, t, i, side_is_low, min_bytes):
    """need < live: only the live pages among the ``need`` edge pages move;
    the span they leave is read off ``t`` and bounded by the guard."""
    lo, hi = t.bands[i].lo, t.bands[i].hi
    return and_(
        make_room_moves(s, i, side_is_low, min_bytes),
        not_(T.make_room_leaps(s, i, side_is_low, min_bytes)),
        T.make_room_ok(s, i, side_is_low, min_bytes, lo, hi),
        becomes(s, t, i, T.make_room(s, i, side_is_low, min_bytes, lo, hi)),
    )


def rel_make_room_leapfrog(s, t, i, side_is_low, min_bytes):
    """need >= live: all live pages pack against the far edge of the region."""
    lo, hi = t.bands[i].lo, t.bands[i].hi
    return and_(
        make_room_moves(s, i, side_is_low, min_bytes),
        T.make_room_leaps(s, i, side_is_low, min_bytes),
        becomes(s, t, i, T.make_room(s, i, side_is_low, min_bytes, lo, hi)),
    )


def rel_compact_holes(s, t, i, retreat_low):
    return becomes(s, t, i, T.compact(s, i, retreat_low))


# ------------------------------------------------- concrete: from a spec Arena


def from_arena(arena):
    """The state of a real ``kvarena.spec.Arena``: exactly what its
    transitions read (``Arena.state``)."""
    return arena.state()


# ------------------------------------------------- symbolic: z3 constants


def grows(n):
    return ["up"] + ["float"] * (n - 2) + ["down"]


def symbolic_state(fresh, tag="s_", like=None, n=4):
    """A state of ``n`` pools whose every number is a z3 constant.

    ``like`` shares the layout (total, sink, pools) of another state, so a
    post-state ``t`` differs from ``s`` only in its bands.
    """
    if like is None:
        pools = tuple(
            Shape(
                g,
                fresh.int(f"epp{i}"),
                fresh.int(f"num_pages{i}"),
                fresh.int(f"min_page{i}"),
                fresh.bool(f"lazy{i}") if g != "float" else False,
            )
            for i, g in enumerate(grows(n))
        )
        total, sink = fresh.int("total"), fresh.int("sink")
    else:
        total, sink, pools = like.total, like.sink, like.pools
        n = len(pools)
    bands = tuple(
        Counts(
            fresh.int(f"{tag}lo{i}"), fresh.int(f"{tag}hi{i}"), fresh.int(f"{tag}live{i}"), fresh.int(f"{tag}holes{i}")
        )
        for i in range(n)
    )
    return Chain(total, sink, pools, bands)


def on_every_state(n, conjuncts):
    """An obligation's ``build``: on a symbolic ``n``-pool state with a valid
    layout and every invariant holding, each of ``conjuncts(s)`` holds."""

    def build():
        s = symbolic_state(Fresh(), "s_", n=n)
        goal = conjuncts(s)
        return Built([layout_ok(s, first_pages=False), inv_all(s)], z3.And(*goal), hints=layout_hint(s))

    return build


def layout_hint(s, epps=(4, 6, 10, 8, 12), total=480):
    """Concrete layout numbers (off-grid on purpose: epps that do not divide
    each other) that make a vacuity model linear and quick to find."""
    cs = [eq(s.total, total)]
    for p, e in zip(s.pools, epps):
        cs.append(eq(p.epp, e))
    return cs
