"""Scalar capacity and policy arithmetic of the implementation (docs/design.md §5, §4, §7).

Torch-free, pure int functions.  They are written afresh (not imported from
``kvarena.spec.arith``/``policy``) but keep the spec helpers' names and
argument order, so ``crosshair diffbehavior`` can compare each pair.
All page counts are host ints: the arena keeps its counters on the host,
so reading capacity never waits on the device.
"""


def _floor(a: int, b: int) -> int:
    return a // b


def _ceil(a: int, b: int) -> int:
    # -(-a // b): exact ceiling for b > 0, no float rounding.
    return -((-a) // b)


def end_available(gap: int, epp: int, index_room: int, holes: int) -> int:
    """Pages an END hands out: whole pages of its gap, capped by the ids it
    has left, plus its lazy holes (docs/design.md §5).  As ``spec/arith.py``'s twin.

    Args:
        gap: free bytes on the END's growth side.
        epp: bytes per page of the END.
        index_room: pages left on its grid (``num_pages - min_page - span``).
        holes: its lazy holes (0 when eager).

    Returns:
        The pages an ``alloc`` of the END can take now.
    """
    ext = _floor(gap, epp)
    if index_room < ext:
        ext = index_room
    return ext + holes


def float_available(parked: bool, lo: int, hi: int, lo_wm: int, hi_wm: int, holes: int, index_room: int) -> int:
    """Pages a float hands out without moving: its whole region when parked,
    else holes plus the larger free side; never more than its free ids
    (docs/design.md §5).  As ``spec/arith.py``'s twin.

    Args:
        parked: whether the float has no live page.
        lo: the first page of its region.
        hi: one past the last page of its region.
        lo_wm: the first page of its span.
        hi_wm: one past the last page of its span.
        holes: its holes.
        index_room: its ids not bound.

    Returns:
        The pages, at least 0.
    """
    if parked:
        free = hi - lo if hi - lo > 0 else 0
    else:
        low_side, high_side = lo_wm - lo, hi - hi_wm
        free = (low_side if low_side >= high_side else high_side) + holes
    if index_room < free:
        free = index_room
    return free if free > 0 else 0


def float_region(below: int, above: int, epp: int, lowest: int, num_pages: int) -> tuple[int, int]:
    """Pages ``[lo, hi)`` of a float's grid strictly between its neighbours'
    frontiers: round the low edge up and the high edge down (anchor bug 1;
    docs/design.md §3, "Float region").  As ``spec/arith.py``'s twin.

    Args:
        below: the high frontier of the first opaque member below, in bytes.
        above: the low frontier of the first opaque member above, in bytes.
        epp: bytes per page of the float.
        lowest: its ``min_page``.
        num_pages: its grid's page count.

    Returns:
        ``(lo, hi)``, in pages of the float's grid.
    """
    lo = _ceil(below, epp)
    if lo < lowest:
        lo = lowest
    hi = _floor(above, epp)
    if hi > num_pages:
        hi = num_pages
    return lo, hi


def park_start(lo: int, hi: int, n: int) -> int:
    """First page of a parked float's new span of ``n`` pages, centred in ``[lo, hi)``
    (docs/design.md §4).  As ``spec/arith.py``'s twin.

    Args:
        lo: the first page of the region.
        hi: one past its last page.
        n: the span's pages.

    Returns:
        ``lo + (hi - lo - n) // 2``.
    """
    return lo + _floor(hi - lo - n, 2)


def make_room_feasible(
    side_is_low: bool, below: int, above: int, lo: int, hi: int, live: int, epp: int, min_bytes: int
) -> bool:
    """Would packing the live pages against the far edge open ``min_bytes``?
    (``make_room``'s first test, docs/design.md §4.)  As ``spec/arith.py``'s twin.

    Args:
        side_is_low: whether the side to open is the float's low side.
        below: the high frontier of the first opaque member below, in bytes.
        above: the low frontier of the first opaque member above, in bytes.
        lo: the first page of the float's region.
        hi: one past the last page of its region.
        live: its live pages.
        epp: bytes per page of the float.
        min_bytes: the band wanted on that side, in bytes.

    Returns:
        Whether a leapfrog would leave at least ``min_bytes`` on that side.
    """
    if side_is_low:
        return (hi - live) * epp - below >= min_bytes
    return above - (lo + live) * epp >= min_bytes


def make_room_need(band_side: int, min_bytes: int, epp: int) -> int:
    """Edge pages to clear so the side band reaches ``min_bytes`` (``make_room``'s
    ``need``, docs/design.md §4).  As ``spec/arith.py``'s twin.

    Args:
        band_side: the band's bytes on that side now.
        min_bytes: the bytes wanted there.
        epp: bytes per page of the float.

    Returns:
        ``ceil((min_bytes - band_side) / epp)``.
    """
    return _ceil(min_bytes - band_side, epp)


def short_side_decision(
    sides_low: int, sides_high: int, band_low: int, band_high: int, float_bytes: int, slack: int
) -> tuple[bool, bool, int]:
    """One float's move for one demand vector (``open_short_side``'s step 7,
    docs/design.md §4).  As ``spec/policy.py``'s twin.

    Args:
        sides_low: bytes the END pools on the low side need.
        sides_high: bytes the END pools on the high side need.
        band_low: free bytes between the float and the member below it.
        band_high: free bytes between the float and the member above it.
        float_bytes: bytes the float itself needs beyond its holes.
        slack: the largest ``epp`` among the demanded pools.

    Returns:
        ``(act, side_is_low, target)``: whether to call ``make_room``, on
        which side, and the bytes wanted on that side.
    """
    surplus_low = band_low - sides_low
    surplus_high = band_high - sides_high
    low_short, high_short = surplus_low < 0, surplus_high < 0
    if low_short or high_short:
        # Open the short side to its demand, plus what of the float's own need
        # the far side cannot cover, plus slack.  Both short: relocation is
        # zero-sum, so do nothing and let eviction act.
        far = surplus_high if low_short else surplus_low
        short_need = sides_low if low_short else sides_high
        short_band = band_low if low_short else band_high
        spill = float_bytes - (far if far > 0 else 0)
        target = short_need + (spill if spill > 0 else 0) + slack
        act = not (low_short and high_short) and target > short_band
        return act, low_short, target
    open_low = surplus_low >= surplus_high
    target = (sides_low if open_low else sides_high) + float_bytes + slack
    best = surplus_low if surplus_low >= surplus_high else surplus_high
    return float_bytes > best, open_low, target


def two_end_joint_pages(gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int) -> int:
    """Largest ``P`` whose coupled bind fits on two ENDs sharing ``gap`` bytes
    (``a`` binds first, then ``b`` in what ``a`` left): ``HybridSWA``'s joint
    view, with ``a`` = full and ``b`` = swa.

    A bind of ``P`` takes ``min(P, holes)`` holes on each side and extends
    ``m_a = max(0, P - holes_a)`` and ``m_b = max(0, P - holes_b)`` pages.
    Both gates pass iff ``m_a*epp_a + m_b*epp_b <= gap`` (b's gate; it
    implies a's), ``m_a <= room_a`` and ``m_b <= room_b``.  The cost is 0 up
    to ``lo = min(holes)``, grows by ``e_x`` (the epp of the side with fewer
    holes, the only one extending) per page up to ``hi = max(holes)``, and
    by ``epp_a + epp_b`` after; so the largest ``P`` within the gap is
    ``lo + gap // e_x`` when ``gap < (hi - lo)*e_x``, else ``hi + (gap -
    (hi - lo)*e_x) // (epp_a + epp_b)``.  The room caps are ``holes +
    room`` per side.  The closed form of the joint view (docs/design.md §6).

    Args:
        gap: free bytes between the two ENDs.
        epp_a: bytes per page of ``a``.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s grid pages outside its span.
        epp_b: bytes per page of ``b``.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s grid pages outside its span.

    Returns:
        The largest ``P``, at least 0.

    Raises:
        ValueError: a size is negative or an epp is not positive.
    """
    if gap < 0 or epp_a <= 0 or epp_b <= 0 or holes_a < 0 or room_a < 0 or holes_b < 0 or room_b < 0:
        raise ValueError("two_end_joint_pages: sizes must be >= 0 and epps > 0")
    lo, hi = (holes_a, holes_b) if holes_a <= holes_b else (holes_b, holes_a)
    e_x = epp_a if holes_a < holes_b else epp_b
    solo = (hi - lo) * e_x
    if gap < solo:
        p = lo + _floor(gap, e_x)
    else:
        p = hi + _floor(gap - solo, epp_a + epp_b)
    cap_a, cap_b = holes_a + room_a, holes_b + room_b
    if cap_a < p:
        p = cap_a
    if cap_b < p:
        p = cap_b
    return p


def two_end_uneven_fits(
    pages_a: int, pages_b: int, gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int, room_b: int
) -> bool:
    """Does a bind of ``pages_a`` pages on END ``a`` and then ``pages_b`` on
    END ``b`` (in what ``a`` left of the shared ``gap``) pass both gates?
    ``HybridSWA``'s uneven demand, ``a`` = full, ``b`` = swa binding only a
    tail of full's new ids.  Each side takes its holes first and extends
    ``m = max(0, pages - holes)`` pages: both gates pass iff each ``m`` is
    within its room and ``m_a*epp_a + m_b*epp_b <= gap`` (docs/design.md §6;
    the uneven demand of docs/design.md §11).

    Args:
        pages_a: pages ``a`` binds.
        pages_b: pages ``b`` binds.
        gap: free bytes between the two ENDs.
        epp_a: bytes per page of ``a``.
        holes_a: ``a``'s lazy holes.
        room_a: ``a``'s grid pages outside its span.
        epp_b: bytes per page of ``b``.
        holes_b: ``b``'s lazy holes.
        room_b: ``b``'s grid pages outside its span.

    Returns:
        Whether both gates pass.

    Raises:
        ValueError: a page count or size is negative or an epp is not positive.
    """
    bad_counts = pages_a < 0 or pages_b < 0 or holes_a < 0 or room_a < 0 or holes_b < 0 or room_b < 0
    if bad_counts or gap < 0 or epp_a <= 0 or epp_b <= 0:
        raise ValueError("two_end_uneven_fits: page counts and sizes must be >= 0 and epps > 0")
    m_a = pages_a - holes_a if pages_a > holes_a else 0
    m_b = pages_b - holes_b if pages_b > holes_b else 0
    return m_a <= room_a and m_b <= room_b and m_a * epp_a + m_b * epp_b <= gap


def swa_tail_pages(prefix_len: int, seq_len: int, swa_tail_len: int, page_size: int) -> int:
    """The new pages holding any of the last ``swa_tail_len`` tokens: the
    SWA pages a PD decode node binds (docs/design.md §13).  As
    ``spec/arith.py``'s twin: the pages from the tail's first new page to
    the request's last one.

    Args:
        prefix_len: tokens already allocated.
        seq_len: the length after the extend.
        swa_tail_len: the window's tail, ``<= seq_len - prefix_len``.
        page_size: tokens per page.

    Returns:
        How many of the new pages (the last ones) the SWA side binds.

    Raises:
        ValueError: ``page_size <= 0``, or lengths outside ``0 <= prefix <=
            seq`` and ``0 <= tail <= seq - prefix``.
    """
    if page_size <= 0 or prefix_len < 0 or seq_len < prefix_len or not 0 <= swa_tail_len <= seq_len - prefix_len:
        raise ValueError("swa_tail_pages: need page_size > 0 and 0 <= prefix <= seq, 0 <= tail <= seq - prefix")
    if swa_tail_len == 0:
        return 0
    first = seq_len - swa_tail_len  # the tail's first token, never in the prefix
    first_page = _floor(first, page_size)
    if first_page * page_size < prefix_len:  # the prefix's partly filled page: already bound
        first_page += 1
    return _ceil(seq_len, page_size) - first_page
