"""The chain in numbers: every band's span and counts, and what follows from them.

A ``Chain`` is the arena with its page tables forgotten: for each pool, in
chain order (up END, floats, down END), its grid (``Shape``) and its band
(``Counts``: the span ``[lo, hi)`` in pages of its own grid, the live pages
and the holes).  Everything ``Arena`` decides from frontiers and counts is
a function here: the chain walks, the gaps, a float's region, the capacity
views, make_room's terms and the inputs of both relief policies.
``transitions`` holds each operation's update of the counts.

Every function is written over the shim of ``arith``, so it runs on Python
ints, where ``Arena`` calls it, and on z3 terms, where ``kvarena.proofs``
calls the very same code: the obligations are about this file, not a copy
of it.  Only ``neighbour`` (an index) is for ints alone.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from . import arith
from .arith import and_, ite, max_, not_
from .planner import End, Float


@dataclass(frozen=True)
class Shape:
    """A pool's grid: what ``make_layout`` fixed at boot (docs/design.md §3).

    Attributes:
        grow: ``"up"``, ``"down"`` or ``"float"``.
        epp: bytes per page.
        num_pages: pages of the grid in the buffer.
        min_page: the lowest page above the sink.
        lazy: whether the pool is lazy (a bool or a z3 Bool); always False
            for a float.
    """

    grow: str  # "up" | "down" | "float"
    epp: int
    num_pages: int
    min_page: int
    lazy: bool = False  # a bool (or z3 Bool); always False for a float


@dataclass(frozen=True)
class Counts:
    """A band: its span ``[lo, hi)`` in pages, its live pages and its holes (docs/design.md §3).

    Attributes:
        lo: the span's first page, on the pool's own grid.
        hi: one past the span's last page.
        live: the live pages in the span.
        holes: the pages of the span that are not live.
    """

    lo: int
    hi: int
    live: int
    holes: int


@dataclass(frozen=True)
class Chain:
    """The arena in numbers: every pool's grid and band, in chain order (docs/design.md §3).

    Attributes:
        total: the buffer's size, in bytes.
        sink: the sink's size, in bytes.
        pools: each pool's ``Shape``: up END, floats, down END.
        bands: each pool's ``Counts``, in the same order.
    """

    total: int
    sink: int
    pools: tuple[Shape, ...]  # chain order
    bands: tuple[Counts, ...]  # chain order

    @property
    def n(self) -> int:
        """The number of pools in the chain (docs/design.md §3)."""
        return len(self.pools)

    def with_band(self, i: int, band: Counts) -> "Chain":
        """The same chain with band ``i`` replaced: one operation's update (docs/design.md §4).

        Args:
            i: the pool's index in chain order.
            band: its new counts.

        Returns:
            A new ``Chain``; this one is unchanged.
        """
        bands = list(self.bands)
        bands[i] = band
        return replace(self, bands=tuple(bands))


def boot_band(p: Shape) -> Counts:
    """A band as the arena boots it (docs/design.md §3).

    The up END is empty at ``min_page``; the down END empty at
    ``num_pages``; a float parked at ``num_pages``.

    Args:
        p: the pool's grid.

    Returns:
        The empty band.
    """
    at = p.min_page if p.grow == "up" else p.num_pages
    return Counts(at, at, 0, 0)


def boot(total: int, sink: int, pools: Sequence[Shape]) -> Chain:
    """The chain as the arena boots it: every band empty (docs/design.md §3).

    Args:
        total: the buffer's size, in bytes.
        sink: the sink's size, in bytes.
        pools: each pool's grid, in chain order.

    Returns:
        The boot state.
    """
    return Chain(total, sink, tuple(pools), tuple(boot_band(p) for p in pools))


# ------------------------------------------------------------ frontiers


def is_end(s: Chain, i: int) -> bool:
    """Whether pool ``i`` is an END, not a float (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        True for the up and the down END.
    """
    return s.pools[i].grow != "float"


def opaque(s: Chain, i: int) -> bool:
    """Whether band ``i`` counts in the chain walks (docs/design.md §3).

    An END always; a float while it holds a live page.

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        True when the band is opaque.
    """
    return True if is_end(s, i) else s.bands[i].live > 0


def low_f(s: Chain, i: int) -> int:
    """Band ``i``'s low frontier, in bytes (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        ``lo * epp``.
    """
    return s.bands[i].lo * s.pools[i].epp


def high_f(s: Chain, i: int) -> int:
    """Band ``i``'s high frontier, in bytes (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        ``hi * epp``.
    """
    return s.bands[i].hi * s.pools[i].epp


def span(s: Chain, i: int) -> int:
    """Band ``i``'s span, in pages: its live pages plus its holes (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        ``hi - lo``.
    """
    return s.bands[i].hi - s.bands[i].lo


def _walk(s: Chain, i: int, upward: bool, value: Callable[[int], int], default: int) -> int:
    """``value(j)`` of the first opaque band above ``i`` (``upward``) or
    below it, else ``default``: built from the far end inward, so the
    nearest opaque band wins."""
    others = range(i + 1, s.n) if upward else range(i)
    r = default
    for j in reversed(others) if upward else others:
        r = ite(opaque(s, j), value(j), r)
    return r


def above(s: Chain, i: int) -> int:
    """Low frontier of the first opaque band above ``i``, or ``total`` (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        The frontier, in bytes.
    """
    return _walk(s, i, True, lambda j: low_f(s, j), s.total)


def below(s: Chain, i: int) -> int:
    """High frontier of the first opaque band below ``i``, or 0 (docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        The frontier, in bytes.
    """
    return _walk(s, i, False, lambda j: high_f(s, j), 0)


def neighbour(s: Chain, i: int, upward: bool) -> int | None:
    """The first opaque band above or below ``i`` (ints only; docs/design.md §3).

    Args:
        s: the chain.
        i: the pool's index.
        upward: look above ``i`` (else below).

    Returns:
        That band's index, or None when there is none.
    """
    others = range(i + 1, s.n) if upward else reversed(range(i))
    return next((j for j in others if opaque(s, j)), None)


def region(s: Chain, i: int) -> tuple[int, int]:
    """A float's pages ``[lo, hi)`` between its opaque neighbours (docs/design.md §3).

    The same formula serves an END: its outer neighbour is the buffer's end
    (``below`` is 0, ``above`` the total), so its region is every page it
    could span with its inner neighbour where it stands, its pages up to its
    frontier plus the whole pages of its gap.

    Args:
        s: the chain.
        i: the pool's index (a float or an END).

    Returns:
        ``(lo, hi)``, in pages of the float's grid (``arith.float_region``).
    """
    p = s.pools[i]
    return arith.float_region(below(s, i), above(s, i), p.epp, p.min_page, p.num_pages)


def gap(s: Chain, i: int) -> int:
    """Free bytes an END can grow into (docs/design.md §3).

    Args:
        s: the chain.
        i: the END's index.

    Returns:
        The gap, at least 0.
    """
    if s.pools[i].grow == "up":
        return arith.up_gap(above(s, i), high_f(s, i))
    return arith.down_gap(low_f(s, i), below(s, i))


def band_bytes(s: Chain, i: int, side_is_low: bool) -> int:
    """Free bytes between float ``i`` and its neighbour on one side (docs/design.md §4, step 3).

    A transparent float sees its whole region in bytes.

    Args:
        s: the chain.
        i: the float's index.
        side_is_low: the low side (else the high side).

    Returns:
        The band, in bytes.
    """
    whole = above(s, i) - below(s, i)
    side = ite(side_is_low, low_f(s, i) - below(s, i), above(s, i) - high_f(s, i))
    return ite(opaque(s, i), side, whole)


def float_gap_bytes(s: Chain, i: int) -> int:
    """Free bytes on both sides of float ``i``: its ``gap_bytes`` view (docs/design.md §5).

    Args:
        s: the chain.
        i: the float's index.

    Returns:
        The two bands' sum; a transparent float's whole region.
    """
    return ite(opaque(s, i), band_bytes(s, i, True) + band_bytes(s, i, False), above(s, i) - below(s, i))


def counted_bytes(s: Chain) -> int:
    """The conservation sum ``Arena.verify`` checks against ``total`` (docs/design.md §5, §7).

    The sink; for every opaque band in chain order, the free bytes since the
    previous high frontier (the sink's at first), clamped at 0, plus its
    pages *counted*, ``(live + holes) * epp``; then the free bytes after the
    last high frontier, clamped at 0.

    A band enters by its counts, not by ``hi - lo``, so the sum does not
    telescope: a frontier that drifts from its band's count changes it.

    Args:
        s: the chain.

    Returns:
        The sum, in bytes.
    """
    prev = covered = s.sink
    for i in range(s.n):
        o = opaque(s, i)
        b = s.bands[i]
        covered = ite(o, covered + max_(0, low_f(s, i) - prev) + (b.live + b.holes) * s.pools[i].epp, covered)
        prev = ite(o, high_f(s, i), prev)
    return covered + max_(0, s.total - prev)


# -------------------------------------------------------------- capacity


def index_room(s: Chain, i: int) -> int:
    """Pages of the pool's grid not yet bound: its ids' room (docs/design.md §4, step 1).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        ``num_pages - min_page - live``.
    """
    p = s.pools[i]
    return p.num_pages - p.min_page - s.bands[i].live


def end_room(s: Chain, i: int) -> int:
    """Pages an END can still extend by on its own grid (docs/design.md §5).

    Args:
        s: the chain.
        i: the END's index.

    Returns:
        ``num_pages - min_page - span``.
    """
    p = s.pools[i]
    return p.num_pages - p.min_page - span(s, i)


def available(s: Chain, i: int) -> int:
    """Pages ``alloc`` hands out now, with no relocation: the gate (docs/design.md §5).

    Args:
        s: the chain.
        i: the pool's index.

    Returns:
        ``arith.end_available`` for an END, ``arith.float_available`` for a float.
    """
    p, b = s.pools[i], s.bands[i]
    if is_end(s, i):
        return arith.end_available(gap(s, i), p.epp, end_room(s, i), b.holes)
    lo, hi = region(s, i)
    return arith.float_available(not_(opaque(s, i)), lo, hi, b.lo, b.hi, b.holes, index_room(s, i))


def flush_credit(s: Chain, i: int) -> int:
    """Bytes an END gains once its growth-side neighbour flushes (docs/design.md §5).

    That neighbour's holes, when it is a lazy END (a float's holes stay its own).

    Args:
        s: the chain.
        i: the END's index.

    Returns:
        The credit, in bytes.
    """

    def credit(j: int) -> int:
        q = s.pools[j]
        return ite(q.lazy, s.bands[j].holes * q.epp, 0) if q.grow != "float" else 0

    return _walk(s, i, s.pools[i].grow == "up", credit, 0)


def schedulable(s: Chain, i: int) -> int:
    """Pages an END hands out once its growth-side neighbour flushes (docs/design.md §5).

    Args:
        s: the chain.
        i: the END's index.

    Returns:
        ``available`` with ``flush_credit`` added to the gap.
    """
    p, b = s.pools[i], s.bands[i]
    return arith.end_available(gap(s, i) + flush_credit(s, i), p.epp, end_room(s, i), b.holes)


# ------------------------------------------------------------- make_room


def _make_room_side(s: Chain, i: int, side_is_low: bool, min_bytes: int) -> tuple[int, bool]:
    """``(band_side, feasible)``: the band make_room has on that side, and
    whether a full leapfrog reaches ``min_bytes``."""
    p, b = s.pools[i], s.bands[i]
    bl, ab = below(s, i), above(s, i)
    band_side = ite(side_is_low, low_f(s, i) - bl, ab - high_f(s, i))
    lo, hi = region(s, i)
    return band_side, arith.make_room_feasible(side_is_low, bl, ab, lo, hi, b.live, p.epp, min_bytes)


def make_room_terms(s: Chain, i: int, side_is_low: bool, min_bytes: int) -> tuple[int, bool, int]:
    """The terms of ``make_room(float i, side, min_bytes)`` (docs/design.md §4).

    ``_make_room_side`` and the edge pages to clear.  ``need`` presumes the
    side is short (``arith.make_room_need``'s precondition): ask only once
    ``make_room_acts`` holds.

    Args:
        s: the chain.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.

    Returns:
        ``(band_side, feasible, need)``: the free bytes on that side, whether
            a leapfrog reaches ``min_bytes``, and the edge pages to clear.
    """
    band_side, feasible = _make_room_side(s, i, side_is_low, min_bytes)
    return band_side, feasible, arith.make_room_need(band_side, min_bytes, s.pools[i].epp)


def make_room_acts(s: Chain, i: int, side_is_low: bool, min_bytes: int) -> bool:
    """Whether ``make_room`` moves something (docs/design.md §4).

    It does when the float is opaque, the side is short of ``min_bytes``,
    and a leapfrog would reach it.

    Args:
        s: the chain.
        i: the float's index.
        side_is_low: the low side (else the high side).
        min_bytes: the bytes wanted on that side.

    Returns:
        True when it acts.
    """
    band_side, feasible = _make_room_side(s, i, side_is_low, min_bytes)
    return and_(opaque(s, i), band_side < min_bytes, feasible)


# ------------------------------------------------- the relief policies' inputs


def demand_skipped(s: Chain, i: int, d: list[int]) -> bool:
    """Whether the anchor policy leaves float ``i`` alone for demand ``d`` (docs/design.md §4, step 1).

    It does when the float is transparent, nothing is demanded, or some
    demanded pool lacks the ids (bytes cannot fix that).

    Args:
        s: the chain.
        i: the float's index.
        d: the demand vector, pages per pool in chain order.

    Returns:
        True when the float is skipped.
    """
    return arith.or_(
        not_(opaque(s, i)), and_(*[dj == 0 for dj in d]), arith.or_(*[d[j] > index_room(s, j) for j in range(s.n)])
    )


def short_side_inputs(s: Chain, i: int, d: list[int]) -> dict[str, int]:
    """``short_side_decision``'s arguments for float ``i`` and demand ``d`` (docs/design.md §4).

    Steps 2, 3, 5 and 6: each END's demand beyond its holes in bytes, the
    float's two bands, the float's own demand beyond its holes, and the
    slack (the largest epp among the demanded pools).

    Args:
        s: the chain.
        i: the float's index.
        d: the demand vector, pages per pool in chain order.

    Returns:
        The keyword arguments of ``policy.short_side_decision``, by name.
    """

    def need_bytes(j: int) -> int:
        return max_(0, d[j] - s.bands[j].holes) * s.pools[j].epp

    slack = 0
    for j in range(s.n):
        slack = max_(slack, ite(d[j] > 0, s.pools[j].epp, 0))
    return {
        "sides_low": need_bytes(0),
        "sides_high": need_bytes(s.n - 1),
        "band_low": band_bytes(s, i, True),
        "band_high": band_bytes(s, i, False),
        "float_bytes": need_bytes(i),
        "slack": slack,
    }


def planner_inputs(s: Chain, d: list[int]) -> tuple[End, list[Float], End]:
    """The inputs of ``planner.plan_chain`` for demand ``d`` (docs/design.md §4b).

    Args:
        s: the chain.
        d: the demand vector, pages per pool in chain order.

    Returns:
        ``(up, floats, down)``: the two ``End``s and the ``Float``s in chain order.
    """

    def end(i: int, frontier: int) -> End:
        p, b = s.pools[i], s.bands[i]
        return End(frontier, p.epp, max_(0, d[i] - b.holes), end_room(s, i))

    floats: list[Float] = []
    for i in range(1, s.n - 1):
        p, b = s.pools[i], s.bands[i]
        floats.append(Float(p.epp, p.min_page, p.num_pages, b.lo, b.hi, b.live, b.holes, d[i], index_room(s, i)))
    return end(0, high_f(s, 0)), floats, end(s.n - 1, low_f(s, s.n - 1))
