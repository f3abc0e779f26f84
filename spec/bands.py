"""One pool's band: its span of physical pages, page tables and holes.

A band knows nothing of its neighbours; ``arena.py`` walks the chain.

Every band is a span ``[lo, hi)`` of physical pages on its pool's grid:

- the up END keeps ``lo = min_page`` and grows ``hi`` (its watermark);
- the down END keeps ``hi = num_pages`` and grows down (``wm = lo - 1``);
- a float moves both ends; parked, it is ``[num_pages, num_pages)``.

Inside the span a page is either live (bound to a virtual id) or a hole.
Holes are kept in the order they were made: reuse takes the oldest first.

A band that **borrows** its ids (docs/design.md §3) indexes ``v2p`` by its
lender's ids, keeps no FIFO, and binds only ids its lender has live; its
physical pages still come from its own grid.

The *content model* records, for each physical page, whose bytes it holds.
Binding writes a page; a move copies pages.  ``verify`` checks that every
live id's bytes are where ``v2p`` says, which is what the implementation's
byte tests check on real memory.
"""

import copy

from . import forward
from .chain import Counts, Shape, boot_band
from .geometry import AccountingError, Geometry, SubPool

# ---------------------------------------------------------- page tables
#
# Three functions are all that ever writes a page table.  They read and
# write ``v2p``, ``p2v`` and ``content`` only by index, so they run on
# lists and dicts here and on z3 arrays in ``kvarena.proofs.integrity``,
# which proves they keep the tables inverse and the data with its id.


def bind_pages(v2p: list[int], p2v: list[int], content: dict[int, int], ids: list[int], pages: list[int]) -> None:
    """Bind id ``ids[k]`` to page ``pages[k]``; the page now holds its bytes.

    One of the three writers of the page tables (docs/design.md §3, virtual
    ids and page tables); ``kvarena.proofs.integrity`` proves it keeps them
    inverse (docs/design.md §7).

    Args:
        v2p: the virtual-to-physical table, written at ``ids``.
        p2v: the physical-to-virtual table, written at ``pages``.
        content: the content model, written at ``pages``.
        ids: virtual ids, each unbound.
        pages: physical pages, each free, paired with ``ids`` in order.
    """
    for v, p in zip(ids, pages):
        v2p[v] = p
        p2v[p] = v
        content[p] = v


def unbind_ids(v2p: list[int], p2v: list[int], ids: list[int]) -> list[int]:
    """Unbind ``ids``; returns their pages (which keep stale bytes).

    One of the three writers of the page tables (docs/design.md §3): both
    entries become ``-1``, the tombstone.

    Args:
        v2p: the virtual-to-physical table.
        p2v: the physical-to-virtual table.
        ids: live virtual ids.

    Returns:
        The pages the ids were bound to, in the order of ``ids``.
    """
    pages = [v2p[v] for v in ids]
    for v, p in zip(ids, pages):
        v2p[v] = -1
        p2v[p] = -1
    return pages


def move_pages(v2p: list[int], p2v: list[int], content: dict[int, int], dst: list[int], src: list[int]) -> None:
    """Relocate ``src[k] -> dst[k]`` as one batched copy: every source is
    read before any destination is written.

    One of the three writers of the page tables (docs/design.md §3): the
    ids stay, their pages change, and the bytes go with them (data movement,
    docs/design.md §6).  The caller checks ``move_ok`` first.

    Args:
        v2p: the virtual-to-physical table.
        p2v: the physical-to-virtual table.
        content: the content model; each destination takes its source's bytes.
        dst: destination pages.
        src: source pages, live, paired with ``dst`` in order.
    """
    moved = [(d, p2v[s], content[s]) for d, s in zip(dst, src)]
    for s in src:
        p2v[s] = -1
    for d, v, data in moved:
        p2v[d] = v
        v2p[v] = d
        content[d] = data


def move_ok(p2v: list[int], dst: list[int], src: list[int]) -> bool:
    """A move's precondition: distinct live sources, distinct destinations,
    each free or itself a source (docs/design.md §4; the integrity proofs
    assume it, docs/design.md §7).

    Args:
        p2v: the physical-to-virtual table.
        dst: destination pages.
        src: source pages.

    Returns:
        Whether ``move_pages(..., dst, src)`` is a relocation that loses no data.
    """
    sources = set(src)
    return (
        len(sources) == len(src)
        and len(set(dst)) == len(dst)
        and all(p2v[s] >= 0 for s in src)
        and all(p2v[d] < 0 or d in sources for d in dst)
    )


