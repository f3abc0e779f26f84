"""PD disaggregation driven through SGLang's own code on the CPU: a prefill
node and a decode node, each an SGLang stack built by SGLang's factories
with kvarena's allocator or SGLang's, and every transferred byte checked on
the decode node.

What is SGLang's own here:

- both nodes boot through ``Scheduler.init_disaggregation``, run unbound on
  a namespace holding the scheduler fields it reads (one rank, the fake
  transfer backend): it builds the prefill node's ``PrefillBootstrapQueue``
  and the decode node's ``DecodePreallocQueue`` and ``DecodeTransferQueue``
  (their KV managers registering the pools' own transfer buffers), and
  installs ``unified_memory_disagg_move_gate`` with ``set_disagg_move_gate``;
- the decode side: ``DecodePreallocQueue.add`` and ``pop_preallocated``
  (admission, ``_pre_alloc``, the translations, ``send_metadata``), then
  ``DecodeTransferQueue.extend`` and ``pop_transferred``;
- the prefill side: ``PrefillBootstrapQueue.add`` and ``pop_bootstrapped``,
  then ``SchedulerDisaggregationPrefillMixin._send_kv_chunk`` (a first
  chunk, then the last with the state indices) and
  ``process_disagg_prefill_inflight_queue``.  The prompt's KV is allocated
  by the prefill allocator's ``alloc_extend`` (``alloc`` at page size 1), as
  SGLang's scheduler allocates it, and written into the pool's own buffers:
  a distinct pattern per request, position, layer and K or V, and per state;
- the fake backend's ``FakeKVSender`` and ``FakeKVReceiver``, subclassed so
  that what SGLang hands them reaches a loopback transfer engine
  (``Loopback``), which copies what a Mooncake engine copies: page envelopes
  between the buffers each node's KV manager registered (``kv_data_ptrs``,
  ``state_data_ptrs`` and their item lengths), the prefill's pages paired
  with the decode's by position as SGLang's senders pair them.

The bytes are then read back on the decode node through its allocator's
read translations (full: ``translate_kv_loc``; SWA, the window's positions:
``translate_loc_from_full_to_swa``; mamba:
``req_to_token_pool.translate_mamba_indices``) and compared byte for byte
with the pattern.  Every decode allocator call made while SGLang's gate
reads closed (it closes once the first request's destinations are
published, so the next requests are preallocated under it) has the
placement tables of every member the gate covers (``_move_gate_targets``)
compared before and after: no bound page may move (``GateWatch``).

The three stacks: SWA (``init_unified_swa_pools``), tri (mamba and SWA) and
mamba.  On the SWA stacks at page size > 1 the decode node preallocates with
``alloc_extend_swa_tail`` (SWA for the window's tail only), at page size 1
with ``alloc``.  The mamba stack runs PD too: its pool is no ``SWAKVPool``
(``_uses_swa_tail_prealloc`` is False), so the decode node calls
``alloc_extend`` (``alloc`` at page size 1) and the state slot goes as
``StateType.MAMBA``, one slot envelope.
"""

import contextlib
import inspect
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MethodType, SimpleNamespace
from typing import Any

import torch

from kvarena.anchor.loader import import_sglang

from . import factories
from .stacks import Geometry, build, cpu_kernels
from .workload import _value

I64 = torch.int64
KINDS = ("swa", "mamba_swa", "mamba")
ALLOCATORS = ("kvarena", "sglang")
PROMPTS = (37, 50, 23, 64)  # tokens per prompt: partial last pages at page size 4, windows past a page boundary
GEOMETRY = Geometry(tokens=256)  # every prompt fits at once, at page size 1 too
# Tokens a decode node keeps free per running request (--num-reserved-decode-tokens): SGLang's default, 512,
# is most of these small pools; small, the later requests are preallocated under the closed gate.
RESERVED = 8
# The decode allocator's calls on SGLang's decode path (notes/issue55-pd-facts.md §3), watched under the gate.
DECODE_CALLS = (
    "prealloc_fits",
    "reclaim_for_prealloc",
    "prealloc_ceiling_fits",
    "alloc",
    "alloc_extend",
    "alloc_extend_swa_tail",
    "translate_kv_indices_for_transfer",
    "translate_swa_indices_for_transfer",
    "available_size",
    "full_available_size",
    "swa_available_size",
    "swa_capacity_and_available",
    "flush_opportunistic",
)


