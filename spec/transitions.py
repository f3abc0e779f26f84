"""Each operation's update of the counts: one source for the arena and the proofs.

A transition takes a ``chain.Chain`` (the state before), the pool's index
and the operation's arguments, and returns the pool's new ``chain.Counts``;
every other band is unchanged (the arena touches only that band).
``Arena`` computes the new counts here first, lays its pages out to match
(``moves`` plans the relocations) and then installs them
(``Band.install``, which checks that the page lists agree).
``kvarena.proofs`` calls the same functions on z3 terms.

Where the outcome depends on *where* the holes lie, which counts do not
record, the page-level fact is an argument (``edge`` for a flush, the span
a boundary make_room leaves, the pages a move spares) and a ``*_ok``
function states what the page logic guarantees of it.  The arena asserts
that guard on every call; the proofs assume it, and nothing more.

Pages moved are derived here too (``make_room_moved``, ``repack_moved``):
the arena's move count must equal them, so the cost bound the proofs
derive is the cost the arena pays.
"""

from . import arith
from .arith import and_, ite, min_
from .chain import Chain, Counts, available, make_room_terms, opaque, region
from .planner import Plan


def alloc_end(s: Chain, i: int, n: int) -> Counts:
    """``alloc`` on an END (docs/design.md §4).

    Its holes first (oldest first), then it extends its frontier by the
    rest (up: ``hi`` grows; down: ``lo`` falls).

    Args:
        s: the state before.
        i: the END's index.
        n: the pages to bind.

    Returns:
        The END's new counts.
    """
    a = s.bands[i]
    k = min_(n, a.holes)
    m = n - k
    if s.pools[i].grow == "up":
        return Counts(a.lo, a.hi + m, a.live + n, a.holes - k)
    return Counts(a.lo - m, a.hi, a.live + n, a.holes - k)


def float_extends_high(s: Chain, i: int) -> bool:
    """Which way a float extends (docs/design.md §4).

    An opaque float that its holes do not cover extends toward its larger
    gap; the high side wins ties.  The choice does not depend on how many
    pages it binds: the gate (``chain.available``) prices the larger gap,
    so an alloc within it always fits on that side.

    Args:
        s: the state before.
        i: the float's index.

    Returns:
        True when it extends its high side.
    """
    a = s.bands[i]
    lo, hi = region(s, i)
    return hi - a.hi >= a.lo - lo


def alloc_float(s: Chain, i: int, n: int) -> Counts:
    """``alloc`` on a float (docs/design.md §4).

    Holes cover it, or a parked float places a span mid-region
    (``arith.park_start``), or it takes its holes and extends toward its
    larger gap (``float_extends_high``).

    Args:
        s: the state before.
        i: the float's index.
        n: the pages to bind.

    Returns:
        The float's new counts.
    """
    a = s.bands[i]
    lo, hi = region(s, i)
    start = arith.park_start(lo, hi, n)
    parked = Counts(start, start + n, n, 0)
    m = n - a.holes
    high = Counts(a.lo, a.hi + m, a.live + n, 0)
    low = Counts(a.lo - m, a.hi, a.live + n, 0)
    holes = Counts(a.lo, a.hi, a.live + n, a.holes - n)
    extended = pick(float_extends_high(s, i), high, low)
    return pick(opaque(s, i), pick(n <= a.holes, holes, extended), parked)


def alloc(s: Chain, i: int, n: int) -> Counts:
    """``alloc(pool i, n)`` for ``1 <= n <= available(s, i)``, the gate (docs/design.md §4).

    Args:
        s: the state before.
        i: the pool's index.
        n: the pages to bind.

    Returns:
        The pool's new counts.
    """
    return alloc_end(s, i, n) if s.pools[i].grow != "float" else alloc_float(s, i, n)


def alloc_ok(s: Chain, i: int, n: int) -> bool:
    """Whether ``alloc`` applies: ``n`` is at least 1 and passes the gate (docs/design.md §4, §5).

    Args:
        s: the state before.
        i: the pool's index.
        n: the pages to bind.

    Returns:
        ``1 <= n <= available(s, i)``.
    """
    return and_(n >= 1, n <= available(s, i))


