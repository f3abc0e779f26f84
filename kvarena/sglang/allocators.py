"""kvarena's composites as sglang 0.5.23's three unified-memory allocators.

Each class here subclasses SGLang's class of the same name, so SGLang's
``isinstance`` checks hold, but never runs its ``__init__`` (that would
build SGLang's own sub-allocators and attach their tables to the KV pool).
What a call decides (allocation, relief, capacity, page tables) is the
implementation composite's; the bytes are SGLang's: the composite's arena is
lent the ``UnifiedKVPool``'s raw buffer and moves pages through the KV and
mamba pools' own ``move_physical_pages``.  kvarena adds tables, not memory.

The drop-in, by concern (this module holds the classes SGLang names, the
SWA stacks' calls and each stack's own):

- ``dropin.py``: what the three classes share (``_Dropin``): boot, the
  token surface, frees and free groups, the joint views, the checks;
- ``forwards.py``: SGLang's in-flight forwards (overlap scheduling);
- ``holds.py``: holds on the arena's moves and the host transfers that need
  them (HiCache's gates, done events and load-back, retraction to host);
- ``views.py``: the sub-allocator views SGLang's code reads, and the
  translation;
- ``surface.py``: which of SGLang's members are kvarena's, SGLang's
  (``INHERITED``) or unsupported (``UNSUPPORTED``);
- ``settings.py``: the policy and kernels an allocator is built with.

A speculative draft fused into the target's entries (``fused_draft``) is
supported: its K/V are more parts of the same slots, so the target's
allocation, frees and whole-envelope moves carry them (docs/design.md §11).
"""

from typing import Any

import torch

from kvarena.anchor.loader import import_sglang
from kvarena.impl import HybridSWA, MambaHybrid, TriPool

from .dropin import _Dropin
from .holds import SWAHostTransfers
from .surface import UNSUPPORTED, _install_unsupported
from .views import FULL, I64, STATE, SWA

_hs: Any = import_sglang("sglang.srt.mem_cache.allocator.unified_hybrid_swa")
_um: Any = import_sglang("sglang.srt.mem_cache.allocator.unified_mamba")


