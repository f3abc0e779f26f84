"""One pool's band on the device: span, page tables, holes, free-id queue.

Page tables are int64 tensors of ``num_pages + 1`` rows: row 0 pins the sink
(virtual 0 <-> physical 0) and the trailing row is a ``-1`` sentinel, so an
index of ``num_pages`` reads ``-1`` and, clamped, lands on the sink.

A band that borrows its ids (docs/design.md §3) has ``v2p`` rows for its
lender's ids and no free-id queue.

``lo``/``hi``/``live``/``holes`` are capacity-bearing ``CapField``s: host
ints (reading capacity never syncs) and an ordered hole tensor (oldest
first) that is always rebound, never written in place.  Each rebind bumps
the band's ``epoch`` and the arena's shared ``clock``.

An in-flight forward's guards (docs/design.md §12) live in one table per
band, ``guard``, made at the first launch or move that needs it and
dropped at ``settle`` (so a band with nothing guarded holds none): by
physical page, ``-1`` for nothing, ``>= 0`` pinned (the id the page held at
launch, ``FREED`` once that id is freed), ``<= -2`` pending (the id ``v``
whose bytes a move left there, as ``-2 - v``); ``num_pages + 1`` rows, as
``p2v``, of which row 0 (the sink's page, never guarded) is where a launch
writes the ids it skips, and is never read.  A page is never both: a
pinned page is live or a freed hole, a pending page a vacated hole, and
neither is ever a move's source or destination.  ``g_lo <= guarded holes
<= g_hi`` are host bounds on how many holes are guarded, exact wherever the
arena read them (``Arena._guarded_holes``).

Pages reserved for a host transfer's load (docs/design.md §13) are
``reserved``, a ``CapField`` tensor of physical pages in reservation
order: live (counted in ``live``), owned by no id (``p2v`` reads ``-1``),
never holes.  While any band holds one the arena holds every move, so
no move ever reads or writes a reserved page.
"""

from typing import NamedTuple, cast

import torch

from kvarena.spec.geometry import Geometry, SubPool

from .memo import CapField, Clock

I64 = torch.int64
FREED = 0  # a pin whose launch id has been freed: the late write still lands there