def alloc_settles(s: Chain, i: int, n: int, guarded: int) -> bool:
    """Whether ``alloc(pool i, n)`` must settle an in-flight forward first (docs/design.md §12).

    ``guarded`` of the pool's holes are pinned or pending.  An alloc takes
    its holes first, the unguarded ones oldest first, and then extends
    (``alloc``): it touches a guarded hole exactly when it takes more than
    the unguarded ones.  The views count guarded holes (``available``), so
    the gate is unchanged: the hand-out settles first instead.

    Args:
        s: the state before.
        i: the pool's index.
        n: the pages to bind, within the gate.
        guarded: the pool's pinned or pending holes, ``0 <= guarded <= holes``.

    Returns:
        True when the alloc would hand out a guarded hole unless it settles.
    """
    return and_(guarded > 0, n > s.bands[i].holes - guarded)


def coupled_fits(s: Chain, lead: int, follower: int | None, n: int, m: int) -> bool:
    """Whether the composites' coupled bind passes both gates (docs/design.md §6).

    The lead pool (full) takes ``n`` pages, then the follower (swa; None
    when the composite has none) takes ``m`` of those ids on the state the
    lead's ``alloc`` left (``spec.composites``).  No relocation.  The
    composites' joint view is the largest ``n`` that fits with ``m == n``;
    the proofs run this same function (``proofs/composites.py``,
    ``proofs/views.py``).

    Args:
        s: the state before.
        lead: the lead pool's index.
        follower: the follower's index, or None.
        n: the pages the lead binds.
        m: the pages the follower binds.

    Returns:
        True when both gates pass.
    """
    lead_fits = n <= available(s, lead)
    if follower is None or lead_fits is False:  # a plain bool short-circuits; a z3 term takes both
        return lead_fits
    t = s.with_band(lead, alloc(s, lead, n))
    return and_(lead_fits, m <= available(t, follower))


def free(s: Chain, i: int, k: int) -> Counts:
    """``free`` of ``k`` live pages (docs/design.md §4).

    An eager END's frontier retreats by ``k`` (its survivors compact); a
    lazy END or a float records ``k`` holes; a float left with no live
    page parks.

    Args:
        s: the state before.
        i: the pool's index.
        k: the pages freed.

    Returns:
        The pool's new counts.
    """
    p, a = s.pools[i], s.bands[i]
    holes = Counts(a.lo, a.hi, a.live - k, a.holes + k)
    if p.grow == "float":
        return pick(a.live == k, park(s, i), holes)
    retreat = (
        Counts(a.lo, a.hi - k, a.live - k, a.holes) if p.grow == "up" else Counts(a.lo + k, a.hi, a.live - k, a.holes)
    )
    return pick(p.lazy, holes, retreat)


def free_ok(s: Chain, i: int, k: int) -> bool:
    """Whether ``free`` applies: at least one page, and no more than are live (docs/design.md §4).

    Args:
        s: the state before.
        i: the pool's index.
        k: the pages freed.

    Returns:
        ``1 <= k <= live``.
    """
    return and_(k >= 1, k <= s.bands[i].live)


def park(s: Chain, i: int) -> Counts:
    """A float with no live page: its span empty at ``num_pages``, no hole (docs/design.md §3).

    Args:
        s: the state before.
        i: the float's index.

    Returns:
        The parked counts.
    """
    np_ = s.pools[i].num_pages
    return Counts(np_, np_, 0, 0)


def flush_end(s: Chain, i: int, edge: int) -> Counts:
    """A lazy END's flush leaves its frontier at page ``edge`` (docs/design.md §4).

    Every page between the anchored end and ``edge`` not live is a hole.

    Args:
        s: the state before.
        i: the END's index.
        edge: the new frontier: one past the top live page for the up END,
            the bottom live page for the down END.

    Returns:
        The END's new counts.
    """
    a = s.bands[i]
    if s.pools[i].grow == "up":
        return Counts(a.lo, edge, a.live, edge - a.lo - a.live)
    return Counts(edge, a.hi, a.live, a.hi - edge - a.live)