@dataclass
class Report:
    kind: str
    page_size: int
    decode: str  # whose allocator the decode node runs: "kvarena" or "sglang"
    prefill: str
    crowded: bool = False
    requests: int = 0  # transferred and checked
    rounds: int = 0  # the decode queue's preallocation rounds it took (admission may leave a request for the next)
    bytes_checked: int = 0
    mismatches: int = 0  # of those, bytes that differ from what the prefill node wrote
    bytes_copied: int = 0  # what the loopback engine copied
    gated_calls: int = 0  # decode allocator calls made while SGLang's gate read closed
    moved_under_gate: int = 0  # bound pages whose physical page changed in those calls
    flushes_under_gate: int = 0  # of those calls, flush_opportunistic
    swa_bound: dict[str, list[int]] = field(default_factory=dict)  # rid -> positions with an SWA page, preallocated
    audit: list[str] = field(default_factory=list)  # both nodes' verify_byte_accounting once all is released
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.errors or self.audit or self.mismatches or self.moved_under_gate)


# ------------------------------------------------------------ the engine


class Loopback:
    """The transfer engine on one machine.  What SGLang's senders and
    receivers are given becomes copies between the memory the two nodes'
    KV managers registered, addressed as ``MooncakeKVManager`` addresses it:
    item ``i`` of a registered entry is ``ptr + i * item_len``; the prefill's
    pages land on the decode's by position, chunk after chunk; a state
    component's index lists pair the same way (the mamba slot, one item).
    Where Mooncake would truncate two lists of different lengths with a
    warning, this raises."""

    def __init__(self) -> None:
        self.memory: list[torch.Tensor] = []  # the registered allocations, as bytes
        self.destinations: dict[int, dict[str, Any]] = {}  # bootstrap room -> what the decode side published
        self.copied = 0  # bytes copied

    def register(self, allocation: torch.Tensor) -> None:
        self.memory.append(allocation.view(torch.uint8).reshape(-1))

    def _items(self, ptr: int, length: int, item: int) -> torch.Tensor:
        """Registered memory at ``[ptr, ptr + length)``, as rows of ``item`` bytes."""
        for mem in self.memory:
            base = mem.data_ptr()
            if base <= ptr and ptr + length <= base + mem.numel():
                span = mem[ptr - base : ptr - base + length // item * item]
                return span.view(-1, item)
        raise ValueError(f"address {ptr:#x} (+{length}) is in no registered memory")

    def _copy(self, src: tuple[int, int, int], dst: tuple[int, int, int], src_ids, dst_ids) -> None:
        """Items ``src_ids`` of the prefill's entry onto items ``dst_ids`` of the decode's."""
        if src[2] != dst[2]:
            raise ValueError(f"item sizes differ: prefill {src[2]} bytes, decode {dst[2]}")
        s, d = _ids(src_ids), _ids(dst_ids)
        if s.numel() != d.numel():
            raise ValueError(f"{s.numel()} prefill items for {d.numel()} decode items")
        self._items(*dst)[d] = self._items(*src)[s]
        self.copied += s.numel() * src[2]

    def published(self, room: int, kv_args: Any, pages, state_indices) -> None:
        """The decode side's ``send_metadata``: where the room's bytes go."""
        self.destinations[room] = {"kv_args": kv_args, "pages": _ids(pages), "state": state_indices, "next": 0}

    def send(self, room: int, kv_args: Any, pages, state_indices) -> None:
        """One ``send`` of the prefill side's: its pages onto the decode's
        next ones in every KV entry; with the last chunk, each state component."""
        dst = self.destinations[room]
        theirs, n = dst["kv_args"], len(pages)
        to = dst["pages"][dst["next"] : dst["next"] + n]
        dst["next"] += n
        for i in range(len(kv_args.kv_data_ptrs)):
            self._copy(_entry(kv_args, i), _entry(theirs, i), pages, to)
        for k in range(len(kv_args.state_types) if state_indices is not None else 0):
            if state_indices[k] is None:
                continue
            for i in range(len(kv_args.state_data_ptrs[k])):
                mine, their = _state_entry(kv_args, k, i), _state_entry(theirs, k, i)
                self._copy(mine, their, state_indices[k], dst["state"][k])


def _ids(x) -> torch.Tensor:
    """Page or slot ids as SGLang passes them (an array, a tensor, a list of either), flat int64."""
    if isinstance(x, (list, tuple)):
        parts = [_ids(v) for v in x]
        return torch.cat(parts) if parts else torch.empty(0, dtype=I64)
    return torch.as_tensor(x).reshape(-1).to(I64)


def _entry(kv_args: Any, i: int) -> tuple[int, int, int]:
    return kv_args.kv_data_ptrs[i], kv_args.kv_data_lens[i], kv_args.kv_item_lens[i]


def _state_entry(kv_args: Any, k: int, i: int) -> tuple[int, int, int]:
    return kv_args.state_data_ptrs[k][i], kv_args.state_data_lens[k][i], kv_args.state_item_lens[k][i]


@contextlib.contextmanager
def _loopback_backend(engine: Loopback) -> Iterator[None]:
    """While the block runs, SGLang's queues make the fake backend's sender
    and receiver as subclasses that report to ``engine`` (the queues look
    the classes up by ``get_kv_class``, which this wraps for the fake backend)."""
    fake = import_sglang("sglang.srt.disaggregation.fake.conn")
    utils = import_sglang("sglang.srt.disaggregation.utils")

    class LoopbackSender(fake.FakeKVSender):  # type: ignore[name-defined]
        def send(self, kv_indices, state_indices=None, num_kv_tokens=None):
            engine.send(self.bootstrap_room, self.kv_mgr.kv_args, kv_indices, state_indices)
            super().send(kv_indices, state_indices, num_kv_tokens)

    class LoopbackReceiver(fake.FakeKVReceiver):  # type: ignore[name-defined]
        def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
            super().__init__(mgr, bootstrap_addr, bootstrap_room)
            self.bootstrap_room = bootstrap_room  # the fake receiver keeps none

        def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
            engine.published(self.bootstrap_room, self.kv_mgr.kv_args, kv_indices, state_indices)
            super().send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len)

    ours = {utils.KVClassType.SENDER: LoopbackSender, utils.KVClassType.RECEIVER: LoopbackReceiver}
    real = utils.get_kv_class

    def get_kv_class(backend, class_type):
        if backend == utils.TransferBackend.FAKE and class_type in ours:
            return ours[class_type]
        return real(backend, class_type)

    modules = [import_sglang(f"sglang.srt.disaggregation.{m}") for m in ("decode", "prefill")]
    saved = [m.get_kv_class for m in modules]
    for m in modules:
        m.get_kv_class = get_kv_class
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.get_kv_class = f


