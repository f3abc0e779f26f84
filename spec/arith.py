"""Integer arithmetic of the arena, written once for two interpreters.

Every formula here runs on Python ints (the executable spec) and on z3
integer terms (the proofs in ``kvarena.proofs``).  That is what makes the
proofs *about this code* rather than about a hand-copied encoding.

The shim is a handful of functions (``ite``, ``and_``/``or_``/``not_``,
``max_``/``min_``, ``fdiv``/``cdiv``).  They dispatch on the type of their arguments:
plain ``bool``/``int`` take the Python path; anything else is taken to be a
z3 term, and z3 is imported only then, so the spec itself never needs it.

The ``int``/``bool`` annotations describe the executable spec (and tell
CrossHair what to generate); the same functions also accept z3 terms.
"""

from typing import TypeVar

T = TypeVar("T")  # ``ite``'s two branches: ints, bools, or z3 terms of either


def _concrete(*xs: object) -> bool:
    return all(isinstance(x, (bool, int)) for x in xs)


def ite(cond: bool, a: T, b: T) -> T:
    """``a if cond else b`` for bools and z3 conditions alike (the shim, docs/design.md §7).

    Args:
        cond: the condition.
        a: the value when ``cond`` holds.
        b: the value when it does not.

    Returns:
        ``a`` or ``b``; on a z3 condition, the term ``If(cond, a, b)``.
    """
    if isinstance(cond, bool):
        return a if cond else b
    import z3

    return z3.If(cond, a, b)


def and_(*xs: bool) -> bool:
    """Conjunction for bools and z3 conditions alike (``True`` when empty; docs/design.md §7).

    Args:
        *xs: the conjuncts.

    Returns:
        Their conjunction: a bool when every conjunct left is one, else a z3 term.
    """
    rest = [x for x in xs if x is not True]
    if any(x is False for x in rest):
        return False
    if not rest:
        return True
    if _concrete(*rest):
        return all(rest)
    import z3

    return z3.And(*rest) if len(rest) > 1 else rest[0]


def or_(*xs: bool) -> bool:
    """Disjunction for bools and z3 conditions alike (``False`` when empty; docs/design.md §7).

    Args:
        *xs: the disjuncts.

    Returns:
        Their disjunction: a bool when every disjunct left is one, else a z3 term.
    """
    rest = [x for x in xs if x is not False]
    if any(x is True for x in rest):
        return True
    if not rest:
        return False
    if _concrete(*rest):
        return any(rest)
    import z3

    return z3.Or(*rest) if len(rest) > 1 else rest[0]


def not_(x: bool) -> bool:
    """Negation for bools and z3 conditions alike (docs/design.md §7).

    Args:
        x: the condition.

    Returns:
        ``not x``; on a z3 condition, the term ``Not(x)``.
    """
    if isinstance(x, bool):
        return not x
    import z3

    return z3.Not(x)


def max_(a: int, b: int) -> int:
    """The larger of two ints or z3 terms (docs/design.md §7).

    Args:
        a: one value.
        b: the other.

    Returns:
        ``max(a, b)``, written as an ``ite``.
    """
    return ite(a >= b, a, b)


def min_(a: int, b: int) -> int:
    """The smaller of two ints or z3 terms (docs/design.md §7).

    Args:
        a: one value.
        b: the other.

    Returns:
        ``min(a, b)``, written as an ``ite``.
    """
    return ite(a <= b, a, b)


def fdiv(a: int, b: int) -> int:
    """Floor division for a positive divisor (docs/design.md §7).

    Args:
        a: the dividend.
        b: the divisor.

    Returns:
        ``a // b``.

    pre: b > 0
    post: __return__ * b <= a < (__return__ + 1) * b
    """
    if _concrete(a, b):
        return a // b
    # z3 terms only (on ints ``/`` is true division): z3's Int division is floor division when b > 0
    return a / b  # type: ignore[return-value]


def cdiv(a: int, b: int) -> int:
    """Ceiling division for a positive divisor (docs/design.md §7).

    Args:
        a: the dividend.
        b: the divisor.

    Returns:
        ``ceil(a / b)``.

    pre: b > 0
    post: (__return__ - 1) * b < a <= __return__ * b
    """
    return -fdiv(-a, b)


