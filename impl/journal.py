"""All or nothing: the undo journal of one arena scope (the fault rule, docs/design.md §9c).

A torch operation may raise: an allocation fails, a device error surfaces,
an engine's mover raises.  Every arena call that changes state runs in one
scope (``Arena.atomic``; calls made inside an open scope join it), and a
scope that raises leaves the arena exactly as it found it:

1. **Host fields** (each band's span, live count, hole list, reserved
   pages, and its free-id ring's head, count and buffer) are restored from
   a snapshot taken when the scope opened.  Hole lists, reserved pages and
   rebuilt rings are rebound, never written in place, so the snapshot's
   references still hold the old values.
2. **Tables** (``v2p``, ``p2v``) are written in place, since an engine may
   hold them.  Before each write the arena records an entry that puts the
   rows it touches back; entries run last first, so the rows end as the
   scope found them.
3. **Bytes**: once a relocation's bytes are written the arena records its
   reverse copy (destination back to source).  Run last first, the reverses
   put every live page's bytes back at the page the restored tables name.
   A move that overwrites its own sources (a shift) and fails midway
   reverses its finished chunks itself before it raises.  Once the scope
   has freed a page, that page's bytes are live again after an undo, so
   from then on every move and ``write_pages`` keeps the bytes of the pages
   it writes, to put back after the reverses (eager compaction overwrites
   the pages it has just freed).
4. **The free-id ring**: ids are appended into slots outside the queue,
   which a restored count frees again, unless this scope took ids from the
   same ring first: then the slots' old ids are kept and put back.
5. **An in-flight forward** (docs/design.md §12): before a scope first
   changes the arena's ``in_flight`` flag, a band's guard table reference
   or its guarded-hole bounds, the arena records them (``flight``: once a
   scope); a guard table written in place records its rows as rule 2 does.
6. **The move gate** (docs/design.md §13): a scope that opens or closes it
   records the old state (reserved pages are a host field: rule 1).

The fault model: one operation raises, before it runs; the undo runs after
it (a device that keeps failing leaves nothing to recover; on CUDA a sticky
error ends the context).  ``tests/impl/test_faults.py`` sweeps it: every
operation of every moving call is made to raise in turn.
"""

from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .band import Band, FreeIds


class Journal:
    """The undo log of one open scope (docs/design.md §9c).

    Args:
        bands: the arena's bands, whose host fields are snapshotted now (rule 1).
    """

    __slots__ = ("flight", "freed", "saved", "taken", "undo")

    def __init__(self, bands: "Iterable[Band]") -> None:
        self.saved = [
            (b, b.lo, b.hi, b.live, b.holes, b.reserved, None if b.free_ids is None else b.free_ids.state())
            for b in bands
        ]
        self.undo: list[Callable[[], object]] = []
        # id() of the rings this scope took ids from: sound, as each ring is a band's, made once,
        # and ``saved`` holds each band alive for the scope, so no id is reused within it
        self.taken: set[int] = set()
        self.freed = False  # whether this scope freed a page (rule 3)
        self.flight = False  # whether the in-flight state is recorded (rule 5)

    def on_undo(self, f: Callable[..., object], *args: object) -> None:
        """Record ``f(*args)``, to run if the scope fails (docs/design.md §9c).

        Args:
            f: the undo step, e.g. a table's ``index_copy_``.
            *args: its arguments, bound now.
        """
        self.undo.append(partial(f, *args))

    def keep_rows(self, rows: "torch.Tensor", pages: "torch.Tensor") -> None:
        """Before ``rows[pages]`` is written: once this scope has freed a
        page, keep what they hold, to put back (rule 3, docs/design.md §9c).

        Args:
            rows: a pool's pages as rows of the byte buffer.
            pages: the row indices about to be written.
        """
        if self.freed:
            self.on_undo(rows.index_copy_, 0, pages, rows.index_select(0, pages))

    def took(self, ring: "FreeIds") -> None:
        """Note that this scope took ids from ``ring`` (rule 4, docs/design.md §9c).

        Args:
            ring: the free-id ring taken from.
        """
        self.taken.add(id(ring))

    def appending(self, ring: "FreeIds", k: int) -> None:
        """Before ``ring.put`` of ``k`` ids: keep the slots' ids if a take
        in this scope may have left its ids there (rule 4, docs/design.md §9c).

        Args:
            ring: the free-id ring about to be appended to.
            k: how many ids will be appended.
        """
        if id(ring) in self.taken:
            slots = ring.tail_slots(k)
            self.on_undo(ring.buf.index_copy_, 0, slots, ring.buf.index_select(0, slots))

    def rollback(self) -> None:
        """Run the entries last first, then restore the host fields (only
        those that changed: an undone no-op leaves every epoch alone; docs/design.md §9c)."""
        for f in reversed(self.undo):
            f()
        for b, lo, hi, live, holes, reserved, ring in self.saved:
            if b.lo != lo:
                b.lo = lo
            if b.hi != hi:
                b.hi = hi
            if b.live != live:
                b.live = live
            if b.holes is not holes:
                b.holes = holes
            if b.reserved is not reserved:
                b.reserved = reserved
            if ring is not None and b.free_ids is not None:
                b.free_ids.restore(ring)