class Band:
    """One pool's band: its span, page tables, free ids and holes (docs/design.md §3).

    At boot the up END is empty at ``min_page``, the down END empty at
    ``num_pages``, and a float parked at ``num_pages``; virtual page 0 maps
    to physical page 0, the sink.

    Args:
        pool: the sub-pool this band holds.
        geom: the pool's grid.
        lazy: whether this END frees lazily (always False for a float).
        lender: the pool whose ids this band borrows, or None.
        lender_geom: the lender's grid, which sizes ``v2p`` and the id range;
            None when the band mints its own ids.
    """

    def __init__(
        self, pool: SubPool, geom: Geometry, lazy: bool, lender: str | None = None, lender_geom: Geometry | None = None
    ) -> None:
        self.pool, self.geom, self.lazy = pool, geom, lazy
        self.name, self.grow = pool.name, pool.grow
        self.lender = lender  # the pool whose ids this band borrows, or None
        ids = lender_geom or geom
        self.id_range = (ids.min_page, ids.num_pages)  # the virtual ids this band may bind
        n = geom.num_pages
        self.v2p = [-1] * ids.num_pages
        self.p2v = [-1] * n
        self.v2p[0] = self.p2v[0] = 0  # virtual page 0 is the sink, in every pool
        # FIFO queue of unbound virtual ids; a borrower mints none
        self.free_ids: list[int] = [] if lender else list(range(ids.min_page, ids.num_pages))
        self.holes: list[int] = []  # physical pages, oldest first
        self.content: dict[int, int] = {}  # physical page -> virtual id whose bytes it holds
        # an in-flight forward's guards, by physical page (spec.forward; -1: none)
        self.pinned = [-1] * n  # the id the page held at launch; forward.FREED once freed
        self.pending = [-1] * n  # the id whose bytes a move left there
        # pages reserved for a host transfer's load (docs/design.md §13): live, owned by no id yet
        self.reserved: list[int] = []
        self.live = 0
        # the boot span: the up END empty at min_page, the others at num_pages
        start = boot_band(Shape(self.grow, geom.epp, n, geom.min_page, lazy))
        self.lo, self.hi = start.lo, start.hi

    # Tables of ints (ids, pages): a copy of one is its deep copy.
    _INT_TABLES = frozenset(("v2p", "p2v", "free_ids", "holes", "content", "pinned", "pending", "reserved"))

    def __deepcopy__(self, memo: dict[int, object]) -> "Band":
        """A deep copy that copies the int tables flat, at C speed: the
        contracts deep-copy the arena before every checked call whose
        postcondition reads ``__old__`` (docs/design.md §7), and an
        element-by-element copy of the tables made most of a fuzz round's
        time.  No table is shared with another object."""
        new = object.__new__(Band)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = v.copy() if k in Band._INT_TABLES else copy.deepcopy(v, memo)
        return new

    # ------------------------------------------------------------ facts

    @property
    def is_end(self) -> bool:
        """True for an END (``up`` or ``down``), False for a float (docs/design.md §3)."""
        return self.grow != "float"

    @property
    def opaque(self) -> bool:
        """An END is always opaque; a float only while it holds a live page (docs/design.md §3)."""
        return self.is_end or self.live > 0

    @property
    def span(self) -> int:
        """Pages in the span ``[lo, hi)``, live pages and holes together (docs/design.md §3)."""
        return self.hi - self.lo

    @property
    def frontiers(self) -> tuple[int, int]:
        """``(low, high)`` in bytes, the span's ends on this pool's grid (docs/design.md §3).

        A parked float reports ``(num_pages*epp, num_pages*epp)`` (docs/design.md §4).
        """
        return self.lo * self.geom.epp, self.hi * self.geom.epp

    @property
    def counts(self) -> Counts:
        """This band as ``chain.Counts``: what the transitions read (docs/design.md §7)."""
        return Counts(self.lo, self.hi, self.live, len(self.holes))

    @property
    def index_room(self) -> int:
        """Pages of this pool's grid not yet bound (for a pool that mints its
        ids, also the ids not yet handed out; a borrower's ids are its
        lender's, so its room is counted on its own grid, like its pages).

        The index space of docs/design.md §4: ``num_pages - min_page - live``.
        """
        return self.geom.num_pages - self.geom.min_page - self.live

    def is_guarded(self, p: int) -> bool:
        """Whether an in-flight forward writes or reads page ``p`` (docs/design.md §12).

        Args:
            p: a physical page of this band's grid.

        Returns:
            True when ``p`` is pinned or pending.
        """
        return bool(forward.guarded(self.pinned, self.pending, p))

    def guarded_holes(self) -> list[int]:
        """The holes an in-flight forward still writes or reads, in hole order (docs/design.md §12).

        Returns:
            The pinned or pending holes, oldest first.
        """
        return [h for h in self.holes if self.is_guarded(h)]

    def lift_guards(self) -> None:
        """Forget every pin and pending mark: the forward has settled (docs/design.md §12)."""
        n = self.geom.num_pages
        self.pinned, self.pending = [-1] * n, [-1] * n

    def occupied_pages(self) -> list[int]:
        """Physical pages holding live data, ascending: the bound pages and
        the reserved ones (docs/design.md §13).  It scans the whole grid,
        so it is also right in the middle of a move, before the span is
        refit.  ``self.live`` is their count (docs/design.md §3).

        Returns:
            The live pages, ascending.
        """
        reserved = set(self.reserved)
        return [p for p in range(self.geom.min_page, self.geom.num_pages) if self.p2v[p] >= 0 or p in reserved]

    # ------------------------------------------------------- mutations

    def take_ids(self, n: int, ids: list[int] | None) -> list[int]:
        """The ids for ``n`` new pages: the given ones, or the FIFO's front (docs/design.md §3).

        Given ids that this band mints leave its FIFO; a borrower's ids are
        its lender's, and its FIFO stays empty.

        Args:
            n: how many ids.
            ids: ids the caller chose (already validated), or None for the FIFO's.

        Returns:
            The ids, in the order they pair with pages.
        """
        if ids is None:
            ids, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        elif not self.lender:
            taken = set(ids)
            self.free_ids = [i for i in self.free_ids if i not in taken]
        return ids

    def bind(self, ids: list[int], pages: list[int]) -> None:
        """Bind ``ids[k]`` to ``pages[k]`` in this band's tables (``bind_pages``; docs/design.md §3).

        Args:
            ids: virtual ids, each unbound here.
            pages: physical pages of this band's grid, each free.
        """
        bind_pages(self.v2p, self.p2v, self.content, ids, pages)

    def unbind(self, ids: list[int]) -> list[int]:
        """Unbind ``ids``; their ids go to the back of the FIFO (a borrower's
        go back to nobody: its lender still holds them; docs/design.md §3).

        Args:
            ids: live virtual ids of this band.

        Returns:
            Their pages, in the order of ``ids``; the pages keep stale bytes.
        """
        pages = unbind_ids(self.v2p, self.p2v, ids)
        if not self.lender:
            self.free_ids.extend(ids)
        return pages

    def move(self, dst: list[int], src: list[int]) -> int:
        """Relocate live pages ``src[i] -> dst[i]``, all at once; returns
        the number of pages moved.

        Both lists are ascending and paired in that order (docs/design.md §4).
        A destination is free or another pair's source (``move_ok``, checked
        here and assumed by the integrity proofs, docs/design.md §7).

        Args:
            dst: destination pages, ascending.
            src: live source pages, ascending.

        Returns:
            Pages moved: ``len(src)``.
        """
        assert len(dst) == len(src)
        assert move_ok(self.p2v, dst, src)
        move_pages(self.v2p, self.p2v, self.content, dst, src)
        return len(src)

    def install(self, counts: Counts, holes: list[int]) -> None:
        """Take the span and live count that ``transitions`` computed, and
        the hole list the page logic left, which must agree with them.

        The counts come from the functions the proofs run (proofs about the
        code that runs, docs/design.md §7); the pages from the page logic.

        Args:
            counts: the band's new span, live pages and number of holes.
            holes: the band's holes, oldest first.
        """
        assert len(holes) == counts.holes, f"pool {self.name!r}: {len(holes)} holes, counts say {counts.holes}"
        self.lo, self.hi, self.live, self.holes = counts.lo, counts.hi, counts.live, list(holes)

    def live_span(self) -> tuple[int, int]:
        """``(lo, hi)``: the extent of the live pages, or the parked span (docs/design.md §3).

        Returns:
            The smallest span holding every live page; ``(num_pages,
                num_pages)`` when there is none.
        """
        live = self.occupied_pages()
        return (live[0], live[-1] + 1) if live else (self.geom.num_pages, self.geom.num_pages)

    # ----------------------------------------------------------- checks

    def check(self) -> None:
        """Raise ``AccountingError`` unless this band is self-consistent (docs/design.md §5, verify).

        It checks the bounds, the pinned sink, the live count, that no live
        page lies below ``min_page`` or outside the span, that ``v2p`` and
        ``p2v`` are inverse on live pages, the content model, the holes, a
        parked float, and the FIFO of free ids.

        Raises:
            AccountingError: a rule is broken; it names this pool and the rule.
        """
        g, name = self.geom, self.name

        def need(ok: bool, rule: str, detail: str = "") -> None:
            if not ok:
                raise AccountingError(name, rule, detail)

        need(g.min_page <= self.lo <= self.hi <= g.num_pages, "bounds", f"span [{self.lo}, {self.hi})")
        if self.grow == "up":
            need(self.lo == g.min_page, "bounds", "up END must start at min_page")
        if self.grow == "down":
            need(self.hi == g.num_pages, "bounds", "down END must end at num_pages")
        need(self.v2p[0] == 0 and self.p2v[0] == 0, "sink pinned", "page 0 must map to 0")
        live = [p for p in range(1, g.num_pages) if self.p2v[p] >= 0]
        reserved = set(self.reserved)
        need(
            len(live) + len(self.reserved) == self.live,
            "live count",
            f"{len(live)} bound{f' + {len(reserved)} reserved' if reserved else ''}, counter {self.live}",
        )
        need(
            len(reserved) == len(self.reserved)
            and all(g.min_page <= p and self.lo <= p < self.hi and self.p2v[p] < 0 for p in reserved)
            and not reserved & set(self.holes),
            "reserved pages",
            f"reserved {self.reserved} must be distinct, unbound, inside the span and not holes",
        )
        need(all(p >= g.min_page for p in live), "no page below min_page")
        need(all(self.lo <= p < self.hi for p in live), "live page outside span")
        id_lo, id_hi = self.id_range
        for p in live:
            v = self.p2v[p]
            need(id_lo <= v < id_hi and self.v2p[v] == p, "v2p/p2v inverse", f"page {p}")
            need(self.content.get(p) == v, "content", f"page {p} holds {self.content.get(p)}, not id {v}")
        bound_ids = [v for v in range(1, id_hi) if self.v2p[v] >= 0]
        need(len(bound_ids) == len(live), "v2p/p2v inverse", "stray v2p entries")
        need(len(set(self.holes)) == len(self.holes), "holes", "duplicate hole")
        need(
            all(self.lo <= h < self.hi and self.p2v[h] < 0 for h in self.holes),
            "holes",
            "a hole outside the span or live",
        )
        if self.is_end and not self.lazy:
            need(not self.holes, "eager band has no holes")
        if not self.is_end:
            need(
                self.opaque or self.lo == self.hi == g.num_pages, "parked float", "a float with no live page must park"
            )
        holes = set(self.holes)
        for p in range(g.num_pages):
            if self.pending[p] >= 0:  # the forward reads the bytes a move left here
                need(
                    p in holes and self.content.get(p) == self.pending[p],
                    "pending page untouched",
                    f"page {p} was vacated holding id {self.pending[p]}; an unsettled forward reads it",
                )
            if self.pinned[p] > 0:  # the forward writes here late: the id must not have moved
                need(
                    self.p2v[p] == self.pinned[p],
                    "pinned page kept",
                    f"page {p} held id {self.pinned[p]} at launch; an unsettled forward writes it",
                )
            elif self.pinned[p] == forward.FREED:
                need(p in holes, "pinned page kept", f"freed pinned page {p} must stay a hole until settle")
        expected = set() if self.lender else set(range(id_lo, id_hi)) - set(bound_ids)
        need(
            len(self.free_ids) == len(set(self.free_ids)) and set(self.free_ids) == expected,
            "free ids",
            "the FIFO must hold exactly the unbound ids",
        )
