"""Holds on the arena's moves, and the transfers that need them
(docs/design.md §13): ``HostTransfers``, the mixin of ``_Dropin`` that
SGLang's HiCache, PD disaggregation and retraction to host drive, and
``SWAHostTransfers``, the SWA stacks' load-back commit and PD's decode-side
preallocation.

HiCache is supported: the move gate SGLang installs
(``set_host_transfer_move_gate``) is read at every call and closes the
arena's gate while a host transfer is in flight, so no page moves under
it; the SWA load-back's physical reservations (``swa_attn_allocator.alloc``,
``set_full_to_swa_mapping``) are the arena's ``reserve`` and
``bind_reserved``; the transfers' done events are waited on before
anything moves again.  PD disaggregation is supported on both roles: its
move gate (``set_disagg_move_gate``) is the hold's second source, the
transfer engine's ids are the full read translation
(``translate_kv_indices_for_transfer``), and a decode node preallocates a
transferred request's SWA tail only (``alloc_extend_swa_tail``).  The gates
are kept by slot (``_install_move_gate``), each slot closing the arena's
gate for its source (``GATE_SOURCE``).
"""

import operator
from collections.abc import Callable
from typing import Any

import torch

from .views import FULL, I64, SGLANG_POOL, SWA, BandView, _pages_of, _tokens_of

# SGLang's move-gate slots, and the source of the arena's one hold each closes (spec.GATES).
GATE_SOURCE = {"host_transfer_move_gate": "host", "disagg_move_gate": "disagg"}


