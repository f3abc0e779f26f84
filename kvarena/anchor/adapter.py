"""Drive the anchor's own allocator classes with kvarena's page-level API.

``AnchorArena(total_bytes, pools, lazy, borrow)`` takes the arguments of
``kvarena.spec.Arena`` and builds the anchor's ``UnifiedKVPool`` and one
``MultiEndedAllocator`` (ENDs) or ``FloatMultiEndedAllocator`` (floats) per
pool, each over a ``FakeKVCache``, wired in chain order as the anchor's
composites wire them.  Its methods take and return what kvarena's do
(virtual *page* ids, pages moved); where the two APIs differ the mapping is
stated at the method.

Geometry.  The anchor's MHA entry is a multiple of 32 bytes (it aligns
entries to 32) and its buffer, viewed as bf16 rows, has an even size; a
mamba entry may have any size.  A kvarena pool maps to:

- kind ``"kv"``, ``entry_bytes = 32*L``: ``MHASubPoolSpec`` with ``L``
  layers of one bf16 head of dim 8 (K and V rows of 16 bytes each);
- kind ``"state"``, or a KV pool of another size: ``MambaSubPoolSpec``
  with one layer, a uint8 conv state of ``entry_bytes - 1`` bytes and a
  one-byte temporal state (the allocator reads only a spec's entry bytes
  and direction; the spec's class decides how the sink is sized);
- ``grow`` to ``grow_direction``, ``lazy`` to ``lazy_compaction`` (ENDs
  only: the anchor's floats are never lazy, nor are kvarena's);
- ``borrow={"swa": "full"}`` to ``is_id_owner=False`` with the lender's
  virtual id space, as the anchor's SWA composites build their SWA side.

The allocators get kvarena's page sizes.  ``anchor_domain`` accepts a
layout when the anchor's reserved floor then equals kvarena's sink, so
``min_page`` and ``num_pages`` agree; anything else raises ``Unsupported``.
"""

import itertools

import torch

from .fake_cache import FakeKVCache
from .loader import anchor_modules

ENTRY_ALIGN = 32


class Unsupported(Exception):
    """A configuration or call the anchor has no counterpart for."""


def _mha_shaped(p):
    return p.kind == "kv" and p.entry_bytes % ENTRY_ALIGN == 0


def anchor_domain(pools, borrow=None, total_bytes=0):
    """Why these pools cannot be built on the anchor, or None.

    The anchor reserves ``max(largest entry, page_size * entry of every
    MHA-shaped pool)`` as its sink, with one page size for the buffer; the
    layout is exact when that equals kvarena's sink (the largest ``epp``)."""
    if any(_mha_shaped(p) for p in pools) and total_bytes % 2:
        return "the anchor views its buffer as bf16 rows: total_bytes must be even"
    for p in pools:
        if p.kind == "state" and p.entry_bytes < 2:
            return f"pool {p.name!r}: a state entry needs at least 2 bytes here"
    buffer_ps = max((p.page_size for p in pools if _mha_shaped(p)), default=1)
    floor = max([max(p.entry_bytes for p in pools)] + [buffer_ps * p.entry_bytes for p in pools if _mha_shaped(p)])
    sink = max(p.entry_bytes * p.page_size for p in pools)
    if floor != sink:
        return (
            f"the anchor's sink would be {floor} bytes, kvarena's is {sink} (one buffer page size, "
            f"KV entries that are not a multiple of {ENTRY_ALIGN} bytes stand in as page-size-1 state)"
        )
    names = {p.name for p in pools}
    for borrower, lender in (borrow or {}).items():
        if lender not in names or borrower not in names:
            return f"borrow {borrower!r} -> {lender!r}: unknown pool"
    return None


def _tensor(ids, device="cpu"):
    return torch.as_tensor(list(ids), dtype=torch.int64, device=device)


