"""The sub-allocators SGLang's code reads, as views over the composite's
bands (``BandView``, the mamba END's ``StateView``), and the translation
from virtual token ids to physical slots they and the drop-in answer with.

A view allocates nothing for tokens (allocation is the composite's); what
it does change (HiCache's load-back reservations, the tree's SWA ``bind``,
state slots) it does through its owner, the drop-in (``dropin.py``).  The
pool names (``FULL``, ``SWA``, ``STATE``, and SGLang's for each) are here,
below every other module of the drop-in.
"""

from typing import TYPE_CHECKING, Any

import torch

from kvarena.impl import kernels as launches

from .surface import _unsupported

if TYPE_CHECKING:
    from .dropin import _Dropin

I64 = torch.int64
FULL, SWA, STATE = "full", "swa", "state"
SGLANG_POOL = {FULL: "full", SWA: "swa", STATE: "mamba"}  # kvarena's pool name -> SGLang's sub-pool


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

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: int | None = None,
    ) -> torch.Tensor | None:
        """Full: SGLang's sub-allocator extend, full's pages alone, the SWA
        side left unbound as SGLang's full sub-allocator leaves it: the
        drop-in's ``alloc_extend_swa_tail`` with no tail (a stack without
        SWA: its ``alloc_extend``), for one request, as SGLang's composite
        calls it; virtual token ids, or None.  A batch, a
        ``num_new_pages`` that is not the request's new pages, or the SWA
        view (whose ids are full's) is a ``ValueError`` naming the pool."""
        if self._name != FULL:
            raise ValueError(f"pool {self._name!r}: alloc_extend: this view's ids are full's; extend full")
        if prefix_lens_cpu.numel() != 1:
            raise ValueError(f"pool 'full': alloc_extend: one request at a time, got {prefix_lens_cpu.numel()}")
        p, s, ps = int(prefix_lens_cpu[0]), int(seq_lens_cpu[0]), self._owner.page_size
        if num_new_pages is not None and num_new_pages != -(-s // ps) - -(-p // ps):  # cdiv(s) - cdiv(p)
            raise ValueError(f"pool 'full': alloc_extend: num_new_pages {num_new_pages} is not the request's")
        args = (prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens)
        owner: Any = self._owner  # a stack with SWA has SWAHostTransfers' alloc_extend_swa_tail
        if SWA in owner.CHAIN:
            return owner.alloc_extend_swa_tail(*args, 0)
        return owner.alloc_extend(*args)

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