# ------------------------------------------------------------- the nodes


@contextlib.contextmanager
def _factories(allocator: str) -> Iterator[None]:
    """SGLang's factories build ``allocator``'s allocators while the block
    runs (kvarena's as installed, if it is); as they were after."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    pools = import_sglang(factories.POOL_MODULE)
    was = factories.installed()
    saved = {name: getattr(pools, name) for name in factories.FACTORIES}
    if allocator == "kvarena" and not was:
        factories.install()
    if allocator == "sglang" and was:  # SGLang's factory, under kvarena's wrapper
        for name, f in saved.items():
            setattr(pools, name, inspect.unwrap(f))
    try:
        yield
    finally:
        if allocator == "kvarena" and not was:
            factories.uninstall()
        for name, f in saved.items():
            setattr(pools, name, f)


@dataclass
class Node:
    """One PD node: its stack, and the scheduler namespace SGLang's code runs on."""

    role: str
    kind: str
    g: Geometry
    bundle: Any
    alloc: Any
    kv: Any
    rtp: Any
    tree: Any
    sched: SimpleNamespace


def _gloo() -> Any:
    """The single-rank gloo group SGLang's polls all-reduce over."""
    dist = torch.distributed
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


@contextlib.contextmanager
def _one_rank(role: str) -> Iterator[None]:
    """SGLang's parallel and PD settings for the one rank of a ``role`` node
    ("prefill" or "decode") on the fake backend: scoped overrides of the
    published server arguments, whose own checks refuse the fake backend
    with unified memory (only Mooncake passes them)."""
    rc = import_sglang("sglang.srt.runtime_context")
    ranks = {"tp_rank": 0, "pp_rank": 0, "attn_tp_rank": 0, "dp_rank": 0}
    disagg = {"disaggregation_mode": role, "disaggregation_transfer_backend": "fake"}
    with (
        rc.get_parallel().override(**ranks, attn_tp_group=SimpleNamespace(cpu_group=_gloo())),
        rc.get_disagg().override(**disagg, num_reserved_decode_tokens=RESERVED),
    ):
        yield


