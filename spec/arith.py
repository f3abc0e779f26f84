"""Integer arithmetic of the arena, written once for two interpreters.

Every formula here runs on Python ints (the executable spec) and on z3
integer terms (the proofs in ``kvarena.proofs``).  That is what makes the
proofs *about this code* rather than about a hand-copied encoding.

The shim is four functions.  They dispatch on the type of their arguments:
plain ``bool``/``int`` take the Python path; anything else is taken to be a
z3 term, and z3 is imported only then, so the spec itself never needs it.

The ``int``/``bool`` annotations describe the executable spec (and tell
CrossHair what to generate); the same functions also accept z3 terms.
"""


def _concrete(*xs):
    return all(isinstance(x, (bool, int)) for x in xs)


def ite(cond, a, b):
    """``a if cond else b`` for bools and z3 conditions alike."""
    if isinstance(cond, bool):
        return a if cond else b
    import z3

    return z3.If(cond, a, b)


def max_(a, b):
    return ite(a >= b, a, b)


def min_(a, b):
    return ite(a <= b, a, b)


def fdiv(a: int, b: int) -> int:
    """Floor division for a positive divisor.

    pre: b > 0
    post: __return__ * b <= a < (__return__ + 1) * b
    """
    if _concrete(a, b):
        return a // b
    return a / b  # z3's Int division is floor division when b > 0


def cdiv(a: int, b: int) -> int:
    """Ceiling division for a positive divisor.

    pre: b > 0
    post: (__return__ - 1) * b < a <= __return__ * b
    """
    return -fdiv(-a, b)


# --------------------------------------------------------------- geometry


def num_pages(total_bytes: int, entry_bytes: int, page_size: int) -> int:
    """Pages of one pool's grid that fit in the buffer.

    pre: total_bytes >= 0 and entry_bytes > 0 and page_size > 0
    post: __return__ * entry_bytes * page_size <= total_bytes
    post: (__return__ + 1) * entry_bytes * page_size > total_bytes
    """
    return fdiv(fdiv(total_bytes, entry_bytes), page_size)


def min_page(sink_bytes: int, epp: int) -> int:
    """The lowest page of a grid that lies wholly above the sink.

    pre: sink_bytes >= 0 and epp > 0
    post: __return__ * epp >= sink_bytes
    post: (__return__ - 1) * epp < sink_bytes
    """
    return cdiv(sink_bytes, epp)


def first_pages(grids: list) -> list:
    """Where one page of every pool lands, packed from byte 0 up the chain.

    ``grids`` is ``[(epp, num_pages, min_page), ...]`` in chain order (up
    END, floats, down END).  The up END takes ``min_page``, each float the
    lowest page of its own grid above the pool before it, the down END its
    top page.  Returns ``[(page, fits), ...]``: a layout is valid iff every
    ``fits`` holds, and then every pool can hand out a page in the empty
    arena (DESIGN section 3: checked on each pool's grid, not in bytes).
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
    """Free bytes between the up END's high frontier and the next band.

    post: __return__ >= 0
    """
    return max_(0, above - high)


def down_gap(low: int, below: int) -> int:
    """Free bytes between the next band down and the down END's low frontier.

    post: __return__ >= 0
    """
    return max_(0, low - below)


def golden_gap(wm_up: int, epp_up: int, wm_down: int, epp_down: int) -> int:
    """The closed form of the two-END gap that the chain walk must equal.

    post: __return__ >= 0
    """
    return max_(0, (wm_down + 1) * epp_down - wm_up * epp_up)


def float_region(below: int, above: int, epp: int, lowest: int, num_pages: int) -> tuple:
    """The pages ``[lo, hi)`` of a float's grid that lie between its neighbours.

    Both ends round *inward*: a neighbour frontier that is off this grid
    must not be rounded into a page that overlaps it (anchor bug 1).

    pre: epp > 0
    post: __return__[0] * epp >= below
    post: __return__[1] * epp <= above
    """
    lo = max_(cdiv(below, epp), lowest)
    hi = min_(fdiv(above, epp), num_pages)
    return lo, hi


# ------------------------------------------------------------- capacity


def end_available(gap: int, epp: int, index_room: int, holes: int) -> int:
    """Pages an END pool can hand out: extension plus (lazy) holes.

    ``index_room`` is ``num_pages - min_page - span``: the pages left on the
    pool's own grid.  ``holes`` is 0 for an eager pool.

    pre: gap >= 0 and epp > 0 and index_room >= 0 and holes >= 0
    post: __return__ >= holes
    """
    return min_(fdiv(gap, epp), index_room) + holes


def float_available(parked: bool, lo: int, hi: int, lo_wm: int, hi_wm: int, holes: int,
                    index_room: int) -> int:
    """Pages a float can hand out without moving anything.

    A parked float may place a span anywhere in its region; otherwise it
    takes its holes and extends on one side, the larger.

    pre: holes >= 0 and index_room >= 0
    post: 0 <= __return__ <= index_room
    """
    free = ite(parked, max_(0, hi - lo), max_(lo_wm - lo, hi - hi_wm) + holes)
    return max_(0, min_(free, index_room))


def park_start(lo: int, hi: int, n: int) -> int:
    """Where a parked float puts a new span of ``n`` pages: mid-region.

    pre: 0 <= n <= hi - lo
    post: lo <= __return__ and __return__ + n <= hi
    """
    return lo + fdiv(hi - lo - n, 2)


# ------------------------------------------------------------ make_room


def make_room_feasible(side_is_low: bool, below: int, above: int, lo: int, hi: int, live: int, epp: int,
                       min_bytes: int) -> bool:
    """Can the float, packed against the far edge, leave ``min_bytes`` free?

    This is exactly what a leapfrog achieves, so it is the test for
    whether ``make_room`` may move anything at all.

    pre: epp > 0
    """
    low_after = (hi - live) * epp - below
    high_after = above - (lo + live) * epp
    return ite(side_is_low, low_after, high_after) >= min_bytes


def make_room_need(band_side: int, min_bytes: int, epp: int) -> int:
    """Pages that must leave the float's edge to open ``min_bytes`` there.

    pre: epp > 0 and band_side < min_bytes
    post: __return__ >= 1
    post: band_side + __return__ * epp >= min_bytes
    """
    return cdiv(min_bytes - band_side, epp)
