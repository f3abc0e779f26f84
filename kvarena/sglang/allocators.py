"""kvarena's composites as sglang 0.5.23's three unified-memory allocators.

Each class here subclasses SGLang's class of the same name, so SGLang's
``isinstance`` checks hold, but never runs its ``__init__`` (that would
build SGLang's own sub-allocators and attach their tables to the KV pool).
What a call decides (allocation, relief, capacity, page tables) is the
implementation composite's; the bytes are SGLang's: the composite's arena is
lent the ``UnifiedKVPool``'s raw buffer and moves pages through the KV and
mamba pools' own ``move_physical_pages``.  kvarena adds tables, not memory.

Every member of SGLang's classes falls in one of three sets, which
``tests/sglang/test_surface.py`` checks against SGLang's own classes:

- **kvarena's**: defined here, on the composite.
- **SGLang's scheduling policy** (``INHERITED``): pure functions of the views
  and gates defined here (``reclaim_plan``, ``can_reserve``, the prefill
  budget, ...), inherited as they are, so SGLang decides how much to evict
  and kvarena what fits.
- **Unsupported** (``UNSUPPORTED``): PD disaggregation (retraction to host
  aside: ``get_cpu_copy`` / ``load_cpu_copy`` are kvarena's), decode
  context parallelism, post-capture backing, and SGLang's
  own sub-allocator machinery that the composite replaces; each raises
  ``NotImplementedError`` naming the feature.

HiCache is supported (docs/design.md §13): the move gate SGLang installs
(``set_host_transfer_move_gate``) is read at every call and closes the
arena's gate while a host transfer is in flight, so no page moves under
it; the SWA load-back's physical reservations (``swa_attn_allocator.alloc``,
``set_full_to_swa_mapping``) are the arena's ``reserve`` and
``bind_reserved``; the transfers' done events are waited on before
anything moves again.

A speculative draft fused into the target's entries (``fused_draft``) is
supported: its K/V are more parts of the same slots, so the target's
allocation, frees and whole-envelope moves carry them (docs/design.md §11).

Overlap scheduling (SGLang's default) is supported: the two hooks the
scheduler calls after each launch (``set_latest_forward_done_event``,
``set_inflight_forward``) keep references, the next call hands the forward
to the composite (its pages pinned until it is settled), and a settle is
the schedule stream's wait on the forward's done event (docs/design.md §12).

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
(``factories.kernels_choice``).  On Triton the translations SGLang's
attention calls are one kernel launch each too.
"""

import logging
import operator
from typing import Any

import torch

from kvarena.anchor.loader import import_sglang
from kvarena.impl import HybridSWA, MambaHybrid, TriPool
from kvarena.impl import kernels as launches
from kvarena.spec.geometry import AccountingError

from . import factories

_hs: Any = import_sglang("sglang.srt.mem_cache.allocator.unified_hybrid_swa")
_um: Any = import_sglang("sglang.srt.mem_cache.allocator.unified_mamba")
_base: Any = import_sglang("sglang.srt.mem_cache.allocator.base")
_pools: Any = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
# The KV pools whose pages SGLang zeroes when its sub-allocator hands them out
# (``MultiEndedAllocator._zero_pages_on_alloc``): MHA and MLA, never mamba state.
ZEROED_ON_HAND_OUT = (_pools.UnifiedMHATokenToKVPool, _pools.UnifiedMLATokenToKVPool)

I64 = torch.int64
FULL, SWA, STATE = "full", "swa", "state"
SGLANG_POOL = {FULL: "full", SWA: "swa", STATE: "mamba"}  # kvarena's pool name -> SGLang's sub-pool
POLICIES = ("planner", "anchor")