def boot(
    role: str,
    kind: str,
    page_size: int,
    allocator: str = "kvarena",
    lazy: bool = True,
    geometry: Geometry | None = None,
) -> Node:
    """A ``role`` node on ``kind``'s stack with ``allocator``'s allocator,
    booted by SGLang's ``Scheduler.init_disaggregation``: its queues built,
    its move gate installed (which an eager allocator refuses)."""
    rc = import_sglang("sglang.srt.runtime_context")
    scheduler = import_sglang("sglang.srt.managers.scheduler")
    g = geometry or GEOMETRY
    with _factories(allocator):
        bundle = build(kind, g, page_size=page_size, lazy=lazy)
    alloc = bundle.token_to_kv_pool_allocator
    rtp = getattr(bundle, "req_to_token_pool", None)
    if rtp is None:  # the SWA stack's factory builds none: the scheduler's plain one
        memory_pool = import_sglang("sglang.srt.mem_cache.memory_pool")
        rtp = memory_pool.ReqToTokenPool(g.max_reqs, g.context_len * page_size, "cpu", False)
    tree = _tree(kind, rtp, alloc, page_size, g.window)
    group = _gloo()
    sched = SimpleNamespace(
        # read by init_disaggregation and the queues it builds
        draft_worker=None,
        spec_algorithm=SimpleNamespace(carries_draft_hidden_states=lambda: False, is_none=lambda: True),
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(architectures=None),
            hf_text_config=SimpleNamespace(full_attention_layer_ids=list(g.full_layers)),
            num_hidden_layers=max(g.full_layers + g.swa_layers + g.mamba_layers) + 1,
            get_total_num_kv_heads=lambda: g.head_num,
        ),
        req_to_token_pool=rtp,
        token_to_kv_pool_allocator=alloc,
        tree_cache=tree,
        server_args=rc.get_server_args(),
        max_total_num_tokens=alloc.size,
        max_running_requests=g.max_reqs,
        enable_unified_memory=True,
        scheduler_stage_metrics=None,
        rust_server=None,
        kv_shard_widening=1,
        tp_worker=SimpleNamespace(
            is_hybrid_swa=kind != "mamba",
            model_runner=SimpleNamespace(
                kv_cache_dtype_str="auto",
                swa_max_total_num_tokens=getattr(alloc, "size_swa", alloc.size),
                effective_logical_max_total_num_tokens=alloc.size,
            ),
        ),
        enable_hisparse=False,
        hisparse_coordinator=None,
        random_seed=0,
        sliding_window_size=g.window if kind != "mamba" else None,
        decode_offload_manager=None,
        # read while the queues run
        running_batch=SimpleNamespace(reqs=[]),
        waiting_queue=[],
        last_batch=None,
        enable_priority_scheduling=False,
        enable_lora=False,
        enable_decode_hicache=False,
        enable_overlap=False,
        output_streamer=SimpleNamespace(stream_output=lambda reqs, *a, **k: None),
        batch_result_processor=SimpleNamespace(_maybe_update_reasoning_tokens=lambda *a, **k: None),
        attn_cp_cpu_group=group,
        attn_tp_cpu_group=group,
        processed_tokens_counter=0,
        metrics_reporter=SimpleNamespace(),
        metrics_collector=None,
    )
    sched._hosts_rust_server = MethodType(scheduler.Scheduler._hosts_rust_server, sched)
    with _one_rank(role):
        scheduler.Scheduler.init_disaggregation(sched)
    return Node(role, kind, g, bundle, alloc, bundle.token_to_kv_pool, rtp, tree, sched)


