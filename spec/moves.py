"""Move plans: which live pages go where, as pure functions of page lists.

Every relocation in the arena is planned here and applied by
``Band.move``: a plan is ``(dst, src)``, two ascending lists of physical
pages paired in order (docs/design.md §4).  A plan reads page numbers only,
so each one can be read, tested and argued about on its own; the arena
gathers the inputs and applies the result.

Notation: ``live`` is the ascending list of a band's live pages,
``holes`` its holes (any order), ``[lo, hi)`` its span and
``[region_lo, region_hi)`` the float's region between its neighbours.
"""

from collections.abc import Callable

MovePlan = tuple[list[int], list[int]]  # (dst, src)


def flush_plan(grow: str, live: list[int], holes: list[int], edge: int, max_moves: int | None = None) -> MovePlan:
    """A lazy END's flush: survivors nearest the frontier into the holes
    furthest from it (docs/design.md §4, lazy END pools).

    ``edge`` is where the packed band would end: ``min_page + live`` for the
    up END, ``num_pages - live`` for the down END.  A survivor beyond the
    edge must come in; a hole inside it must be filled, and there are
    exactly as many of one as of the other.  ``max_moves`` takes the first
    pairs in frontier order: the survivors nearest the frontier (so the
    frontier retreats as far as the cap allows) into the holes furthest
    from it (deepest inside the band).

    Args:
        grow: ``"up"`` or ``"down"``, the END's direction.
        live: the band's live pages, ascending.
        holes: its holes.
        edge: where the packed band would end.
        max_moves: the most pairs to move; None for no cap.

    Returns:
        ``(dst, src)``, the holes to fill and the survivors that fill them.
    """
    if grow == "up":
        src = [p for p in live if p >= edge]
        dst = sorted(h for h in holes if h < edge)
    else:
        src = [p for p in live if p < edge]
        dst = sorted(h for h in holes if h >= edge)
    assert len(src) == len(dst)  # one out-of-place survivor per misplaced hole
    k = len(src) if max_moves is None else min(len(src), max_moves)
    if grow == "up":  # frontier is high: nearest survivors are the last
        return dst[:k], src[len(src) - k :]
    return dst[len(dst) - k :], src[:k]  # frontier is low: nearest survivors first


def guarded_flush_plan(
    grow: str,
    live: list[int],
    holes: list[int],
    edge: int,
    max_moves: int | None,
    pinned: list[int],
    guarded: list[int],
) -> MovePlan:
    """A lazy END's flush that does not wait for an in-flight forward
    (docs/design.md §12, the non-urgent walk).

    ``flush_plan``'s pairing, walked from the frontier inward: the walk
    stops at the first pinned survivor (the forward still writes it; what
    lies deeper waits too) and never fills a guarded hole (the forward
    reads or writes it).  With nothing pinned or guarded it is
    ``flush_plan``.

    Args:
        grow: ``"up"`` or ``"down"``, the END's direction.
        live: the band's live pages, ascending.
        holes: its holes.
        edge: where the packed band would end.
        max_moves: the most pairs to move; None for no cap.
        pinned: the live pages an in-flight forward writes.
        guarded: the holes it writes or reads.

    Returns:
        ``(dst, src)``, ascending and paired in order.

    post: not (set(__return__[1]) & set(pinned))
    post: not (set(__return__[0]) & set(guarded))
    post: (pinned or guarded) or __return__ == flush_plan(grow, live, holes, edge, max_moves)
    """
    up = grow == "up"
    stop, skip = set(pinned), set(guarded)
    outside = [p for p in live if (p >= edge if up else p < edge)]
    outside = outside[::-1] if up else outside  # nearest the frontier first
    src: list[int] = []
    for p in outside:
        if p in stop:
            break
        src.append(p)
    inside = sorted(h for h in holes if (h < edge if up else h >= edge) and h not in skip)
    dst = inside if up else inside[::-1]  # furthest from the frontier first
    k = min(len(src), len(dst)) if max_moves is None else min(len(src), len(dst), max_moves)
    return sorted(dst[:k]), sorted(src[:k])


