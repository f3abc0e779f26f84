"""An in-flight forward: what the arena may not touch until it settles.

docs/design.md §12.  An engine that overlaps scheduling with the forward
(SGLang's default) prepares batch N+1 while batch N still runs.  The
forward was launched with physical slots translated at launch time, so
until its done event has fired:

- **pinned** pages: the pages its write set held at launch.  The forward
  writes them late, at the old location: a move that reads one copies stale
  bytes (the write race).  A pinned page never moves; one whose id is freed
  stays a hole of its band until settle.
- **pending** pages: pages a move vacated.  The forward still reads the old
  location of every page it reads: a write there (a move's destination, or
  a hand-out that zeroes or fills it) corrupts that read (the read race).
  A pending page is a hole that waits.

A page freed by the engine is *not* pending: its request's output is
discarded (the engine's contract, as SGLang's), so nothing that is kept
reads it.  A pinned page that is freed keeps its pin: the late write still
lands there.

``settle`` (the stream wait on the done event) lifts both.  The arena's
rule (``Arena``) is SGLang's: an operation on the urgent path settles
first, once, when it would move a page, hand out a guarded hole or drop one
from its band; the non-urgent flush never waits (it stops at a pinned
survivor and leaves guarded pages where they are).  A copy of live pages to
the host (retraction to host) is a reader outside the forward: it settles
first, and changes nothing here.

The functions here read and write a band's tables by index only, so they
run on lists in the arena and on z3 arrays in ``kvarena.proofs.inflight``.
``pinned[p]`` is the id the page held at launch (``0``: freed since launch;
``-1``: not pinned); ``pending[p]`` is the id whose bytes a move left there
(``-1``: not pending).
"""

from collections.abc import Sequence
from typing import Protocol

from .arith import and_, ite, or_

FREED = 0  # pinned[p] once its launch id is freed: still written, no longer bound


class Table(Protocol):
    """What the functions here need of a table: read and write by index (docs/design.md §12)."""

    def __getitem__(self, k: int, /) -> int: ...
    def __setitem__(self, k: int, v: int, /) -> None: ...


def pin(v2p: Table, pinned: Table, ids: Sequence[int]) -> None:
    """Pin the pages that ``ids`` hold now (docs/design.md §12, pinned).

    Args:
        v2p: the band's virtual-to-physical table.
        pinned: the band's pins, written at each id's page.
        ids: live virtual ids the forward writes.
    """
    for v in ids:
        pinned[v2p[v]] = v


def release(pinned: Table, pages: Sequence[int]) -> None:
    """Mark pinned pages whose ids were just freed (docs/design.md §12): the
    late write still lands there, so they stay pinned, as ``FREED``.

    Args:
        pinned: the band's pins.
        pages: the pages the free unbound.
    """
    for p in pages:
        pinned[p] = ite(pinned[p] >= 0, FREED, pinned[p])


def vacate(pending: Table, content: Table, src: Sequence[int]) -> None:
    """A move while a forward is in flight: its sources wait (docs/design.md
    §12, pending).  Each keeps the id whose bytes the forward may still
    read; call it before the move, while ``content`` holds them.

    Args:
        pending: the band's pending pages, written at each source.
        content: the content model.
        src: the move's sources.
    """
    for s in src:
        pending[s] = content[s]


def guarded(pinned: Table, pending: Table, p: int) -> bool:
    """Whether page ``p`` is pinned or pending (docs/design.md §12).

    Args:
        pinned: the band's pins.
        pending: the band's pending pages.
        p: a physical page.

    Returns:
        True when the forward writes or reads ``p``.
    """
    return or_(pinned[p] >= 0, pending[p] >= 0)


def move_clear(pinned: Table, pending: Table, dst: Sequence[int], src: Sequence[int]) -> bool:
    """A move that an unsettled forward allows (docs/design.md §12): it reads
    no pinned page (the write race) and writes no guarded page (a pending
    page is read; a pinned one is written late).

    Args:
        pinned: the band's pins.
        pending: the band's pending pages.
        dst: the move's destinations.
        src: its sources.

    Returns:
        True when the move races with nothing.
    """
    return and_(*[pinned[s] < 0 for s in src], *[pinned[d] < 0 for d in dst], *[pending[d] < 0 for d in dst])


def bind_clear(pinned: Table, pending: Table, pages: Sequence[int]) -> bool:
    """A hand-out that an unsettled forward allows (docs/design.md §12): no
    page bound is guarded (binding writes it: zeroed, then filled).

    Args:
        pinned: the band's pins.
        pending: the band's pending pages.
        pages: the pages to bind.

    Returns:
        True when no page is pinned or pending.
    """
    return and_(*[pinned[p] < 0 for p in pages], *[pending[p] < 0 for p in pages])