class HostTransfers:
    """SGLang's move gates and its transfers' done events (HiCache), the
    load-back's full-only allocation, the KV pools' host-transfer wiring,
    and the retraction backup's copies."""

    # Host transfers (HiCache, docs/design.md §13): SGLang's move gates by slot, and its transfers' done events.
    _move_gates: dict[str, Any]
    _transfer_events: dict[Any, Any]
    # The drop-in's (_Dropin, InFlightForwards).
    composite: Any
    _composite: Any
    _flight_event: Any
    CHAIN: tuple[str, ...]
    page_size: int
    full_attn_allocator: BandView
    _pools: dict[str, Any]
    _zeroed: list[str]
    _size_full: int
    _size_swa: int
    _views: Callable[[], list[BandView]]
    _current_stream: Callable[[], Any]
    _longer_than_any_state: Callable[[Any], bool]

    def _host_transfer_wiring(self, kvcache, unified_buffer) -> None:
        """What SGLang's composites set on the KV pools for HiCache: full
        transfers carry virtual ids, resolved on the transfer stream by the
        full translation (SWA ones carry physical ids already), and the host
        pools are sized by each sub-pool's token capacity."""
        kvcache.full_kv_pool.host_transfer_translate = self.full_attn_allocator.translate_kv_loc
        if SWA not in self.CHAIN:
            return
        for name, pool, tokens in (
            (FULL, kvcache.full_kv_pool, self._size_full),
            (SWA, kvcache.swa_kv_pool, self._size_swa),
        ):
            pool.host_capacity_tokens = tokens
            pool.host_capacity_bytes = tokens * unified_buffer.spec(SGLANG_POOL[name]).entry_bytes()

    # ------------------------------------------ host transfers (HiCache)

    def set_host_transfer_move_gate(self, gate) -> None:
        """SGLang's HiCache hook, at startup: ``gate()`` is True when no host
        transfer is in flight (``HiCacheController.has_inflight_device_transfers``
        reads its queues).  Every later call reads it first (``_sync_gate``):
        while it reads False the arena holds every move (docs/design.md §13),
        because a queued transfer addresses pages by the physical ids it
        resolved.  As SGLang's, it needs lazy compaction (an eager free
        compacts at once); eager: ``ValueError`` naming the pool."""
        self._install_move_gate("host_transfer_move_gate", gate, "HiCache")

    def set_disagg_move_gate(self, gate) -> None:
        """SGLang's PD hook, at scheduler startup on both roles:
        ``gate()`` is True when none of the node's KV transfers is in flight
        (``unified_memory_disagg_move_gate``: the prefill node's inflight
        queue and pending chunks, the decode node's transfer queue and
        published destinations).  The arena's hold gets it as its second
        source: while it reads False no page moves, because the transfer
        engine addresses pages by the physical ids
        ``translate_kv_indices_for_transfer`` gave it.  As SGLang's, it needs
        lazy compaction; eager: ``ValueError`` naming the pool."""
        self._install_move_gate("disagg_move_gate", gate, "PD disaggregation")

    def translate_kv_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """PD's KV transfer (both roles): virtual token ids to the full
        pool's physical token ids, int64, which the transfer engine
        addresses page envelopes by.  The full read translation; it stays
        valid while the transfer runs because the node's move gate holds
        every page where it is until the transfer ends.  On the device, no read."""
        return self.full_attn_allocator.translate_kv_loc(kv_indices.to(I64))

    def _install_move_gate(self, slot: str, gate, feature: str) -> None:
        if not callable(gate):
            raise ValueError(f"{feature}: the move gate must be callable, got {gate!r}")
        arena = self.composite.arena
        eager = [n for n in self.CHAIN if arena.pool(n).grow != "float" and not arena.is_lazy(n)]
        if eager:
            raise ValueError(
                f"pool {eager[0]!r}: {feature}'s move gate needs lazy compaction (an eager free moves pages "
                "under an in-flight transfer); unset SGLANG_DISABLE_LAZY_COMPACTION"
            )
        self._move_gates = {**self._move_gates, slot: gate}

    def _move_gate_targets(self) -> tuple["BandView", ...]:
        """Every member a move gate covers: all of them (one arena holds its moves whole)."""
        return tuple(self._views())

    def set_hicache_transfer_done_event(self, transfer_key, event) -> None:
        """SGLang's HiCache hook, after it submits a transfer: the event that
        fires when it is done (the latest per key).  Before anything moves
        again the schedule stream waits on every one (``_sync_gate``), as
        SGLang's sub-allocators do before a flush; a reference only."""
        self._transfer_events = {**self._transfer_events, transfer_key: event}

    def _sync_gate(self) -> None:
        """Read SGLang's move gates: the arena's gate is closed while any reads
        False (a host transfer in flight) and opened when all read True.  A
        host call over SGLang's queues, no tensor read; the arena's views
        see the gate as state, so a memo cannot outlive a flip
        (docs/design.md §13).  Once open, the transfers' done events are
        waited on (a device-side wait) before anything can move."""
        arena = self._composite.arena
        closed = {GATE_SOURCE[slot] for slot, gate in self._move_gates.items() if not gate()}
        for source in sorted(closed ^ arena.closed_gates):  # the sources that flipped
            (arena.close_gate if source in closed else arena.open_gate)(source)
        if not closed and self._transfer_events:
            self._wait_transfers()

    def _wait_transfers(self) -> None:
        stream = self._current_stream()
        for event in self._transfer_events.values():
            stream.wait_event(event)
        self._transfer_events = {}

    def moves_blocked(self) -> bool:
        """Whether the arena holds its moves now (a gate reads closed, or a
        load's reservation is not yet bound)."""
        return bool(self._gated().moves_held())

    def _gated(self) -> Any:
        """The arena, its gates read from SGLang's first (``composite``)."""
        return self.composite.arena

    def _alloc_full_only(self, need_size: int) -> torch.Tensor | None:
        """``full_attn_allocator.alloc``: HiCache's load-back allocates the full
        rows alone (``HybridCacheController.load``), their SWA side left
        unbound until ``set_full_to_swa_mapping``.  The uneven demand (no
        SWA token) runs the relief ladder if it must; the pages are zeroed
        as every hand-out is; virtual token ids, page-aligned."""
        n = self._tokens(FULL, need_size)
        if n == 0:
            return torch.empty(0, dtype=I64, device=self.composite.device)
        c = self.composite
        if not c.fits(n, swa_tokens=0 if SWA in self.CHAIN else None):
            c.relieve(n, swa_tokens=0 if SWA in self.CHAIN else None)
        ids = c.arena.alloc(FULL, n // self.page_size, check=False)
        if ids is None:
            return None
        if FULL in self._zeroed:
            self._pools[FULL].zero_physical_pages(c.arena.v2p_at(FULL, ids))
        return _tokens_of(ids, self.page_size)

    def _tokens(self, name: str, need_size) -> int:
        try:
            n = operator.index(need_size)
        except TypeError:
            raise ValueError(f"pool {name!r}: need_size must be an int, got {need_size!r}") from None
        if n < 0 or n % self.page_size:
            raise ValueError(f"pool {name!r}: need_size {n} must be a multiple of page_size {self.page_size}, >= 0")
        return n

    # ---------------------------------------------- retraction to host

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        """SGLang's retraction backup (``Req.offload_kv_cache``, PD decode's
        ``cpu_tensor`` backend): the bytes of ``indices`` (virtual token ids)
        and, where the KV pool carries it, the request's mamba state, copied
        to the host by SGLang's own code over kvarena's tables.  The forward
        in flight is settled first (its stream waited on, docs/design.md §12):
        the copy reads pages it may still write.  The copy moves nothing and
        frees nothing; the request's pages are freed by the retraction after
        it, by the ordinary calls."""
        self._settle_for_host_copy()
        return super().get_cpu_copy(indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index)

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        """SGLang's restore of a retraction backup (``Req.load_kv_cache``):
        ``kv_cache_cpu`` written at ``indices``' pages, which the resumed
        request was just allocated.  A fresh page is never one an in-flight
        forward reads or writes (``alloc`` settles before it hands out a
        guarded hole), but the forward is settled first all the same, as
        SGLang's resume waits on the forward stream first."""
        self._settle_for_host_copy()
        return super().load_cpu_copy(kv_cache_cpu, indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index)

    def _settle_for_host_copy(self) -> None:
        """Settle the forward in flight, if any: a device-side wait (the
        arena's ``on_settle``), no host read."""
        c = self.composite  # hands over what SGLang reported since the last call
        if c.arena.in_flight:
            c.settle()
            self._flight_event = None


class SWAHostTransfers(HostTransfers):
    """The SWA stacks' side of HiCache's load-back: the commit that binds the
    reserved SWA pages (``set_full_to_swa_mapping``), and SGLang's
    compaction gate over the arena's holds."""

    def clear_full_to_swa_mapping(self, full_indices: torch.Tensor) -> None:
        """Nothing to clear: SWA binds full's ids, there is no mapping tensor."""

    def set_full_to_swa_mapping(self, full_indices: torch.Tensor, swa_indices: torch.Tensor) -> None:
        """HiCache's load-back commit: the SWA pages reserved for a load
        (``swa_attn_allocator.alloc_physical``, physical token ids) go to the
        full rows they were loaded for (virtual token ids, live in full, SWA
        unbound): the arena's ``bind_reserved``.  Whole pages, token by
        token, as SGLang passes them; a cold path whose host checks raise
        ``ValueError`` naming the pool, nothing changed."""
        if full_indices is None or full_indices.numel() == 0:
            return
        if full_indices.numel() != swa_indices.numel():
            raise ValueError(
                f"pool 'swa': set_full_to_swa_mapping: {full_indices.numel()} full ids, {swa_indices.numel()} swa ids"
            )
        ps = self.page_size
        ids = _pages_of(full_indices, ps, "set_full_to_swa_mapping")
        pages = _pages_of(swa_indices, ps, "set_full_to_swa_mapping")
        self.composite.arena.bind_reserved(SWA, ids, pages)

    def alloc_extend_swa_tail(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> torch.Tensor | None:
        """A PD decode node's preallocation of one transferred request
        (``alloc_for_decode_prealloc``, page size > 1): full slots for every
        new position, SWA pages only for the new pages that hold the last
        ``swa_tail_len`` tokens; the composite's ``alloc_extend_swa_tail`` on
        its trusted path, no device read.  Its gate is the uneven demand
        SGLang's admission priced (``ensure_capacity(new_pages*ps,
        tail_pages*ps)``); the fresh pages are zeroed before SGLang sends
        their ids.  None on a shortfall; bad input a ``ValueError``."""
        try:
            return self.composite.alloc_extend_swa_tail(
                prefix_lens.to(I64),
                seq_lens.to(I64),
                last_loc.to(I64),
                False,
                swa_tail_len=operator.index(swa_tail_len),
                prefix_lens_cpu=prefix_lens_cpu,
                seq_lens_cpu=seq_lens_cpu,
                extend_num_tokens=extend_num_tokens,
            )
        except ValueError:
            if self._longer_than_any_state(seq_lens_cpu):
                return None
            raise

    def _compaction_allowed(self) -> bool:
        """Whether relief may move pages now: not while the arena holds its
        moves (a host transfer in flight, docs/design.md §13).  SGLang's
        ``reclaim_plan`` then prices the demand on the arena as it stands."""
        return not self.moves_blocked()