# --------------------------------------------------------------- geometry


def num_pages(total_bytes: int, entry_bytes: int, page_size: int) -> int:
    """Pages of one pool's grid that fit in the buffer (docs/design.md §3).

    Args:
        total_bytes: the buffer's size.
        entry_bytes: bytes of one slot.
        page_size: slots per page.

    Returns:
        ``(total_bytes // entry_bytes) // page_size``.

    pre: total_bytes >= 0 and entry_bytes > 0 and page_size > 0
    post: __return__ * entry_bytes * page_size <= total_bytes
    post: (__return__ + 1) * entry_bytes * page_size > total_bytes
    """
    return fdiv(fdiv(total_bytes, entry_bytes), page_size)


def min_page(sink_bytes: int, epp: int) -> int:
    """The lowest page of a grid that lies wholly above the sink (docs/design.md §3).

    Args:
        sink_bytes: the sink's size.
        epp: bytes per page of the grid.

    Returns:
        ``ceil(sink_bytes / epp)``.

    pre: sink_bytes >= 0 and epp > 0
    post: __return__ * epp >= sink_bytes
    post: (__return__ - 1) * epp < sink_bytes
    """
    return cdiv(sink_bytes, epp)


def layout_grids(total_bytes: int, entries: list[int], page_sizes: list[int]) -> tuple[int, list[tuple[int, int, int]]]:
    """The sink and every pool's grid (docs/design.md §3).

    The sink is the largest ``epp``, and each pool's grid follows from it
    (``make_layout`` calls this; so does ``kvarena.proofs.layout``).

    Args:
        total_bytes: the buffer's size.
        entries: each pool's entry bytes.
        page_sizes: each pool's page size, in the same order.

    Returns:
        ``(sink, [(epp, num_pages, min_page), ...])``, the grids in the order
            the pools were given.
    """
    epps = [e * p for e, p in zip(entries, page_sizes)]
    sink = epps[0]
    for e in epps[1:]:
        sink = max_(sink, e)
    return sink, [
        (e, num_pages(total_bytes, en, ps), min_page(sink, e)) for e, en, ps in zip(epps, entries, page_sizes)
    ]


def first_pages(grids: list[tuple[int, int, int]]) -> list[tuple[int, bool]]:
    """Where one page of every pool lands, packed from byte 0 up the chain.

    The up END takes ``min_page``, each float the lowest page of its own
    grid above the pool before it, the down END its top page.  A layout is
    valid iff every ``fits`` holds, and then every pool can hand out a page
    in the empty arena (docs/design.md §3: checked on each pool's grid, not
    in bytes).

    Args:
        grids: ``[(epp, num_pages, min_page), ...]`` in chain order (up END,
            floats, down END).

    Returns:
        ``[(page, fits), ...]``, one per pool in chain order.
    """
    epp, n, m = grids[0]
    out = [(m, m < n)]
    high = (m + 1) * epp
    for epp, n, m in grids[1:-1]:
        page = max_(cdiv(high, epp), m)
        out.append((page, page < n))
        high = (page + 1) * epp
    epp, n, m = grids[-1]
    top = n - 1
    out.append((top, ite(top >= m, top * epp >= high, False)))
    return out


# ----------------------------------------------------------------- gaps


def up_gap(above: int, high: int) -> int:
    """Free bytes between the up END's high frontier and the next band (docs/design.md §3).

    Args:
        above: the low frontier of the first opaque band above, in bytes.
        high: the up END's high frontier, in bytes.

    Returns:
        ``max(0, above - high)``.

    post: __return__ >= 0
    """
    return max_(0, above - high)


def down_gap(low: int, below: int) -> int:
    """Free bytes between the next band down and the down END's low frontier (docs/design.md §3).

    Args:
        low: the down END's low frontier, in bytes.
        below: the high frontier of the first opaque band below, in bytes.

    Returns:
        ``max(0, low - below)``.

    post: __return__ >= 0
    """
    return max_(0, low - below)