def _swa_views(cls):
    """The SWA side's views and frees (HybridSWA and TriPool)."""

    def swa_available_size(self) -> int:
        return min(self._size_swa - self.swa_attn_allocator.allocated_count(), self.schedulable_swa_available_size())

    def schedulable_swa_available_size(self) -> int:
        return self.composite.arena.schedulable_available_size(SWA)

    def conserve_swa_available_size(self) -> int:
        return self._size_swa - self.swa_attn_allocator.allocated_count()

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor, *, out: torch.Tensor | None = None):
        return self.swa_attn_allocator.translate_kv_loc(kv_indices, out=out)

    def swa_v2p_page_table(self) -> torch.Tensor:
        return self.swa_attn_allocator.virtual_to_physical

    def translate_swa_indices_for_transfer(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """Virtual ids to SWA-physical ones (SGLang's SWA tree calls it on insert)."""
        return self.swa_attn_allocator.translate_kv_loc(kv_indices.to(I64))

    def free_swa(self, free_index: torch.Tensor) -> None:
        """Tombstone the SWA entries of these tokens that are still live
        (full keeps its pages); one host read: how many were live."""
        if free_index is None or free_index.numel() == 0:
            return
        toks = free_index.reshape(-1).to(I64)
        # the composite reads one representative per page: each token stands for its own page
        reps = toks.repeat_interleave(self.page_size) if self.page_size > 1 else toks
        self._wait_forward(SWA)
        self.composite.free_swa(reps, 0, check=False)

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Tombstone a segment whose SWA pages are all live: their count is a
        shape, so nothing is read back."""
        if free_index is None or free_index.numel() == 0:
            return
        reps = self._reps(free_index, start_pos, "free_swa_segment")
        c = self._handed()  # not through ``composite``: the drain's deferred full-side frees wait for it
        self._wait_forward(SWA)
        c.free_swa(
            reps.repeat_interleave(self.page_size) if self.page_size > 1 else reps, 0, False, num_live=reps.numel()
        )

    def free_full(self, free_index: torch.Tensor) -> None:
        """Free tokens whose SWA side is already tombstoned."""
        if free_index is None or free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.full_free_group.append(free_index.reshape(-1).to(I64).clone())
            return
        self._free_tolerant(free_index.reshape(-1).to(I64))

    def ensure_capacity(self, full_tokens: int, swa_tokens: int) -> bool:
        """Does the uneven demand fit, after the relief ladder if it must run
        (flush, slide; no eviction)?"""
        if full_tokens < 0 or swa_tokens < 0:
            return False
        full, swa = int(full_tokens), int(swa_tokens)
        if self._fits(self.composite, full, swa):
            return True
        self._relieve(full, swa)
        return self._fits(self.composite, full, swa)

    def _fits_page_demand(
        self,
        num_full_pages: int,
        num_swa_pages: int,
        *,
        full_reclaim_pages: int = 0,
        swa_reclaim_pages: int = 0,
        compacted: bool = False,
        empty_pool: bool = False,
    ) -> bool:
        """Does a demand of full and SWA pages fit once the reclaimed pages
        are free?  On the boot state for ``empty_pool``.  ``compacted`` (what
        SGLang's ``reclaim_plan`` asks, kvarena's moves having no gates): the
        pages left live after the reclaim, packed, plus the demand, priced on
        the boot state, as relief packs the bands.  Otherwise freed pages are
        taken first by a bind (holes, or a retreated eager frontier), so the
        demand net of the reclaim is priced against the arena as it stands."""
        ps = self.page_size
        if compacted and not empty_pool:
            arena = self.composite.arena
            live = {n: arena.live_pages(n) for n in self.CHAIN}
            full = live[FULL] - min(live[FULL], max(0, full_reclaim_pages)) + num_full_pages
            swa = live[SWA] - min(live[SWA], max(0, swa_reclaim_pages)) + num_swa_pages
            return self._boot_state().fits(max(full, swa) * ps, state_slots=live.get(STATE, 0), swa_tokens=swa * ps)
        full = max(0, num_full_pages - full_reclaim_pages) * ps
        swa = max(0, num_swa_pages - swa_reclaim_pages) * ps
        return self._fits(self._boot_state() if empty_pool else self.composite, full, swa)

    for f in (
        swa_available_size,
        schedulable_swa_available_size,
        conserve_swa_available_size,
        translate_loc_from_full_to_swa,
        translate_swa_indices_for_transfer,
        free_swa,
        free_swa_segment,
        free_full,
        ensure_capacity,
        _fits_page_demand,
    ):
        setattr(cls, f.__name__, f)
    cls.swa_v2p_page_table = property(swa_v2p_page_table)
    cls._conserve_swa_available_size = conserve_swa_available_size
    return cls


def _fits(composite, full_tokens: int, swa_tokens: int) -> bool:
    """The composite's uneven gate.  SWA binds a subset of full's new ids, so
    a demand of more SWA than full (only HiCache's load-back asks for it: SWA
    pages for rows whose full side is resident) is priced as that many full
    tokens too: sound, and conservative by the full side's share."""
    return composite.fits(max(full_tokens, swa_tokens), swa_tokens=swa_tokens)


def _relieve(composite, full_tokens: int, swa_tokens: int) -> bool:
    return composite.relieve(max(full_tokens, swa_tokens), swa_tokens=swa_tokens)


@_swa_views
class _SWACalls(_Dropin, SWAHostTransfers):
    _fits = staticmethod(_fits)

    def _relieve(self, full_tokens: int, swa_tokens: int) -> bool:
        return _relieve(self.composite, full_tokens, swa_tokens)


class UnifiedSWATokenToKVPoolAllocator(_SWACalls, _hs.UnifiedSWATokenToKVPoolAllocator):
    """Full + sliding-window KV on one buffer: kvarena's ``HybridSWA`` (swa an
    up END, full a down END), over SGLang's ``UnifiedSWAKVPool``."""

    KIND = HybridSWA
    CHAIN = (SWA, FULL)

    def __init__(
        self,
        *,
        unified_buffer,
        kvcache,
        device: str,
        full_max_total_num_tokens: int | None = None,
        swa_max_total_num_tokens: int | None = None,
        page_size: int | None = None,
        need_sort: bool = False,
        forward_stream=None,
        lazy_compaction: bool = False,
        policy: str | None = None,
    ) -> None:
        self._boot(
            unified_buffer=unified_buffer,
            kvcache=kvcache,
            state_pool=None,
            device=device,
            page_size=page_size,
            need_sort=need_sort,
            policy=policy,
            lazy_compaction=lazy_compaction,
            forward_stream=forward_stream,
            full_max_total_num_tokens=full_max_total_num_tokens,
            swa_max_total_num_tokens=swa_max_total_num_tokens,
        )

    def _composite_args(self, total_bytes: int, entry: dict[str, int]) -> tuple[int, ...]:
        return (total_bytes, entry[FULL], entry[SWA])


class UnifiedMambaSWATokenToKVPoolAllocator(_SWACalls, _hs.UnifiedMambaSWATokenToKVPoolAllocator):
    """Full KV + sliding-window KV + mamba state on one buffer: kvarena's
    ``TriPool`` (state an up END, swa a float, full a down END)."""

    KIND = TriPool
    CHAIN = (STATE, SWA, FULL)

    def __init__(
        self,
        *,
        unified_buffer,
        kvcache,
        mamba_kvcache,
        device: str,
        full_max_total_num_tokens: int,
        swa_max_total_num_tokens: int,
        page_size: int | None = None,
        need_sort: bool = False,
        forward_stream=None,
        lazy_compaction: bool = False,
        policy: str | None = None,
    ) -> None:
        self._boot(
            unified_buffer=unified_buffer,
            kvcache=kvcache,
            state_pool=mamba_kvcache,
            device=device,
            page_size=page_size,
            need_sort=need_sort,
            policy=policy,
            lazy_compaction=lazy_compaction,
            forward_stream=forward_stream,
            full_max_total_num_tokens=full_max_total_num_tokens,
            swa_max_total_num_tokens=swa_max_total_num_tokens,
        )
        # None, as SGLang's tri-pool: its leak checker then skips the flat free-list census
        self.free_pages = None
        self.release_pages = None
        # The retraction backup carries the state itself, translated (get_cpu_copy): SGLang's
        # Req.offload_kv_cache would hand the mamba pool the virtual slot id, which it reads as a row.
        kvcache.cpu_copy_carries_mamba = True

    def _composite_args(self, total_bytes: int, entry: dict[str, int]) -> tuple[int, ...]:
        return (total_bytes, entry[FULL], entry[SWA], entry[STATE])

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        """The retraction backup (``HostTransfers.get_cpu_copy``) with the
        request's mamba state in it, read at its physical slot.  SGLang
        0.5.23's ``Req.offload_kv_cache`` on this stack passes the mamba pool the
        virtual slot id, which the pool (a physical store) reads as a row: it
        backs up whatever state lives there (docs/design.md §9).  Since the
        KV pool here says it carries the state, SGLang leaves it to us."""
        kv = super().get_cpu_copy(indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index)
        state = None if mamba_indices is None else self._pools[STATE].get_cpu_copy(self._state_rows(mamba_indices))
        return {"kv": kv, "state": state}

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        """Restore ``get_cpu_copy``'s backup: the KV at ``indices``' pages,
        the state at ``mamba_indices``' physical slot."""
        super().load_cpu_copy(kv_cache_cpu["kv"], indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index)
        if kv_cache_cpu["state"] is not None and mamba_indices is not None:
            self._pools[STATE].load_cpu_copy(kv_cache_cpu["state"], self._state_rows(mamba_indices))

    def _state_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Virtual state slots -> the state pool's physical rows."""
        return self.mamba_allocator.virtual_to_physical[torch.as_tensor(slots).reshape(-1).to(I64)]

    def prepare_mamba_allocation(self, target_size: int) -> None:
        """Make room for ``target_size`` state slots if relief can (flush,
        slide; no eviction); the slot allocator then asks the state band."""
        _prepare_state(self, target_size)

    def mamba_slot_full_token_cost(self) -> int:
        return self.composite.state_slot_token_cost()

    def _token_reclaim_satisfied(self, num_tokens: int) -> bool:
        """SGLang's stop test for a round of eviction: the demand fits now
        (sufficient; the relief ladder in ``ensure_capacity`` may need less)."""
        return self._token_id_capacity(num_tokens) and self.composite.fits(num_tokens)


class UnifiedMambaTokenToKVPoolAllocator(_Dropin, _um.UnifiedMambaTokenToKVPoolAllocator):
    """Full KV + mamba state on one buffer: kvarena's ``MambaHybrid`` (state
    an up END, full a down END), over SGLang's ``HybridLinearKVPool``."""

    KIND = MambaHybrid
    CHAIN = (STATE, FULL)

    def __init__(
        self,
        *,
        unified_buffer,
        kvcache,
        device: str,
        page_size: int | None = None,
        need_sort: bool = False,
        forward_stream=None,
        lazy_compaction: bool = False,
        policy: str | None = None,
    ) -> None:
        self._boot(
            unified_buffer=unified_buffer,
            kvcache=kvcache,
            state_pool=kvcache.mamba_pool,
            device=device,
            page_size=page_size,
            need_sort=need_sort,
            policy=policy,
            lazy_compaction=lazy_compaction,
            forward_stream=forward_stream,
        )

    def _composite_args(self, total_bytes: int, entry: dict[str, int]) -> tuple[int, ...]:
        return (total_bytes, entry[FULL], entry[STATE])

    @property
    def size(self) -> int:
        """SGLang's: dynamic, the available view plus the live tokens, so the
        idle leak check (``available + held == size``) cancels the view."""
        return self.available_size() + self.full_attn_allocator.allocated_count()

    @size.setter
    def size(self, value) -> None:
        pass  # SGLang's base __init__ assigns it

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_mamba(self) -> int:
        return self.mamba_allocator.max_slots - 1

    def available_size(self) -> int:
        """SGLang's view for this stack: full's schedulable size, which
        credits the state END's lazy holes (an allocation's relief flushes
        them), so the retract gate and eviction do not over-reclaim."""
        return self.composite.arena.schedulable_available_size(FULL)

    def full_available_size(self) -> int:
        return self.available_size()

    def prepare_mamba_allocation(self, target_size: int) -> None:
        _prepare_state(self, target_size)

    def mamba_slot_full_token_cost(self) -> int:
        return self.composite.state_slot_token_cost()

    def ensure_capacity(self, full_tokens: int, swa_tokens: int = 0) -> bool:
        if full_tokens < 0:
            return False
        if self.composite.fits(full_tokens):
            return True
        self.composite.relieve(full_tokens)
        return self.composite.fits(full_tokens)


def _prepare_state(allocator, target_size: int) -> None:
    if target_size <= allocator.composite.state_available_size():
        return
    allocator.composite.relieve(state_slots=target_size)


_BASE_OF = {
    UnifiedSWATokenToKVPoolAllocator: _hs.UnifiedSWATokenToKVPoolAllocator,
    UnifiedMambaSWATokenToKVPoolAllocator: _hs.UnifiedMambaSWATokenToKVPoolAllocator,
    UnifiedMambaTokenToKVPoolAllocator: _um.UnifiedMambaTokenToKVPoolAllocator,
}
for _cls, _sglang_cls in _BASE_OF.items():
    _install_unsupported(_cls, [n for n in UNSUPPORTED if hasattr(_sglang_cls, n)])

ALLOCATORS = tuple(_BASE_OF)