def _tree(kind: str, rtp: Any, alloc: Any, page_size: int, window: int) -> Any:
    """SGLang's tree with the components its registry gives the stack, disabled (PD decode's default)."""
    cache = import_sglang("sglang.srt.mem_cache.unified_radix_cache")
    params = import_sglang("sglang.srt.mem_cache.cache_init_params")
    ct = import_sglang("sglang.srt.mem_cache.unified_cache.component_type").ComponentType
    components = (ct.FULL,) + ((ct.SWA,) if kind != "mamba" else ()) + ((ct.MAMBA,) if kind != "swa" else ())
    return cache.UnifiedRadixCache(
        params.CacheInitParams(
            disable=True,
            req_to_token_pool=rtp,
            token_to_kv_pool_allocator=alloc,
            page_size=page_size,
            sliding_window_size=window if kind != "mamba" else None,
            tree_components=components,
        )
    )


# ------------------------------------------------------------- the bytes


def _keys(room: int, n: int) -> torch.Tensor:
    """What the pattern keys a request's positions by: its room and position."""
    return room * 4096 + torch.arange(n, dtype=I64)


def _layers(node: Node) -> list[tuple[int, bool]]:
    """``(layer, in_swa)`` for every attention layer of the node's stack."""
    out = [(layer, False) for layer in node.g.full_layers]
    return out + ([(layer, True) for layer in node.g.swa_layers] if node.kind != "mamba" else [])


def _row(node: Node, req: Any, n: int) -> torch.Tensor:
    """The request's virtual token ids, by position."""
    return node.rtp.req_to_token[req.kv.req_pool_idx, :n].to(I64)


