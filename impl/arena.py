"""The production arena on torch: one byte buffer, bands on one chain (docs/design.md §3, §4, §10).

Same behaviour as ``kvarena.spec.Arena`` page for page (the differential
tests hold the two equal), written independently over tensors.  From the
spec it imports ``geometry``'s boot-time layout and validation (docs/design.md
§2) and ``planner``'s decision, which ``plan_floats`` calls on this
arena's host counters (the names: ``kvarena.impl``'s docstring); every
other per-operation step is here.

The composites (``impl/composites.py``) use only this class's public
methods: ``counts`` (a band's host counts, a copy), ``id_end`` and
``v2p_at`` (reads of a table into a new tensor), ``bind_with_borrowers``
(a coupled bind their joint gate has priced) and ``new_memo`` (a memo on
this arena's clock); nothing they are handed writes the arena.

Host syncs.  Counters (span ends, live, hole counts) live on the host, so
the capacity gate and ``alloc`` without borrowed ids never wait on the
device.  ``free(check=False)``, ``bind_with_borrowers``, ``v2p_at`` and
``translate`` on a tensor are sync-free (``tests/impl/test_host_sync.py``
scans them).  The remaining syncs are marked ``# SYNC:`` where they happen:
id validation, and the cold paths (flush, make_room, compact_holes, refit)
that compute move sets from the tables.

In-flight forwards (docs/design.md §12).  ``in_flight`` is a host flag and
each band's pins and pending pages one device table (``impl/band.py``), so
with nothing in flight every path above is as it was, and ``launch`` is
device work only (a scatter of the pinned pages).  While one is in flight
the decode path stays sync-free too: ``free(check=False)`` marks the
freed pins with three device operations, and ``alloc`` decides whether it
must settle (the spec's ``transitions.alloc_settles``) from host bounds on
its band's guarded holes.  The bounds are exact except for holes that
``free(check=False)`` made in this flight, whose pins only the device
knows; an allocation that reaches into them reads their count once
(``_guarded_holes``, ``# SYNC:``), and so does a float whose last page is
freed while something of it is guarded (it settles if a hole or a freed
page is guarded).  A settle (each ``settle``, and every urgent settle) makes
the bounds exact again; ``free(check=True)`` and the non-urgent flush count
exactly as they go.

Host transfers (docs/design.md §13).  ``closed_gates`` (the sources that
hold the gate closed: HiCache's host transfers, PD's KV transfers) is a
capacity field of the arena itself (a ``CapField``: closing or opening a gate ticks the
memo's clock, since an END's schedulable view credits no hole while moves
are held), and each band's ``reserved`` pages one more.  While moves are
held (``moves_held``) a flush only absorbs, and a slide, pack or plan that
would move a page does nothing; everything else is as it was.
"""

import functools
import itertools
import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, SupportsIndex, TypeVar, cast

import torch
from torch.utils.dlpack import from_dlpack

from kvarena.spec.arena import GATES
from kvarena.spec.evict import MAX_EVICT_ROUNDS, evicted
from kvarena.spec.geometry import AccountingError, Geometry, SubPool, borrowing, check_policy, lazy_ends, make_layout
from kvarena.spec.planner import End, Float, move_order, plan_chain

from . import capacity as cap
from . import kernels as launches
from .band import FREED, I64, Band, BandCounts, live_once
from .journal import Journal
from .memo import CapField, Clock, Memo

Ids = torch.Tensor | Iterable[int]  # virtual ids: a tensor, or a host sequence of ints

SIDES = ("low", "high")
VIEWS = ("available_pages", "schedulable_pages", "gap_bytes")


Mover = Callable[[str, torch.Tensor, torch.Tensor], object]
"""``mover(pool, dst_pages, src_pages)`` copies whole page envelopes of
``pool``'s grid, ``src_pages[i] -> dst_pages[i]`` (int64 physical pages).
Apart from self-pairs ``(p, p)``, which a copy leaves as they are, the two
sets are disjoint and no page repeats.  The arena updates its tables itself."""


WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}  # a move's element, by width
TEMP_BYTES = {"cpu": 4 << 20, "cuda": 64 << 20}  # a gather's temporary, at most (others: cuda's)


@dataclass(frozen=True)
class SrcRun:
    """``_move``'s ``disjoint`` when the caller knows, without reading the
    device, that the sets are disjoint (but for self-pairs) and that the
    sources are the ascending pages ``start, start + 1, ...``: the copy then
    reads them as one slice, in one pass and sync-free (docs/design.md §8).
    Always truthy."""

    start: int


def _alias(rows: torch.Tensor) -> torch.Tensor:
    """``rows``' memory through a storage torch does not tie to theirs.

    torch refuses a gather or scatter whose source shares the written
    tensor's storage even when the rows touched are disjoint (it compares
    extents, not rows).  A move reads through this alias only where no row
    it writes is a row another pair reads (``Arena._copy_pages``)."""
    return from_dlpack(rows)