def golden_gap(wm_up: int, epp_up: int, wm_down: int, epp_down: int) -> int:
    """The closed form of the two-END gap that the chain walk must equal (docs/design.md §3).

    Args:
        wm_up: the up END's watermark (its next page).
        epp_up: the up END's bytes per page.
        wm_down: the down END's watermark (its next page down).
        epp_down: the down END's bytes per page.

    Returns:
        ``max(0, (wm_down + 1) * epp_down - wm_up * epp_up)``.

    post: __return__ >= 0
    """
    return max_(0, (wm_down + 1) * epp_down - wm_up * epp_up)


def float_region(below: int, above: int, epp: int, lowest: int, num_pages: int) -> tuple[int, int]:
    """The pages ``[lo, hi)`` of a float's grid that lie between its neighbours (docs/design.md §3).

    Both ends round *inward*: a neighbour frontier that is off this grid
    must not be rounded into a page that overlaps it (anchor bug 1).

    Args:
        below: the high frontier of the first opaque band below, in bytes.
        above: the low frontier of the first opaque band above, in bytes.
        epp: the float's bytes per page.
        lowest: the float's ``min_page``.
        num_pages: the float's page count.

    Returns:
        ``(lo, hi)``, in pages of the float's grid.

    pre: epp > 0
    post: __return__[0] * epp >= below
    post: __return__[1] * epp <= above
    """
    lo = max_(cdiv(below, epp), lowest)
    hi = min_(fdiv(above, epp), num_pages)
    return lo, hi


# ------------------------------------------------------------- capacity


def end_available(gap: int, epp: int, index_room: int, holes: int) -> int:
    """Pages an END pool can hand out: extension plus (lazy) holes (docs/design.md §5).

    Args:
        gap: the END's gap, in bytes.
        epp: its bytes per page.
        index_room: ``num_pages - min_page - span``, the pages left on the
            pool's own grid.
        holes: its holes; 0 for an eager pool.

    Returns:
        ``min(gap // epp, index_room) + holes``.

    pre: gap >= 0 and epp > 0 and index_room >= 0 and holes >= 0
    post: __return__ >= holes
    """
    return min_(fdiv(gap, epp), index_room) + holes


def float_available(parked: bool, lo: int, hi: int, lo_wm: int, hi_wm: int, holes: int, index_room: int) -> int:
    """Pages a float can hand out without moving anything (docs/design.md §5).

    A parked float may place a span anywhere in its region; otherwise it
    takes its holes and extends on one side, the larger.

    Args:
        parked: whether the float holds no live page.
        lo: its region's first page.
        hi: one past its region's last page.
        lo_wm: its span's first page.
        hi_wm: one past its span's last page.
        holes: its holes.
        index_room: its ids not yet bound.

    Returns:
        The pages, at most ``index_room``.

    pre: holes >= 0 and index_room >= 0
    post: 0 <= __return__ <= index_room
    """
    free = ite(parked, max_(0, hi - lo), max_(lo_wm - lo, hi - hi_wm) + holes)
    return max_(0, min_(free, index_room))


def park_start(lo: int, hi: int, n: int) -> int:
    """Where a parked float puts a new span of ``n`` pages: mid-region (docs/design.md §4).

    Args:
        lo: the region's first page.
        hi: one past the region's last page.
        n: the span's pages.

    Returns:
        The span's first page, ``lo + (hi - lo - n) // 2``.

    pre: 0 <= n <= hi - lo
    post: lo <= __return__ and __return__ + n <= hi
    """
    return lo + fdiv(hi - lo - n, 2)


# ------------------------------------------------------------ make_room


def make_room_feasible(
    side_is_low: bool, below: int, above: int, lo: int, hi: int, live: int, epp: int, min_bytes: int
) -> bool:
    """Can the float, packed against the far edge, leave ``min_bytes`` free? (docs/design.md §4)

    This is exactly what a leapfrog achieves, so it is the test for
    whether ``make_room`` may move anything at all.

    Args:
        side_is_low: open the low side (else the high side).
        below: the high frontier of the first opaque band below, in bytes.
        above: the low frontier of the first opaque band above, in bytes.
        lo: the float's region's first page.
        hi: one past the region's last page.
        live: the float's live pages.
        epp: its bytes per page.
        min_bytes: the bytes wanted on that side.

    Returns:
        Whether a leapfrog leaves at least ``min_bytes`` on that side.

    pre: epp > 0
    """
    low_after = (hi - live) * epp - below
    high_after = above - (lo + live) * epp
    return ite(side_is_low, low_after, high_after) >= min_bytes


