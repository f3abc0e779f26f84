"""SGLang's three unified-memory stacks, built on this machine through its own
factories (so ``install()`` decides whose allocator they get).

``Geometry`` names one small model shape; ``build(kind, ...)`` calls the
factory by attribute lookup on SGLang's module, as SGLang's configurator
does, and returns the bundle.  ``runtime_context()`` publishes the server
arguments SGLang's allocator and scheduler code read (CPU, one rank).
"""

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from kvarena.anchor.loader import import_sglang, sglang_imports

KINDS = ("swa", "mamba", "mamba_swa")  # init_unified_swa_pools, init_unified_mamba_pools, init_unified_mamba_swa_pools


@dataclass(frozen=True)
class Geometry:
    """A small hybrid model: layer ids per kind, heads, state shapes, sizes."""

    full_layers: tuple[int, ...] = (0, 2)
    swa_layers: tuple[int, ...] = (1, 3)
    mamba_layers: tuple[int, ...] = (4,)
    head_num: int = 2
    head_dim: int = 8
    conv_shape: tuple[int, int] = (3, 8)
    temporal_shape: tuple[int, int, int] = (1, 4, 8)
    tokens: int = 160  # the full (and SWA) token counts SGLang sizes the buffer from
    mamba_slots: int = 12
    max_reqs: int = 6
    context_len: int = 256
    window: int = 16
    dtype: torch.dtype = torch.float16
    extra: dict[str, object] = field(default_factory=dict)


def runtime_context() -> None:
    """Publish CPU server arguments, one rank (SGLang's allocators read them)."""
    rc = import_sglang("sglang.srt.runtime_context")
    server_args = import_sglang("sglang.srt.server_args")
    rc.reset_context()
    args = server_args.ServerArgs(model_path="dummy", device="cpu", attention_backend="torch_native")
    args._mamba_cache_chunk_size = 64  # mamba cache setup must not look the dummy model up
    with sglang_imports():  # publishing resolves the arguments, which imports model configs
        rc.publish(args, role="tokenizer")


def _cache_params(g: Geometry) -> SimpleNamespace:
    return SimpleNamespace(
        shape=SimpleNamespace(conv=[g.conv_shape], temporal=g.temporal_shape),
        dtype=SimpleNamespace(conv=torch.bfloat16, temporal=torch.float32),
        layers=list(g.mamba_layers),
    )


def draft_placement(kind: str, g: Geometry = Geometry(), layers: int = 1, runners: int = 1):
    """Where SGLang puts a speculative draft of ``layers`` full-attention
    layers (an EAGLE or MTP head; ``runners`` execution copies) on ``kind``'s
    stack: SGLang's own ``place_fused_draft``, the draft's K/V rows fused
    into the full sub-pool's entries.  Raises ``ValueError`` if SGLang
    declines it."""
    fd = import_sglang("sglang.srt.mem_cache.layout.fused_draft")
    geometry = fd.DraftKVGeometry(head_num=g.head_num, head_dim=g.head_dim, v_head_dim=g.head_dim)
    profile = fd.DraftKVProfile(
        num_layers=layers, kinds={fd.LAYER_FULL: fd.DraftLayerSet(layer_ids=tuple(range(layers)), geometry=geometry)}
    )
    hosts = {"swa": ("full", "swa"), "mamba": ("full", "mamba"), "mamba_swa": ("full", "swa", "mamba")}[kind]
    decision = fd.place_fused_draft(
        profile=profile,
        num_runners=runners,
        ctx=fd.PlacementContext(host_names=hosts),
        store_dtype=g.dtype,
        kv_dtype=g.dtype,
    )
    if decision.placement is None:
        raise ValueError(f"SGLang declined the draft on the {kind} stack: {decision.declined}")
    return decision.placement


