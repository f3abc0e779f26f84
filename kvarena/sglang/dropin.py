"""What kvarena's three SGLang allocators share (``_Dropin``): construction
over SGLang's pools, the token surface, frees and free groups, the joint
views, translation and the checks.  SGLang's in-flight forwards and its
host transfers are ``_Dropin``'s mixins (``forwards.py``, ``holds.py``);
the classes SGLang names are ``allocators.py``'s.

The step path (``alloc_extend``, ``alloc_decode``, ``free_swa_segment``,
the translations) uses the host copies SGLang passes and reads nothing back
from the device; ``free_swa`` (which must find the still-live entries) reads
one count.  Like SGLang's own, the step path trusts its device tensors
(they come from SGLang's scheduler), but what the host copies show wrong (a
negative extend, a zero ``seq_len``, lengths that differ) is a ``ValueError``
naming the argument before anything changes; the capacity calls and
``verify_byte_accounting`` are where a broken invariant shows.

Pages handed out for tokens are zeroed in the pools SGLang zeroes (its KV
pool's ``zero_physical_pages``), an eager free waits on ``forward_stream``
as SGLang's does, and ``swa_attn_allocator.bind`` rebinds tables as
SGLang's does (docs/guides/integrating.md, "The rest of SGLang's default
path").

The composite runs its step calls on Triton kernels or on torch
(docs/design.md §14): the device's default (Triton on CUDA, torch
elsewhere) unless the environment variable ``KVARENA_KERNELS`` says
``torch`` or ``triton`` (read when an allocator is built; another value is
a ``ValueError`` naming the variable), or ``install(kernels=...)`` chose
(``settings.kernels_choice``).  On Triton the translations SGLang's
attention calls are one kernel launch each too.
"""

import logging
import operator
from typing import Any

import torch

from kvarena.anchor.loader import import_sglang
from kvarena.impl import HybridSWA, MambaHybrid, TriPool
from kvarena.spec.geometry import AccountingError

from .forwards import InFlightForwards
from .holds import HostTransfers
from .settings import POLICIES, kernels_choice
from .surface import _unsupported
from .views import FULL, I64, SGLANG_POOL, STATE, SWA, BandView, StateView

_base: Any = import_sglang("sglang.srt.mem_cache.allocator.base")
_pools: Any = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
# The KV pools whose pages SGLang zeroes when its sub-allocator hands them out
# (``MultiEndedAllocator._zero_pages_on_alloc``): MHA and MLA, never mamba state.
ZEROED_ON_HAND_OUT = (_pools.UnifiedMHATokenToKVPool, _pools.UnifiedMLATokenToKVPool)

_log = logging.getLogger(__name__)


def _dcp_size() -> int:
    """The decode-context-parallel width SGLang's runtime context publishes (1 without one)."""
    try:
        return int(import_sglang("sglang.srt.runtime_context").get_parallel().attn_dcp_size)
    except Exception:  # no context published: a single rank
        return 1