def make_room_need(band_side: int, min_bytes: int, epp: int) -> int:
    """Pages that must leave the float's edge to open ``min_bytes`` there (docs/design.md §4).

    Args:
        band_side: the free bytes on that side now.
        min_bytes: the bytes wanted on that side.
        epp: the float's bytes per page.

    Returns:
        ``ceil((min_bytes - band_side) / epp)``.

    pre: epp > 0 and band_side < min_bytes
    post: __return__ >= 1
    post: band_side + __return__ * epp >= min_bytes
    """
    return cdiv(min_bytes - band_side, epp)


# ------------------------------------------------- two ENDs, one gap


def two_end_fits(
    pages: int, gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int
) -> bool:
    """Do both END gates pass for a coupled bind of ``pages`` pages? (docs/design.md §6)

    Two ENDs share one gap of ``gap`` bytes.  END ``a`` binds first: it
    takes ``min(pages, holes_a)`` holes and extends ``m_a = max(0, pages -
    holes_a)`` pages, gated by ``end_available``; then END ``b`` does the
    same in what ``a`` left of the gap, ``gap - m_a*epp_a``.  This is the
    gate sequence of a composite's ``_bind`` (full first, then swa), stated
    gate by gate: ``two_end_joint_pages`` is the largest ``pages`` for which
    it holds.

    Args:
        pages: the pages each END binds.
        gap: the shared gap, in bytes.
        epp_a: END ``a``'s bytes per page.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s pages left on its grid.
        epp_b: END ``b``'s bytes per page.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s pages left on its grid.

    Returns:
        Whether both gates pass.

    pre: pages >= 0 and gap >= 0 and epp_a > 0 and epp_b > 0
    pre: holes_a >= 0 and room_a >= 0 and holes_b >= 0 and room_b >= 0
    """
    return two_end_gates(pages, pages, gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b)


def two_end_gates(
    pages_a: int, pages_b: int, gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int
) -> bool:
    """The two END gates of an uneven bind: ``a`` binds ``pages_a`` pages, then ``b`` binds ``pages_b``.

    A composite's SWA side binds only the tail of full's new ids
    (docs/design.md §11, "Uneven demand").

    ``a`` takes ``min(pages_a, holes_a)`` holes and extends ``m_a =
    max(0, pages_a - holes_a)`` pages, gated by ``end_available``; ``b``
    is then gated in what ``a`` left, ``gap - m_a*epp_a``.  Stated gate by
    gate, as ``_bind`` runs them; ``two_end_fits`` is the even case
    (``pages_a == pages_b``) and ``two_end_uneven_fits`` the closed form.

    Args:
        pages_a: the pages END ``a`` binds.
        pages_b: the pages END ``b`` binds.
        gap: the shared gap, in bytes.
        epp_a: ``a``'s bytes per page.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s pages left on its grid.
        epp_b: ``b``'s bytes per page.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s pages left on its grid.

    Returns:
        Whether both gates pass.

    pre: pages_a >= 0 and pages_b >= 0 and gap >= 0 and epp_a > 0 and epp_b > 0
    pre: holes_a >= 0 and room_a >= 0 and holes_b >= 0 and room_b >= 0
    """
    first = pages_a <= end_available(gap, epp_a, room_a, holes_a)
    left = max_(0, gap - max_(0, pages_a - holes_a) * epp_a)  # what a left; a's gate keeps it >= 0
    second = pages_b <= end_available(left, epp_b, room_b, holes_b)
    return ite(first, second, False)