def flush_end_ok(s: Chain, i: int, edge: int) -> bool:
    """The guard of ``flush_end`` (docs/design.md §4).

    The frontier of a flush lies between the packed band's edge and where
    it was (a move cap can stop it anywhere between).

    Args:
        s: the state before.
        i: the END's index.
        edge: the new frontier.

    Returns:
        True when ``edge`` is such a frontier.
    """
    a = s.bands[i]
    if s.pools[i].grow == "up":
        return and_(a.lo + a.live <= edge, edge <= a.hi)
    return and_(a.lo <= edge, edge <= a.hi - a.live)


def refit(s: Chain, i: int, lo: int, hi: int) -> Counts:
    """A float's span shrunk (or moved) to the extent of its live pages (docs/design.md §4).

    Parked when it has none.

    Args:
        s: the state before.
        i: the float's index.
        lo: the new span's first page.
        hi: one past its last page.

    Returns:
        The float's new counts.
    """
    a = s.bands[i]
    return pick(a.live > 0, Counts(lo, hi, a.live, hi - lo - a.live), park(s, i))


def refit_ok(s: Chain, i: int, lo: int, hi: int) -> bool:
    """The guard of ``refit``: a float's flush only absorbs boundary holes (docs/design.md §4).

    The new span lies in the old one and holds the live pages.

    Args:
        s: the state before.
        i: the float's index.
        lo: the new span's first page.
        hi: one past its last page.

    Returns:
        True when ``[lo, hi)`` is such a span.
    """
    a = s.bands[i]
    return and_(a.lo <= lo, hi <= a.hi, hi - lo >= a.live)


def compact(s: Chain, i: int, retreat_low: bool) -> Counts:
    """``compact_holes`` (docs/design.md §4).

    The live pages packed against the edge opposite ``retreat_low``, order
    kept, no hole left; a transparent float stays.

    Args:
        s: the state before.
        i: the float's index.
        retreat_low: the low edge retreats (the pages pack high).

    Returns:
        The float's new counts.
    """
    a = s.bands[i]
    packed = pick(retreat_low, Counts(a.hi - a.live, a.hi, a.live, 0), Counts(a.lo, a.lo + a.live, a.live, 0))
    return pick(opaque(s, i), packed, a)


# ------------------------------------------------------------ make_room


def make_room_leaps(s: Chain, i: int, side_is_low: bool, min_bytes: int) -> bool:
    """Whether a make_room that acts leapfrogs (docs/design.md §4).

    It does when the edge to clear holds every live page: it packs them
    against the far edge of the region.

    Args:
        s: the state before.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.

    Returns:
        True when ``need >= live``.
    """
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    return need >= s.bands[i].live


def make_room(s: Chain, i: int, side_is_low: bool, min_bytes: int, lo: int, hi: int) -> Counts:
    """The float's band after a ``make_room`` that acts (docs/design.md §4).

    A leapfrog packs it against the far edge of its region; otherwise the
    span is ``[lo, hi)``, where the boundary moves left the live pages
    (``make_room_ok``).

    Args:
        s: the state before.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.
        lo: the boundary case's new span's first page.
        hi: one past its last page.

    Returns:
        The float's new counts.
    """
    a = s.bands[i]
    r_lo, r_hi = region(s, i)
    leap = pick(side_is_low, Counts(r_hi - a.live, r_hi, a.live, 0), Counts(r_lo, r_lo + a.live, a.live, 0))
    return pick(make_room_leaps(s, i, side_is_low, min_bytes), leap, Counts(lo, hi, a.live, hi - lo - a.live))