class AnchorArena:
    def __init__(self, total_bytes, pools, lazy=False, borrow=None):
        why = anchor_domain(pools, borrow, total_bytes)
        if why:
            raise Unsupported(why)
        A = anchor_modules()
        self.A = A
        self.total_bytes = total_bytes
        self.borrow = dict(borrow or {})
        by_name = {p.name: p for p in pools}
        ups = [p for p in pools if p.grow == "up"]
        downs = [p for p in pools if p.grow == "down"]
        floats = [p for p in pools if p.grow == "float"]
        self.chain = tuple(p.name for p in ups + floats + downs)
        ends = {ups[0].name, downs[0].name}
        lazy_set = ends if lazy is True else set() if lazy is False else set(lazy)
        self.page_size = {p.name: p.page_size for p in pools}
        kv_ps = max((p.page_size for p in pools if _mha_shaped(p)), default=1)
        specs = [self._spec(by_name[n]) for n in self.chain]
        try:
            self.buffer = A.UnifiedKVPool(
                total_bytes=total_bytes, sub_pool_specs=specs, device="cpu", enable_memory_saver=False, page_size=kv_ps
            )
        except (RuntimeError, AssertionError, ValueError) as e:
            raise Unsupported(f"the anchor refuses this layout: {e}") from e
        self.alloc_of, self.cache = {}, {}
        order = sorted(self.chain, key=lambda n: n in self.borrow)  # lenders first
        for name in order:
            p = by_name[name]
            num_pages = self.buffer.max_slots(name) // p.page_size
            cache = FakeKVCache(num_pages, p.page_size)
            kw = {
                "kvcache": cache,
                "unified_buffer": self.buffer,
                "sub_pool_name": name,
                "device": "cpu",
                "is_id_owner": name not in self.borrow,
                "page_size": p.page_size,
            }
            if name in self.borrow:
                kw["virtual_num_pages"] = self.alloc_of[self.borrow[name]].num_virtual_ids
            if p.grow == "float":
                a = A.FloatMultiEndedAllocator(**kw)
            else:
                a = A.MultiEndedAllocator(lazy_compaction=name in lazy_set, **kw)
            self.alloc_of[name], self.cache[name] = a, cache
        members = [self.alloc_of[n] for n in self.chain]
        for low, high in itertools.pairwise(members):
            low.bind_high_peer(high)
            high.bind_low_peer(low)

    @staticmethod
    def _spec(p, name=None):
        """The anchor's sub-pool spec for kvarena pool ``p`` (named ``name``, default ``p.name``)."""
        A = anchor_modules()
        grow, name = p.grow, name or p.name
        if _mha_shaped(p):
            return A.MHASubPoolSpec(
                name=name,
                layer_num=p.entry_bytes // ENTRY_ALIGN,
                grow_direction=grow,
                head_num=1,
                head_dim=8,
                store_dtype=torch.bfloat16,
            )
        return A.MambaSubPoolSpec(
            name=name,
            layer_num=1,
            grow_direction=grow,
            conv_state_shapes=((p.entry_bytes - 1,),),
            conv_dtype=torch.uint8,
            temporal_state_shape=(1,),
            temporal_dtype=torch.uint8,
        )

    # ------------------------------------------------------------ helpers

    def _tokens(self, name, vpages):
        """Every token id of these virtual pages, page by page."""
        ps = self.page_size[name]
        v = _tensor(vpages)
        return (v[:, None] * ps + torch.arange(ps)).reshape(-1)

    def _pages_of(self, name, tokens):
        return [int(t) // self.page_size[name] for t in tokens.tolist()[:: self.page_size[name]]]

    def _record_writes(self, name, vpages):
        a = self.alloc_of[name]
        if vpages:
            self.cache[name].write(vpages, a.virtual_to_physical[_tensor(vpages)])

    def _moved(self, name, fn):
        """Run ``fn`` and return (its result, pages the fake cache copied)."""
        c = self.cache[name]
        before = c.pages_moved
        out = fn()
        return out, c.pages_moved - before

    # --------------------------------------------------------- operations

    def alloc(self, name, n, ids=None):
        """kvarena's ``alloc``.  The anchor's ``alloc(n * page_size)``
        runs its shortfall ladder (``_relieve_for_alloc``) before failing,
        so it corresponds to kvarena's ``alloc``, then on ``None``
        ``relieve(name, n)`` and ``alloc`` again.  A borrower's
        ``alloc_with_virtual`` has no gate of its own (the anchor's
        composites check the budget first and it asserts otherwise): the
        adapter applies the pool's ``available_size`` gate, as kvarena does."""
        a = self.alloc_of[name]
        ps = self.page_size[name]
        if n == 0:
            return []
        if name in self.borrow:
            if n * ps > a.available_size():
                return None
            a.alloc_with_virtual(_tensor(ids))
            out = list(ids)
        else:
            toks = a.alloc(n * ps)
            if toks is None:
                return None
            out = self._pages_of(name, toks)
        self._record_writes(name, out)
        return out

    def free(self, name, ids, segment=False):
        """kvarena's ``free``.  ``free`` hands the anchor every token of the
        pages; for page sizes above 1 it recovers pages with ``torch.unique``,
        which sorts them, so they join the id FIFO in ascending order.
        ``segment=True`` calls ``free_segment(tokens, start_pos=0)``
        instead, which keeps the caller's order (docs/anchor.md §1).
        Returns pages the fake cache copied (eager compaction)."""
        a = self.alloc_of[name]
        toks = self._tokens(name, ids)
        if segment:
            return self._moved(name, lambda: a.free_segment(toks, start_pos=0))[1]
        return self._moved(name, lambda: a.free(toks))[1]

    def flush(self, name, max_moves=None):
        """kvarena's ``flush``: ``max_moves=None`` is the anchor's urgent
        ``flush_for_allocation``; a cap is its opportunistic flush with
        ``_lazy_max_moves_per_call`` set to it (the anchor reads that
        per call).  The anchor returns survivor moves for an END and pages
        absorbed for a float; the adapter returns pages copied, as
        kvarena does."""
        a = self.alloc_of[name]
        if max_moves is None:
            return self._moved(name, a.flush_for_allocation)[1]
        a._lazy_max_moves_per_call = max_moves
        return self._moved(name, a.flush_opportunistic)[1]

    def make_room(self, name, side, min_bytes):
        """kvarena's ``make_room`` returns pages moved; the anchor's returns
        the bytes now open on ``side``, kept in ``last_bytes_open``."""
        a = self.alloc_of[name]
        self.last_bytes_open, moved = self._moved(name, lambda: a.make_room(side=side, min_bytes=min_bytes))
        return moved

    def compact_holes(self, name, retreat_side):
        a = self.alloc_of[name]
        return self._moved(name, lambda: a.compact_holes(retreat_side=retreat_side))[1]

    def open_short_side(self, name, demand):
        """The anchor's ``_float_open_short_side(float, {allocator: pages})``;
        pages copied in every pool."""
        flt = self.alloc_of[name]
        before = {n: c.pages_moved for n, c in self.cache.items()}
        self.A.open_short_side(flt, {self.alloc_of[n]: d for n, d in demand.items()})
        return sum(c.pages_moved - before[n] for n, c in self.cache.items())

    def relieve(self, name, need_pages):
        """The anchor's ladder for one band, ``_relieve_for_alloc`` (no
        eviction: the anchor evicts only in its composites)."""
        return bool(self.A.relieve(self.alloc_of[name], need_pages * self.page_size[name]))

    def translate(self, name, ids):
        """Physical pages of virtual pages, through the anchor's token
        ``translate_kv_loc`` (its first slot of each page)."""
        ps = self.page_size[name]
        ids = list(ids)
        if not ids:
            return []
        toks = torch.as_tensor([i * ps if i >= 0 else -1 for i in ids], dtype=torch.int64)
        return [max(0, int(s)) // ps for s in self.alloc_of[name].translate_kv_loc(toks).tolist()]

    # -------------------------------------------------------------- views

    def available_size(self, name):
        return int(self.alloc_of[name].available_size())

    def available_pages(self, name):
        return self.available_size(name) // self.page_size[name]

    def schedulable_available_size(self, name):
        return int(self.alloc_of[name].schedulable_available_size())

    def gap_bytes(self, name):
        """An END's ``_current_gap_bytes``; the anchor has no float gap view."""
        a = self.alloc_of[name]
        if a.grow_direction == "float":
            raise Unsupported("the anchor has no gap view for a float")
        return int(a._current_gap_bytes())

    def frontiers(self, name):
        a = self.alloc_of[name]
        return int(a._byte_low_frontier()), int(a._byte_high_frontier())

    def holes(self, name):
        return sorted(int(h) for h in self.alloc_of[name]._free_phys_pages.tolist())

    def free_ids(self, name):
        f = self.alloc_of[name].free_virtual_ids
        return [] if f is None else [int(v) for v in f.tolist()]

    def pages(self, name):
        """Every live virtual page id (the sink excluded) -> its physical page."""
        v2p = self.alloc_of[name].virtual_to_physical[:-1].tolist()
        return {v: p for v, p in enumerate(v2p) if v and p >= 0}

    def misplaced(self, name):
        """Live virtual pages whose data the fake cache does not hold at
        their translated page (every slot checked)."""
        live = self.pages(name)
        if not live:
            return []
        return self.cache[name].misplaced(list(live), list(live.values()))

    def violations(self):
        """The anchor's own accounting check over the chain (empty: healthy)."""
        return list(self.A.chain_violations([self.alloc_of[n] for n in self.chain]))