def live_once(ids: torch.Tensor, live: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``live`` ids of ``ids`` ascending and once each (docs/design.md §6, ``free_swa``).

    Sync-free: sort with dead ids keyed ``end`` (past every id), key a
    repeat past the end too, sort again.

    Args:
        ids: int64 ids.
        live: which of them are live (bool, their shape).
        end: one past the last id.

    Returns:
        The keys (the live ids, then ``end`` keys) and their count (a
        one-entry tensor, ready to read).
    """
    key = torch.sort(torch.where(live, ids, end)).values
    rest = key[1:]
    rest.masked_fill_(rest == key[:-1], end)  # a repeat keyed past the end (sort's own tensor)
    key = torch.sort(key).values
    return key, (key < end).sum(0, keepdim=True)


class BandCounts(NamedTuple):
    """A band's counts on the host, as ``Arena.counts`` hands them out: a
    copy, so whoever reads it cannot write the band.  In pages of the
    band's own grid (spans and rooms: docs/design.md §3, §5)."""

    lo: int  # the span [lo, hi)
    hi: int
    live: int
    holes: int  # how many
    opaque: bool  # an END, or a float with a live page
    index_room: int  # grid pages not bound
    span_room: int  # grid pages outside the span: how far an END may still extend


class FreeIds:
    """FIFO of unbound virtual ids as a device ring; head/count on the host (docs/design.md §3).

    Args:
        first: the first id the pool owns (its ``min_page``).
        end: one past the last id (its ``num_pages``).
        device: where the ring lives.
    """

    def __init__(self, first: int, end: int, device: torch.device) -> None:
        self.cap = end - first
        self.buf = torch.arange(first, end, dtype=I64, device=device)
        self.head, self.count = 0, self.cap

    def _slots(self, start: int, n: int) -> torch.Tensor:
        return (torch.arange(n, dtype=I64, device=self.buf.device) + start) % self.cap

    def tail_slots(self, n: int) -> torch.Tensor:
        """The ``n`` slots ``put`` writes next (outside the queue; the journal keeps them, docs/design.md §9c).

        Args:
            n: how many slots.

        Returns:
            Their ring indices, int64.
        """
        return self._slots(self.head + self.count, n)

    def state(self) -> tuple[torch.Tensor, int, int]:
        """What ``restore`` needs (docs/design.md §9c).

        Returns:
            The buffer (rebound, never rewritten, where the queue's order
            changes), head and count.
        """
        return self.buf, self.head, self.count

    def restore(self, state: tuple[torch.Tensor, int, int]) -> None:
        """Put the ring back as ``state`` found it, on a failed scope (docs/design.md §9c).

        Args:
            state: what ``state()`` returned.
        """
        self.buf, self.head, self.count = state

    def advance(self, n: int) -> int:
        """Pop the ``n`` oldest ids without reading them: a fused bind reads
        them from the ring itself (``impl/kernels.py``; docs/design.md §14).

        Args:
            n: how many ids; at most ``count``.

        Returns:
            The ring index of the first.
        """
        head = self.head
        self.head, self.count = (self.head + n) % self.cap, self.count - n
        return head

    def claim(self, k: int) -> int:
        """Count ``k`` ids in at the back, which a fused free writes into the
        ring itself (docs/design.md §14); as ``put`` but for the writes.

        Args:
            k: how many ids.

        Returns:
            The ring index of the first slot.
        """
        tail = (self.head + self.count) % self.cap
        self.count += k
        return tail

    def take(self, n: int) -> torch.Tensor:
        """Pop the ``n`` oldest ids: ids go out FIFO (docs/design.md §3).

        Args:
            n: how many ids; at most ``count``.

        Returns:
            The ids, int64, in a fresh tensor.
        """
        if self.head + n <= self.cap:  # no wrap: one copy of a slice, not an index gather
            out = self.buf[self.head : self.head + n].clone()
        else:
            out = self.buf.index_select(0, self._slots(self.head, n))
        self.head, self.count = (self.head + n) % self.cap, self.count - n
        return out

    def put(self, ids: torch.Tensor) -> None:
        """Append ids at the back: freed ids queue last (docs/design.md §3).

        No host sync: the length is a shape.

        Args:
            ids: int64 ids, not in the queue.
        """
        k = ids.numel()
        self.buf.index_copy_(0, self.tail_slots(k), ids)
        self.count += k

    def queue(self) -> torch.Tensor:
        """The queued ids, front first (docs/design.md §3).

        Returns:
            A fresh int64 tensor of ``count`` ids.
        """
        return self.buf.index_select(0, self._slots(self.head, self.count))

    def remove(self, ids: torch.Tensor) -> None:
        """Drop borrowed ``ids`` (all queued), keeping the others' order (docs/design.md §3).

        A stable sort on the "drop" flag moves the kept ids to the front, so
        no mask indexing is needed; the kept count is known on the host.

        Args:
            ids: int64 ids, each in the queue once.
        """
        q = self.queue()
        drop = torch.isin(q, ids).to(torch.int8)
        order = torch.sort(drop, stable=True).indices
        keep = self.count - ids.numel()
        buf = self.buf.clone()  # a new ring: an undo restores the old one (impl/journal.py)
        buf[:keep] = q.index_select(0, order[:keep])
        self.buf, self.head, self.count = buf, 0, keep


class Band:
    """One pool's band: its span, page tables, holes and free-id queue (docs/design.md §3).

    Args:
        pool: the pool.
        geom: its grid.
        lazy: whether an END pool frees lazily (leaves holes).
        device: where the tables live.
        lender: the pool whose ids it borrows, or None.
        lender_geom: the lender's grid, when it borrows: its tables cover the lender's ids.
    """

    lo = CapField[int]()
    hi = CapField[int]()
    live = CapField[int]()
    holes = CapField[torch.Tensor]()  # int64 tensor of physical pages, oldest first
    reserved = CapField[torch.Tensor]()  # int64 tensor of physical pages reserved for a load, in order

    def __init__(
        self,
        pool: SubPool,
        geom: Geometry,
        lazy: bool,
        device: torch.device,
        lender: str | None = None,
        lender_geom: Geometry | None = None,
    ) -> None:
        self.pool, self.geom, self.lazy, self.device = pool, geom, lazy, device
        self.name, self.grow = pool.name, pool.grow
        self.lender = lender
        self.epoch = 0
        self.clock: Clock | None = None  # the arena-wide Clock, attached by the arena's memo (impl/memo.py)
        n = geom.num_pages
        ids = lender_geom or geom
        self.id_range = (ids.min_page, ids.num_pages)
        self.v2p = torch.full((ids.num_pages + 1,), -1, dtype=I64, device=device)  # last row: sentinel
        self.p2v = torch.full((n + 1,), -1, dtype=I64, device=device)
        self.v2p[0] = 0
        self.p2v[0] = 0
        self.free_ids = None if lender else FreeIds(ids.min_page, ids.num_pages, device)
        self.holes = torch.empty(0, dtype=I64, device=device)
        self._reserve, self._mark = self.holes, 0  # where append_holes writes: see there
        self.reserved = torch.empty(0, dtype=I64, device=device)  # host transfers' loads (docstring above)
        self.live = 0
        self.guard: torch.Tensor | None = None  # an in-flight forward's pins and pending pages (docstring above)
        self.g_lo = self.g_hi = 0  # bounds on how many holes are guarded
        start = geom.min_page if self.grow == "up" else n  # down END, parked float
        self.lo = self.hi = start

    @property
    def is_end(self) -> bool:
        """Whether the pool is an END (grows up or down), not a float (docs/design.md §3)."""
        return self.grow != "float"

    @property
    def opaque(self) -> bool:
        """An END, or a float with a live page; a transparent float is absent from walks (docs/design.md §3)."""
        return self.is_end or self.live > 0

    @property
    def n_holes(self) -> int:
        """How many holes, read from a shape: no host sync (docs/design.md §8)."""
        return self.holes.numel()  # a shape: no sync

    @property
    def index_room(self) -> int:
        """Grid pages not bound: the index space left (docs/design.md §4, §5)."""
        return self.geom.num_pages - self.geom.min_page - self.live

    @property
    def span_room(self) -> int:
        """Grid pages outside the span: how far an END may still extend (docs/design.md §5)."""
        return self.geom.num_pages - self.geom.min_page - (self.hi - self.lo)

    @property
    def counts(self) -> BandCounts:
        """The host counts, a copy (docs/design.md §3, §5)."""
        return BandCounts(self.lo, self.hi, self.live, self.n_holes, self.opaque, self.index_room, self.span_room)

    @property
    def frontiers(self) -> tuple[int, int]:
        """``(low, high)`` frontiers in bytes, from the span (docs/design.md §3)."""
        return self.lo * self.geom.epp, self.hi * self.geom.epp

    def pages(self, start: int, stop: int) -> torch.Tensor:
        """Physical pages ``[start, stop)`` of this band's grid (docs/design.md §3).

        Args:
            start: the first page.
            stop: one past the last page.

        Returns:
            The pages, int64, on the band's device.
        """
        return torch.arange(start, stop, dtype=I64, device=self.device)

    @property
    def id_end(self) -> int:
        """One past the last id: the index of ``v2p``'s sentinel row (docs/design.md §3)."""
        return self.id_range[1]

    def queued_ids(self) -> torch.Tensor:
        """The free-id queue, front first (docs/design.md §3).

        Returns:
            The queued ids, int64; empty for a borrower.
        """
        if self.free_ids is None:
            return torch.empty(0, dtype=I64, device=self.device)
        return self.free_ids.queue()

    @property
    def n_reserved(self) -> int:
        """How many pages are reserved, read from a shape: no host sync (docs/design.md §13)."""
        return self.reserved.numel()

    def occupied_mask(self) -> torch.Tensor:
        """Which grid pages ``[min_page, num_pages)`` hold live data: the bound
        ones and the reserved ones (docs/design.md §3, §13).

        Returns:
            A bool tensor, one row per page from ``min_page``.
        """
        g = self.geom
        held = self.p2v[g.min_page : g.num_pages] >= 0
        if self.n_reserved:  # live too, though no id owns them yet
            held = held.index_fill(0, self.reserved - g.min_page, True)
        return held

    def occupied_pages(self) -> torch.Tensor:
        """Live physical pages, ascending: the bound and the reserved ones
        (docs/design.md §3, §13).

        Host sync (nonzero): only the cold paths that compute move sets
        (flush, make_room, compact) call it (docs/design.md §8).

        Returns:
            The pages, int64.
        """
        return torch.nonzero(self.occupied_mask()).flatten() + self.geom.min_page

    def append_holes(self, pages: torch.Tensor) -> None:
        """Queue freed ``pages`` behind the holes: reuse goes oldest first (docs/design.md §4).

        The holes are a view of a reserve.  While they end at the reserve's
        high-water mark and it has room, the new pages are copied in behind
        them, so a free copies its own pages, not every hole; else they and
        the pages go to a fresh reserve of twice their size or the grid's
        page count, whichever is larger (so a steady free-and-reuse cycle
        refreshes once every page count's worth of frees).  Nothing is ever
        written below a mark, so a view taken earlier (a bind's pages, the
        holes a journal saved) keeps its values.  No host sync: offsets and
        lengths are shapes.

        Args:
            pages: int64 physical pages, not holes.
        """
        self.hole_run(pages.numel()).copy_(pages)

    def hole_run(self, m: int) -> torch.Tensor:
        """Make room for ``m`` holes behind the others and count them in: the
        reserve's run they go to, for the caller to write at once
        (``append_holes``; a fused free writes it itself, docs/design.md §14).

        Args:
            m: how many pages.

        Returns:
            A view of the ``m`` reserve slots now at the end of ``holes``.
        """
        h, res = self.holes, self._reserve
        n = h.numel()
        start = cast(int, h.storage_offset())  # a shape, never a SymInt here
        if h._base is not res or start + n != self._mark or self._mark + m > res.numel():
            res = torch.empty(max(2 * (n + m), self.geom.num_pages), dtype=I64, device=self.device)
            res[:n].copy_(h)
            self._reserve, start = res, 0
        self._mark = start + n + m
        self.holes = res[start : self._mark]
        return res[start + n : self._mark]

    def park(self) -> None:
        """Park a float: empty span at ``num_pages``, no holes (docs/design.md §3, §4)."""
        self.lo = self.hi = self.geom.num_pages
        self.holes = self.holes[:0]