def _pool_page_size(unified_buffer, kvcache) -> int:
    """The page size SGLang's unified buffer was built with (its sink and
    first pages are sized by it): an allocator left at its default page
    size takes it, as SGLang's factories pass it."""
    for owner, attr in ((unified_buffer, "_page_size"), (kvcache, "page_size")):
        value = getattr(owner, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 1


def _zeroing(kind: type) -> type:
    """``kind`` whose coupled bind (every page it hands out for tokens) then
    calls ``on_fresh(ids)``: the drop-in zeroes those pages there, as SGLang's
    sub-allocators zero a page envelope on hand-out."""

    class Zeroing(kind):  # type: ignore[misc, valid-type]
        on_fresh: Any = None

        def _take_pages(self, n: int, slots: Any = None, swa_n: int | None = None) -> torch.Tensor | None:
            ids = super()._take_pages(n, slots, swa_n)
            if ids is not None and ids.numel() and self.on_fresh is not None:  # numel: a shape
                self.on_fresh(ids, swa_n)
            return ids

    Zeroing.__name__ = Zeroing.__qualname__ = kind.__name__  # snapshots and memo keys name the composite
    return Zeroing


_ZEROING: dict[type, type] = {kind: _zeroing(kind) for kind in (HybridSWA, MambaHybrid, TriPool)}


def _refuse_moves(name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    raise AssertionError(f"pool {name!r}: the boot-state twin decides on counts and never moves a page")


class _Dropin(InFlightForwards, HostTransfers):
    """What the three allocators share: construction over SGLang's pools,
    the token surface, frees and free groups, gates and checks (the
    forwards' hand-over and the host transfers' gates are its mixins')."""

    KIND: type = HybridSWA
    CHAIN: tuple[str, ...] = ()
    page_size: int  # set by SGLang's base __init__, which _boot runs
    free_group: list[torch.Tensor] | None
    free_page_reps_group: list[torch.Tensor] | None
    full_page_reps_group: list[torch.Tensor]
    full_free_group: list[torch.Tensor]
    free_pages: torch.Tensor | None
    release_pages: torch.Tensor | None
    DEFAULT_POLICY = "planner"  # install(policy) builds a subclass with its own
    DEFAULT_KERNELS: str | None = None  # install(kernels=...) likewise; None: KVARENA_KERNELS, else the device's
    _full_after_swa: list[torch.Tensor]  # the tree's full-side frees, until its drain ends

    @property
    def composite(self) -> Any:
        """The implementation composite.  Every call reaches it through here,
        so a forward SGLang reported since the last call is handed to it
        first (``_take_forward``): before anything can move or hand out a page."""
        c = self._handed()
        if self._full_after_swa:
            self._free_deferred()
        return c

    @composite.setter
    def composite(self, value: Any) -> None:
        self._composite = value

    def _handed(self) -> Any:
        """The composite with what SGLang reported since the last call handed
        over: its forwards (``_take_forward``), a forward whose event has
        fired settled (``_settle_if_fired``: after the last forward the
        arena goes idle, SGLang never reporting "none in flight"), its move
        gates read.  Host calls only."""
        if self._forward_due is not None:
            self._take_forward()
        self._settle_if_fired()
        if self._move_gates:
            self._sync_gate()
        return self._composite

    # ------------------------------------------------------------ boot

    def _boot(
        self,
        *,
        unified_buffer,
        kvcache,
        state_pool,
        device,
        page_size,
        need_sort,
        policy,
        lazy_compaction,
        forward_stream=None,
        full_max_total_num_tokens=None,
        swa_max_total_num_tokens=None,
    ) -> None:
        self._move_gates, self._transfer_events, self._full_after_swa = {}, {}, []
        policy = self.DEFAULT_POLICY if policy is None else policy
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if page_size is None:  # left at its default: the pool's pages, which SGLang's factories pass
            page_size = _pool_page_size(unified_buffer, kvcache)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"pool 'full': page_size must be an int >= 1, got {page_size!r}")
        if (full_max_total_num_tokens is None) != (swa_max_total_num_tokens is None):
            raise ValueError("full_max_total_num_tokens and swa_max_total_num_tokens: give both or neither")
        if getattr(unified_buffer, "post_capture_active", False):
            _unsupported("post-capture KV backing")
        if _dcp_size() > 1:
            _unsupported("decode context parallelism (attn_dcp_size > 1)")
        entry = {n: unified_buffer.spec(SGLANG_POOL[n]).entry_bytes() for n in self.CHAIN}
        raw = unified_buffer._raw  # SGLang's one byte buffer: lent, not copied
        self._pools = {FULL: kvcache.full_kv_pool}
        if SWA in self.CHAIN:
            self._pools[SWA] = kvcache.swa_kv_pool
        if STATE in self.CHAIN:
            self._pools[STATE] = state_pool
        args = self._composite_args(unified_buffer.total_bytes, entry)
        kw = {"page_size": page_size, "lazy": bool(lazy_compaction), "policy": policy, "device": raw.device}
        kw["kernels"] = kernels_choice(self.DEFAULT_KERNELS)  # KVARENA_KERNELS, else the device's default
        self.pages_moved = dict.fromkeys(self.CHAIN, 0)  # pages relocated per pool, self-copies included
        self.composite = _ZEROING[self.KIND](*args, **kw, buffer=raw, mover=self._move_pages)
        self._zeroed = [n for n in (FULL, SWA) if n in self._pools and isinstance(self._pools[n], ZEROED_ON_HAND_OUT)]
        self.composite.on_fresh = self._zero_fresh
        self.composite.arena.on_settle = self._wait_forward_done  # a settle is the stream wait on the forward
        self._twin: Any = None  # the boot state, for the empty-pool gates: built on first use (_boot_state)
        self._twin_args = (args, kw, raw)
        self._check_grids(unified_buffer)
        size_full = (
            unified_buffer.max_slots("full") - 1
            if full_max_total_num_tokens is None
            else int(full_max_total_num_tokens)
        )
        _base.BaseTokenToKVPoolAllocator.__init__(
            self,
            size=size_full,
            page_size=page_size,
            dtype=unified_buffer.spec("full").get_dtype(),
            device=device,
            kvcache=kvcache,
            need_sort=need_sort,
        )
        self.unified_buffer = unified_buffer
        self.policy = policy
        self.lazy_compaction = bool(lazy_compaction)
        # Overlap scheduling's forward stream: an eager free of an END waits on it before it writes tables and
        # moves pages, as SGLang's sub-allocators do (a float's free moves nothing and a lazy one defers).
        self.forward_stream = forward_stream
        self._waits = dict.fromkeys((FULL, STATE), forward_stream is not None and not self.lazy_compaction)
        self._waits[SWA] = self._waits[FULL] and SWA in self.CHAIN and self.composite.arena.pool(SWA).grow != "float"
        self._size_full = size_full
        self._full_max_total_num_tokens = size_full
        if SWA in self.CHAIN:
            self._size_swa = (
                unified_buffer.max_slots("swa") - 1
                if swa_max_total_num_tokens is None
                else int(swa_max_total_num_tokens)
            )
            self._swa_max_total_num_tokens = self._size_swa
        self.full_attn_allocator = BandView(self, FULL)
        if SWA in self.CHAIN:
            self.swa_attn_allocator = BandView(self, SWA)
            kvcache.attach_allocators(full_allocator=self.full_attn_allocator, swa_allocator=self.swa_attn_allocator)
        if STATE in self.CHAIN:
            self.mamba_allocator = StateView(self, STATE)
        self._host_transfer_wiring(kvcache, unified_buffer)
        # SGLang's free-group lists, by its names (its inherited policy flushes them).
        self.skipped_frees = 0  # ids a plain free skipped: -1, page 0, out of range, not live, repeated
        self.free_group = None
        self.free_page_reps_group = None
        self.full_page_reps_group = []
        self.full_free_group = []
        self.free_pages = torch.empty(0, dtype=I64, device=device)
        self.release_pages = torch.empty(0, dtype=I64, device=device)

    def _composite_args(self, total_bytes: int, entry: dict[str, int]) -> tuple[int, ...]:
        raise NotImplementedError

    def _check_grids(self, unified_buffer) -> None:
        """kvarena's grids must be SGLang's: the same pages at the same bytes."""
        for n in self.CHAIN:
            g, ps = self.composite.arena.geometry(n), self.composite.arena.pool(n).page_size
            name = SGLANG_POOL[n]
            want = (unified_buffer.max_slots(name) // ps, -(-unified_buffer.min_slot_index(name) // ps))
            if (g.num_pages, g.min_page) != want:
                raise ValueError(
                    f"pool {n!r}: kvarena's grid (pages, first page) {(g.num_pages, g.min_page)} "
                    f"is not SGLang's {want} for sub-pool {name!r}"
                )

    def _boot_state(self) -> Any:
        """A composite in the boot state, for the empty-pool and compacted
        gates (SGLang's ``reclaim_plan``, the prefill budget).  It decides
        on its host counts alone (``fits`` reads no table), so it keeps no
        device tensor: its tables are dropped once built, and kvarena's
        device tables stay those of the live composite, no more than
        SGLang's.  Built on first use (the mamba stack never asks)."""
        if self._twin is None:
            args, kw, raw = self._twin_args
            twin = self.KIND(*args, **kw, buffer=raw, mover=_refuse_moves)
            none = torch.empty(0, dtype=I64, device=twin.device)
            for band in twin.arena.bands.values():  # every table: a gate that read one would fail, not misread
                band.v2p = band.p2v = band.holes = band._reserve = none
                if band.free_ids is not None:
                    band.free_ids.buf = none
            self._twin = twin
        return self._twin

    def _zero_fresh(self, ids: torch.Tensor, swa_n: int | None = None) -> None:
        """Zero the page envelopes just bound to ``ids``, through SGLang's own
        ``zero_physical_pages``, in every pool SGLang zeroes on hand-out: some
        attention kernels load whole pages (trtllm_mha's fmha_v2 prefill, fp8
        XQA decode, MLA) and a NaN left past ``seq_len`` (a former mamba
        state's bytes, say) reaches their output.  ``swa_n``: SWA bound only
        the last ``swa_n`` ids (a PD preallocation); the others have no SWA
        page to zero.  On the device, no read."""
        arena = self.composite.arena
        for name in self._zeroed:
            bound = ids if name != SWA or swa_n is None else ids[ids.numel() - swa_n :]
            if bound.numel():
                self._pools[name].zero_physical_pages(arena.v2p_at(name, bound))

    def _move_pages(self, name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        """The arena's mover: SGLang's own page copy of that sub-pool."""
        self._pools[name].move_physical_pages(dst, src, self.composite.arena.pool(name).page_size)
        self.pages_moved[name] += dst.numel()  # a shape: no read

    # ------------------------------------------------------ allocation

    def _host(self, values: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        dev = torch.tensor(values, dtype=I64).to(self.composite.device, non_blocking=True)  # host to device
        return dev, torch.tensor(values, dtype=I64)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` tokens on fresh pages (a multiple of the page size),
        or None."""
        ps = self.page_size
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0 or need_size % ps:
            raise ValueError(f"pool 'full': alloc({need_size!r}) must be a multiple of page_size {ps}, >= 0")
        if need_size == 0:
            return torch.empty(0, dtype=I64, device=self.composite.device)
        full = self.full_attn_allocator
        if need_size > (full.num_pages - full.min_page_index) * ps:  # more than any state holds: SGLang's None
            return None
        zero, zero_cpu = self._host([0])
        seq, seq_cpu = self._host([need_size])
        last, _ = self._host([-1])
        out = self.composite.alloc_extend(
            zero, seq, last, check=False, prefix_lens_cpu=zero_cpu, seq_lens_cpu=seq_cpu, extend_num_tokens=need_size
        )
        return out

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots for positions ``[prefix, seq)`` of each request (docs/anchor.md
        §1), or None; no device read.  Bad input the host copies show is a
        ``ValueError`` naming it, raised before anything changes."""
        try:
            out = self.composite.alloc_extend(
                prefix_lens.to(I64),
                seq_lens.to(I64),
                last_loc.to(I64),
                check=False,
                prefix_lens_cpu=prefix_lens_cpu,
                seq_lens_cpu=seq_lens_cpu,
                extend_num_tokens=extend_num_tokens,
            )
        except ValueError:
            if self._longer_than_any_state(seq_lens_cpu):
                return None
            raise
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request for position ``seq - 1``, or None; no device
        read.  Bad input the host copy shows is a ``ValueError`` naming it."""
        try:
            out = self.composite.alloc_decode(
                seq_lens.to(I64), last_loc.to(I64), check=False, seq_lens_cpu=seq_lens_cpu
            )
        except ValueError:
            if self._longer_than_any_state(seq_lens_cpu):
                return None
            raise
        return out

    def _longer_than_any_state(self, seq_lens_cpu: torch.Tensor | None) -> bool:
        """Does a request ask for more tokens than any arena state holds?  The
        composite calls that bad input; SGLang's allocator returns None for it
        (more pages than ids), so the drop-in does too (the error path only)."""
        full = self.full_attn_allocator
        most = (full.num_pages - full.min_page_index) * self.page_size
        return seq_lens_cpu is not None and bool((torch.as_tensor(seq_lens_cpu).cpu() > most).any())

    # ------------------------------------------------------------ free
    #
    # The engine's per-step frees read nothing back (docs/guides/integrating.md, "Frees"): a finished
    # request's rows (``free_segments``/``free_full_segments``), the tree's values (``free_segment``,
    # ``free_full_segment``, ``free_swa_segment``), a request's state slot.  Their counts are shapes,
    # and SGLang has split each segment on the host already (live window or not).  A plain ``free``
    # reads once, as SGLang's own does (its dedup and its SWA filter), and tolerates a bad id.

    def free(self, free_index: torch.Tensor) -> None:
        """Free the pages of these tokens, their still-live SWA entries first
        (kvarena's borrow rule: an id leaves SWA before full).  A plain free,
        not the engine's per-step path: one host read, which also skips
        and counts what SGLang's lazy free would not stop at (``-1``, page
        0, out of range, not live, repeated: ``skipped_frees``)."""
        if free_index is None or free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.reshape(-1).to(I64).clone())
            return
        self._free_tolerant(free_index.reshape(-1).to(I64))

    def _free_tolerant(self, toks: torch.Tensor) -> None:
        """The plain free: one read names the live pages, the rest is
        skipped and counted; then the trusted segment free of those pages."""
        c, ps = self.composite, self.page_size
        end = c.arena.id_end(FULL)
        page = torch.div(toks, ps, rounding_mode="floor")
        page = torch.where((toks >= 0) & (page < end), page, 0)  # -1 and out of range: the sink's row, dead
        rows = [toks, page, c.arena.v2p_at(FULL, page)]
        rows.append(c.arena.v2p_at(SWA, page) if SWA in self.CHAIN else torch.zeros_like(page))
        # SYNC: the plain free's one read (SGLang's reads too: its dedup, its SWA filter)
        host = torch.stack(rows).tolist()
        pages: dict[int, bool] = {}  # live page -> its SWA entry is live, in the order named
        tokens: set[int] = set()
        skipped = 0
        for t, p, full, swa in zip(*host):  # the cold path: a host loop over what it read
            if p <= 0 or full <= 0 or t in tokens:  # -1, the sink's page, out of range, not live, repeated
                skipped += 1
                continue
            tokens.add(t)
            pages[p] = swa > 0
        if skipped:
            self.skipped_frees += skipped
            _log.warning("kvarena: pool 'full': free skipped %d ids that name no live page", skipped)
        if pages:
            ids = torch.tensor(list(pages), dtype=I64).to(c.device, non_blocking=True) * ps
            self._free_reps(ids, sum(pages.values()))

    def _free_reps(self, reps: torch.Tensor, swa_live: int) -> None:
        """The trusted segment free of page representatives (one token per
        page, each page once, live in full), ``swa_live`` of their SWA
        entries live (SGLang's host split): no read.  The contract is
        trusted, as SGLang's own lazy free trusts it; a breach (an id freed
        twice, an SWA entry left live on a full-side free) breaks a rule
        ``verify_byte_accounting`` checks, SGLang's idle check."""
        if reps.numel() == 0:
            return
        self._wait_forward(FULL)
        toks = reps.repeat_interleave(self.page_size) if self.page_size > 1 else reps  # whole pages: [::ps] = reps
        self.composite.free_segment(toks, 0, check=False, num_live=swa_live if SWA in self.CHAIN else None)

    def _reps(self, free_index: torch.Tensor, start_pos: int, what: str = "free_segment") -> torch.Tensor:
        """One token of every page of a page-aligned segment (its start
        checked on the host: ``ValueError`` naming the pool)."""
        ps, pool = self.page_size, SWA if what == "free_swa_segment" else FULL
        try:
            bad = isinstance(start_pos, bool) or operator.index(start_pos) < 0 or start_pos % ps != 0
        except TypeError:
            bad = True
        if bad:
            raise ValueError(
                f"{what}: pool {pool!r}: start_pos {start_pos!r} must be a non-negative multiple of page_size {ps}"
            )
        return free_index.reshape(-1).to(I64)[::ps]

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """A segment whose SWA entries are all live (SGLang's contract for
        ``free_segment``): both sides, nothing read."""
        if free_index is None or free_index.numel() == 0:
            return
        reps = self._reps(free_index, start_pos)
        if self.free_page_reps_group is not None:
            self.free_page_reps_group.append(reps.clone())
            return
        self._free_reps(reps, reps.numel())

    def free_full_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """A segment whose SWA side is tombstoned already (SGLang's contract
        for ``free_full_segment``): full alone, nothing read."""
        if free_index is None or free_index.numel() == 0:
            return
        reps = self._reps(free_index, start_pos, "free_full_segment")
        if self.free_group is not None:
            self.full_page_reps_group.append(reps.clone())
            return
        self._free_reps(reps, 0)

    def _defer_full_free(self, reps: torch.Tensor) -> None:
        """The tree's full-side free of a node (``full_attn_allocator.
        free_segment``), which SGLang issues before or after that node's
        ``free_swa_segment`` in one drain of its frees.  kvarena's borrow
        rule frees an id's SWA entry first, so the full side waits for the
        drain to end (the next call that is not a window free) and then
        goes with no SWA entry live: nothing read.  SGLang's tree holds a
        node's SWA value only while its full value is live, so a node's
        SWA entry is gone by then; a breach would leave an SWA entry on a
        freed id, which ``verify_byte_accounting`` reports."""
        if SWA not in self.CHAIN:
            self._free_reps(reps, 0)
            return
        self._full_after_swa.append(reps.clone())

    def _free_deferred(self) -> None:
        reps, self._full_after_swa = self._full_after_swa, []
        self._free_reps(torch.cat(reps), 0)

    def free_group_begin(self) -> None:
        if self.free_group is not None:
            raise ValueError("pool 'full': free groups cannot be nested")
        self.free_group, self.full_free_group = [], []
        self.free_page_reps_group, self.full_page_reps_group = [], []

    def free_group_end(self) -> None:
        """Free the group: its segments in one trusted free (SWA entries
        live for ``free_segment``'s, tombstoned for ``free_full_segment``'s;
        SGLang's contract: a page once a group), nothing read; then its
        plain frees, one read.  The group closes once that returns."""
        both = self.free_page_reps_group or []
        reps = both + self.full_page_reps_group
        plain = (self.free_group or []) + self.full_free_group
        if reps:
            self._free_reps(torch.cat(reps), sum(r.numel() for r in both))
        if plain:
            self._free_tolerant(torch.cat(plain))
        self.free_group, self.full_free_group = None, []
        self.free_page_reps_group, self.full_page_reps_group = None, []

    # ----------------------------------------------------------- views

    def available_size(self) -> int:
        """The joint view: the largest ``alloc_extend`` of one new request
        that succeeds now without relief (tokens)."""
        return self.composite.available_size()

    def _compute_available_size(self) -> int:
        return self.composite.available_size()

    def full_available_size(self) -> int:
        return min(self._size_full - self.full_attn_allocator.allocated_count(), self.schedulable_full_available_size())

    def schedulable_full_available_size(self) -> int:
        return self.composite.arena.schedulable_available_size(FULL)

    def conserve_full_available_size(self) -> int:
        return self._size_full - self.full_attn_allocator.allocated_count()

    def _conserve_full_available_size(self) -> int:
        return self.conserve_full_available_size()

    def debug_print(self) -> str:
        return f"kvarena {type(self.composite).__name__} ({self.policy}): joint available {self.available_size()}"

    def allocator_state_str(self) -> str:
        return "; ".join(v.allocator_state_str() for v in self._views())

    def is_slot_allocated(self, slot: int) -> bool:
        return self.full_attn_allocator.is_slot_allocated(slot)

    def _views(self) -> list[BandView]:
        views = [self.full_attn_allocator]
        if SWA in self.CHAIN:
            views.append(self.swa_attn_allocator)
        if STATE in self.CHAIN:
            views.append(self.mamba_allocator)
        return views

    # ------------------------------------------------------ translation

    def translate_kv_loc(self, loc: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.full_attn_allocator.translate_kv_loc(loc, out=out)

    def translate_write_loc(
        self, loc: torch.Tensor, *, out: torch.Tensor | None = None, out_width: int | None = None
    ) -> torch.Tensor:
        return self.full_attn_allocator.translate_write_loc(loc, out=out, out_width=out_width)

    @property
    def full_v2p_page_table(self) -> torch.Tensor:
        return self.full_attn_allocator.virtual_to_physical

    @property
    def full_p2v_page_table(self) -> torch.Tensor:
        return self.full_attn_allocator.physical_to_virtual

    # ---------------------------------------------- speculative decoding

    @property
    def draft_virtual_id_space(self) -> int:
        """The virtual token ids a fused draft's tables span: the full
        sub-pool's, as SGLang's (its draft worker sizes its pools to it).  A
        draft's K/V are more parts of every full entry (``fused_draft``), so
        the draft shares the target's pages, ids and tables: kvarena's
        grids, read from SGLang's specs, hold the draft's parts, and every
        relocation moves whole envelopes, draft parts with them."""
        return self.full_attn_allocator.max_slots - 1

    # ---------------------------------------------------- maintenance

    def flush_opportunistic(self) -> int:
        """SGLang's sync point (an overlap-off boundary, or fully idle: its
        forward stream drained): the composite's non-urgent flush of each
        lazy END, as SGLang's lazy mode compacts there; pages moved.  A
        node whose waiting requests SGLang admits on the views alone needs
        it: a PD decode node's preallocation queue runs no relief, so a
        request whose room only a compaction frees waited forever
        (``tests/sglang/test_pd.py``).  While a gate or a reservation holds
        the moves, the flush only absorbs (docs/design.md §13)."""
        return int(self.composite.flush_opportunistic())

    def prewarm_compaction(self) -> None:
        """SGLang's startup hook, before graph capture and KV sizing: compile
        and run, on no work, every kernel the drop-in launches, so none
        compiles (or takes device memory outside the pools) while serving,
        when an urgent relocation under a full pool could not afford it.
        kvarena's step kernels, every variant (``Arena.prewarm``), and
        SGLang's own page copy (relocation) and zeroing (hand-out) in each
        pool, on the sink page: page 0 copied onto itself (every byte
        written is the byte read) and zeroed (it holds only padding's writes)."""
        c = self.composite
        c.arena.prewarm()
        sink = torch.zeros(2, dtype=I64, device=c.device)  # two entries: a copy's batched path, as a real move's
        for name, pool in self._pools.items():
            pool.move_physical_pages(sink, sink, c.arena.pool(name).page_size)
        for name in self._zeroed:
            self._pools[name].zero_physical_pages(sink[:1])

    def verify_byte_accounting(self) -> list[str]:
        """[] when the composite verifies, else the violation, naming the
        pool (SGLang's idle check: where a breach of the per-step frees'
        contract shows, ``_free_reps``)."""
        try:
            self.composite.verify()
        except AccountingError as e:
            return [str(e)]
        return []

    def clear(self) -> None:
        """Free every page of every pool; the views return to their boot values."""
        self.free_group, self.free_page_reps_group, self.full_page_reps_group, self.full_free_group = None, None, [], []
        c = self.composite  # the tree's deferred frees first
        full = self.full_attn_allocator.physical_to_virtual
        live = full[full > 0]  # SYNC: a cold reset
        if live.numel():
            c.free(live * self.page_size)
        if STATE in self.CHAIN:
            self.mamba_allocator.clear()
        arena = self.composite.arena
        for n in self.CHAIN:
            if arena.is_lazy(n):
                arena.flush(n)
