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
"""

from typing import NamedTuple

import torch

from kvarena.spec.geometry import Geometry, SubPool

from .memo import CapField, Clock

I64 = torch.int64


class BandCounts(NamedTuple):
    """A band's counts on the host, as ``Arena.counts`` hands them out: a
    copy, so whoever reads it cannot write the band.  In pages of the
    band's own grid."""

    lo: int  # the span [lo, hi)
    hi: int
    live: int
    holes: int  # how many
    opaque: bool  # an END, or a float with a live page
    index_room: int  # grid pages not bound
    span_room: int  # grid pages outside the span: how far an END may still extend


class FreeIds:
    """FIFO of unbound virtual ids as a device ring; head/count on the host."""

    def __init__(self, first: int, end: int, device: torch.device) -> None:
        self.cap = end - first
        self.buf = torch.arange(first, end, dtype=I64, device=device)
        self.head, self.count = 0, self.cap

    def _slots(self, start: int, n: int) -> torch.Tensor:
        return (torch.arange(n, dtype=I64, device=self.buf.device) + start) % self.cap

    def tail_slots(self, n: int) -> torch.Tensor:
        """The ``n`` slots ``put`` writes next (outside the queue)."""
        return self._slots(self.head + self.count, n)

    def state(self) -> tuple[torch.Tensor, int, int]:
        """What ``restore`` needs: the buffer (rebound, never rewritten,
        where the queue's order changes) and head and count."""
        return self.buf, self.head, self.count

    def restore(self, state: tuple[torch.Tensor, int, int]) -> None:
        self.buf, self.head, self.count = state

    def take(self, n: int) -> torch.Tensor:
        """Pop the ``n`` oldest ids (a fresh tensor)."""
        if self.head + n <= self.cap:  # no wrap: one copy of a slice, not an index gather
            out = self.buf[self.head : self.head + n].clone()
        else:
            out = self.buf.index_select(0, self._slots(self.head, n))
        self.head, self.count = (self.head + n) % self.cap, self.count - n
        return out

    def put(self, ids: torch.Tensor) -> None:
        """Append ids at the back (no host sync: the length is a shape)."""
        k = ids.numel()
        self.buf.index_copy_(0, self.tail_slots(k), ids)
        self.count += k

    def queue(self) -> torch.Tensor:
        return self.buf.index_select(0, self._slots(self.head, self.count))

    def remove(self, ids: torch.Tensor) -> None:
        """Drop borrowed ``ids`` (all queued), keeping the others' order.

        A stable sort on the "drop" flag moves the kept ids to the front, so
        no mask indexing is needed; the kept count is known on the host.
        """
        q = self.queue()
        drop = torch.isin(q, ids).to(torch.int8)
        order = torch.sort(drop, stable=True).indices
        keep = self.count - ids.numel()
        buf = self.buf.clone()  # a new ring: an undo restores the old one (impl/journal.py)
        buf[:keep] = q.index_select(0, order[:keep])
        self.buf, self.head, self.count = buf, 0, keep


class Band:
    lo = CapField[int]()
    hi = CapField[int]()
    live = CapField[int]()
    holes = CapField[torch.Tensor]()  # int64 tensor of physical pages, oldest first

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
        self.live = 0
        start = geom.min_page if self.grow == "up" else n  # down END, parked float
        self.lo = self.hi = start

    @property
    def is_end(self) -> bool:
        return self.grow != "float"

    @property
    def opaque(self) -> bool:
        return self.is_end or self.live > 0

    @property
    def n_holes(self) -> int:
        return self.holes.numel()  # a shape: no sync

    @property
    def index_room(self) -> int:
        return self.geom.num_pages - self.geom.min_page - self.live

    @property
    def span_room(self) -> int:
        """Grid pages outside the span: how far an END may still extend."""
        return self.geom.num_pages - self.geom.min_page - (self.hi - self.lo)

    @property
    def counts(self) -> BandCounts:
        return BandCounts(self.lo, self.hi, self.live, self.n_holes, self.opaque, self.index_room, self.span_room)

    @property
    def frontiers(self) -> tuple[int, int]:
        return self.lo * self.geom.epp, self.hi * self.geom.epp

    def pages(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, dtype=I64, device=self.device)

    @property
    def id_end(self) -> int:
        """One past the last id: the index of ``v2p``'s sentinel row."""
        return self.id_range[1]

    def queued_ids(self) -> torch.Tensor:
        """The free-id queue, front first (empty for a borrower)."""
        if self.free_ids is None:
            return torch.empty(0, dtype=I64, device=self.device)
        return self.free_ids.queue()

    def occupied_pages(self) -> torch.Tensor:
        """Live physical pages, ascending.  Host sync (nonzero): only the cold
        paths that compute move sets (flush, make_room, compact) call it."""
        g = self.geom
        return torch.nonzero(self.p2v[g.min_page : g.num_pages] >= 0).flatten() + g.min_page

    def park(self) -> None:
        self.lo = self.hi = self.geom.num_pages
        self.holes = self.holes[:0]