# SGLang's members that stay SGLang's: scheduling policy over the gates below.
INHERITED = frozenset(
    {
        "reclaim_plan",
        "can_reserve",
        "prealloc_fits",
        "prealloc_fits_assumes_reclaim",
        "prealloc_ceiling_fits",
        "reclaim_for_prealloc",
        "create_prefill_budget",
        "max_new_tokens_for_memory",
        "swa_capacity_and_available",
        "get_extend_allocation_demand",
        "evict_to_free_tokens",
        "request_slot_reserve",
        "current_full_capacity",
        "current_swa_capacity",
        "size",
        "size_full",
        "size_swa",
        "get_kvcache",
        "mamba_full_cache_donor",
        "flush_deferred_full_frees",
        "full_tokens_before_mamba_recheck",
        "merge_and_sort_free",
        "_copy_for_free_group",
        "check_decode_capacity",
        "free_segments",
        "free_full_segments",
        "_page_disjoint",
        "free_full",  # the mamba stack's: a plain free (no SWA peer)
        "get_all_free_pages",
        "new_pages_available",
        "swa_req_ring",
        "_token_id_capacity",  # the tri-pool's eviction gates, over the views' id and byte counts
        "_token_allocation_byte_shortfall",
    }
)

# SGLang's members kvarena does not support, and the feature each belongs to.
UNSUPPORTED = {
    "alloc_extend_swa_tail": "PD disaggregation (decode-node preallocation)",
    "translate_kv_indices_for_transfer": "PD disaggregation (KV transfer)",
    "set_disagg_move_gate": "PD disaggregation (move gates)",
    "resize": "post-capture KV backing",
    "swa_ring_cost_tokens": "the per-request SWA ring",
}
_INTERNAL = "SGLang's own sub-allocators (kvarena's composite replaces them)"
_STATIC_SWA = "SGLang's static SWA allocator (full_to_swa_index_mapping)"
UNSUPPORTED |= dict.fromkeys(
    (
        "_build_swa_attn_allocator",
        "_wire_peers",
        "_flush_targets",
        "_ask_float_for_room",
        "_alloc_demand",
        "_extend_in_virtual_space",
        "_free_swa_page_reps",
        "_release_page_reps",
        "_joint_capacity_memo_violations",
        "_token_end_frontiers",
        "_token_end_reclaim_satisfied",
        "_token_float_high_target",
    ),
    _INTERNAL,
)
UNSUPPORTED |= dict.fromkeys(
    ("_expand_to_full_pages", "_free_swa_pages", "_free_swa_pages_cuda", "_free_swa_pages_none_cuda", "_release_swa"),
    _STATIC_SWA,
)


_log = logging.getLogger(__name__)
_IDLE = object()  # set_latest_forward_done_event(None): no forward in flight (a report, see _Dropin)


def _unsupported(feature: str):
    raise NotImplementedError(
        f"kvarena.sglang: {feature} is not supported by kvarena's allocator "
        "(docs/guides/integrating.md, 'SGLang on kvarena')"
    )


def _raiser(name: str, feature: str):
    def method(self, *args, **kwargs):
        _unsupported(f"{feature}: {name}")

    method.__name__ = name
    method.__doc__ = f"Unsupported: {feature} (raises ``NotImplementedError``)."
    return method


def _unsupported_property(name: str, feature: str):
    def get(self):
        _unsupported(f"{feature}: {name}")

    return property(get, doc=f"Unsupported: {feature}.")


def _translate(
    v2p: torch.Tensor, ps: int, loc: torch.Tensor, out: torch.Tensor | None, fused: bool = False
) -> torch.Tensor:
    """SGLang's translation: ``v2p[t // ps] * ps + t % ps``, and ``0`` (the
    sink every kernel skips) for an unbound, negative or out-of-range id.
    Any shape; int64; sync-free.  ``fused``: one Triton launch (the arena's
    ``translate`` kernel, the same rule), written straight into ``out`` when
    it is a contiguous int64 tensor of ``loc``'s size."""
    t = loc.to(I64)
    if fused:
        flat = t.reshape(-1).contiguous()
        direct = out is not None and out.dtype == I64 and out.is_contiguous() and out.numel() == flat.numel()
        dst = out.view(-1) if out is not None and direct else torch.empty_like(flat)
        if flat.numel():  # numel: a shape
            launches.translate(flat, dst, v2p, v2p.numel() - 1, ps)  # the last row: the -1 sentinel
        if out is None:
            return dst.view(t.shape)
        if not direct:
            out.copy_(dst.reshape(out.shape))
        return out
    last = v2p.numel() - 1  # the -1 sentinel row
    page = torch.div(t, ps, rounding_mode="floor")
    row = torch.where((t >= 0) & (page < last), page, last)
    phys = v2p.index_select(0, row.reshape(-1)).reshape(t.shape)
    res = torch.where(phys > 0, phys * ps + torch.remainder(t, ps), 0)
    if out is None:
        return res
    out.copy_(res.reshape(out.shape))
    return out