def _kv(node: Node, room: int, ids: torch.Tensor, swa_from: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """``(buffer, rows, values)`` per layer, K and V: the positions' rows
    (in the SWA layers, those from ``swa_from``) by the node's attention
    translations, and the values the pattern puts there."""
    keys = _keys(room, ids.numel())
    for layer, in_swa in _layers(node):
        s = swa_from if in_swa else 0
        rows = node.alloc.translate_loc_from_full_to_swa(ids[s:]) if in_swa else node.alloc.translate_kv_loc(ids)
        for part, buf in enumerate((node.kv.get_key_buffer(layer), node.kv.get_value_buffer(layer))):
            yield buf, rows, _value(keys[s:], layer, part, buf[0].numel(), buf.dtype).view(-1, *buf.shape[1:])


def _state(node: Node, room: int, req: Any) -> Iterator[tuple[torch.Tensor, ...]]:
    """``(buffer, row, values)`` per mamba state of the request's slot (its
    slot-major view, at the slot's physical row now); none on the SWA stack."""
    if node.kind == "swa":
        return
    slot = node.rtp.req_index_to_mamba_index_mapping[req.kv.req_pool_idx].reshape(1)
    row = node.rtp.translate_mamba_indices(slot).to(I64)
    cache = node.rtp.mamba_pool.mamba_cache
    for i, buf in [*enumerate(cache.conv), (-1, cache.temporal)]:
        view = buf.movedim(1, 0)
        values = (room * 31 + 7 * i + torch.arange(view[0].numel())) % 251  # below 256: exact in every dtype here
        yield view, row, values.view(1, *view.shape[1:]).to(view.dtype)


def _stamp(node: Node, room: int, req: Any, n: int) -> None:
    """The prefill's forward: each position's K and V in every layer, and
    each state, written into the pool's own buffers where the allocator
    translates them."""
    for buf, rows, values in [*_kv(node, room, _row(node, req, n), 0), *_state(node, room, req)]:
        buf[rows] = values


def _compare(node: Node, room: int, req: Any, n: int, swa_from: int) -> tuple[int, int]:
    """The request's transferred bytes on the decode node, read through its
    own translations: ``(bytes checked, bytes that differ)``."""
    checked = differ = 0
    for buf, rows, values in [*_kv(node, room, _row(node, req, n), swa_from), *_state(node, room, req)]:
        got, want = buf[rows].contiguous().view(torch.uint8), values.contiguous().view(torch.uint8)
        checked += got.numel()
        differ += int((got != want).sum())
    return checked, differ


# ---------------------------------------------------------- the move gate


class GateWatch:
    """The decode allocator's calls on SGLang's path (``DECODE_CALLS``, and
    the state slots' hand-out, ``req_to_token_pool.alloc``), watched while
    SGLang's gate reads closed: the placement tables of every member the
    gate covers (the allocator's ``_move_gate_targets``) before and after
    each; a page bound before whose physical page changed moved under the
    gate.  The calls are wrapped by instance attributes while the block runs."""

    def __init__(self, node: Node, report: Report) -> None:
        utils = import_sglang("sglang.srt.disaggregation.utils")
        self.gate = utils.unified_memory_disagg_move_gate(node.sched)  # reads what the installed one reads
        self.node, self.report, self.depth = node, report, 0
        self.calls = [(node.alloc, name) for name in DECODE_CALLS if hasattr(node.alloc, name)]
        self.calls.append((node.rtp, "alloc"))

    def _placement(self) -> list[torch.Tensor]:
        return [t.virtual_to_physical.clone() for t in self.node.alloc._move_gate_targets()]

    def _watched(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth or self.gate():  # inside a watched call, or moves are allowed
                return f(*args, **kwargs)
            before = self._placement()
            self.depth += 1
            try:
                out = f(*args, **kwargs)
            finally:
                self.depth -= 1
            r = self.report
            moved = sum(int(((b > 0) & (a != b)).sum()) for b, a in zip(before, self._placement()))
            r.gated_calls += 1
            r.moved_under_gate += moved
            if moved:
                r.errors.append(f"{name} moved {moved} bound pages while SGLang's gate read closed")
            if name == "flush_opportunistic":
                r.flushes_under_gate += 1
                if out:
                    r.errors.append(f"flush_opportunistic moved {out} pages while SGLang's gate read closed")
            return out

        return call

    def __enter__(self) -> "GateWatch":
        for owner, name in self.calls:
            setattr(owner, name, self._watched(name, getattr(owner, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name in self.calls:
            delattr(owner, name)


# --------------------------------------------------------------- the run


def prompts(n: int) -> tuple[int, ...]:
    """``n`` prompt lengths: ``PROMPTS``, then again a few tokens longer each time round."""
    return tuple(PROMPTS[i % len(PROMPTS)] + 7 * (i // len(PROMPTS)) for i in range(n))


def _req(rid: str, n: int, room: int) -> Any:
    """A real ``Req`` with an ``n``-token prompt, on the fake backend's bootstrap host."""
    sb = import_sglang("sglang.srt.managers.schedule_batch")
    sampling = import_sglang("sglang.srt.sampling.sampling_params")
    utils = import_sglang("sglang.srt.disaggregation.utils")
    params = sampling.SamplingParams(max_new_tokens=8)
    params.normalize(None)
    req = sb.Req(rid, "", array("q", range(1, n + 1)), params, vocab_size=1000)
    req.bootstrap_host, req.bootstrap_room = utils.FAKE_BOOTSTRAP_HOST, room
    return req


def _prefill(node: Node, req: Any, n: int, room: int) -> None:
    """The prefill node's forward of the prompt: a request row (and state
    slot), its KV allocated as SGLang's scheduler allocates it
    (``alloc_extend``; ``alloc`` at page size 1), the pattern written, the
    first token sampled."""
    if node.rtp.alloc([req]) is None:
        raise RuntimeError("prefill node: no request row left")
    zero, seq = torch.zeros(1, dtype=I64), torch.tensor([n], dtype=I64)
    a = node.alloc
    loc = a.alloc(n) if a.page_size == 1 else a.alloc_extend(zero, zero, seq, seq, torch.tensor([-1]), n)
    if loc is None:
        raise RuntimeError(f"prefill node: no room for {n} tokens")
    node.rtp.write((req.kv.req_pool_idx, slice(0, n)), loc)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end = n
    _stamp(node, room, req, n)
    req.output_ids.append(room)


def _send(node: Node, req: Any, n: int) -> None:
    """SGLang's prefill sender path: a first chunk (half the prompt; it holds
    a partial last page back), then the last, with the state indices."""
    mixin = import_sglang("sglang.srt.disaggregation.prefill").SchedulerDisaggregationPrefillMixin
    mixin._send_kv_chunk(node.sched, req, last_chunk=False, end_idx=n // 2)
    node.sched.disagg_prefill_inflight_queue.append(req)
    mixin._send_kv_chunk(node.sched, req, last_chunk=True)


def _swa_bound(node: Node, req: Any, n: int) -> list[int]:
    """The positions whose virtual page has an SWA page bound on ``node``."""
    swa = getattr(node.alloc, "swa_attn_allocator", None)
    if swa is None:
        return []
    pages = _row(node, req, n) // node.alloc.page_size
    return torch.nonzero(swa.virtual_to_physical[pages] > 0).reshape(-1).tolist()


def crowd(node: Node, room: int) -> None:
    """Other requests' full rows on an SWA stack's node (as HiCache's
    load-back takes them, ``full_attn_allocator.alloc``) until the SWA band
    can take only ``room`` more tokens without a move; then three in four
    freed: holes behind live full pages, so an SWA page beyond ``room``
    needs relief, which moves pages."""
    full, swa, ps = node.alloc.full_attn_allocator, node.alloc.swa_attn_allocator, node.alloc.page_size
    held = []
    while swa.available_size() > room and (got := full.alloc(ps)) is not None:
        held.append(got)
    for k, got in enumerate(held[:-1]):  # every fourth stays, and the last: a live page at the frontier
        if k % 4:
            full.free(got)


def run(
    kind: str,
    page_size: int = 4,
    decode: str = "kvarena",
    prefill: str = "kvarena",
    prompts: tuple[int, ...] = PROMPTS,
    geometry: Geometry | None = None,
    crowded: bool = False,
) -> Report:
    """Requests with ``prompts`` tokens through PD on ``kind``'s stack,
    ``decode`` and ``prefill`` naming whose allocator each node runs: the
    prefill node prefills them and sends by SGLang's sender path, the decode
    node preallocates and receives them through SGLang's queues, the
    loopback engine copies the bytes; every transferred byte is checked on
    the decode node and every decode allocator call under SGLang's closed
    gate watched, a request at a time released once checked; then both
    nodes are audited (``verify_byte_accounting``).  ``crowded`` (the SWA
    stacks): the decode node first gets holes in its full band and room in
    its SWA band for the first request only (``crowd``), so the next one's
    SWA pages need relief: while the gate is closed, relief must wait."""
    g = geometry or GEOMETRY
    report = Report(kind, page_size, decode, prefill, crowded)
    engine = Loopback()
    common = import_sglang("sglang.srt.mem_cache.common")
    mixin = import_sglang("sglang.srt.disaggregation.prefill").SchedulerDisaggregationPrefillMixin
    with _loopback_backend(engine), cpu_kernels():
        p, d = (
            boot("prefill", kind, page_size, prefill, geometry=g),
            boot("decode", kind, page_size, decode, geometry=g),
        )
        for node in (p, d):
            engine.register(node.bundle.unified_memory_pool._raw)  # the one allocation both KV managers registered
        rooms = {f"r{i}": (i + 1, n) for i, n in enumerate(prompts)}
        d_reqs = {rid: _req(rid, n, room) for rid, (room, n) in rooms.items()}
        pq, tq = d.sched.disagg_decode_prealloc_queue, d.sched.disagg_decode_transfer_queue
        with _one_rank("decode"):
            for req in d_reqs.values():
                pq.add(req)
        with _one_rank("prefill"):
            for rid, (room, n) in rooms.items():
                p.sched.disagg_prefill_bootstrap_queue.add(_req(rid, n, room), num_kv_heads=g.head_num)
        if crowded:
            if kind == "mamba":
                raise ValueError("crowded: the mamba stack has no SWA band")
            crowd(d, pq._prealloc_required_tokens(next(iter(d_reqs.values())))[1])
        watch = GateWatch(d, report)
        pending: dict[str, tuple[int, int]] = dict(rooms)
        bootstrapped: dict[str, Any] = {}  # rid -> the prefill node's request, once bootstrapped
        for _ in range(2 * len(rooms)):  # a request admission refuses waits for the next round
            report.rounds += 1
            with _one_rank("decode"), watch:
                ready, failed = pq.pop_preallocated()
                report.errors += [f"{r.req.rid}: preallocation failed" for r in failed]
                tq.extend(ready)
                for r in ready:
                    report.swa_bound[r.req.rid] = _swa_bound(d, r.req, rooms[r.req.rid][1])
                d.alloc.flush_opportunistic()  # the scheduler's idle hook, the transfers in flight
            with _one_rank("prefill"):  # the prefill node runs the requests whose destinations are published
                bootstrapped |= {req.rid: req for req in p.sched.disagg_prefill_bootstrap_queue.pop_bootstrapped()}
                for r in ready:
                    room, n = rooms[r.req.rid]
                    _prefill(p, bootstrapped[r.req.rid], n, room)
                    _send(p, bootstrapped[r.req.rid], n)
                mixin.process_disagg_prefill_inflight_queue(p.sched)
            with _one_rank("decode"), watch:
                done = tq.pop_transferred()
            for req in done:
                room, n = pending.pop(req.rid)
                window = 0 if kind == "mamba" else max(0, n - g.window) // page_size * page_size
                checked, differ = _compare(d, room, req, n, window)
                report.requests += 1
                report.bytes_checked += checked
                report.mismatches += differ
                common.release_kv_cache(req, d.tree, checkpoint=False)  # as a finished request's
            if not pending:
                break
        report.errors += [f"{rid}: never transferred" for rid in pending]
        report.bytes_copied = engine.copied
        report.audit = [f"{n.role}: {e}" for n in (p, d) for e in n.alloc.verify_byte_accounting()]
    return report