def build(
    kind: str,
    g: Geometry = Geometry(),
    page_size: int = 1,
    lazy: bool = True,
    device: str = "cpu",
    forward_stream=None,
    extra_buffer: bool = False,
    fused_draft=None,
):
    """The bundle of ``kind``'s factory: ``unified_memory_pool``,
    ``token_to_kv_pool`` and ``token_to_kv_pool_allocator`` (and, for the
    mamba stacks, ``req_to_token_pool``).  ``forward_stream`` is what
    SGLang's scheduler passes with overlap scheduling (the stream an eager
    free waits on).  ``extra_buffer``: the mamba stacks' ping-pong tracking
    slots (``enable_mamba_extra_buffer``), which SGLang's "auto" mamba radix
    cache strategy turns on for Qwen3-Next at its defaults: each request then
    takes its tracking slots from the state band too, two with overlap
    scheduling (a forward stream here), one without.  ``fused_draft``: a
    speculative draft's ``FusedDraftPlacement`` (``draft_placement``): every
    entry of the sub-pools it names also carries the draft's K/V lanes."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    pools = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
    layers = g.full_layers + (g.mamba_layers if kind == "mamba" else g.swa_layers)
    common = {
        "device": device,
        "kv_cache_dtype": g.dtype,
        "head_num": g.head_num,
        "head_dim": g.head_dim,
        "page_size": page_size,
        "start_layer": 0,
        "end_layer": max(layers) + 1,
        "full_attention_layer_ids": list(g.full_layers),
        "enable_memory_saver": False,
        "need_sort": False,
        "lazy_compaction": lazy,
        "forward_stream": forward_stream,
        "fused_draft": fused_draft,
    }
    swa = {
        "v_head_dim": g.head_dim,
        "swa_head_num": g.head_num,
        "swa_head_dim": g.head_dim,
        "swa_v_head_dim": g.head_dim,
        "swa_attention_layer_ids": list(g.swa_layers),
        "full_max_total_num_tokens": g.tokens * page_size,
        "swa_max_total_num_tokens": g.tokens * page_size,
        "sliding_window_size": g.window,
    }
    mamba = {
        "mamba_layer_ids": list(g.mamba_layers),
        "mamba2_cache_params": _cache_params(g),
        "max_mamba_cache_size": g.mamba_slots,
        "model_context_len": g.context_len * page_size,
        "extra_max_context_len": 1,
        "max_num_reqs": g.max_reqs,
        "enable_mamba_extra_buffer": bool(extra_buffer),
        "enable_mamba_extra_buffer_lazy": False,
        "disable_overlap_schedule": forward_stream is None,  # sizes the tracking slots: two with overlap
    }
    if kind == "swa":
        return pools.init_unified_swa_pools(**common, **swa)
    if kind == "mamba_swa":
        return pools.init_unified_mamba_swa_pools(**common, **swa, **mamba)
    return pools.init_unified_mamba_pools(
        **common,
        **mamba,
        is_draft_worker=False,
        use_mla_backend=False,
        max_total_num_tokens=g.tokens * page_size,
        speculative_num_draft_tokens=None,
    )


class _OnHost:
    """A Triton launch ``kernel[grid](*args)`` answered by a torch function."""

    def __init__(self, run):
        self.run = run

    def __getitem__(self, grid):
        return self.run


@contextlib.contextmanager
def cpu_kernels():
    """While the block runs, SGLang's own allocator runs its paged
    ``alloc_extend``/``alloc_decode`` on the CPU: its two Triton kernels
    are answered by SGLang's naive torch versions (``allocator/paged.py``)."""
    sub = import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
    paged = import_sglang("sglang.srt.mem_cache.allocator.paged")

    def extend(prefix, seq, last, free_pages, out, _pow2, ps):
        paged.alloc_extend_naive(prefix, seq, last, free_pages, out, ps, out.device)

    def decode(seq, last, free_pages, out, _pow2, ps):
        opens = int(((seq - 1) % ps == 0).sum())  # the naive version takes the count the kernel derives
        paged.alloc_decode_naive(seq, last, free_pages, out, ps, opens)

    saved = sub.alloc_extend_kernel, sub.alloc_decode_kernel
    sub.alloc_extend_kernel, sub.alloc_decode_kernel = _OnHost(extend), _OnHost(decode)
    try:
        yield
    finally:
        sub.alloc_extend_kernel, sub.alloc_decode_kernel = saved