class BandView:
    """One band as SGLang's code reads a sub-allocator (``full_attn_allocator``,
    ``swa_attn_allocator``, the mamba END): geometry, live page tables,
    counts and translations.  It allocates nothing; allocation is the
    composite's."""

    shards_under_dcp = False  # decode context parallelism is unsupported

    def __init__(self, owner: "_Dropin", name: str) -> None:
        arena = owner.composite.arena
        g, p = arena.geometry(name), arena.pool(name)
        self._owner, self._name = owner, name
        self.sub_pool_name = SGLANG_POOL[name]
        self.page_size = self.pool_page_size = p.page_size
        self.entry_bytes = p.entry_bytes
        self.entry_bytes_per_page = g.epp
        self.num_pages = g.num_pages
        self.min_page_index = g.min_page
        self.max_slots = owner.unified_buffer.max_slots(self.sub_pool_name)  # SGLang's, in slots
        self.min_slot_index = owner.unified_buffer.min_slot_index(self.sub_pool_name)
        self.grow_direction = p.grow
        self.device = arena.device
        v2p, p2v = arena.live_tables(name)
        self.num_virtual_ids = v2p.numel() - 1
        self._v2p, self._p2v = v2p, p2v

    @property
    def _arena(self) -> Any:
        """The arena, through the owner: what SGLang reported since its last
        call is handed over first, so a view counts the frees it deferred."""
        return self._owner.composite.arena

    @property
    def virtual_to_physical(self) -> torch.Tensor:
        """The live page table (a view the arena updates in place): read only."""
        return self._v2p

    @property
    def physical_to_virtual(self) -> torch.Tensor:
        return self._p2v

    @property
    def watermark_physical(self) -> int:
        """The frontier facing the shared gap: the first page past an up
        END's span, the last page before a down END's."""
        c = self._arena.counts(self._name)
        return c.hi if self.grow_direction == "up" else c.lo - 1

    def translate_kv_loc(self, loc: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        return _translate(self._v2p, self.page_size, loc, out, self._arena.kernels == "triton")

    def translate_write_loc(
        self, loc: torch.Tensor, *, out: torch.Tensor | None = None, out_width: int | None = None
    ) -> torch.Tensor:
        """The write translation: the read one (no context parallelism here).
        ``out_width`` writes that many packed lanes of a 1-D ``out``, the
        batch's ``loc.numel()`` ids (any shape, packed) then the sink, as
        SGLang's does; a width under the batch is a ``ValueError``."""
        fused = self._arena.kernels == "triton"
        if out is None or out_width is None:
            return _translate(self._v2p, self.page_size, loc, out, fused)
        n = loc.numel()  # SGLang's contract: every id of the batch, whatever loc's shape
        if not n <= out_width <= out.numel() or out.dim() != 1:
            raise ValueError(
                f"pool {self._name!r}: translate_write_loc: out_width {out_width} must hold the batch's {n} ids "
                f"within a 1-D out of {out.numel()}"
            )
        _translate(self._v2p, self.page_size, loc.reshape(-1), out[:n], fused)
        out[n:out_width].zero_()
        return out

    def allocated_count(self) -> int:
        """Live tokens (pages times the page size)."""
        return self._arena.live_pages(self._name) * self.page_size

    def _live_pages(self) -> int:
        return self._arena.live_pages(self._name)

    @property
    def free_virtual_ids(self) -> torch.Tensor:
        """The unbound ids, front first (a copy; empty for a borrower)."""
        return self._arena.free_ids(self._name)

    def available_size(self) -> int:
        return self._arena.available_size(self._name)

    def schedulable_available_size(self) -> int:
        """SGLang's move gates are read first: a held arena credits no hole a
        move would deliver (docs/design.md §13)."""
        return self._owner._gated().schedulable_available_size(self._name)

    def moves_blocked(self) -> bool:
        """SGLang's gate query: whether the arena holds its moves now."""
        return self._owner.moves_blocked()

    # HiCache's load-back (docs/design.md §13): full rows alone, SWA pages reserved by physical id.

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Full: ``need_size`` tokens of full rows alone, their SWA side
        unbound (``HybridCacheController.load``); virtual token ids, or None.
        SWA: a reservation (``alloc_physical``), the id space SGLang's
        load-back allocates and rolls back in for a sub-allocator that is
        not its own (``_swa_allocation_callbacks``)."""
        if self._name == FULL:
            return self._owner._alloc_full_only(need_size)
        return self.alloc_physical(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        """Full: free these tokens' pages (SWA entries that are live go with
        them; the drop-in's plain free).  SWA: cancel a reservation
        (``cancel_physical_reservation``)."""
        if self._name == FULL:
            if free_index is not None and free_index.numel():
                self._owner._free_tolerant(free_index.reshape(-1).to(I64))
            return
        self.cancel_physical_reservation(free_index)

    def alloc_physical(self, need_size: int) -> torch.Tensor | None:
        """SWA only: reserve pages for a load-back's H2D copy and return their
        PHYSICAL token ids, or None.  The pages are live in every view, owned
        by no id, and hold the arena's moves until ``set_full_to_swa_mapping``
        binds them or they are cancelled: the queued copy carries these ids.
        A shortfall runs the arena's relief ladder for the pool first."""
        if self._name != SWA:
            _unsupported(f"alloc_physical on the {self.sub_pool_name!r} sub-allocator")
        n = self._owner._tokens(SWA, need_size) // self.page_size
        arena = self._owner.composite.arena
        if n == 0:
            return torch.empty(0, dtype=I64, device=arena.device)
        if n > arena.available_pages(SWA):
            arena.relieve(SWA, n)
        pages = arena.reserve(SWA, n)
        if pages is None:
            return None
        return _tokens_of(torch.as_tensor(pages, dtype=I64, device=arena.device), self.page_size)

    def cancel_physical_reservation(self, free_index: torch.Tensor) -> None:
        """SWA only: give reserved pages back (a load-back rolled back); they
        become holes.  The transfers' done events are waited on first, as
        SGLang's ``free_physical`` does.  A page not reserved: ``ValueError``
        naming the pool, nothing changed."""
        if self._name != SWA:
            _unsupported(f"cancel_physical_reservation on the {self.sub_pool_name!r} sub-allocator")
        if free_index is None or free_index.numel() == 0:
            return
        owner = self._owner
        arena = owner.composite.arena
        if owner._transfer_events:
            owner._wait_transfers()
        arena.cancel(SWA, _pages_of(free_index, self.page_size, "cancel_physical_reservation"))

    free_physical = cancel_physical_reservation

    def is_slot_allocated(self, slot: int) -> bool:
        page = int(slot) // self.page_size
        return 0 < page < self.num_virtual_ids and int(self._v2p[page]) > 0  # SYNC: a debug query

    def allocator_state_str(self) -> str:
        c = self._arena.counts(self._name)
        return f"{self.sub_pool_name}: span [{c.lo}, {c.hi}), live {c.live}, holes {c.holes}"

    def clear_inverse_history(self) -> None:
        """Nothing to clear: kvarena's ``p2v`` is exact at every step."""

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int = 0) -> None:
        """Full only (SGLang's tree frees a node's full side here, its SWA side
        by ``free_swa_segment`` in the same drain): the drop-in's
        ``_defer_full_free``, nothing read."""
        if self._name != FULL:
            _unsupported(f"free_segment on the {self.sub_pool_name!r} sub-allocator (the external KV linker)")
        if free_index is None or free_index.numel() == 0:
            return
        self._owner._defer_full_free(self._owner._reps(free_index, start_pos))

    def bind(self, virtual_pages: torch.Tensor, physical_pages: torch.Tensor) -> None:
        """SWA only: hand the SWA pages ``physical_pages`` (live, owned by
        other ids) to ``virtual_pages`` (live in full, SWA tombstoned), as
        SGLang's tree does when an insert lands over an evicted SWA range
        (``SWAComponent._transfer_swa_pages``, which then tombstones the old
        owners itself).  As SGLang's ``bind``, a rebind of the tables, no
        bytes moved: the new owners name the pages, the old owners are
        tombstoned here already, the same pages stay live (no count, span or
        hole changes, so no view does).  A cold path: the ids are checked on
        the host first (``ValueError`` naming the pool, nothing changed),
        then three table writes."""
        if self._name != SWA:
            _unsupported(f"bind on the {self.sub_pool_name!r} sub-allocator")
        arena = self._owner.composite.arena  # through the owner: an in-flight forward is handed over first
        kept = virtual_pages.reshape(-1).to(I64)
        pages = physical_pages.reshape(-1).to(I64)
        v2p, p2v = arena.live_tables(SWA)
        ids, phys = kept.tolist(), pages.tolist()  # SYNC: a cold path (SGLang's caller reads them too)
        g, end = arena.geometry(SWA), arena.id_end(SWA)
        if len(ids) != len(phys) or len(set(ids)) != len(ids) or len(set(phys)) != len(phys):
            raise ValueError(f"bind: pool 'swa': {len(ids)} ids for {len(phys)} pages, each once: {ids} -> {phys}")
        if any(not g.min_page <= p < g.num_pages for p in phys) or any(not 0 < v < end for v in ids):
            raise ValueError(f"bind: pool 'swa': ids {ids} or pages {phys} out of range")
        old = p2v.index_select(0, pages)
        # SYNC: the cold path's checks: the pages' owners, the new owners' swa and full entries
        owners, swa, full = (t.tolist() for t in (old, arena.v2p_at(SWA, kept), arena.v2p_at(FULL, kept)))
        if min(owners, default=1) < 1 or any(p != -1 for p in swa) or min(full, default=1) < 1:
            raise ValueError(
                f"bind: pool 'swa': pages {phys} must be live and ids {ids} live in full, tombstoned in swa"
            )
        v2p.index_fill_(0, old, -1)  # the old owners: tombstoned
        v2p.index_copy_(0, kept, pages)
        p2v.index_copy_(0, pages, kept)