def _copy_in_chunks(
    rows: torch.Tensor, dst: torch.Tensor, src: torch.Tensor, ascending: bool = True, shift: bool = False
) -> None:
    """``rows[dst[i]] = rows[src[i]]`` through a temporary of at most
    ``TEMP_BYTES``, reused chunk after chunk: a temporary as large as the
    move costs a fresh allocation's page faults on the CPU (it halved the
    bandwidth) and a second move's worth of memory on a GPU.  Chunks run
    in index order, or in reverse when ``ascending`` is False; each chunk's
    sources are all read before any of its destinations is written.

    A ``shift`` (every page moving one way, the chunks ordered so none
    overwrites a source still to be read) that raises midway copies its
    finished chunks back, in the opposite order, before the exception
    leaves: the sources are whole again (``impl/journal.py``, rule 3)."""
    k = src.numel()
    per = max(1, TEMP_BYTES.get(rows.device.type, TEMP_BYTES["cuda"]) // max(1, rows.shape[1] * rows.element_size()))
    tmp = rows.new_empty((min(per, k), rows.shape[1]))
    starts = range(0, k, per)
    done = (0, 0)  # the pairs [a, b) copied so far: a prefix, or a suffix when descending
    try:
        for i in starts if ascending else reversed(starts):  # chunks of TEMP_BYTES, not pages
            n = min(per, k - i)
            torch.index_select(rows, 0, src[i : i + n], out=tmp[:n])
            rows.index_copy_(0, dst[i : i + n], tmp[:n])
            done = (0, i + n) if ascending else (i, k)
    except BaseException:
        a, b = done
        if shift and b > a:
            _copy_in_chunks(rows, src[a:b], dst[a:b], not ascending)
        raise


class Scope:
    """``Arena.atomic()``: a block of arena calls that is all or nothing (docs/design.md §9c).

    The outermost scope keeps the journal (``impl/journal.py``); one opened
    inside it joins it.  On a raise the outermost undoes the whole block,
    then lets the exception go on.

    Args:
        arena: the arena the block changes.
    """

    __slots__ = ("arena", "journal")

    def __init__(self, arena: "Arena") -> None:
        self.arena = arena
        self.journal: Journal | None = None

    def __enter__(self) -> None:
        if self.arena._journal is None:
            self.journal = self.arena._journal = Journal(self.arena._order)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        journal = self.journal
        if journal is not None:
            self.journal = self.arena._journal = None
            if kind is not None:
                journal.rollback()


F = TypeVar("F", bound=Callable[..., Any])


def _all_or_nothing(method: F) -> F:
    """An arena method that runs in a scope (``Arena.atomic``)."""

    @functools.wraps(method)
    def run(arena: "Arena", *args: Any, **kwargs: Any) -> Any:
        if arena._journal is not None:  # inside an open scope: it joins it (the step's nested calls)
            return method(arena, *args, **kwargs)
        with Scope(arena):
            return method(arena, *args, **kwargs)

    return cast(F, run)


def _unbind(b: Band, ids: torch.Tensor, pages: torch.Tensor) -> None:
    """A bind's undo: the rows it writes were unbound."""
    b.v2p.index_fill_(0, ids, -1)
    b.p2v.index_fill_(0, pages, -1)


def _rebind(b: Band, ids: torch.Tensor, pages: torch.Tensor) -> None:
    """A free's undo: ``ids`` back on ``pages``."""
    b.v2p.index_copy_(0, ids, pages)
    b.p2v.index_copy_(0, pages, ids)


def _packed(pages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``pages[mask]`` first, in their order, then the rest: a selection
    with no host read (the caller reads how many with its plan)."""
    return pages.index_select(0, torch.argsort((~mask).to(torch.int8), stable=True))


def _unmove_rows(b: Band, dst: torch.Tensor, src: torch.Tensor, v: torch.Tensor, alive: torch.Tensor) -> None:
    """A move's table undo.  Every destination was free or a source, so
    clearing them and then putting each source's id ``v`` back restores
    ``p2v``; the live ids point at their sources again (a dead pair's row
    is the ``-1`` sentinel's)."""
    b.p2v.index_fill_(0, dst, -1)
    b.p2v.index_copy_(0, src, v)
    b.v2p.index_copy_(0, torch.where(alive, v, b.id_end), torch.where(alive, src, -1))


def _restore_flight(arena: "Arena", in_flight: bool, bands: list[tuple[Band, torch.Tensor | None, int, int]]) -> None:
    """The in-flight state's undo (``impl/journal.py``, rule 5): the flag,
    and each band's guard table reference and guarded-hole bounds."""
    arena.in_flight = in_flight
    for b, guard, lo, hi in bands:
        b.guard, b.g_lo, b.g_hi = guard, lo, hi


def _swap_back(rows: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    """A whole gather-and-scatter move's reverse."""
    rows.index_copy_(0, src, rows.index_select(0, dst))


_choose_kernels = launches.choose


def _check_buffer(buffer: object, total_bytes: int, device: str | torch.device) -> None:
    """An external buffer must be the arena's whole byte range on its device."""
    if not isinstance(buffer, torch.Tensor):
        raise ValueError(f"buffer must be a torch.Tensor, got {type(buffer).__name__}")
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
        raise ValueError(f"buffer must be a contiguous 1-D uint8 tensor, got {buffer.dtype} {tuple(buffer.shape)}")
    if buffer.numel() != total_bytes:
        raise ValueError(f"buffer holds {buffer.numel()} bytes, total_bytes is {total_bytes}")
    want = torch.device(device)
    if buffer.device.type != want.type or (want.index is not None and buffer.device.index != want.index):
        raise ValueError(f"buffer is on {buffer.device}, the arena on {want}")


class Arena:
    """The arena (docs/design.md §3), with the public API of docs/design.md §10.

    ``buffer`` lends it an existing byte buffer (an engine's KV storage; the
    arena then adds tables, not memory) and ``mover`` routes every
    relocation's bytes through the engine's own page copy (``Mover``); both
    default to the arena's own (docs/design.md §11).  ``on_settle``, None
    or a callable the engine sets, runs at every ``settle`` of an in-flight
    forward, before the guards are lifted: the engine's wait on the
    forward (a stream wait on its done event; docs/design.md §12).

    Args:
        total_bytes: the byte buffer's size.
        pools: the sub-pools; the chain is ``[up, floats in this order, down]``.
        lazy: True, False, or the set of END pools that free lazily.
        policy: ``"anchor"`` (the seed's short-side slide) or ``"planner"`` (docs/design.md §4b).
        borrow: ``{borrower: lender}``, e.g. ``{"swa": "full"}``; None for none.
        device: where the tables and the buffer live.
        buffer: an engine's contiguous 1-D uint8 tensor of ``total_bytes`` on ``device``, or None.
        mover: ``mover(pool, dst_pages, src_pages)``, the engine's page copy, or None.
        kernels: ``"torch"`` or ``"triton"``: what runs the step calls' device work
            (docs/design.md §14); None for ``KVARENA_KERNELS``, else the device's default.

    Raises:
        ValueError: a bad configuration (docs/design.md §3), naming the pool, a
            bad ``lazy``, ``policy`` or ``borrow``, a ``buffer`` that does not
            fit, or a ``mover`` that is not callable.
    """

    # The gate's sources closed now: a transfer in flight holds every move
    # (docs/design.md §13).  A capacity field: each rebind ticks the memo's
    # clock (``epoch``, ``clock``).
    closed_gates = CapField[frozenset[str]]()

    def __init__(
        self,
        total_bytes: int,
        pools: list[SubPool],
        lazy: bool | Collection[str] = False,
        policy: str = "anchor",
        borrow: Mapping[str, str] | None = None,
        device: str | torch.device = "cpu",
        buffer: torch.Tensor | None = None,
        mover: Mover | None = None,
        kernels: str | None = None,
    ) -> None:
        # Boot-time validation is the spec's (docs/design.md §2): configuration, not an operation.
        layout = make_layout(total_bytes, pools)
        if buffer is not None:
            _check_buffer(buffer, total_bytes, device)
        if mover is not None and not callable(mover):
            raise ValueError(f"mover must be callable, got {type(mover).__name__}")
        lazy_set = lazy_ends(layout, lazy)
        check_policy(policy)
        lenders = borrowing(layout, borrow)
        self.policy = policy
        self.lenders = lenders
        self.device = torch.device(device)
        self.layout = layout
        self.total_bytes = total_bytes
        self.chain = layout.chain
        self.sink_bytes = layout.sink_bytes
        # An external buffer is used as it is: its bytes belong to whoever lent it.
        self.buffer = torch.zeros(total_bytes, dtype=torch.uint8, device=self.device) if buffer is None else buffer
        self.mover = mover
        self._kernels = _choose_kernels(kernels, self.device)
        self._zero = torch.zeros((), dtype=I64, device=self.device)  # where()'s 0, made once
        self._no_pages = torch.empty(0, dtype=I64, device=self.device)  # a bind's holes, when it takes none
        self.bands = {
            n: Band(
                layout.pools[n],
                layout.geometry[n],
                n in lazy_set,
                self.device,
                lenders.get(n),
                layout.geometry[lenders[n]] if n in lenders else None,
            )
            for n in self.chain
        }
        self._order = list(self.bands.values())
        # each lender's borrowers, in chain order: fixed at construction, so a bind looks them up once
        self._borrowers = {n: [self.bands[o] for o in self.chain if lenders.get(o) == n] for n in self.chain}
        self._memo = Memo.shared_by(self._order)  # one arena-wide epoch; a deep copy gets its own
        self._cache = self._memo.cache  # the memo's dict, emptied in place on every tick
        self.epoch = 0  # the arena's own capacity field (``closed_gates``) ticks the bands' clock
        self.clock: Clock = self._memo.clock
        self.closed_gates = frozenset()
        self._journal: Journal | None = None  # the open scope's undo log (impl/journal.py)
        self.in_flight = False  # a forward launched and not yet settled (docs/design.md §12)
        self.on_settle: Callable[[], None] | None = None  # the engine's wait on that forward, or None
        self.verify()

    @property
    def kernels(self) -> str:
        """What runs the step calls' device work: ``"torch"`` or ``"triton"``
        (docs/design.md §14).  Settable at any time between calls; the two
        leave the same state, results and bytes.

        Raises:
            ValueError: (on setting) an unknown choice, or ``"triton"`` where
                it cannot run, saying why (``impl/kernels.py``).
        """
        return self._kernels

    @kernels.setter
    def kernels(self, kernels: str) -> None:
        """Set the kernels, checked (docs/design.md §14).

        Args:
            kernels: ``"torch"`` or ``"triton"``.

        Raises:
            ValueError: an unknown choice, or ``"triton"`` where it cannot run.
        """
        self._kernels = _choose_kernels(kernels, self.device)

    # ------------------------------------------------------------ access

    def _band(self, name: str) -> Band:
        try:  # the hot paths' lookup: one dict read
            return self.bands[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise ValueError(f"pool {name!r}: unknown pool (arena has {', '.join(self.chain)})") from None

    def _float(self, name: str) -> Band:
        b = self._band(name)
        if b.is_end:
            raise ValueError(f"pool {name!r}: only a float band can slide; this is the {b.grow} END")
        return b

    def geometry(self, name: str) -> Geometry:
        """``name``'s grid (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            Its ``epp``, ``num_pages`` and ``min_page``.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).geom

    def pool(self, name: str) -> SubPool:
        """``name``'s ``SubPool``, as given (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            The sub-pool.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).pool

    def is_lazy(self, name: str) -> bool:
        """Whether ``name`` frees lazily (leaves holes; docs/design.md §4); as the spec's.

        Args:
            name: the pool.

        Returns:
            True for a lazy END; False for an eager END and for every float.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).lazy

    def live_pages(self, name: str) -> int:
        """How many pages are allocated (live; docs/design.md §3); as the spec's.

        A host counter: no host read.

        Args:
            name: the pool.

        Returns:
            The live pages.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).live

    def lender(self, name: str) -> str | None:
        """The pool whose ids ``name`` borrows (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            The lender, or None.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).lender

    def borrowers(self, name: str) -> list[str]:
        """The pools that borrow ``name``'s ids, in chain order (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            The borrowers' names.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return [b.name for b in self._borrowers[self._band(name).name]]

    def v2p(self, name: str) -> torch.Tensor:
        """``name``'s virtual-to-physical table, a copy (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            Rows ``[0, id_end)`` (the lender's ids for a borrower), int64; ``-1`` unbound.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        return b.v2p[: b.id_end].clone()

    def p2v(self, name: str) -> torch.Tensor:
        """``name``'s physical-to-virtual table, a copy (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            Rows ``[0, num_pages)``, int64; ``-1`` free.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        return b.p2v[: b.geom.num_pages].clone()

    def live_tables(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``name``'s ``v2p`` (rows ``[0, id_end]``) and ``p2v`` (rows ``[0,
        num_pages]``), each with its ``-1`` sentinel row last, themselves, not copies:
        views the arena keeps updating in place, for an engine whose kernels
        gather through them (a captured graph keeps their addresses).  Read
        only: a write through them is a write the arena does not know of
        (docs/design.md §3, §11).

        Args:
            name: the pool.

        Returns:
            ``(v2p, p2v)``, live views.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        return b.v2p[: b.id_end + 1], b.p2v[: b.geom.num_pages + 1]

    def free_ids(self, name: str) -> torch.Tensor:
        """The FIFO of unbound virtual ids, front first (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            The ids, int64; empty for a borrower.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).queued_ids()

    def frontiers(self, name: str) -> tuple[int, int]:
        """``name``'s frontiers in bytes (docs/design.md §3); as the spec's.

        A parked float reports ``(num_pages*epp, num_pages*epp)`` (docs/design.md §4).

        Args:
            name: the pool.

        Returns:
            ``(low_bytes, high_bytes)``.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).frontiers

    def holes(self, name: str) -> torch.Tensor:
        """``name``'s holes (docs/design.md §4, §10).

        Args:
            name: the pool.

        Returns:
            The physical pages, sorted, int64 (a new tensor).

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return torch.sort(self._band(name).holes).values

    def counts(self, name: str) -> BandCounts:
        """``name``'s span, live and hole counts and rooms: host ints, a copy
        (docs/design.md §3, §5).  No host read.

        Args:
            name: the pool.

        Returns:
            The counts, in pages of ``name``'s grid.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).counts

    def id_end(self, name: str) -> int:
        """One past ``name``'s last id (its lender's, for a borrower): the
        index of ``v2p``'s ``-1`` sentinel row (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            The id end.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).id_end

    def v2p_at(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """``name``'s ``v2p`` rows at ``rows`` (an int64 tensor on the arena's
        device, each in ``[0, id_end]``), gathered into a new tensor.

        Sync-free and unchecked: the composites' way to read the table on
        their hot paths (row ``id_end`` reads ``-1``, row 0, the sink's,
        reads 0; an index outside the table fails the gather on CPU and is
        a device-side assert on CUDA; docs/design.md §3, §8).

        Args:
            name: the pool.
            rows: the rows to read.

        Returns:
            The rows' entries, int64, in a new tensor.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).v2p.index_select(0, rows)

    # ----------------------------------------------------------- bytes

    def page_view(self, name: str) -> torch.Tensor:
        """Raw page envelopes of ``name``'s grid (impl only: the bytes, docs/design.md §10).

        Args:
            name: the pool.

        Returns:
            A uint8 ``[num_pages, epp]`` view of the buffer (not a copy).

        Raises:
            ValueError: an unknown pool, naming it.
        """
        g = self._band(name).geom
        return self.buffer[: g.num_pages * g.epp].view(g.num_pages, g.epp)

    def _page_rows(self, name: str) -> torch.Tensor:
        """``name``'s page envelopes as rows of the widest integer (8, 4, 2 or
        1 bytes) dividing both the envelope and the buffer's address and
        offset (a lent buffer may sit anywhere): what every move copies, so
        it moves whole words, not bytes."""
        g = self._band(name).geom
        buf = self.buffer
        w = math.gcd(8, g.epp, buf.data_ptr(), buf.storage_offset())
        return buf[: g.num_pages * g.epp].view(WORDS[w]).view(g.num_pages, g.epp // w)

    def kv_view(self, name: str, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A KV pool's pages as ``[num_pages, page_size, entry_bytes/itemsize]``;
        a state pool's slots as ``[num_pages, entry_bytes/itemsize]``
        (impl only: the bytes, docs/design.md §10).

        Args:
            name: the pool.
            dtype: the element type the bytes are read as.

        Returns:
            A typed view of the buffer (not a copy).

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        g, p = b.geom, b.pool
        raw = self.page_view(name)
        shape = (g.num_pages, p.entry_bytes) if p.kind == "state" else (g.num_pages, p.page_size, p.entry_bytes)
        return raw.view(shape).view(dtype)

    def write_pages(self, name: str, ids: Ids, data: torch.Tensor) -> None:
        """Write whole page envelopes ``data`` (uint8 ``[len(ids), epp]``) at ``ids``
        (impl only: the bytes, docs/design.md §10).

        The ids are validated with one documented host read.

        Args:
            name: the pool.
            ids: live virtual ids.
            data: the envelopes, one row per id.

        Raises:
            ValueError: an unknown pool, an id that is not live, or ``data``
                that is not a tensor of shape ``[len(ids), epp]``, naming the pool.
        """
        b = self._band(name)
        ids = self._bound_ids(b, ids)
        want = (ids.numel(), b.geom.epp)
        if not isinstance(data, torch.Tensor) or tuple(data.shape) != want:
            shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
            raise ValueError(f"pool {name!r}: data must be a tensor of shape {want}, got {shape}")
        pages = b.v2p.index_select(0, ids)
        rows = self.page_view(name)
        if self._journal is not None:
            self._journal.keep_rows(rows, pages)
        rows.index_copy_(0, pages, data.to(self.device, torch.uint8))

    def read_pages(self, name: str, ids: Ids) -> torch.Tensor:
        """Page envelopes of ``ids`` (impl only: the bytes, docs/design.md §10).

        The ids are validated with one documented host read.

        Args:
            name: the pool.
            ids: live virtual ids.

        Returns:
            uint8 ``[len(ids), epp]``, a new tensor.

        Raises:
            ValueError: an unknown pool or an id that is not live, naming the pool.
        """
        b = self._band(name)
        ids = self._bound_ids(b, ids)
        return self.page_view(name).index_select(0, b.v2p.index_select(0, ids))

    def _move(self, b: Band, dst: torch.Tensor, src: torch.Tensor, disjoint: bool | SrcRun = False) -> int:
        """Relocate pages ``src[i] -> dst[i]``: bytes and tables, one batch.

        Without a mover, ``_copy_pages`` copies the bytes: sync-free when
        the caller vouches the sets are ``disjoint`` (eager compaction's:
        disjoint but for dead self-pairs, its sources a ``SrcRun``); else,
        on the cold paths, after one host read of the sets' shape, so
        overlapping sets (compact_holes) are safe.  With a mover, ``disjoint``
        sets go to it in one call, sync-free; others through
        ``_move_bytes_with_mover``.
        A pair whose source is dead (eager free's padding, always a
        self-copy) leaves the tables alone: its id indexes the ``-1``
        sentinel row.
        """
        k = src.numel()
        if k == 0:
            return 0
        journal = self._open()
        journal.keep_rows(self._page_rows(b.name), dst)
        if self.mover is None:
            self._copy_pages(b.name, dst, src, disjoint)
            journal.on_undo(self._copy_back, b.name, dst, src)
        elif disjoint:
            self.mover(b.name, dst, src)
            journal.on_undo(self._copy_back, b.name, dst, src)
        else:  # waves, each recording its own reverse
            self._move_bytes_with_mover(b.name, dst, src, journal)
        v = b.p2v.index_select(0, src)
        alive = v >= 0
        journal.on_undo(_unmove_rows, b, dst, src, v, alive)
        b.p2v.index_fill_(0, src, -1)
        b.p2v.index_copy_(0, dst, v)
        b.v2p.index_copy_(0, torch.where(alive, v, b.id_end), torch.where(alive, dst, -1))
        return k

    def _copy_pages(self, name: str, dst: torch.Tensor, src: torch.Tensor, disjoint: bool | SrcRun) -> None:
        """Copy envelopes ``src[i] -> dst[i]`` of ``name``'s grid as whole
        words (``_page_rows``).

        Disjoint sets go in one pass where one side is a run of pages (a
        leapfrog's target, make_room's gap, eager compaction's vacated
        pages): a slice copy when both are, a gather straight into the
        destination run, a scatter from the source run.  Otherwise through a
        small temporary (``_copy_in_chunks``): in any chunk order when the
        sets are disjoint; when they share pages (compact_holes' shift), in
        the order that reads each source before it is overwritten, or, for
        a pattern with no such order, whole.
        """
        rows = self._page_rows(name)
        k = src.numel()
        if isinstance(disjoint, SrcRun):  # sync-free, one pass
            rows.index_copy_(0, dst, _alias(rows)[disjoint.start : disjoint.start + k])
            return
        if disjoint:  # sync-free, shape unknown
            _copy_in_chunks(rows, dst, src)
            return
        shared, rising, falling, s0, d0 = self._move_shape(dst, src)
        if not shared:
            if s0 is not None and d0 is not None:
                rows[d0 : d0 + k].copy_(rows[s0 : s0 + k])  # disjoint runs: disjoint slices
            elif d0 is not None:
                torch.index_select(_alias(rows), 0, src, out=rows[d0 : d0 + k])
            elif s0 is not None:
                rows.index_copy_(0, dst, _alias(rows)[s0 : s0 + k])
            else:
                _copy_in_chunks(rows, dst, src)
        elif rising or falling:  # every pair moves one way: chunks from the far end first
            _copy_in_chunks(rows, dst, src, ascending=falling, shift=True)
        else:
            rows.index_copy_(0, dst, rows.index_select(0, src))

    def _move_shape(self, dst: torch.Tensor, src: torch.Tensor) -> tuple[bool, bool, bool, int | None, int | None]:
        """A cold move's shape, in one host read (SYNC: flush, make_room,
        compact_holes and the planner's repack read the live pages already):
        whether a destination is some source, whether both sets ascend with
        every page moving up (``rising``) or every page down (``falling``),
        and the first page of each set that is a run of pages (else None)."""

        def run(t: torch.Tensor) -> torch.Tensor:
            return (t[1:] - t[:-1] == 1).all()

        def up(t: torch.Tensor) -> torch.Tensor:
            return (t[1:] > t[:-1]).all()

        ordered = torch.sort(src).values  # a binary search, not isin's sorts of both sets
        found = ordered.index_select(0, torch.searchsorted(ordered, dst).clamp_max(src.numel() - 1))
        both = up(src) & up(dst)
        flags = [(found == dst).any(), both & (dst >= src).all(), both & (dst <= src).all(), run(src), run(dst)]
        read = torch.cat([torch.stack(flags).to(I64), src[:1], dst[:1]]).tolist()  # SYNC: a cold move's shape
        shared, rising, falling, s_run, d_run, s0, d0 = read
        return bool(shared), bool(rising), bool(falling), s0 if s_run else None, d0 if d_run else None

    def _copy_back(self, name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        """A finished move's reverse: the bytes at ``dst`` back to ``src``,
        through the mover when there is one (an undo, ``impl/journal.py``)."""
        if self.mover is None:
            self._copy_pages(name, src, dst, False)
        else:
            self._move_bytes_with_mover(name, src, dst)

    def _move_bytes_with_mover(
        self, name: str, dst: torch.Tensor, src: torch.Tensor, journal: Journal | None = None
    ) -> None:
        """Hand the move to the mover as disjoint waves.

        The mover's contract is a copy of whole page envelopes between
        disjoint page sets (it may carry state a raw copy misses, or wait for
        in-flight readers).  Self-pairs are dropped.  Overlapping sets (a
        shift) go in waves: a pair runs once no pending pair still reads its
        destination, so every source is read before it is overwritten.  A
        cycle, which no kvarena move forms, is moved through a temporary.
        Each finished wave records its reverse in ``journal`` (if given).
        """
        assert self.mover is not None
        keep = dst != src
        dst, src = dst[keep], src[keep]
        while dst.numel():  # SYNC: numel after a mask (relocation is a cold path)
            ready = ~torch.isin(dst, src)
            if not bool(ready.any()):  # SYNC: a cycle: gather every source first
                rows = self._page_rows(name)
                rows.index_copy_(0, dst, rows.index_select(0, src))
                if journal is not None:
                    journal.on_undo(_swap_back, rows, dst, src)
                return
            wave_dst, wave_src = dst[ready], src[ready]
            self.mover(name, wave_dst, wave_src)
            if journal is not None:
                journal.on_undo(self.mover, name, wave_src, wave_dst)
            dst, src = dst[~ready], src[~ready]

    # ------------------------------------------------------- chain walks

    def _neighbour(self, name: str, upward: bool) -> Band | None:
        i = self.chain.index(name)
        rest = self.chain[i + 1 :] if upward else self.chain[:i][::-1]
        for n in rest:
            if self.bands[n].opaque:
                return self.bands[n]
        return None

    def above(self, name: str) -> int:
        """Low frontier of the first opaque band above ``name``, or ``total_bytes``
        (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            The frontier, in bytes.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        self._band(name)  # an unknown pool: the ValueError that names it
        nb = self._neighbour(name, True)
        return self.total_bytes if nb is None else nb.frontiers[0]

    def below(self, name: str) -> int:
        """High frontier of the first opaque band below ``name``, or 0
        (docs/design.md §3); as the spec's.

        Args:
            name: the pool.

        Returns:
            The frontier, in bytes.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        self._band(name)  # an unknown pool: the ValueError that names it
        nb = self._neighbour(name, False)
        return 0 if nb is None else nb.frontiers[1]

    def region(self, name: str) -> tuple[int, int]:
        """A pool's pages ``[lo, hi)`` between its opaque neighbours, rounded
        inward on its own grid (docs/design.md §3, "Float region"); for an
        END, the most it could span; as the spec's.

        Args:
            name: the pool (a float, or an END).

        Returns:
            ``(lo, hi)``, in pages of ``name``'s grid.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        g = self._band(name).geom
        return cap.float_region(self.below(name), self.above(name), g.epp, g.min_page, g.num_pages)

    # ---------------------------------------------------- capacity views

    def _gap(self, b: Band) -> int:
        low, high = b.frontiers
        if b.grow == "up":
            return max(0, self.above(b.name) - high)
        if b.grow == "down":
            return max(0, low - self.below(b.name))
        below, above = self.below(b.name), self.above(b.name)
        return above - below if not b.opaque else (low - below) + (above - high)

    def _available(self, b: Band) -> int:
        g = b.geom
        if b.is_end:
            room = b.span_room
            return cap.end_available(self._gap(b), g.epp, room, b.n_holes)
        region_lo, region_hi = self.region(b.name)
        return cap.float_available(not b.opaque, region_lo, region_hi, b.lo, b.hi, b.n_holes, b.index_room)

    def _schedulable(self, b: Band) -> int:
        if not b.is_end or self.moves_held():  # a held flush only absorbs: no hole becomes gap
            return self._available(b)
        nb = self._neighbour(b.name, b.grow == "up")
        assert nb is not None  # an END faces the other END at least
        credit = nb.n_holes * nb.geom.epp if nb.is_end and nb.lazy else 0
        return cap.end_available(self._gap(b) + credit, b.geom.epp, b.span_room, b.n_holes)

    _FRESH: ClassVar[dict[str, Callable[["Arena", Band], int]]] = {
        "available_pages": _available,
        "schedulable_pages": _schedulable,
        "gap_bytes": _gap,
    }

    def _view(self, view: str, name: str) -> int:
        """A memoised view.  The hit path is one dict lookup: an entry present
        is valid (every clock tick empties the memo), and its pool was
        checked when it was stored."""
        try:
            return self._cache[view, name]
        except (KeyError, TypeError):  # a miss, or an unhashable name: checked below
            return self._memo.put(view, name, self._FRESH[view](self, self._band(name)))

    def new_memo(self) -> Memo:
        """An empty ``Memo`` on this arena's clock: any capacity change of any
        band empties it.  For views this arena does not know (a composite's
        joint view); ``verify`` does not check it, its owner does
        (docs/design.md §5).

        Returns:
            The memo.
        """
        return Memo(self._memo.clock)

    def fresh_view(self, view: str, name: str) -> int:
        """A view recomputed from the fields, bypassing the memo (docs/design.md §5).

        Args:
            view: ``"available_pages"``, ``"schedulable_pages"`` or ``"gap_bytes"``.
            name: the pool.

        Returns:
            The view's value.

        Raises:
            ValueError: an unknown view, or an unknown pool, naming it.
        """
        if view not in self._FRESH:
            raise ValueError(f"fresh_view: unknown view {view!r} (views: {', '.join(self._FRESH)})")
        return self._FRESH[view](self, self._band(name))

    def gap_bytes(self, name: str) -> int:
        """Free bytes an END can grow into; for a float, free bytes on both
        sides (docs/design.md §3, "Gap"); as the spec's.  Memoised (docs/design.md §5).

        Args:
            name: the pool.

        Returns:
            The bytes, at least 0.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._view("gap_bytes", name)

    def available_pages(self, name: str) -> int:
        """Pages ``alloc`` hands out now, with no relocation: the gate
        (docs/design.md §5); as the spec's.  Memoised, from host counters: no host read.

        Args:
            name: the pool.

        Returns:
            The pages.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._view("available_pages", name)

    def available_size(self, name: str) -> int:
        """Tokens (slots) ``alloc`` hands out now (docs/design.md §5); as the spec's.

        Args:
            name: the pool.

        Returns:
            ``available_pages(name) * page_size``.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self.available_pages(name) * self._band(name).pool.page_size

    def schedulable_available_size(self, name: str) -> int:
        """Tokens available once the growth-side neighbour flushes: a lazy END
        neighbour's holes are credited, in bytes, to this END's gap
        (docs/design.md §5); as the spec's.  A float's is its available size,
        and so is every pool's while moves are held (``moves_held``: a flush
        then only absorbs; docs/design.md §13).

        Args:
            name: the pool.

        Returns:
            The tokens.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._view("schedulable_pages", name) * self._band(name).pool.page_size

    def conserved_available_size(self, name: str) -> int:
        """Capacity minus allocated tokens: the leak invariant's view
        (docs/design.md §5); as the spec's.

        Args:
            name: the pool.

        Returns:
            The tokens.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        return b.index_room * b.pool.page_size

    # -------------------------------------------------- argument checks

    def _count(self, name: str, n: SupportsIndex, what: str = "n") -> int:
        if isinstance(n, bool):
            raise ValueError(f"pool {name!r}: {what} must be an int, got {n!r}")
        try:
            n = operator.index(n)
        except TypeError:
            raise ValueError(f"pool {name!r}: {what} must be an int, got {n!r}") from None
        if n < 0:
            raise ValueError(f"pool {name!r}: {what} must be >= 0, got {n}")
        return n

    def _as_tensor(self, b: Band, ids: Ids) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            if ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise ValueError(f"pool {b.name!r}: ids must be ints")
            return (ids if ids.dim() == 1 else ids.reshape(-1)).to(self.device, I64)  # 1-D: no view dispatched
        return torch.tensor(self._host_ids(b, ids), dtype=I64, device=self.device)

    def _host_ids(self, b: Band, ids: Iterable[int]) -> list[int]:
        try:
            ids = list(ids)
            if any(isinstance(i, bool) for i in ids):
                raise TypeError  # a bool is not an id
            return [operator.index(i) for i in ids]
        except TypeError:
            raise ValueError(f"pool {b.name!r}: ids must be ints") from None

    def _checked(self, b: Band, ids: Ids, bound: bool, freeing: bool = False) -> torch.Tensor:
        """Validate ids for pool ``b``; ``bound``: they must be allocated.

        Binding into a borrower needs each id live in the lender; freeing
        from a lender (``freeing``) needs it unbound in every borrower.

        SYNC: a documented host read of the ids and their v2p rows.
        """
        t = self._as_tensor(b, ids)
        host = t.tolist()  # SYNC: validation reads ids on the host
        first, end = b.id_range
        if len(set(host)) != len(host):
            raise ValueError(f"pool {b.name!r}: repeated id in {host}")
        for v in host:
            if v == 0:
                raise ValueError(f"pool {b.name!r}: id 0 is the sink and is never allocated")
            if not first <= v < end:
                raise ValueError(f"pool {b.name!r}: id {v} out of range [{first}, {end})")
        if not host:
            return t

        def rows(band: Band) -> list[int]:
            return band.v2p.index_select(0, t).tolist()  # SYNC: table read

        for v, p in zip(host, rows(b)):
            if (p >= 0) != bound:
                state = "not allocated" if bound else "already allocated"
                raise ValueError(f"pool {b.name!r}: id {v} is {state}")
        if b.lender and not bound:
            for v, p in zip(host, rows(self.bands[b.lender])):
                if p < 0:
                    raise ValueError(f"pool {b.name!r}: id {v} is not live in its lender {b.lender!r}")
        for other in self.borrowers(b.name) if freeing else ():
            for v, p in zip(host, rows(self.bands[other])):
                if p >= 0:
                    raise ValueError(
                        f"pool {b.name!r}: id {v} is still bound in its borrower {other!r}; free it there first"
                    )
        return t

    def _bound_ids(self, b: Band, ids: Ids) -> torch.Tensor:
        return self._checked(b, ids, bound=True)

    # -------------------------------------------------------- operations

    def atomic(self) -> Scope:
        """``with arena.atomic(): ...``: the calls in the block are all or
        nothing; if anything in it raises, every change it made is undone
        before the exception leaves the block (``impl/journal.py`` states
        the rule).  Every changing call is such a block on its own; a block
        inside one joins it.  ``relieve`` with an evictor cannot run inside
        one (``ValueError``): the evictor's frees are the engine's, past
        undoing (docs/design.md §9c).

        Returns:
            The scope, a context manager.
        """
        return Scope(self)

    @property
    def in_atomic(self) -> bool:
        """Whether an ``atomic()`` block is open (docs/design.md §9c)."""
        return self._journal is not None

    def _open(self) -> Journal:
        """The open scope's journal: every changing call runs in one."""
        assert self._journal is not None, "a changing call outside Arena.atomic()"
        return self._journal

    @_all_or_nothing
    def alloc(self, name: str, n: int, ids: Ids | None = None, check: bool = True) -> torch.Tensor | None:
        """``n`` pages as an int64 tensor of virtual ids, or None if short.

        Holes first (oldest first), then the frontier extends; ids pair with
        pages in order.  The gate reads host counters, so this never syncs
        unless it validates given ids: ``check=False`` is the decode path's
        way to bind ids it knows are valid (a borrower binding its lender's
        fresh ids), with no host read; bad ids there are undefined behaviour.
        As the spec's (docs/design.md §4); one ``atomic()`` scope (docs/design.md §9c).

        With a forward in flight (docs/design.md §12) the holes reused are
        the unguarded ones, oldest first; an allocation that would need a
        guarded one settles first and then allocates as with nothing in
        flight.  It decides from host bounds on the guarded holes, reading
        their count once only when it reaches holes freed unchecked in this
        flight (``_guarded_holes``).

        Args:
            name: the pool.
            n: pages wanted, at least 0; 0 gives an empty tensor.
            ids: the virtual ids to bind (a borrower must give them: each live
                in its lender, not in itself); None takes the FIFO's oldest.
            check: False to bind ``ids`` unchecked.

        Returns:
            The virtual ids (a new tensor), or None when ``n > available_pages(name)``,
            nothing changed.

        Raises:
            ValueError: an unknown pool, ``n`` not an int >= 0, ``len(ids) != n``,
                a borrower without ``ids``, or a bad id (checked), naming the
                pool; nothing changed.
        """
        b = self._band(name)
        n = self._count(name, n)
        if ids is not None:
            ids = self._checked(b, ids, bound=False) if check else self._as_tensor(b, ids)
            if ids.numel() != n:
                raise ValueError(f"pool {name!r}: {ids.numel()} ids given for n={n}")
        elif b.lender and n:
            raise ValueError(f"pool {name!r}: borrows its ids from {b.lender!r}; pass ids=")
        if n == 0:
            return torch.empty(0, dtype=I64, device=self.device)
        if n > self.available_pages(name):
            return None
        if ids is None:
            return self._bind(b, n)  # fresh ids from the queue: the caller's own tensor
        return self._bind(b, n, ids).clone()  # the caller's ids: never hand them back aliased

    @_all_or_nothing
    def bind_with_borrowers(
        self, name: str, n: int, slots: launches.Slots | None = None, tail: int | None = None
    ) -> torch.Tensor:
        """Bind ``n > 0`` fresh ids of lender ``name`` (its queue's oldest),
        then the same ids in each of its borrowers; the ids (a new tensor).

        The coupled bind of a composite, whose joint gate has already
        decided that both binds fit (the lender's, then each borrower's in
        what the lender left): no gate here, no check, no host sync.  A
        bind that does not fit is undefined behaviour (docs/design.md §3, §6, §8).

        ``slots`` (Triton kernels only, docs/design.md §14) is a composite's
        token work on the bound ids, fused into the bind's one launch: it
        writes ``slots.slots``.  With it ``n`` may be 0 (the launch then
        only writes the slots).

        ``tail`` (the uneven demand, docs/design.md §11): the borrowers bind
        only the last ``tail`` of the ids, after the lender's launch (a PD
        preallocation, not a per-step call).

        Args:
            name: the lender.
            n: pages to bind, at least 1 (0 with ``slots``).
            slots: the composite's slot work, or None.
            tail: how many of the ids, the last ones, the borrowers bind; None: all.

        Returns:
            The ids, int64.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        borrowers = self._borrowers[name]
        if tail is not None and tail != n:
            ids = self._bind_fused(b, n, None, [], slots) if self._kernels == "triton" else self._bind(b, n)
            for borrower in borrowers if tail else []:
                self._bind(borrower, tail, ids[n - tail :])
            return ids
        if self._kernels == "triton":
            return self._bind_fused(b, n, None, borrowers, slots)
        ids = self._bind(b, n)
        for borrower in borrowers:
            self._bind(borrower, n, ids)
        return ids

    def _bind(self, b: Band, n: int, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Bind ``n`` pages, ``0 < n <= available_pages``, to ``ids`` (valid
        unbound ids, or None: the queue's oldest).  No check, no sync: the
        tail of ``alloc`` and of ``bind_with_borrowers``.  Returns the ids."""
        if self._kernels == "triton" and (ids is None or b.free_ids is None):
            return self._bind_fused(b, n, ids, [])
        pages = self._hand_out(b, n)
        journal = self._open()
        if ids is None:
            assert b.free_ids is not None  # only a band that mints its ids binds without them
            ids = b.free_ids.take(n)
            journal.took(b.free_ids)
        elif b.free_ids is not None:  # a borrower keeps no queue
            b.free_ids.remove(ids)
        journal.on_undo(_unbind, b, ids, pages)
        b.v2p.index_copy_(0, ids, pages)
        b.p2v.index_copy_(0, pages, ids)
        b.live = b.live + n
        return ids

    def _bind_fused(
        self, b: Band, n: int, ids: torch.Tensor | None, borrowers: list[Band], slots: launches.Slots | None = None
    ) -> torch.Tensor:
        """``_bind`` of ``b`` and then of its first borrower (if any, the
        others after it), the device work in one Triton launch (with the
        composite's ``slots`` work, when given); returns the ids.  The host
        moves its counters first; the journal records the undo once the
        kernel has written what it undoes (``impl/kernels.py``, docs/design.md §14)."""
        journal = self._open()
        if ids is None:
            assert b.free_ids is not None  # only a band that mints its ids binds without them
            journal.took(b.free_ids)
            ring = launches.Ring(b.free_ids.buf, b.free_ids.advance(n), b.free_ids.cap)
        else:
            ids = ids.contiguous()  # the kernel reads it as a ring of n
            ring = launches.Ring(ids, 0, n)
        out = torch.empty(n, dtype=I64, device=self.device) if ids is None else ids
        sides = []
        for band in [b, *borrowers[:1]]:
            first, ext = self._take(band, n) if n else (band.holes[:0], 0)
            sides.append((band, launches.Side(band.v2p, band.p2v, first, ext, torch.empty_like(out))))
        launches.bind(n, ring, out, sides[0][1], sides[1][1] if len(sides) > 1 else None, slots)
        for band, side in sides:
            journal.on_undo(_unbind, band, out, side.pages)
            band.live = band.live + n
        for band in borrowers[1:]:
            self._bind_fused(band, n, out, [])
        return out

    def _hand_out(self, b: Band, n: int) -> torch.Tensor:
        """Take ``0 < n <= available_pages`` pages of ``b`` as ``alloc`` does:
        the oldest unguarded holes, then the extension (settling first when
        it needs a guarded hole).  The caller binds or reserves them."""
        first, ext = self._take(b, n)
        k = first.numel()
        if k == 0:  # no hole: the extension alone (no slice, no cat)
            return b.pages(ext, ext + n)
        return first if n == k else torch.cat([first, b.pages(ext, ext + n - k)])

    def _take(self, b: Band, n: int) -> tuple[torch.Tensor, int]:
        """``_hand_out``'s choice, on the host: the pages are ``first``'s
        (holes), then ``ext, ext + 1, ...`` (the extension), ``n`` in all;
        a fused bind reads them so (``impl/kernels.py``)."""
        if self.in_flight and b.g_hi > 0 and self._skips_guards(b, n):
            return self._take_unguarded(b, n), 0
        k = min(n, b.n_holes)
        if k == 0:  # no hole: the extension alone (no slice of the holes)
            return self._no_pages, (self._extend(b, n) if n else 0)
        first = b.holes[:k]
        b.holes = b.holes[k:]
        return first, (self._extend(b, n - k) if n > k else 0)

    def _skips_guards(self, b: Band, n: int) -> bool:
        """Whether a bind of ``n`` pages in ``b``, with a forward in flight
        and maybe a guarded hole, must pass over its guarded holes; False
        once it has settled (the spec's ``transitions.alloc_settles``: a
        guarded hole and more pages than the unguarded holes), or when no
        hole is guarded (docs/design.md §12).  Host ints, unless the bounds
        cannot tell (``_guarded_holes``)."""
        h = b.n_holes
        if n <= h - b.g_hi:  # it never reaches as many holes as may be guarded
            return True
        g = b.g_lo if b.g_lo > 0 and n > h - b.g_lo else self._guarded_holes(b)
        if g > 0 and n > h - g:
            self.settle()  # it would hand out a hole the forward still writes or reads
            return False
        return g > 0

    def _take_unguarded(self, b: Band, n: int) -> torch.Tensor:
        """The ``n`` oldest unguarded holes of ``b``, out of its hole list,
        the others keeping their order (``n`` is at most the unguarded
        holes; docs/design.md §12).  Sync-free: a stable sort puts the
        taken holes first."""
        assert b.guard is not None  # g_hi > 0: a guard table exists
        h = b.holes
        free = b.guard.index_select(0, h) == -1
        taken = free & (torch.cumsum(free, 0) <= n)
        order = torch.sort(torch.logical_not(taken).to(torch.int8), stable=True).indices
        self._keep_flight()
        b.holes = h.index_select(0, order[n:])
        b.g_hi = min(b.g_hi, b.n_holes)  # only unguarded holes left the list
        return h.index_select(0, order[:n])

    def _extend(self, b: Band, m: int) -> int:
        """Grow ``b``'s span by ``m > 0`` pages (the gate checked they fit);
        the first new page (they run ascending from it)."""
        if b.grow == "up":
            b.hi = b.hi + m
            return b.hi - m
        if b.grow == "down":
            b.lo = b.lo - m
            return b.lo
        region_lo, region_hi = self.region(b.name)
        if not b.opaque:
            start = cap.park_start(region_lo, region_hi, m)
            b.lo, b.hi = start, start + m
            return start
        if region_hi - b.hi >= b.lo - region_lo:  # toward the larger gap, high wins ties: the
            b.hi = b.hi + m  # side the gate priced, so it fits
            return b.hi - m
        b.lo = b.lo - m
        return b.lo

    @_all_or_nothing
    def free(self, name: str, ids: Ids, check: bool = True) -> None:
        """Free pages by virtual id.

        ``check=True``: validate first (a documented host read); ``ValueError``
        naming the pool on any bad id, nothing changed.  ``check=False`` is
        the sync-free path for callers that already hold valid live ids
        (decode, which frees only pages with ``v2p > 0``); bad ids there are
        undefined behaviour (a ``-1`` fails the table gather on CPU and is
        a device-side assert on CUDA; it never reaches the FIFO silently).
        As the spec's (docs/design.md §4, §8); one ``atomic()`` scope (docs/design.md §9c).

        With a forward in flight (docs/design.md §12) an eager END settles
        first (its compaction moves), as does a float left with no live page
        if one of its holes or freed pages is guarded (it drops its holes;
        deciding reads the host once unless nothing of it is guarded).  A
        freed pinned page stays pinned, as ``FREED``, and a hole until
        settle: three device operations, and with ``check=True`` one more
        read to count them.

        Args:
            name: the pool.
            ids: live virtual ids.
            check: False for the sync-free path.

        Raises:
            ValueError: an unknown pool, or (checked) an id that is repeated,
                the sink, out of range, not allocated, or still bound in a
                borrower, naming the pool; nothing changed.
        """
        b = self._band(name)
        ids = self._checked(b, ids, bound=True, freeing=True) if check else self._as_tensor(b, ids)
        k = ids.numel()
        if k == 0:
            return None
        if self._fuses_free(b, k):
            self._free_fused(b, k, check, lambda drop: launches.free(ids.contiguous(), b.v2p, b.p2v, drop))
            return None
        pages = b.v2p.index_select(0, ids)
        freed_pins = self._free_in_flight(b, pages, k, check) if self.in_flight else None
        journal = self._open()
        journal.on_undo(_rebind, b, ids, pages)
        journal.freed = True
        b.v2p.index_fill_(0, ids, -1)
        b.p2v.index_fill_(0, pages, -1)
        if b.free_ids is not None:
            journal.appending(b.free_ids, k)
            b.free_ids.put(ids)
        b.live = b.live - k
        if b.is_end and not b.lazy:
            self._compact_eager(b, pages, k)
        else:
            b.append_holes(pages)
            if not b.is_end and b.live == 0:
                b.park()
            if freed_pins is not None:  # freed pins are guarded holes now
                lo, hi = freed_pins
                b.g_lo, b.g_hi = b.g_lo + lo, min(b.g_hi + hi, b.n_holes)
        return None

    def prewarm(self) -> int:
        """Compile and run every kernel variant this arena's step can launch,
        on no work (``kernels.prewarm``; docs/design.md §14): nothing changes.
        On the torch path, 0: its kernels are torch's own, built already.

        Returns:
            The launches made.
        """
        if self._kernels != "triton":
            return 0
        # a slide's copy, by each pool's word (none with a mover: it copies the bytes)
        words = [] if self.mover is not None else [self._page_rows(n).dtype for n in self.chain]
        return launches.prewarm(self.device, [b.free_ids is not None for b in self.bands.values()], words)

    @_all_or_nothing
    def free_live(self, name: str, tokens: torch.Tensor, page_size: int, count: int) -> None:
        """Free the distinct live ids among ``tokens // page_size``, ascending:
        a window's free (docs/anchor.md §1, ``free_segment``; docs/design.md §14).

        ``-1`` (padding), the sink's id and ids whose pages are already
        free are skipped, a repeat freed once.  ``count`` is how many ids
        that is, as the engine knows it (a host int, so nothing is read
        back): when it equals ``len(tokens)`` every token is taken to name
        a live id of its own.  The trusted decode path: ``tokens`` is a 1-D
        int64 tensor on the arena's device, each in ``[-1, id_end *
        page_size)``, and a wrong ``count`` is undefined behaviour; the
        free is ``free(check=False)`` of those ids.  With Triton kernels,
        selection and free are one launch.

        Args:
            name: the pool.
            tokens: token ids (ids, for ``page_size`` 1), any stride.
            page_size: tokens a page.
            count: how many distinct live ids they name.

        Raises:
            ValueError: an unknown pool, a ``page_size`` below 1, or a
                ``count`` that is not an int in ``[0, len(tokens)]``, naming
                the pool; nothing changed (host ints: no read).
        """
        b = self._band(name)
        count = self._count(name, count, "count")
        if self._count(name, page_size, "page_size") < 1 or count > tokens.numel():  # numel: a shape
            raise ValueError(f"pool {name!r}: {tokens.numel()} tokens, count {count}, page size {page_size}")
        if not count:
            return None
        if self._fuses_free(b, count) and tokens.numel() <= launches.SORT_WIDTH:
            end = b.id_end
            self._free_fused(
                b, count, False, lambda drop: launches.free_live(tokens, page_size, end, count, b.v2p, b.p2v, drop)
            )
            return None
        ids = torch.div(tokens, page_size, rounding_mode="floor")
        if count == ids.numel():  # every token a live id of its own
            key = torch.sort(ids).values
        else:
            key = live_once(ids, b.v2p.index_select(0, torch.clamp(ids, min=0)) > 0, b.id_end)[0]
        self.free(name, key if count == key.numel() else key[:count], check=False)
        return None

    def _fuses_free(self, b: Band, k: int) -> bool:
        """Whether a free of ``k`` ids of ``b`` runs as one Triton launch: not
        an eager END (its compaction moves pages), nor a float freeing its
        last page while something of it is guarded (it may settle)."""
        if self._kernels != "triton" or (b.is_end and not b.lazy):
            return False
        return not (self.in_flight and not b.is_end and b.live == k and b.guard is not None)

    def _free_fused(self, b: Band, k: int, check: bool, run: Callable[[launches.Drop], torch.Tensor]) -> None:
        """``free``'s tail with the device work in one launch (``run`` launches
        it and returns the ids it freed).  As the torch path: the same
        tables, ring, holes, guards and host counts."""
        journal = self._open()
        journal.freed = True
        guard = b.guard if self.in_flight else None
        if guard is not None:
            self._keep_flight()
        ring = None
        if b.free_ids is not None:
            journal.appending(b.free_ids, k)
            ring = launches.Ring(b.free_ids.buf, b.free_ids.claim(k), b.free_ids.cap)
        b.live = b.live - k
        pages = torch.empty(k, dtype=I64, device=self.device)
        old = None if guard is None else torch.empty(k, dtype=I64, device=self.device)
        holes = b.hole_run(k)
        ids = run(launches.Drop(pages, ring, holes, guard, old))
        journal.on_undo(_rebind, b, ids, pages)
        if guard is not None and old is not None:
            journal.on_undo(guard.index_copy_, 0, pages, old)
            pins = self._pins_among(old) if check else 0
            b.g_lo, b.g_hi = b.g_lo + pins, min(b.g_hi + (pins if check else k), b.n_holes)
        if not b.is_end and b.live == 0:
            b.park()

    def _free_in_flight(self, b: Band, pages: torch.Tensor, k: int, check: bool) -> tuple[int, int] | None:
        """A free of ``k`` pages while a forward is in flight, before the
        unbind (docs/design.md §12).  Settles first where ``free`` says; else
        marks the freed pins ``FREED``.  Returns bounds on how many freed
        pages were pinned (exact when ``check``: one read; else ``(0, k)``),
        or None when it settled or nothing of ``b`` is guarded."""
        eager = b.is_end and not b.lazy
        if eager or (not b.is_end and b.live == k and self._parks_guarded(b, pages)):
            self.settle()
            return None
        guard = b.guard
        if guard is None:
            return None
        self._keep_flight()
        old = guard.index_select(0, pages)
        self._open().on_undo(guard.index_copy_, 0, pages, old)
        guard.index_copy_(0, pages, old.clamp_max(FREED))  # a live page is pinned (-> FREED) or not (-1)
        if check:
            pins = self._pins_among(old)
            return pins, pins
        return 0, k

    def _parks_guarded(self, b: Band, pages: torch.Tensor) -> bool:
        """Whether float ``b``, about to park as ``pages`` are freed, holds a
        guarded hole or frees a pinned page.  SYNC: one read, unless the
        host knows (no guard table, or a hole known guarded)."""
        if b.guard is None:
            return False
        if b.g_lo > 0:
            return True
        return bool((b.guard.index_select(0, torch.cat([b.holes, pages])) != -1).any())  # SYNC: a float parks

    def _pins_among(self, rows: torch.Tensor) -> int:
        """How many of these guard rows of live pages are pins (SYNC: a
        checked free, which reads the host to validate already)."""
        return int((rows >= 0).sum())  # SYNC: a checked free counts the pins it frees

    def _compact_eager(self, b: Band, freed: torch.Tensor, k: int) -> None:
        """Retreat the frontier by ``k`` and fill holes from the vacated pages.

        Sync-free: fixed length-``k`` move sets.  Say ``j`` survivors sit in
        the vacated pages; then exactly ``j`` freed pages lie inside the new
        band.  Sorting vacated pages survivors-first (up END; last for the
        down END) against the ascending freed pages pairs the survivors with
        those holes in ascending order, and every other pair is a dead page
        paired with itself: a harmless self-copy.  The pairs are listed by
        vacated page, so the sources are one run (``SrcRun``): one pass.
        """
        n = b.geom.num_pages
        if b.grow == "up":
            b.hi = b.hi - k
            start = b.hi
            dead_first = False
        else:
            b.lo = b.lo + k
            start = b.lo - k
            dead_first = True
        vacated = b.pages(start, start + k)
        dead = (b.p2v.index_select(0, vacated) < 0).to(I64)
        rank = (1 - dead if dead_first else dead) * (n + 1) + vacated
        # pair i: vacated[order[i]] -> i-th freed page; listed by vacated page instead
        dst = torch.empty_like(freed).index_copy_(0, torch.sort(rank).indices, torch.sort(freed).values)
        self._move(b, dst, vacated, SrcRun(start))  # disjoint

    @_all_or_nothing
    def flush(self, name: str, max_moves: int | None = None, urgent: bool = True) -> int:
        """Settle a band's backlog; pages moved.

        A lazy END absorbs frontier holes and moves the survivors nearest the
        frontier into the holes furthest from it (at most ``max_moves``).  A
        float only absorbs its boundary holes.  As the spec's (docs/design.md §4).
        A cold path that reads the host (``# SYNC:``): the move set depends on
        which pages are live.

        With a forward in flight (docs/design.md §12) an urgent flush settles
        first when it would move a page or the band holds a guarded hole.  A
        non-urgent one never waits: the END's walk from the frontier stops
        at the first pinned survivor and skips guarded holes, every page it
        vacates waits as a pending hole (at the back of the hole list,
        ascending), the frontier retreats over no guarded page, and a float
        with a guarded hole is left alone.  With nothing in flight the two
        are the same flush.  While moves are held (``moves_held``,
        docs/design.md §13) it only absorbs, as ``max_moves=0``.

        Args:
            name: the pool.
            max_moves: the most pages to move; None for no cap, 0 to absorb only.
            urgent: False for a flush that must not wait for an in-flight
                forward (between steps); True for the shortfall ladder's.

        Returns:
            The pages moved.

        Raises:
            ValueError: an unknown pool, or ``max_moves`` not an int >= 0, naming the pool.
        """
        b = self._band(name)
        if max_moves is not None:
            max_moves = self._count(name, max_moves, "max_moves")
        if self.moves_held():
            max_moves = 0  # a host transfer holds the pages where they are: absorb only
        guarded = self._guarded_holes(b) > 0  # never, with nothing in flight
        if not b.is_end:
            if b.opaque:
                if guarded and not urgent:
                    return 0  # a guarded hole may lie at the boundary: it waits for settle
                if guarded:
                    self.settle()
                self._refit(b)
            return 0
        g = b.geom
        # SYNC: the move set depends on which pages are live.
        live = b.occupied_pages()
        holes = torch.sort(b.holes).values
        if b.grow == "up":
            edge = g.min_page + b.live  # packed band: [min_page, edge)
            src, dst = live[live >= edge], holes[holes < edge]
        else:
            edge = g.num_pages - b.live  # packed band: [edge, num_pages)
            src, dst = live[live < edge], holes[holes >= edge]
        if self.in_flight and not urgent and b.guard is not None:
            src, dst = self._walk(b, src, dst)
        k = min(src.numel(), dst.numel())
        k = k if max_moves is None else min(k, max_moves)
        if b.grow == "up":  # survivors nearest the frontier, holes furthest from it
            src, dst = src[src.numel() - k :], dst[:k]
        else:
            src, dst = src[:k], dst[dst.numel() - k :]
        if urgent and (k or guarded):
            self.settle()  # the ladder's flush: it waits for the forward, once
        vacated = self.in_flight and k > 0
        if vacated:
            self._vacate(b, src)
        moved = self._move(b, dst, src)
        inside = b.occupied_mask()  # live pages, reserved ones too
        if self.in_flight and b.guard is not None:  # the frontier keeps every guarded page inside
            inside = inside | (b.guard[g.min_page : g.num_pages] != -1)
        kept = torch.nonzero(inside).flatten() + g.min_page  # SYNC: the new frontier
        if b.grow == "up":
            b.hi = int(kept[-1]) + 1 if kept.numel() else g.min_page
        else:
            b.lo = int(kept[0]) if kept.numel() else g.num_pages
        h = b.holes
        keep = ~torch.isin(h, dst) & (h >= b.lo) & (h < b.hi)
        b.holes = torch.cat([h[keep], src]) if vacated else h[keep]  # order kept; vacated pages wait last
        if self.in_flight and b.guard is not None:
            self._recount_guarded(b)
        return moved

    def _walk(self, b: Band, src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The non-urgent walk's candidates (docs/design.md §12): of the
        survivors outside the packed band (``src``, ascending), those the
        walk from the frontier reaches before the first pinned one; of the
        holes inside it (``dst``, ascending), the unguarded ones.  SYNC:
        masks, on the flush's cold path."""
        assert b.guard is not None
        pinned = src[b.guard.index_select(0, src) >= 0]
        if pinned.numel():  # what lies deeper than a pinned survivor waits too
            src = src[src > pinned.max()] if b.grow == "up" else src[src < pinned.min()]
        return src, dst[b.guard.index_select(0, dst) == -1]

    def _refit(self, b: Band) -> None:
        """Shrink a float's span to its live pages; drop holes left outside.

        SYNC: reads the live pages' extent."""
        live = b.occupied_pages()
        if live.numel() == 0:
            b.park()
            return
        b.lo, b.hi = int(live[0]), int(live[-1]) + 1
        h = b.holes
        keep = (h >= b.lo) & (h < b.hi) & (b.p2v.index_select(0, h) < 0)
        b.holes = h[keep]

    @_all_or_nothing
    def make_room(self, name: str, side: str, min_bytes: int) -> int:
        """Slide float ``name`` until the band on ``side`` has ``min_bytes``.

        Returns pages moved; 0 with nothing changed when the side already has
        it, the float is transparent, or even a leapfrog cannot reach it.
        As the spec's (docs/design.md §4).  A cold path that reads the host
        (``# SYNC:``): the move set depends on the live pages.  With a
        forward in flight it settles first when it moves a page or the
        float holds a guarded hole (docs/design.md §12).  While moves are
        held (docs/design.md §13) a slide that would move a page does nothing.

        Args:
            name: the float.
            side: ``"low"`` or ``"high"``.
            min_bytes: the bytes wanted between the float and its neighbour on
                ``side``: a target for the whole band, not an increment.

        Returns:
            The pages moved.

        Raises:
            ValueError: an unknown pool or an END, a bad ``side``, or
                ``min_bytes`` not an int >= 0, naming the pool.
        """
        b = self._float(name)
        if side not in SIDES:
            raise ValueError(f"pool {name!r}: side must be 'low' or 'high', got {side!r}")
        min_bytes = self._count(name, min_bytes, "min_bytes")
        if not b.opaque:
            return 0
        g = b.geom
        below, above = self.below(name), self.above(name)
        low_f, high_f = b.frontiers
        band_side = low_f - below if side == "low" else above - high_f
        if band_side >= min_bytes:
            return 0
        region_lo, region_hi = self.region(name)
        if not cap.make_room_feasible(side == "low", below, above, region_lo, region_hi, b.live, g.epp, min_bytes):
            return 0
        edge_pages = cap.make_room_need(band_side, min_bytes, g.epp)  # pages to clear at ``side``
        if self._kernels == "triton" and b.live and not self.moves_held():
            return self._slide_on_device(b, side == "low", edge_pages, region_lo, region_hi)
        live = b.occupied_pages()  # SYNC: move sets depend on the live pages
        holes = b.holes
        if edge_pages >= b.live:  # leapfrog: pack everything against the far edge
            first = region_hi - b.live if side == "low" else region_lo
            target = b.pages(first, first + b.live)
            # the target is a run: range tests, not isin's sorts (most of a 4 KiB-page leapfrog's time)
            src = live[(live < first) | (live >= first + b.live)]
            dst = target[b.p2v.index_select(0, target) < 0]
        elif side == "low":
            edge = b.lo + edge_pages  # clear [b.lo, edge): into holes past it, then the high gap
            src = live[live < edge]
            room = torch.cat([torch.sort(holes[holes >= edge]).values, b.pages(b.hi, region_hi)])
            dst = room[: src.numel()]
        else:
            edge = b.hi - edge_pages  # clear [edge, b.hi): into holes below it, then the low gap
            src = live[live >= edge]
            near = torch.sort(holes[holes < edge], descending=True).values
            room = torch.cat([near, torch.flip(b.pages(region_lo, b.lo), (0,))])
            dst = torch.sort(room[: src.numel()]).values
        if src.numel() and self.moves_held():
            return 0  # a host transfer holds the pages where they are
        if src.numel() or self._guarded_holes(b):
            self.settle()  # the urgent path (docs/design.md §12): it may move and reshape
        moved = self._move(b, dst, src)
        self._refit(b)
        return moved

    def _slide_on_device(self, b: Band, low: bool, edge_pages: int, region_lo: int, region_hi: int) -> int:
        """``make_room``'s slide on the Triton path: the plan the torch path
        makes, computed on the device from the tables, and one launch that
        moves the bytes and the tables (``kernels.move``; through the mover
        when there is one).  One host read: the pages to move, which size
        the launch, with the span and the hole count they leave
        (docs/design.md §14, "Relocation").  Every destination is free, so
        the sets are disjoint.  A leapfrog of a span with no hole that lies
        wholly outside its target reads nothing: its sets are two runs."""
        lo, hi, n, nh = b.lo, b.hi, b.live, b.n_holes
        first = region_hi - n if low else region_lo  # a leapfrog's target: [first, first + n)
        if edge_pages >= n:  # leapfrog: every live page outside the packed target moves into its free pages
            new_lo, new_hi, holes = first, first + n, b.holes[:0]
            if nh == 0 and (first >= hi or first + n <= lo):  # no hole, wholly outside: two runs the host knows
                src, dst, k = b.pages(lo, hi), b.pages(first, first + n), n
            else:
                span, target = b.pages(lo, hi), b.pages(first, first + n)
                outside = (b.p2v[lo:hi] >= 0) & ((span < first) | (span >= first + n))
                src, dst = _packed(span, outside), _packed(target, b.p2v[first : first + n] < 0)
                k = int(outside.sum())  # SYNC: the pages to move, which size the launch
        else:
            edge = lo + edge_pages if low else hi - edge_pages  # clear [lo, edge) or [edge, hi)
            cleared, stay = (b.pages(lo, edge), b.pages(edge, hi)) if low else (b.pages(edge, hi), b.pages(lo, edge))
            moving = b.p2v.index_select(0, cleared) >= 0
            src, count = _packed(cleared, moving), moving.sum()
            # the holes ascending, with a last entry no index past them reads
            ordered = torch.cat([torch.sort(b.holes).values, b.holes.new_full((1,), -1)])
            below = (ordered[:nh] < edge).sum()  # holes below the edge
            r = torch.arange(edge_pages, device=self.device)
            if low:  # into the holes above the edge, lowest first, then the gap above the span
                above = nh - below
                dst = torch.where(r < above, ordered[(below + r).clamp_max(nh)], hi + r - above)
                m = torch.minimum(count, above)  # holes filled: the m lowest above the edge
                top = ordered[(below + m - 1).clamp(0, nh)]
                filled = (b.holes >= edge) & (b.holes <= top) & (m > 0)
            else:  # into the holes below the edge, highest first, then the gap below the span; ascending
                gap = (count - below).clamp_min(0)
                dst = torch.where(r < gap, lo - gap + r, ordered[(below - count + r).clamp(0, nh)])
                m = torch.minimum(count, below)  # holes filled: the m highest below the edge
                bottom = ordered[(below - m).clamp(0, nh)]
                filled = (b.holes < edge) & (b.holes >= bottom) & (m > 0)
            held = b.p2v.index_select(0, stay) >= 0  # pages that stay: at least one, as live > edge_pages
            first_held = stay[0] + torch.argmax(held.to(torch.int8))
            last_held = stay[-1] - torch.argmax(torch.flip(held, (0,)).to(torch.int8))
            last = dst[(count - 1).clamp_min(0)]
            new_lo_t = torch.where(count > 0, torch.minimum(first_held, dst[0]), first_held)
            new_hi_t = torch.where(count > 0, torch.maximum(last_held, last), last_held) + 1
            keep = ~filled & (b.holes >= new_lo_t) & (b.holes < new_hi_t)
            read = torch.stack(
                [count, new_lo_t, new_hi_t, keep.sum()]
            ).tolist()  # SYNC: the move's size and what it leaves
            k, new_lo, new_hi, n_keep = read
            assert n_keep == new_hi - new_lo - n, f"pool {b.name!r}: {n_keep} holes in [{new_lo}, {new_hi})"
            holes = b.holes.index_select(0, torch.argsort((~keep).to(torch.int8), stable=True)[:n_keep])
        if k or self._guarded_holes(b):
            self.settle()  # the urgent path (docs/design.md §12)
        if k:
            self._move_fused(b, dst[:k], src[:k])
        b.lo, b.hi, b.holes = new_lo, new_hi, holes
        return k

    def _move_fused(self, b: Band, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Relocate live pages ``src[i] -> dst[i]`` into free pages, bytes and
        tables: one launch (``kernels.move``), or the mover and the tables'
        writes; the undo recorded once it ran (``impl/journal.py``)."""
        if self.mover is not None:
            self._move(b, dst, src, True)
            return
        journal = self._open()
        rows = self._page_rows(b.name)
        journal.keep_rows(rows, dst)
        v = launches.move(rows, dst, src, b.v2p, b.p2v)
        journal.on_undo(self._copy_back, b.name, dst, src)
        journal.on_undo(lambda: _unmove_rows(b, dst, src, v, v >= 0))  # no operation after the launch: it ran

    @_all_or_nothing
    def compact_holes(self, name: str, retreat_side: str) -> int:
        """Pack a float's live pages toward the edge opposite ``retreat_side``,
        keeping their order.  As the spec's (docs/design.md §4).  A cold path
        that reads the host (``# SYNC:``): the move set depends on the live pages.
        With a forward in flight it settles first when it moves a page or
        the float holds a guarded hole (docs/design.md §12).  While moves
        are held (docs/design.md §13) a pack that would move a page does nothing.

        Args:
            name: the float.
            retreat_side: ``"low"`` or ``"high"``, the side it leaves.

        Returns:
            The pages moved.

        Raises:
            ValueError: an unknown pool or an END, or a bad ``retreat_side``,
                naming the pool.
        """
        b = self._float(name)
        if retreat_side not in SIDES:
            raise ValueError(f"pool {name!r}: retreat_side must be 'low' or 'high', got {retreat_side!r}")
        if not b.opaque:
            return 0
        live = b.occupied_pages()  # SYNC: move set depends on the live pages
        first = b.hi - live.numel() if retreat_side == "low" else b.lo
        target = b.pages(first, first + live.numel())
        off = target != live
        dst, src = target[off], live[off]
        if src.numel() and self.moves_held():
            return 0  # a host transfer holds the pages where they are
        if src.numel() or self._guarded_holes(b):
            self.settle()  # the urgent path (docs/design.md §12): it may move and drops holes
        moved = self._move(b, dst, src)
        self._refit(b)
        return moved

    def translate(self, name: str, ids: Ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Physical pages of virtual ids; a tombstone (unbound, -1) maps to 0.

        On a tensor this is sync-free: ids outside the id range index
        the ``-1`` sentinel row, so nothing reads out of range, and the
        result is computed into a temporary before ``out`` is written, so
        ``out`` may alias ``ids``.  A host sequence is range-checked like the
        spec (docs/design.md §4, §8).

        Args:
            name: the pool.
            ids: virtual ids, a tensor (any shape) or a host sequence.
            out: a tensor of ``ids``' shape to write the pages into, or None.

        Returns:
            The physical pages (``out`` when given), int64, of ``ids``' shape.

        Raises:
            ValueError: an unknown pool, or a host id outside ``[-1, id_end)``, naming the pool.
        """
        b = self._band(name)
        n = b.id_end
        if not isinstance(ids, torch.Tensor):
            host = self._host_ids(b, ids)
            for v in host:  # host input: checked before it reaches the device
                if not -1 <= v < n:
                    raise ValueError(f"pool {name!r}: id {v} out of range [-1, {n})")
            ids = torch.tensor(host, dtype=I64, device=self.device)
        if self._kernels == "triton":
            flat = ids.reshape(-1).contiguous()
            dst = out if out is not None and out.is_contiguous() else torch.empty_like(flat, dtype=I64)
            launches.translate(flat, dst, b.v2p, n, 1)
            if out is None:
                return dst.reshape(ids.shape)
            if dst is not out:
                out.copy_(dst.reshape(ids.shape))
            return out
        idx = torch.where((ids >= 0) & (ids < n), ids, n)
        pages = b.v2p.index_select(0, idx.reshape(-1)).clamp_min(0).reshape(ids.shape)
        if out is None:
            return pages
        out.copy_(pages)
        return out

    def slots(self, name: str, tokens: torch.Tensor, page_size: int) -> torch.Tensor:
        """Slots of token ids: ``v2p[t // page_size] * page_size + t %
        page_size``, int64 (docs/design.md §6, §14).  A dead row, the sink's,
        ``-1`` and any id out of range give slot 0.  Sync-free.

        Args:
            name: the pool.
            tokens: a 1-D int64 tensor of token ids on the arena's device.
            page_size: tokens a page (1: ``tokens`` are ids, the slots pages).

        Returns:
            The slots, a new tensor.
        """
        b = self._band(name)
        n = b.id_end
        if self._kernels == "triton":
            out = torch.empty_like(tokens, dtype=I64)
            launches.translate(tokens.contiguous(), out, b.v2p, n, page_size)
            return out
        # below 0 reads the sink's row, past the ids the sentinel's: both give slot 0
        phys = b.v2p.index_select(0, torch.div(tokens, page_size, rounding_mode="floor").clamp_(0, n))
        return torch.where(phys > 0, torch.remainder(tokens, page_size).add_(phys, alpha=page_size), self._zero)

    # ------------------------------------------------ in-flight forwards

    @_all_or_nothing
    def launch(self, writes: Mapping[str, Ids | None], check: bool = True) -> None:
        """A forward was launched: pin the pages it writes (docs/design.md §12); as the spec's.

        Until ``settle`` no move reads a pinned page and no move or hand-out
        writes a pinned page or a page a move vacated (pending): the
        operations settle first, or (the non-urgent flush) leave them
        alone.  A launch while one is in flight adds its pins.  Device work
        only: a scatter of each pool's pinned pages into its guard table
        (made here when the band has none); ``check=True`` validates the
        ids first with one host read, ``check=False`` (the engine's step)
        reads nothing.  One ``atomic()`` scope (docs/design.md §9c).

        Args:
            writes: ``{pool: virtual ids the forward writes}`` (a tensor or
                a host sequence); ``-1`` and the sink (0) are skipped; None
                for every page the pool holds.  Pools not named are not written.
            check: False to take the ids as valid (unchecked: an id outside
                the pool's range, or not allocated, pins nothing).

        Raises:
            ValueError: an unknown pool, or (checked) an id that is not an
                int, out of range, or not allocated in that pool, naming the
                pool.  Nothing has changed.
        """
        pins: list[tuple[Band, torch.Tensor | None]] = []
        for name, ids in writes.items():
            b = self._band(name)
            if ids is None:
                pins.append((b, None))
            else:
                pins.append((b, self._launch_ids(b, ids) if check else self._as_tensor(b, ids)))
        self._keep_flight()
        for b, t in pins:
            self._pin(b, t)
        self.in_flight = True

    def _launch_ids(self, b: Band, ids: Ids) -> torch.Tensor:
        """``launch``'s checked ids for ``b``: ints in ``[-1, id_end)``, each
        ``> 0`` allocated; in the spec's words.  SYNC: validation reads the
        ids and their rows."""
        what = f"pool {b.name!r}: launch"
        try:
            if isinstance(ids, torch.Tensor):
                if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                    raise TypeError
                vals = ids.reshape(-1).tolist()  # SYNC: launch validation
            else:
                host = list(ids)
                if any(isinstance(v, bool) for v in host):
                    raise TypeError  # a bool is not an id
                vals = [operator.index(v) for v in host]
        except TypeError:
            raise ValueError(f"{what}: ids must be ints") from None
        end = b.id_end
        rows = self.v2p_at(b.name, torch.tensor([min(max(v, 0), end) for v in vals], dtype=I64, device=self.device))
        for v, p in zip(vals, rows.tolist()):  # SYNC: launch validation
            if not -1 <= v < end:
                raise ValueError(f"{what}: id {v} out of range [-1, {end})")
            if v > 0 and p < 0:
                raise ValueError(f"{what}: id {v} is not allocated")
        return torch.tensor(vals, dtype=I64, device=self.device)

    def _pin(self, b: Band, ids: torch.Tensor | None) -> None:
        """Pin the pages that ``ids`` (None: every live id) hold in ``b``: its
        guard table's rows get the ids.  Sync-free (docs/design.md §12)."""
        if ids is None:  # every live page holds its id: a new table, nothing written in place
            b.guard = torch.where(b.p2v > 0, b.p2v, -1 if b.guard is None else b.guard)
            return
        fresh = b.guard is None
        guard = torch.full((b.geom.num_pages + 1,), -1, dtype=I64, device=self.device) if b.guard is None else b.guard
        rows = ids.clamp(0, b.id_end)  # -1, the sink and ids past the end read a page <= 0
        target = b.v2p.index_select(0, rows).clamp(min=0)  # ... which writes the sink's row: never read
        if not fresh:
            self._open().on_undo(guard.index_copy_, 0, target, guard.index_select(0, target))
        guard.index_copy_(0, target, rows)
        b.guard = guard

    def settle(self) -> None:
        """The in-flight forward is done, or waited on: lift every pin and
        pending mark (docs/design.md §12); as the spec's.  Pending pages stay
        holes, now free to reuse; no count changes, so no view does.
        Host work only: each band drops its guard table, after ``on_settle``
        (the engine's wait on the forward) when one is set.  Nothing in
        flight: nothing to do.
        """
        if not self.in_flight:
            return
        if self.on_settle is not None:
            self.on_settle()  # the forward's writes and reads are ordered before what follows
        self._keep_flight()
        for b in self._order:
            b.guard = None
            b.g_lo = b.g_hi = 0
        self.in_flight = False

    def _keep_flight(self) -> None:
        """Record the in-flight state for the open scope's undo, once a
        scope, before its first change (``impl/journal.py``, rule 5)."""
        journal = self._journal
        if journal is not None and not journal.flight:
            journal.flight = True
            state = [(b, b.guard, b.g_lo, b.g_hi) for b in self._order]
            journal.on_undo(_restore_flight, self, self.in_flight, state)

    def _vacate(self, b: Band, src: torch.Tensor) -> None:
        """A move while a forward is in flight: its sources wait, pending,
        holding the ids whose bytes the forward may still read.  Before the
        move (docs/design.md §12)."""
        self._keep_flight()
        if b.guard is None:
            b.guard = torch.full((b.geom.num_pages + 1,), -1, dtype=I64, device=self.device)
        else:
            self._open().on_undo(b.guard.index_copy_, 0, src, b.guard.index_select(0, src))
        b.guard.index_copy_(0, src, -2 - b.p2v.index_select(0, src))

    def _guarded_holes(self, b: Band) -> int:
        """How many of ``b``'s holes an in-flight forward guards, exactly; 0
        with nothing in flight (docs/design.md §12).  The host bounds answer
        when they agree; else ``_recount_guarded`` reads the count once."""
        if not self.in_flight or b.g_hi == 0:
            return 0
        if b.g_lo < b.g_hi:
            self._recount_guarded(b)
        return b.g_lo

    def _recount_guarded(self, b: Band) -> None:
        """Make ``b``'s guarded-hole bounds exact.  SYNC: one read (the
        cold paths, and an allocation that reaches holes freed unchecked in
        this flight)."""
        assert b.guard is not None
        g = int((b.guard.index_select(0, b.holes) != -1).sum())  # SYNC: the guarded holes, counted
        self._keep_flight()
        b.g_lo = b.g_hi = g

    def pinned(self, name: str) -> torch.Tensor:
        """Pages an in-flight forward writes (docs/design.md §12); as the spec's.

        Args:
            name: the pool.

        Returns:
            The pinned physical pages, ascending, int64 (a new tensor);
                empty when nothing is in flight.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._guarded_pages(self._band(name), True)

    def pending(self, name: str) -> torch.Tensor:
        """Holes a move vacated while a forward is in flight, which it may
        still read (docs/design.md §12); as the spec's.

        Args:
            name: the pool.

        Returns:
            The pending physical pages, ascending, int64 (a new tensor);
                empty when nothing is in flight.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._guarded_pages(self._band(name), False)

    def _guarded_pages(self, b: Band, pinned: bool) -> torch.Tensor:
        if b.guard is None:
            return torch.empty(0, dtype=I64, device=self.device)
        rows = b.guard[1 : b.geom.num_pages]  # the sink's row is launch's scratch (``_pin``)
        return torch.nonzero(rows >= 0 if pinned else rows <= -2).flatten() + 1  # SYNC: a view, a cold path

    # ------------------------------------ host transfers: gates and reservations

    @property
    def gate_closed(self) -> bool:
        """Whether any source holds the gate closed (``closed_gates``; docs/design.md §13)."""
        return bool(self.closed_gates)

    def moves_held(self) -> bool:
        """Whether every move is held (docs/design.md §13): a gate is
        closed (a host transfer or a PD transfer is in flight) or a band
        holds a reserved page (a load is queued on it); as the spec's.
        Host reads only.

        While held, no live page changes its physical page: a flush only
        absorbs, a slide, pack or plan that would move a page does nothing,
        and allocation takes holes and frontiers only.

        Returns:
            True while moves are held.
        """
        return bool(self.closed_gates) or any(b.n_reserved for b in self._order)

    def _require_lazy(self, what: str) -> None:
        """A hold needs lazy ENDs: an eager END compacts (moves) on every free."""
        for b in self._order:
            if b.is_end and not b.lazy:
                raise ValueError(
                    f"pool {b.name!r}: {what} holds moves, but this END is eager and compacts on every free; "
                    "build the arena with lazy ENDs"
                )

    def _set_gates(self, gates: frozenset[str]) -> None:
        """Rebind the closed sources when they change (a tick of the memo's clock), with its undo."""
        if self.closed_gates != gates:
            self._open().on_undo(setattr, self, "closed_gates", self.closed_gates)
            self.closed_gates = gates

    @staticmethod
    def _gate(source: str) -> str:
        if source not in GATES:
            raise ValueError(f"gate source {source!r}: expected one of {GATES}")
        return source

    @_all_or_nothing
    def close_gate(self, source: str = "host") -> None:
        """A transfer of ``source`` is in flight: hold every move until every
        source has opened (docs/design.md §13); as the spec's.  No count
        changes; an END's schedulable view stops crediting its neighbour's
        holes.  One ``atomic()`` scope (docs/design.md §9c).

        Args:
            source: one of ``GATES``: ``"host"`` (HiCache) or ``"disagg"`` (PD).

        Raises:
            ValueError: an unknown source, or an END of this arena is eager
                (named): its frees move pages.  Nothing has changed.
        """
        source = self._gate(source)
        self._require_lazy("close_gate")
        self._set_gates(self.closed_gates | {source})

    @_all_or_nothing
    def open_gate(self, source: str = "host") -> None:
        """Every transfer of ``source`` is done: moves may run again once no
        other source and no reservation holds them (docs/design.md §13); as
        the spec's.  One ``atomic()`` scope (docs/design.md §9c).

        Args:
            source: one of ``GATES``.

        Raises:
            ValueError: an unknown source.  Nothing has changed.
        """
        self._set_gates(self.closed_gates - {self._gate(source)})

    @_all_or_nothing
    def reserve(self, name: str, n: int) -> torch.Tensor | None:
        """Reserve ``n`` pages for a host transfer's load; the physical pages,
        or None if short (docs/design.md §13); as the spec's.

        The pages are taken as ``alloc`` takes them (holes first, then the
        frontier) and count as live in every view, but no id owns them:
        the engine loads bytes into them by physical page, then hands them
        to ids (``bind_reserved``) or gives them back (``cancel``).  While
        a band holds one, moves are held (``moves_held``).  No relief runs:
        the caller relieves first.  No host read; one ``atomic()`` scope.

        Args:
            name: the pool.
            n: pages wanted, at least 0; 0 gives an empty tensor.

        Returns:
            The reserved physical pages (a new int64 tensor), in the order
            ``alloc`` would bind them; None, with nothing changed, when
            ``n > available_pages(name)``.

        Raises:
            ValueError: an unknown pool, ``n`` not an int >= 0, or an eager
                END in the arena, naming the pool; nothing changed.
        """
        b = self._band(name)
        n = self._count(name, n)
        self._require_lazy(f"reserve({name!r})")
        if n == 0:
            return torch.empty(0, dtype=I64, device=self.device)
        if n > self.available_pages(name):
            return None
        pages = self._hand_out(b, n)
        b.reserved = torch.cat([b.reserved, pages])
        b.live = b.live + pages.numel()  # live in every view, though no id owns them yet
        return pages.clone()

    def _reserved_pages(self, b: Band, pages: Ids, what: str) -> torch.Tensor:
        """``pages`` as a tensor, each a distinct reserved page of ``b``;
        else ``ValueError`` in the spec's words.  SYNC: a cold path's
        validation reads the pages on the host."""
        try:
            if isinstance(pages, torch.Tensor):
                if pages.dtype.is_floating_point or pages.dtype.is_complex or pages.dtype == torch.bool:
                    raise TypeError
                host = pages.reshape(-1).tolist()  # SYNC: validation
            else:
                host = list(pages)
                if any(isinstance(p, bool) for p in host):
                    raise TypeError  # a bool is not a page
                host = [operator.index(p) for p in host]
        except TypeError:
            raise ValueError(f"pool {b.name!r}: {what}: pages must be ints") from None
        if len(set(host)) != len(host):
            raise ValueError(f"pool {b.name!r}: {what}: repeated page in {host}")
        held = set(b.reserved.tolist())  # SYNC: validation
        stray = [p for p in host if p not in held]
        if stray:
            raise ValueError(f"pool {b.name!r}: {what}: pages {stray} are not reserved")
        return torch.tensor(host, dtype=I64, device=self.device)

    def _unreserve(self, b: Band, pages: torch.Tensor) -> None:
        """Drop reserved ``pages`` from ``b``'s list, the others keeping their order."""
        b.reserved = b.reserved[~torch.isin(b.reserved, pages)]

    @_all_or_nothing
    def bind_reserved(self, name: str, ids: Ids, pages: Ids) -> None:
        """Give reserved pages to ids: ``ids[k]`` owns ``pages[k]``
        (docs/design.md §13); as the spec's.  The bytes a load put there
        become the ids' (a borrower's ids must be live in its lender).  No
        count changes.  A cold path: the pages and ids are validated with
        host reads; one ``atomic()`` scope (docs/design.md §9c).

        Args:
            name: the pool.
            ids: virtual ids, each free here, one per page.
            pages: reserved physical pages of the pool.

        Raises:
            ValueError: an unknown pool; a page not reserved here, or
                repeated; a bad id (as ``alloc``'s ``ids``); or not one id
                per page, naming the pool; nothing changed.
        """
        b = self._band(name)
        pages = self._reserved_pages(b, pages, "bind_reserved")
        ids = self._checked(b, ids, bound=False)
        if ids.numel() != pages.numel():
            raise ValueError(f"pool {name!r}: bind_reserved: {ids.numel()} ids for {pages.numel()} pages")
        if ids.numel() == 0:
            return
        if b.free_ids is not None:  # a borrower keeps no queue
            b.free_ids.remove(ids)
        self._open().on_undo(_unbind, b, ids, pages)
        b.v2p.index_copy_(0, ids, pages)
        b.p2v.index_copy_(0, pages, ids)
        self._unreserve(b, pages)

    @_all_or_nothing
    def cancel(self, name: str, pages: Ids) -> None:
        """Give reserved pages back: they become holes, as freed pages of
        their band do, and a float left with no live page parks
        (docs/design.md §13); as the spec's.  A cold path: the pages are
        validated with a host read; one ``atomic()`` scope.

        Args:
            name: the pool.
            pages: reserved physical pages of the pool.

        Raises:
            ValueError: an unknown pool, or a page not reserved here, or
                repeated, naming the pool; nothing changed.
        """
        b = self._band(name)
        pages = self._reserved_pages(b, pages, "cancel")
        k = pages.numel()
        if k == 0:
            return
        parks = not b.is_end and b.live == k
        if parks and self._guarded_holes(b):
            self.settle()  # a parking float drops its holes, and the forward still guards one
        self._unreserve(b, pages)
        b.live = b.live - k
        if parks:
            b.park()
        else:
            b.append_holes(pages)  # as freed pages: reused oldest first

    def reserved(self, name: str) -> torch.Tensor:
        """Pages reserved for a host transfer's load and not yet bound or
        cancelled (docs/design.md §13); as the spec's.

        Args:
            name: the pool.

        Returns:
            The reserved physical pages, in the order they were reserved,
            int64 (a new tensor).

        Raises:
            ValueError: an unknown pool, naming it.
        """
        return self._band(name).reserved.clone()

    # ------------------------------------------------------------ policy

    @_all_or_nothing
    def open_short_side(self, name: str, demand: Mapping[str, int]) -> int:
        """Slide float ``name`` for a demand vector ``{pool: pages}``: the anchor
        policy's rung (docs/design.md §4, "Demand vector"); as the spec's.

        Args:
            name: the float.
            demand: pages each pool needs; 0 for pools the operation does not touch.

        Returns:
            The pages moved (``make_room``'s), 0 when the policy does nothing.

        Raises:
            ValueError: an unknown pool or an END, or a demand not an int >= 0,
                naming the pool.
        """
        b = self._float(name)
        for n in demand:
            self._band(n)
        demand = {n: self._count(n, d, "demand") for n, d in demand.items()}
        if not b.opaque or not any(demand.values()):
            return 0
        if any(d > self.bands[n].index_room for n, d in demand.items()):
            return 0  # short of virtual ids: bytes cannot fix that

        def side_need(end: str) -> int:
            e = self.bands[end]
            return max(0, demand.get(end, 0) - e.n_holes) * e.geom.epp

        low_f, high_f = b.frontiers
        act, side_is_low, target = cap.short_side_decision(
            side_need(self.chain[0]),
            side_need(self.chain[-1]),
            low_f - self.below(name),
            self.above(name) - high_f,
            max(0, demand.get(name, 0) - b.n_holes) * b.geom.epp,
            max(self.bands[n].geom.epp for n, d in demand.items() if d),
        )
        if not act:
            return 0
        return self.make_room(name, "low" if side_is_low else "high", target)

    @_all_or_nothing
    def plan_floats(self, demand: Mapping[str, int]) -> int:
        """The planner's rung (docs/design.md §4b); pages moved.

        The decision is the spec's own ``planner.plan_chain`` (one source,
        like ``check_policy``), fed from this arena's host counters; the
        repacks run in ``planner.move_order``, each one batched move (a cold
        path: each move set is read from the live pages, ``# SYNC:``).  As the spec's.
        With a forward in flight a repack settles first when it moves a page
        or its float holds a guarded hole (docs/design.md §12).  While moves
        are held (docs/design.md §13) a plan that would move a page does
        nothing at all: whole or nothing.

        Args:
            demand: pages each pool needs; 0 for pools the operation does not touch.

        Returns:
            The pages moved; 0 when the demand already fits or cannot be met,
            or moves are held and it would move one.

        Raises:
            ValueError: an unknown pool, or a demand not an int >= 0, naming the pool.
        """
        for n in demand:
            self._band(n)
        demand = {n: self._count(n, d, "demand") for n, d in demand.items()}
        names = self.chain[1:-1]
        floats = [
            Float(
                b.geom.epp,
                b.geom.min_page,
                b.geom.num_pages,
                b.lo,
                b.hi,
                b.live,
                b.n_holes,
                demand.get(n, 0),
                b.index_room,
            )
            for n, b in ((n, self.bands[n]) for n in names)
        ]
        ends = []
        for name, side in ((self.chain[0], 1), (self.chain[-1], 0)):
            e = self.bands[name]
            ends.append(End(e.frontiers[side], e.geom.epp, max(0, demand.get(name, 0) - e.n_holes), e.span_room))
        plan = plan_chain(ends[0], floats, ends[1])
        # Every repack's move set first (a float's pages are its own: no other repack touches
        # them), so that a held arena can refuse the plan whole.
        repacks = []
        for i in move_order(floats, plan):
            b = self.bands[names[i]]
            live = b.occupied_pages()  # SYNC: the move set depends on the live pages
            target = b.pages(plan.starts[i], plan.starts[i] + live.numel())
            # pages already in the target stay; the rest fill its free pages, both ascending
            repacks.append((b, target[~torch.isin(target, live)], live[~torch.isin(live, target)]))
        if self.moves_held() and any(src.numel() for _, _, src in repacks):
            return 0  # a host transfer holds the pages where they are
        moved = 0
        for b, dst, src in repacks:
            if src.numel() or self._guarded_holes(b):
                self.settle()  # the urgent path (docs/design.md §12): it may move and drops holes
            moved += self._move(b, dst, src)
            self._refit(b)
        return moved

    def flush_targets(self, name: str) -> list[str]:
        """The bands an urgent flush visits for a shortfall in ``name``: the
        nearest opaque band on each side the band grows toward (an END
        grows one way, a float both; docs/design.md §4, relieve's rung 1).

        Args:
            name: the pool.

        Returns:
            Their names.

        Raises:
            ValueError: an unknown pool, naming it.
        """
        b = self._band(name)
        ways = {"up": (True,), "down": (False,), "float": (False, True)}[b.grow]
        return [nb.name for nb in (self._neighbour(name, up) for up in ways) if nb is not None]

    def relieve(self, name: str, need_pages: int, evict: Callable[[int], object] | None = None) -> bool:
        """The shortfall ladder; True once ``need_pages`` fits in ``name``.

        Each attempt flushes the flush targets, then, while the need is
        still short, runs the policy's slide: ``"anchor"`` offers ``{name:
        need_pages}`` to the floats in chain order, ``"planner"`` runs one
        ``plan_floats``; attempts after the first are eviction rounds (at most 4),
        each opened by ``evict(shortfall)``, and a return of 0 ends them
        (``spec.evict``: the callback's contract).
        The verdict is read after the last step.  Never raises on a
        shortfall.  Each attempt's rungs are one ``atomic()`` scope and the
        evictor runs between them (its frees are the engine's), so a fault
        leaves the state where an attempt or an evictor call ended
        (docs/design.md §4, §9c).

        Args:
            name: the pool.
            need_pages: the pages wanted.
            evict: ``evict(shortfall_pages)`` frees what it can and returns the
                count freed; None for no eviction.

        Returns:
            Whether ``need_pages`` fits now.

        Raises:
            ValueError: an unknown pool, ``need_pages`` not an int >= 0, an
                ``evict`` that is not callable, an evictor inside an open
                ``atomic()`` block, or an ``evict`` return that is not a count,
                naming the pool.
        """
        self._band(name)
        need = self._count(name, need_pages, "need_pages")
        if evict is not None and not callable(evict):
            raise ValueError(f"pool {name!r}: relieve: evict must be callable or None, got {evict!r}")
        if evict is not None and self.in_atomic:
            raise ValueError(f"pool {name!r}: relieve: an evictor cannot run inside atomic() (its frees stay)")

        def short() -> int:
            return need - self.available_pages(name)

        attempts = 1 + (MAX_EVICT_ROUNDS if evict is not None else 0)
        for attempt in range(attempts):
            if attempt == 0:
                if short() <= 0:
                    return True
            elif evict is None or not evicted(evict(short()), f"pool {name!r}: relieve"):
                break
            with self.atomic():  # one attempt's rungs: all or nothing; the evictor runs between
                for t in self.flush_targets(name):
                    self.flush(t)
                if self.policy == "planner":
                    if short() > 0:
                        self.plan_floats({name: need})
                else:
                    for f in self.chain[1:-1]:
                        if short() <= 0:
                            break
                        self.open_short_side(f, {name: need})
            if short() <= 0:
                return True
        return short() <= 0

    # ------------------------------------------------------------ checks

    def verify(self) -> None:
        """Check every accounting rule; raise ``AccountingError`` naming the pool.

        The memo is checked first, so a write around a ``CapField`` is
        reported as what it is.  Everything else is recounted from the
        device tables (SYNC: a cold path).  The checks of docs/design.md §5,
        an in-flight forward's (docs/design.md §12: "pending page
        untouched", "pinned page kept", "guards without a forward", and the
        implementation's "guarded holes" bounds), and a host transfer's
        (docs/design.md §13: "reserved pages", "hold needs lazy ENDs").

        Raises:
            AccountingError: a rule is broken, naming the pool and the rule.
        """
        for view, pool, value in self._memo.entries():
            fresh = self.fresh_view(view, pool)
            if value != fresh:
                raise AccountingError(pool, "stale memo", f"{view} memo {value}, fresh {fresh}")
        recount = {b.name: self._check_band(b) for b in self._order}
        for borrower, lender in self.lenders.items():
            mine = self.bands[borrower].v2p[1:-1] >= 0
            theirs = self.bands[lender].v2p[1:-1] >= 0
            stray = (torch.nonzero(mine & ~theirs).flatten() + 1).tolist()  # SYNC: verify is an audit
            if stray:
                raise AccountingError(
                    borrower, "borrowed ids live in the lender", f"ids {stray} are not live in {lender!r}"
                )
        # The ENDs' own checks keep the first band clear of the sink and the
        # last inside the buffer; what is left is neighbours overlapping.
        opaque = [b for b in self._order if b.opaque]
        for below, b in itertools.pairwise(opaque):
            low, high = b.frontiers[0], below.frontiers[1]
            if low < high:
                raise AccountingError(
                    b.name, "opaque bands overlap", f"low frontier {low} < {below.name} high frontier {high}"
                )
        self._conservation(opaque, recount)

    def _conservation(self, opaque: list[Band], recount: dict[str, int]) -> None:
        """Bytes accounted from counts, not frontiers: the sink, the padding up
        to the first band, and for each opaque band its recounted live pages
        and holes plus the free bytes the chain walk sees above it (clamped
        at 0) must make the buffer.  A frontier that drifts from its band's
        count fails here and nowhere else."""
        covered = self.sink_bytes + max(0, opaque[0].frontiers[0] - self.sink_bytes)
        for b in opaque:
            covered += (recount[b.name] + b.n_holes) * b.geom.epp + max(0, self.above(b.name) - b.frontiers[1])
        if covered != self.total_bytes:
            off = [b for b in opaque if b.hi - b.lo != recount[b.name] + b.n_holes] or opaque[-1:]
            b = off[0]
            raise AccountingError(
                b.name,
                "conservation",
                f"accounted {covered} of {self.total_bytes} bytes; span {b.hi - b.lo} pages, "
                f"live {recount[b.name]} + holes {b.n_holes}",
            )

    def _check_band(self, b: Band) -> int:
        """Check one band from its device tables; return its live pages (bound
        and reserved), recounted."""
        g, name, n, ids_end = b.geom, b.name, b.geom.num_pages, b.id_end

        def need(ok: bool, rule: str, detail: str = "") -> None:
            if not ok:
                raise AccountingError(name, rule, detail)

        lo, hi, live_count = b.lo, b.hi, b.live
        need(g.min_page <= lo <= hi <= n, "bounds", f"span [{lo}, {hi})")
        if b.grow == "up":
            need(lo == g.min_page, "bounds", "up END must start at min_page")
        if b.grow == "down":
            need(hi == n, "bounds", "down END must end at num_pages")
        v2p, p2v = b.v2p.tolist(), b.p2v.tolist()  # SYNC: verify is an audit, never on a hot path
        need(v2p[0] == 0 and p2v[0] == 0, "sink pinned", "page 0 must map to 0")
        need(v2p[ids_end] == -1 and p2v[n] == -1, "sentinel", "the trailing row must hold -1")
        live = [p for p in range(1, n) if p2v[p] >= 0]  # recount from p2v, not the counter
        reserved = b.reserved.tolist()  # SYNC: verify is an audit
        holes = b.holes.tolist()  # SYNC: verify is an audit
        loads = set(reserved)  # live too, owned by no id yet (docs/design.md §13)
        extra = f" + {len(loads)} reserved" if loads else ""
        need(len(live) + len(reserved) == live_count, "live count", f"{len(live)} bound{extra}, counter {live_count}")
        need(
            len(loads) == len(reserved)
            and all(g.min_page <= p and lo <= p < hi and p2v[p] < 0 for p in loads)
            and not loads & set(holes),
            "reserved pages",
            f"reserved {reserved} must be distinct, unbound, inside the span and not holes",
        )
        need(all(p >= g.min_page for p in live), "no page below min_page")
        need(all(lo <= p < hi for p in live), "live page outside span")
        first_id = b.id_range[0]
        for p in live:
            v = p2v[p]
            need(first_id <= v < ids_end and v2p[v] == p, "v2p/p2v inverse", f"page {p}")
        bound = [v for v in range(1, ids_end) if v2p[v] >= 0]
        need(len(bound) == len(live), "v2p/p2v inverse", "stray v2p entries")
        need(len(set(holes)) == len(holes), "holes", "duplicate hole")
        need(all(lo <= h < hi and p2v[h] < 0 for h in holes), "holes", "a hole outside the span or live")
        if b.is_end and not b.lazy:
            need(not holes, "eager band has no holes")
        if not b.is_end:
            need(b.opaque or lo == hi == n, "parked float", "a float with no live page must park")
        if self.gate_closed or reserved:
            eager = any(o.is_end and not o.lazy for o in self._order)
            need(not eager, "hold needs lazy ENDs", "moves held in an arena with an eager END")
        self._check_guards(b, need, p2v, holes)
        queue = b.queued_ids().tolist()  # SYNC: verify is an audit
        expected = set() if b.lender else set(range(first_id, ids_end)) - set(bound)
        need(
            len(queue) == len(set(queue)) and set(queue) == expected,
            "free ids",
            "the FIFO must hold exactly the unbound ids",
        )
        return len(live) + len(reserved)

    def _check_guards(self, b: Band, need: Callable[..., None], p2v: list[int], holes: list[int]) -> None:
        """An in-flight forward's rules on ``b``, by the spec's names (docs/design.md §12):
        a pending page is still a hole (none of its bytes handed out or
        moved over), a pinned page still holds its launch id or, freed, is a
        hole; no guard with nothing in flight; and (the implementation's
        own) the host bounds hold the guarded holes' count."""
        n = b.geom.num_pages
        if b.guard is None:
            need(b.g_lo == b.g_hi == 0, "guarded holes", f"bounds [{b.g_lo}, {b.g_hi}] without a guard table")
            return
        guard = b.guard.tolist()  # SYNC: verify is an audit
        guard[0] = -1  # the sink's row: where launch writes what it skips (``_pin``)
        hole_set = set(holes)
        for p, v in enumerate(guard[:n]):
            if v <= -2:  # the forward reads the bytes a move left here
                need(
                    p in hole_set,
                    "pending page untouched",
                    f"page {p} was vacated holding id {-2 - v}; an unsettled forward reads it",
                )
            elif v > 0:  # the forward writes here late: the id must not have moved
                need(p2v[p] == v, "pinned page kept", f"page {p} held id {v} at launch; an unsettled forward writes it")
            elif v == FREED:
                need(p in hole_set, "pinned page kept", f"freed pinned page {p} must stay a hole until settle")
        if not self.in_flight and any(v != -1 for v in guard[:n]):
            raise AccountingError(b.name, "guards without a forward", "pins or pending pages with nothing in flight")
        g = sum(1 for h in holes if guard[h] != -1)
        need(b.g_lo <= g <= b.g_hi, "guarded holes", f"{g} guarded holes, bounds [{b.g_lo}, {b.g_hi}]")

    def snapshot(self) -> dict[str, object]:
        """The whole state as JSON-able data (same shape as the spec's).

        Copies every table to the host: a tool and test path, never a hot one.
        docs/design.md §10.

        Returns:
            The total and sink bytes, the policy, the chain, whether a
            forward is in flight, and per pool its sub-pool, grid, laziness,
            lender, span, frontiers, live count, tables, free ids, holes,
            pinned and pending pages (``[page, id]`` pairs, docs/design.md
            §12) and reserved pages, and whether the gate is closed
            (docs/design.md §13), as host lists.
        """
        pools = {}
        for name in self.chain:
            b = self.bands[name]
            g, n = b.geom, b.geom.num_pages
            tables = {"v2p": b.v2p[: b.id_end], "p2v": b.p2v[:n], "free_ids": b.queued_ids(), "holes": b.holes}
            host = {k: t.tolist() for k, t in tables.items()}  # SYNC: snapshot, a tool and test path
            guard = [] if b.guard is None else [-1, *b.guard[1:n].tolist()]  # the sink's row: never a guard
            pools[name] = {
                "pool": {
                    "entry_bytes": b.pool.entry_bytes,
                    "page_size": b.pool.page_size,
                    "grow": b.grow,
                    "kind": b.pool.kind,
                },
                "geometry": {"epp": g.epp, "num_pages": n, "min_page": g.min_page},
                "lazy": b.lazy,
                "lender": b.lender,
                "span": [b.lo, b.hi],
                "frontiers": list(b.frontiers),
                "live": b.live,
                **host,
                "pinned": [[p, v] for p, v in enumerate(guard) if v >= 0],
                "pending": [[p, -2 - v] for p, v in enumerate(guard) if v <= -2],
                "reserved": b.reserved.tolist(),  # SYNC: snapshot, a tool and test path
            }
        return {
            "total_bytes": self.total_bytes,
            "sink_bytes": self.sink_bytes,
            "policy": self.policy,
            "chain": list(self.chain),
            "in_flight": self.in_flight,
            "closed_gates": sorted(self.closed_gates),
            "pools": pools,
        }