def two_end_uneven_fits(
    pages_a: int, pages_b: int, gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int
) -> bool:
    """Closed form of ``two_end_gates`` (docs/design.md §11, "Uneven demand").

    Does a bind of ``pages_a`` pages in ``a`` and then ``pages_b`` in ``b``
    pass both gates?  ``HybridSWA``'s uneven joint feasibility (a = full,
    b = swa).

    Argument.  With ``m_a = max(0, pages_a - holes_a)`` and ``m_b =
    max(0, pages_b - holes_b)`` the pages each side extends, both gates
    pass iff (1) ``m_a <= room_a``, (2) ``m_b <= room_b`` and (3)
    ``m_a*epp_a + m_b*epp_b <= gap``: ``a``'s gate is ``m_a <= gap //
    epp_a`` and (1); ``b``'s is ``m_b <= (gap - m_a*epp_a) // epp_b`` and
    (2); by the Galois connection of floor division those read ``m_a*epp_a
    <= gap`` and (3), and (3) implies the first since ``m_b*epp_b >= 0``.
    No search: each side's holes enter only through its own ``m``.  Proved
    on the abstract arena as ``composite.hybrid.uneven_sound`` and
    ``uneven_tight``.

    Args:
        pages_a: the pages END ``a`` binds.
        pages_b: the pages END ``b`` binds.
        gap: the shared gap, in bytes.
        epp_a: ``a``'s bytes per page.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s pages left on its grid.
        epp_b: ``b``'s bytes per page.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s pages left on its grid.

    Returns:
        Whether both gates pass, equal to ``two_end_gates``.

    Raises:
        ValueError: on ints, a negative page count, gap, holes or room, or
            a non-positive epp, as in ``two_end_joint_pages`` (and the
            implementation's twin); a negative page count is no bind, and
            would pass as one of 0 pages.

    pre: pages_a >= 0 and pages_b >= 0 and gap >= 0 and epp_a > 0 and epp_b > 0
    pre: holes_a >= 0 and room_a >= 0 and holes_b >= 0 and room_b >= 0
    post: __return__ == two_end_gates(pages_a, pages_b, gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b)
    """
    if _concrete(pages_a, pages_b, gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b) and not (
        gap >= 0 and epp_a > 0 and epp_b > 0 and min(pages_a, pages_b, holes_a, room_a, holes_b, room_b) >= 0
    ):
        raise ValueError("two_end_uneven_fits: page counts and sizes must be >= 0 and epps > 0")
    m_a = max_(0, pages_a - holes_a)
    m_b = max_(0, pages_b - holes_b)
    return and_(m_a <= room_a, m_b <= room_b, m_a * epp_a + m_b * epp_b <= gap)