class StateView(BandView):
    """The mamba END, as ``UnifiedMambaSlotAllocator`` drives it: slots come
    from the composite's state band (``alloc_state``/``free_state``)."""

    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self._owner.composite.alloc_state(need_size)

    def free(self, free_index: torch.Tensor) -> None:
        """A request's slots, live and each once (SGLang's contract, its
        lazy free's too): the engine's step, nothing read."""
        if free_index is None or free_index.numel() == 0:
            return
        c = self._owner._handed()  # not through ``composite``: a tree drain's deferred full-side frees wait for it
        self._owner._wait_forward(STATE)
        c.free_state(free_index.reshape(-1).to(I64), check=False)

    def clear(self) -> None:
        live = self._p2v[self._p2v > 0]  # SYNC: a cold reset
        if live.numel():
            self._owner.composite.free_state(live)


def _tokens_of(pages: torch.Tensor, ps: int) -> torch.Tensor:
    """Every token id of these pages, page by page (``page*ps + offset``)."""
    pages = pages.reshape(-1).to(I64)
    if ps == 1:
        return pages
    return (pages.unsqueeze(1) * ps + torch.arange(ps, dtype=I64, device=pages.device)).reshape(-1)


def _pages_of(token_ids: torch.Tensor, ps: int, what: str) -> list[int]:
    """The pages of whole-page token runs (``page*ps + 0 .. ps-1``, in order),
    as SGLang's HiCache passes them; anything else is a ``ValueError`` naming
    the pool.  A cold path: one host read."""
    toks = token_ids.reshape(-1).to(I64).cpu()  # SYNC: HiCache's load-back, a cold path
    if toks.numel() % ps:
        raise ValueError(f"pool 'swa': {what}: {toks.numel()} token ids are not whole pages of {ps}")
    rows = toks.reshape(-1, ps)
    pages = torch.div(rows[:, 0], ps, rounding_mode="floor")
    if bool((rows[:, 0] % ps != 0).any()) or not torch.equal(rows, pages.unsqueeze(1) * ps + torch.arange(ps)):
        raise ValueError(f"pool 'swa': {what}: token ids {toks.tolist()} are not whole pages of {ps}")
    return pages.tolist()