def make_room_plan(
    side: str, live: list[int], holes: list[int], span: tuple[int, int], region: tuple[int, int], edge_pages: int
) -> MovePlan:
    """``make_room``'s relocation: clear ``edge_pages`` pages at ``side``.

    Two cases (docs/design.md §4, make_room):

    - **leapfrog** (``edge_pages >= len(live)``): every live page packs
      against the far edge of the region; pages already in the target stay.
    - **boundary**: only the live pages among the ``edge_pages`` pages at
      ``side`` move, into the holes beyond them (nearest the cleared edge
      first), then into the far gap.

    Why the boundary case always has enough destinations (low side; the
    high side is its mirror).  Say ``s`` of the live pages lie in the cleared
    pages ``[lo, lo + edge_pages)``.  The holes above them number
    ``(hi - lo - edge_pages) - (live - s)`` and the far gap ``region_hi - hi``,
    so the room is ``region_hi - lo - edge_pages - live + s``, which is at
    least ``s`` exactly when ``lo + edge_pages <= region_hi - live``.  The
    arena calls this only when a leapfrog would reach the target
    (``arith.make_room_feasible``), and ``edge_pages`` is the fewest pages
    that reach it (``arith.make_room_need``), which gives that inequality;
    ``make_room.destinations_suffice`` proves it.

    Args:
        side: ``"low"`` or ``"high"``, the side to open.
        live: the float's live pages, ascending.
        holes: its holes.
        span: its span ``(lo, hi)``.
        region: its region ``(region_lo, region_hi)``.
        edge_pages: the pages to clear at ``side`` (``arith.make_room_need``).

    Returns:
        ``(dst, src)``: where the moving live pages go, and which they are.
    """
    lo, hi = span
    region_lo, region_hi = region
    n = len(live)
    if edge_pages >= n:  # leapfrog
        target = range(region_hi - n, region_hi) if side == "low" else range(region_lo, region_lo + n)
        stay = set(live) & set(target)
        return [p for p in target if p not in stay], [p for p in live if p not in stay]
    if side == "low":
        edge = lo + edge_pages  # clear [lo, edge)
        src = [p for p in live if p < edge]
        room = sorted(h for h in holes if h >= edge) + list(range(hi, region_hi))
        dst = room[: len(src)]
    else:
        edge = hi - edge_pages  # clear [edge, hi)
        src = [p for p in live if p >= edge]
        room = sorted((h for h in holes if h < edge), reverse=True) + list(range(lo - 1, region_lo - 1, -1))
        dst = sorted(room[: len(src)])
    assert len(dst) == len(src)  # the room argument above
    return dst, src


def pack_plan(live: list[int], start: int) -> MovePlan:
    """The planner's repack (``Arena.plan_floats``; docs/design.md §4b).

    Make ``live`` occupy ``[start, start + len(live))`` moving the fewest
    pages.  Live pages already in that range stay; the others (ascending)
    fill its free pages (ascending).  Order among the pages is not kept: a
    page's virtual id goes with it, so order carries no meaning.  Moves
    ``len(live)`` pages at most, and exactly the live pages outside the
    range.

    Args:
        live: the float's live pages, ascending.
        start: the first page of the target range.

    Returns:
        ``(dst, src)``: the target's free pages and the live pages outside it.
    """
    target = range(start, start + len(live))
    inside = set(live) & set(target)
    return [p for p in target if p not in inside], [p for p in live if p not in inside]


def compact_plan(live: list[int], span: tuple[int, int], retreat_side: str) -> MovePlan:
    """``compact_holes``: pack ``live`` against the edge opposite ``retreat_side`` (docs/design.md §4).

    Order is kept; pages already in place stay.

    Args:
        live: the float's live pages, ascending.
        span: its span ``(lo, hi)``.
        retreat_side: ``"low"`` or ``"high"``, the edge that retreats.

    Returns:
        ``(dst, src)``, paired in order.
    """
    lo, hi = span
    first = hi - len(live) if retreat_side == "low" else lo
    pairs = [(first + i, p) for i, p in enumerate(live) if first + i != p]
    return [d for d, _ in pairs], [s for _, s in pairs]


def eager_free_plan(grow: str, span: tuple[int, int], freed: list[int], is_live: Callable[[int], bool]) -> MovePlan:
    """An eager END's compaction after a free of ``len(freed)`` pages (docs/design.md §4).

    The survivors left in the vacated pages move into the freed pages that
    lie inside the new span; there are as many of each, since the span lost
    exactly as many pages as were freed.

    Args:
        grow: ``"up"`` or ``"down"``, the END's direction.
        span: the band *after* its frontier retreated, ``(lo, hi)``.
        freed: the pages just freed.
        is_live: ``is_live(p)`` says whether page ``p`` is live.

    Returns:
        ``(dst, src)``: the freed pages inside the new span and the survivors
            that fill them.
    """
    lo, hi = span
    k = len(freed)
    vacated = range(hi, hi + k) if grow == "up" else range(lo - k, lo)
    dst = sorted(p for p in freed if (p < hi if grow == "up" else p >= lo))
    src = [p for p in vacated if is_live(p)]
    return dst, src