def two_end_joint_pages(gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int) -> int:
    """The largest coupled bind two ENDs sharing one gap admit (docs/design.md §6).

    The largest ``P`` for which a coupled bind of ``P`` pages succeeds
    (``two_end_fits``): the closed form of ``HybridSWA``'s joint view
    (a = full, b = swa).

    Argument.  A bind of ``P`` pages extends ``m_a = max(0, P - holes_a)``
    pages of ``a`` and ``m_b = max(0, P - holes_b)`` of ``b``.  Both gates
    pass iff (1) ``m_a <= room_a``, (2) ``m_b <= room_b`` and (3) ``f(P) =
    m_a*epp_a + m_b*epp_b <= gap``: ``b``'s gate ``m_b <= (gap -
    m_a*epp_a) // epp_b`` is (3) (floor division by a positive divisor is
    a Galois connection), and (3) implies ``a``'s own ``m_a <= gap //
    epp_a`` since ``m_b*epp_b >= 0``.  (1) and (2) read ``P <= holes + room``.
    ``f`` is piecewise linear in ``P`` with slopes 0 (both sides on holes,
    up to ``lo = min(holes)``), ``e1`` (only the side with fewer holes,
    whose epp is ``e1``, extends; up to ``hi = max(holes)``) and ``epp_a +
    epp_b`` (both extend).  The slopes increase, so ``f`` is convex and is
    the max of its three linear pieces: ``f(P) = max(0, (P - lo)*e1, (hi -
    lo)*e1 + (P - hi)*(epp_a + epp_b))``.  Hence ``f(P) <= gap`` iff every
    piece is, and each piece gives one floor-division bound on ``P``.
    Every constraint is down-closed in ``P``, so the answer is the min of
    the four bounds; it is at least ``0`` (``P = 0`` always fits).  Proved
    on the abstract arena as ``composite.hybrid.joint_sound`` and
    ``joint_tight``.

    Args:
        gap: the shared gap, in bytes.
        epp_a: END ``a``'s bytes per page.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s pages left on its grid.
        epp_b: END ``b``'s bytes per page.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s pages left on its grid.

    Returns:
        ``P``, in pages; at least 0.

    Raises:
        ValueError: on ints, a negative size or a non-positive epp (the
            implementation's twin raises the same, so ``crosshair
            diffbehavior`` compares the two on the valid domain only).

    pre: gap >= 0 and epp_a > 0 and epp_b > 0
    pre: holes_a >= 0 and room_a >= 0 and holes_b >= 0 and room_b >= 0
    post: __return__ >= 0
    post: two_end_fits(__return__, gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b)
    post: not two_end_fits(__return__ + 1, gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b)
    """
    if _concrete(gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b) and not (
        gap >= 0 and epp_a > 0 and epp_b > 0 and min(holes_a, room_a, holes_b, room_b) >= 0
    ):
        raise ValueError("two_end_joint_pages: sizes must be >= 0 and epps > 0")
    lo, hi = min_(holes_a, holes_b), max_(holes_a, holes_b)
    e1 = ite(holes_a < holes_b, epp_a, epp_b)  # the side that runs out of holes first (a tie: hi == lo)
    one_side = lo + fdiv(gap, e1)  # (P - lo)*e1 <= gap
    both = hi + fdiv(gap - (hi - lo) * e1, epp_a + epp_b)  # (hi - lo)*e1 + (P - hi)*(epp_a + epp_b) <= gap
    return min_(min_(one_side, both), min_(holes_a + room_a, holes_b + room_b))


# ------------------------------------------------- disaggregation (PD)


def swa_tail_pages(prefix_len: int, seq_len: int, swa_tail_len: int, page_size: int) -> int:
    """The new pages that hold any of a request's last ``swa_tail_len``
    tokens: the SWA pages a PD decode node binds when it preallocates a
    transferred request (docs/design.md §13, "PD disaggregation").

    The extend takes the new pages ``[cdiv(prefix, ps), cdiv(seq, ps))``;
    the tail's tokens ``[seq - tail, seq)`` lie on pages from ``(seq -
    tail) // ps`` on.  The pages bound are the new pages from the later of
    the two: the last ``cdiv(seq, ps) - max(cdiv(prefix, ps), (seq - tail)
    // ps)`` new pages (0 for an empty tail).  A tail page carried in from
    the prefix costs nothing here: it is no new page.  Proved to be at most
    the new pages, to cover every tail token on a new page and to hold a
    tail token on each page it names (``disagg.tail.*``).

    Args:
        prefix_len: the tokens already allocated.
        seq_len: the request's length after the extend, ``>= prefix_len``.
        swa_tail_len: the window's tail, ``0 <= tail <= seq - prefix``.
        page_size: tokens per page, ``> 0``.

    Returns:
        The count of new pages the SWA side binds: the last ones.

    Raises:
        ValueError: on ints, arguments outside the domain above (the
            implementation's twin raises the same).

    pre: page_size > 0 and 0 <= prefix_len <= seq_len and 0 <= swa_tail_len <= seq_len - prefix_len
    post: 0 <= __return__ <= cdiv(seq_len, page_size) - cdiv(prefix_len, page_size)
    """
    if _concrete(prefix_len, seq_len, swa_tail_len, page_size) and not (
        page_size > 0 and 0 <= prefix_len <= seq_len and 0 <= swa_tail_len <= seq_len - prefix_len
    ):
        raise ValueError("swa_tail_pages: need page_size > 0 and 0 <= prefix <= seq, 0 <= tail <= seq - prefix")
    first_new = cdiv(prefix_len, page_size)
    first_tail = fdiv(seq_len - swa_tail_len, page_size)
    return ite(swa_tail_len > 0, cdiv(seq_len, page_size) - max_(first_new, first_tail), 0)