def _dcp_size() -> int:
    """The decode-context-parallel width SGLang's runtime context publishes (1 without one)."""
    try:
        return int(import_sglang("sglang.srt.runtime_context").get_parallel().attn_dcp_size)
    except Exception:  # no context published: a single rank
        return 1


def _zeroing(kind: type) -> type:
    """``kind`` whose coupled bind (every page it hands out for tokens) then
    calls ``on_fresh(ids)``: the drop-in zeroes those pages there, as SGLang's
    sub-allocators zero a page envelope on hand-out."""

    class Zeroing(kind):  # type: ignore[misc, valid-type]
        on_fresh: Any = None

        def _take_pages(self, n: int, slots: Any = None) -> torch.Tensor | None:
            ids = super()._take_pages(n, slots)
            if ids is not None and ids.numel() and self.on_fresh is not None:  # numel: a shape
                self.on_fresh(ids)
            return ids

    Zeroing.__name__ = Zeroing.__qualname__ = kind.__name__  # snapshots and memo keys name the composite
    return Zeroing


_ZEROING: dict[type, type] = {kind: _zeroing(kind) for kind in (HybridSWA, MambaHybrid, TriPool)}


def _refuse_moves(name: str, dst: torch.Tensor, src: torch.Tensor) -> None:
    raise AssertionError(f"pool {name!r}: the boot-state twin decides on counts and never moves a page")