def make_room_ok(s: Chain, i: int, side_is_low: bool, min_bytes: int, lo: int, hi: int) -> bool:
    """The guard of ``make_room``: what the boundary moves guarantee (docs/design.md §4).

    The ``need`` cleared pages are free, the span moved at most ``need``
    pages, stays in the region and holds the live pages.  (A leapfrog
    ignores ``lo`` and ``hi``.)

    Args:
        s: the state before.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.
        lo: the boundary case's new span's first page.
        hi: one past its last page.

    Returns:
        True when ``[lo, hi)`` is such a span.
    """
    a = s.bands[i]
    r_lo, r_hi = region(s, i)
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    low = and_(lo >= a.lo + need, hi <= r_hi, hi <= a.hi + need)
    high = and_(hi <= a.hi - need, lo >= r_lo, lo >= a.lo - need)
    return and_(ite(side_is_low, low, high), hi - lo >= a.live)


def make_room_moved(s: Chain, i: int, side_is_low: bool, min_bytes: int, spared: int) -> int:
    """Pages a make_room that acts moves (docs/design.md §4).

    A leapfrog moves every live page but the ``spared`` already inside its
    target; the boundary case moves the live pages among the ``need``
    cleared ones, ``need`` less the ``spared`` holes among them.

    Args:
        s: the state before.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.
        spared: the pages that need no move (see above).

    Returns:
        The pages moved.
    """
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    return ite(make_room_leaps(s, i, side_is_low, min_bytes), s.bands[i].live - spared, need - spared)


def make_room_moved_ok(s: Chain, i: int, side_is_low: bool, min_bytes: int, spared: int) -> bool:
    """The guard of ``make_room_moved`` (docs/design.md §4).

    ``spared`` counts pages: at least 0, and at most the live pages
    (leapfrog), or the holes and the cleared pages (boundary).

    Args:
        s: the state before.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.
        spared: the pages that need no move.

    Returns:
        True when ``spared`` is such a count.
    """
    a = s.bands[i]
    _, _, need = make_room_terms(s, i, side_is_low, min_bytes)
    return and_(spared >= 0, spared <= ite(make_room_leaps(s, i, side_is_low, min_bytes), a.live, min_(a.holes, need)))


# ------------------------------------------------------------- the planner


def repack(s: Chain, i: int, start: int) -> Counts:
    """The planner repacks float ``i``: its live pages at ``[start, start + live)``, no hole (docs/design.md §4b).

    Args:
        s: the state before.
        i: the float's index.
        start: the page the live pages start at.

    Returns:
        The float's new counts.
    """
    a = s.bands[i]
    return Counts(start, start + a.live, a.live, 0)


def repack_moved(s: Chain, i: int, spared: int) -> int:
    """Pages a repack moves (docs/design.md §4b).

    Every live page but the ``spared`` already in its target
    (``moves.pack_plan``).

    Args:
        s: the state before.
        i: the float's index.
        spared: the live pages already in the target.

    Returns:
        ``live - spared``.
    """
    return s.bands[i].live - spared


def planned(s: Chain, plan: Plan) -> Chain:
    """The chain after ``plan_floats`` carries out ``plan`` (docs/design.md §4b).

    Each float the plan moves is repacked at its start; every other band is
    as it was.

    Args:
        s: the state before.
        plan: the planner's decision (``planner.plan_chain``).

    Returns:
        The state after.
    """
    for k, i in enumerate(range(1, s.n - 1)):
        s = s.with_band(i, pick(plan.moves[k], repack(s, i, plan.starts[k]), s.bands[i]))
    return s


# --------------------------------------------------------------- helpers


def pick(cond: bool, a: Counts, b: Counts) -> Counts:
    """``a if cond else b`` for two ``Counts``, field by field on z3 terms (docs/design.md §7).

    Args:
        cond: the condition.
        a: the counts when ``cond`` holds.
        b: the counts when it does not.

    Returns:
        ``a`` or ``b``; on a z3 condition, counts of ``If`` terms.
    """
    if isinstance(cond, bool):
        return a if cond else b
    return Counts(*(ite(cond, x, y) for x, y in zip((a.lo, a.hi, a.live, a.holes), (b.lo, b.hi, b.live, b.holes))))