class _Dropin:
    """What the three allocators share: construction over SGLang's pools,
    the token surface, frees and free groups, gates and checks."""

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
    # Overlap scheduling (docs/design.md §12): SGLang's in-flight forward, as its two hooks left it.
    _forward_due: list[Any] | None = None  # (done event, out_cache_loc or None) or _IDLE, not yet handed over
    _flight_event: Any = None  # the done event of the last forward the composite was handed
    _full_after_swa: list[torch.Tensor]  # the tree's full-side frees, until its drain ends
    # Host transfers (HiCache, docs/design.md §13): SGLang's move gates by slot, and its transfers' done events.
    _move_gates: dict[str, Any]
    _transfer_events: dict[Any, Any]

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
        kw["kernels"] = factories.kernels_choice(self.DEFAULT_KERNELS)  # KVARENA_KERNELS, else the device's default
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

    def _zero_fresh(self, ids: torch.Tensor) -> None:
        """Zero the page envelopes just bound to ``ids``, through SGLang's own
        ``zero_physical_pages``, in every pool SGLang zeroes on hand-out: some
        attention kernels load whole pages (trtllm_mha's fmha_v2 prefill, fp8
        XQA decode, MLA) and a NaN left past ``seq_len`` (a former mamba
        state's bytes, say) reaches their output.  On the device, no read."""
        arena = self.composite.arena
        for name in self._zeroed:
            self._pools[name].zero_physical_pages(arena.v2p_at(name, ids))

    def _current_stream(self) -> Any:
        """The stream this thread issues work on, for the pool's device:
        ``torch.cuda``'s on CUDA, ``torch.cpu``'s on CPU (where a wait is a
        no-op: CPU work runs in program order), never ``torch.cuda`` on a
        CPU tensor's path."""
        return torch.get_device_module(self._composite.device).current_stream()

    def _wait_forward(self, *pools: str) -> None:
        """Before a free of ``pools`` writes tables or moves pages: eager mode
        orders it after the in-flight forward, ``current_stream().wait_stream(
        forward_stream)``, as SGLang's ``free`` does for an END (a device-side
        wait, no host read).  Lazy frees and a float's free move nothing then."""
        if any(self._waits[n] for n in pools):
            self._current_stream().wait_stream(self.forward_stream)

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

    # ---------------------------------------------- overlap scheduling

    def set_latest_forward_done_event(self, event) -> None:
        """SGLang's hook, after every forward it launches: the event that
        fires when that forward is done.  Alone it hands over a forward that
        reads these pools (so what a move vacates waits for it) and writes
        none; ``set_inflight_forward`` adds what it writes.  ``None``: no
        forward in flight (the next call settles, and its wait is a no-op).
        A reference only: no device work, no host read."""
        self._report_forward(_IDLE if event is None else (event, None))

    def set_inflight_forward(self, forward_done, out_cache_loc_virtual: torch.Tensor | None) -> None:
        """SGLang's hook, after every forward it launches: its done event and
        the virtual token ids it writes (``out_cache_loc``); ``None`` ids: it
        writes no pool of this allocator (it still reads them); a ``None``
        event: no forward, nothing to hand over.  References only: the next
        call hands the forward to the composite (``_take_forward``), which
        keeps every page it writes or reads until it is settled
        (docs/design.md §12)."""
        if forward_done is not None:
            self._report_forward((forward_done, out_cache_loc_virtual))

    def _report_forward(self, report) -> None:
        """Queue a hook's report for the next call; the two hooks' reports of
        one forward (one event) make one entry, with its write set if either
        named one.  Host bookkeeping only."""
        due = self._forward_due or []
        last: Any = due[-1] if due else _IDLE
        if report is not _IDLE and last is not _IDLE and last[0] is report[0]:
            due[-1] = report if report[1] is not None else last
        else:
            due.append(report)
        self._forward_due = due

    def _take_forward(self) -> None:
        """Hand the reported forwards to the composite, in order: each one's
        pages are pinned (``launch``, a scatter on the device; no host read;
        the state slots it writes are every live one, since SGLang names
        none), after settling the ones before it if their event has fired
        (a cold point: that settle's wait is a no-op; settle changes no
        count, so no view changes).  ``_IDLE`` settles."""
        due, self._forward_due = self._forward_due or [], None
        c = self._composite
        for report in due:
            if report is _IDLE:
                c.settle()
                self._flight_event = None
                continue
            self._settle_if_fired()
            event, loc = report
            self._flight_event = event
            if loc is None:  # it writes none of these pools, and reads them
                c.launch(torch.empty(0, dtype=I64, device=c.device), state_slots=[], check=False)
            else:
                c.launch(loc.reshape(-1).to(I64), state_slots=None, check=False)

    def _settle_if_fired(self) -> None:
        """Settle the composite if the last forward handed to it is done
        (its event's ``query()``, a host call that reads no tensor): at a
        cold point, where waiting on it would be a no-op."""
        c = self._composite
        if c.arena.in_flight and self._flight_event is not None and self._flight_event.query():
            c.settle()
            self._flight_event = None

    def _wait_forward_done(self) -> None:
        """The arena's ``on_settle``: the schedule stream waits on the done
        event of the forwards the composite was handed (they run in order,
        so the last one's), as SGLang's ``_settle_inflight_forward`` does.
        A device-side dependency, no host read."""
        if self._flight_event is not None:
            self._current_stream().wait_event(self._flight_event)

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
        closed = not all(gate() for gate in self._move_gates.values())
        if closed != arena.gate_closed:
            if closed:
                arena.close_gate()
            else:
                arena.open_gate()
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

    # ---------------------------------------------------- maintenance

    def flush_opportunistic(self) -> int:
        """0: kvarena settles lazy holes when a demand runs short (the relief
        ladder), never between steps.  Measured (issue 40): compacting every
        step changed no refusal or admission, the settles by -5 to +11 a run,
        and moved 2 to 83 times the pages in the check's workload, 0.57 to
        0.98 bytes per byte allocated in the simulator against 0 to 0.13
        (docs/guides/integrating.md, "The rest of SGLang's default path")."""
        return 0

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

    def _compaction_allowed(self) -> bool:
        """Whether relief may move pages now: not while the arena holds its
        moves (a host transfer in flight, docs/design.md §13).  SGLang's
        ``reclaim_plan`` then prices the demand on the arena as it stands."""
        return not self.moves_blocked()

    for f in (
        swa_available_size,
        schedulable_swa_available_size,
        conserve_swa_available_size,
        translate_loc_from_full_to_swa,
        translate_swa_indices_for_transfer,
        free_swa,
        free_swa_segment,
        free_full,
        clear_full_to_swa_mapping,
        set_full_to_swa_mapping,
        ensure_capacity,
        _fits_page_demand,
        _compaction_allowed,
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


def _install_unsupported(cls, names):
    for name in names:
        feature = UNSUPPORTED[name]
        if isinstance(getattr(cls, name), property):
            setattr(cls, name, _unsupported_property(name, feature))
        else:
            setattr(cls, name, _raiser(name, feature))
    return cls


@_swa_views
class _SWACalls(_Dropin):
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
        page_size: int = 1,
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
        page_size: int = 1,
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
        """The retraction backup (``_Dropin.get_cpu_copy``) with the request's
        mamba state in it, read at its physical slot.  SGLang 0.5.23's
        ``Req.offload_kv_cache`` on this stack passes the mamba pool the
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
        page_size: int = 1,
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
