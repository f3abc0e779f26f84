"""Each engine's own defaults, as the simulator's setups run them.

The unified setups and the static splits run under SGLang's defaults (the
anchor engine; kvarena is its drop-in); vLLM's padded pool under vLLM's.
Every figure is the engine's own default on an H200 serving these models
(``vllm serve``; SGLang's server), with its source: SGLang 0.5.23 as
installed (paths under ``sglang/srt/``), vLLM 0.34.0's wheel (paths under
``vllm/``).  The notes behind them are ``docs/guides/simulator.md``.

- the **running limit**: SGLang's ``max_running_requests`` when unset
  (``mem_cache/kv_cache_configurator.py``, ``resolve_max_num_reqs``:
  ``token_capacity / context_len x 512`` held to [2048, 4096], at most half
  the token capacity); vLLM's ``max_num_seqs``, 1024 on an H100/H200 for
  ``vllm serve`` (``engine/arg_utils.py``, ``get_batch_defaults``);
- the **largest CUDA graph**: SGLang captures decode batches up to 256 on a
  device of 90 to 160 GiB below TP 4 (``arg_groups/memory_hook.py``,
  ``handle_gpu_memory_settings``); vLLM up to ``min(2 x max_num_seqs,
  512)`` (``config/vllm.py``, ``_set_cudagraph_sizes``).  A decode batch
  above it runs eagerly (``timing.Clock.eager_seconds``);
- **prefill and decode in one pass or two**: SGLang runs a prefill chunk
  as a forward pass of its own, before the decodes (``enable_mixed_chunk``
  is False, ``arg_groups/fields/schedule.py``; ``managers/scheduler.py``,
  ``get_next_batch_to_run``: "Run prefill first if possible"), its prefill
  graphs holding up to ``chunked_prefill_size`` tokens
  (``memory_hook.py``); ``--enable-mixed-chunk`` mixes a chunk into the
  decode batch, the decodes taking their share of its budget
  (``PrefillAdder``'s ``mixed_with_decode_tokens``).  vLLM always mixes:
  a step's token budget (``max_num_batched_tokens``, 8192 for ``vllm
  serve``) goes to the decodes first and the rest to prefill chunks
  (``v1/core/sched/scheduler.py``), and its graphs hold batches up to 512
  tokens (FULL_AND_PIECEWISE, ``config/compilation.py``);
- the **decode reserve**: SGLang holds back a share of the running
  requests' remaining output at admission, its ``new_token_ratio``
  decaying from 0.7 to 0.098 (the simulator's ``engine.NewTokenRatio``);
  vLLM holds none, and when a decode finds no free
  block it preempts the newest request and recomputes it later (the
  simulator's retraction, whose recompute the clock charges as prefill);
- the **mamba SSM state dtype**: SGLang keeps it in fp32
  (``configs/mamba_utils.py``, ``mamba2_state_dtype``); vLLM in the
  model's dtype, bf16 (``model_executor/layers/mamba/mamba_utils.py``,
  ``MambaStateDtypeCalculator``), except where a model's hook says
  otherwise: Nemotron-H's keeps fp32 (``model_executor/models/config.py``,
  ``NemotronHForCausalLMConfig``), and so does the synthetic preset, which
  carries Nemotron-H's state;
- the **mamba prefix-cache checkpoints** (``Checkpoints``), with the cache
  on.  SGLang's default strategy on an H200 is ``extra_buffer``
  (``arg_groups/overrides.py``, ``_mamba_radix_cache_resolution``: the
  overlap scheduler is on): a running request holds two more state slots
  (``mem_cache/allocation_sizing.py``, ``get_mamba_tracking_slots``), a
  prefill snapshots its state at its last multiple of the kernel's chunk
  (``mamba_cache_chunk_size``; at a cached prefix's branch point if there
  is one), a decode every ``mamba_track_interval`` (256) tokens
  (``managers/schedule_batch.py``), and a finished request leaves its last
  snapshot in the tree, its KV past it freed
  (``mem_cache/unified_radix_cache.py``, ``checkpoint_into_tree``).  With
  ``no_buffer`` (what SGLang picks without the overlap scheduler) a
  request holds one slot and leaves the state of its whole length.  vLLM's
  default with prefix caching is ``mamba_cache_mode="align"``
  (``model_executor/models/config.py``, ``MambaModelConfig``): states are
  kept at its block size (``kvarena.sim.padded``), a request holds two
  state blocks (``v1/core/single_type_kv_cache_manager.py``,
  ``MambaManager``), and hits land on whole blocks.

The running limit is one rule for every setup of an engine, read from the
setup's own full-attention pool (a static split's full pages; the unified
allocator's full view, ``allocator.size_full``, which is the whole buffer:
``kv_cache_configurator.py``, ``hybrid_swa_token_capacity``).  On a model
with recurrent state SGLang also caps running requests at its **mamba
slots over a request's share** (``Engine.running_cap``):
``max_mamba_cache_size // ratio`` with ratio 1 without the radix cache and
``3 + tracking slots`` with it (``kv_cache_configurator.py``,
``resolve_max_num_reqs`` and ``_calculate_mamba_ratio``).  It applies to
every SGLang setup, ``--enable-unified-memory`` included: SGLang sizes
``max_mamba_cache_size`` from ``--mamba-full-memory-ratio`` whatever the
pool (``_handle_max_mamba_cache``), and kvarena's drop-in replaces only the
pool factories, so kvarena inside SGLang inherits the default split's cap.
The simulator's ``unified-uncapped`` setup lifts it, to show what the cap
costs; it is not how SGLang 0.5.23 runs.

SGLang 0.5.23 turns hybrid SWA memory off for Gemma 2 and 3
(``arg_groups/model_overrides/gemma2_gemma3.py``: ``disable_hybrid_swa_memory``),
so it keeps every layer's KV at full length there (``Engine.runs_hybrid``),
and ``--enable-unified-memory`` refuses a model that is not hybrid
(``kv_cache_configurator.py``, "only supports hybrid Mamba and hybrid
sliding-window-attention models"): kvarena cannot engage on Gemma today.
"""

import math
from dataclasses import dataclass

MAMBA_STRATEGIES = ("extra_buffer", "no_buffer")  # SGLang's --mamba-radix-cache-strategy, as resolved
SGLANG_TRACK_INTERVAL = 256  # --mamba-track-interval's default (arg_groups/fields/exec_.py)
SGLANG_RUNNING_FLOOR, SGLANG_RUNNING_CEIL = 2048, 4096  # resolve_max_num_reqs's clamp
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (kv_cache_configurator.py): with the
# radix cache on, a running request's share of the mamba slots is 3 + its tracking slots.
MAMBA_RUNNING_RATIO = 3


@dataclass(frozen=True)
class Checkpoints:
    """Where a request's recurrent state is kept for the prefix cache.

    ``track_slots``: state slots a running request holds besides its own;
    ``prefill_grid`` / ``decode_grid``: tokens: a prefill snapshots at its
    last multiple of the first, a decode at each multiple of the second.
    None of this object (``Engine.checkpoints`` returns None): the state at
    the request's whole length, one slot."""

    track_slots: int
    prefill_grid: int
    decode_grid: int


@dataclass(frozen=True)
class Engine:
    name: str
    max_running: int | None  # requests running at once (None: SGLang's rule, ``running_limit``)
    graph_batch: int | None  # the largest decode batch a CUDA graph holds
    decode_reserve: bool  # admission holds back a share of the remaining output
    mixed_chunk: bool  # a prefill chunk rides a decode iteration (False: a pass of its own)
    prefill_graph: int | None  # the most tokens a prefill or mixed pass's CUDA graph holds
    ssm_dtype_bytes: int  # the mamba SSM state's element size
    ssm_dtype_overrides: tuple = ()  # (preset, bytes): a model hook's own dtype
    mamba_cap: bool = False  # running requests capped at the mamba slots over a request's share
    hybrid_swa_off: tuple = ()  # presets whose SWA layers the engine keeps at full length
    source: str = ""

    def running_limit(self, sizes, full_units=None):
        """The running limit of a setup whose full-attention pool holds
        ``full_units`` pages (None: the whole buffer as full pages, the
        unified allocator's full view)."""
        if self.max_running is not None:
            return self.max_running
        if full_units is None:
            full_units = sizes.total // sizes.unit_full
        tokens = full_units * sizes.page_tokens  # SGLang's token capacity: the full pool's tokens
        est = int(tokens / sizes.preset.context_len * 512)
        return min(max(min(est, SGLANG_RUNNING_CEIL), SGLANG_RUNNING_FLOOR), tokens // 2)

    def running_cap(self, p, slots, prefix_cache, strategy="extra_buffer"):
        """The cap on running requests that ``slots`` mamba slots give on
        preset ``p`` (None: no cap).  SGLang: ``slots // ratio``, ratio 1
        without the radix cache and 3 plus a request's tracking slots with it
        (``resolve_max_num_reqs``, ``_calculate_mamba_ratio``)."""
        if not (self.mamba_cap and p.state_bytes):
            return None
        if not prefix_cache:
            return slots
        ck = self.checkpoints(p, strategy)
        return slots // (MAMBA_RUNNING_RATIO + (ck.track_slots if ck else 0))

    def runs_hybrid(self, p):
        """Does this engine keep ``p``'s sliding-window layers at their window?"""
        return bool(p.swa_bytes) and p.name not in self.hybrid_swa_off

    def ssm_bytes_for(self, p):
        return dict(self.ssm_dtype_overrides).get(p.name, self.ssm_dtype_bytes)

    def preset(self, p):
        """``p`` as this engine keeps its state."""
        return p.with_ssm_dtype_bytes(self.ssm_bytes_for(p)) if p.ssm_bytes else p

    def checkpoints(self, p, strategy="extra_buffer", block_tokens=0):
        """This engine's checkpoint rule on preset ``p`` with the prefix cache
        on (None: the state at the whole length, no tracking slot).
        ``block_tokens``: vLLM's block size (``padded.Layout``)."""
        if not p.state_bytes:
            return None
        if self.name == "vllm":
            return Checkpoints(1, block_tokens, block_tokens)
        if strategy not in MAMBA_STRATEGIES:
            raise ValueError(f"simulate: mamba strategy must be one of {', '.join(MAMBA_STRATEGIES)}, got {strategy!r}")
        if strategy == "no_buffer":
            return None
        return Checkpoints(2, p.mamba_chunk_tokens, math.lcm(p.mamba_chunk_tokens, SGLANG_TRACK_INTERVAL))


SGLANG = Engine(
    "sglang",
    max_running=None,
    graph_batch=256,
    decode_reserve=True,
    mixed_chunk=False,
    prefill_graph=8192,
    ssm_dtype_bytes=4,
    mamba_cap=True,
    hybrid_swa_off=("gemma-3-27b",),
    source="SGLang 0.5.23: kv_cache_configurator.py resolve_max_num_reqs; memory_hook.py; mamba_utils.py; schedule.py; "
    "model_overrides/gemma2_gemma3.py",
)
VLLM = Engine(
    "vllm",
    max_running=1024,
    graph_batch=512,
    decode_reserve=False,
    mixed_chunk=True,
    prefill_graph=512,
    ssm_dtype_bytes=2,
    ssm_dtype_overrides=(("nemotron-h-8b", 4), ("tri-synthetic", 4)),
    source="vLLM 0.34.0: arg_utils.py get_batch_defaults; config/vllm.py _set_cudagraph_sizes; models/config.py; "
    "v1/core/sched/scheduler.py",
)
ENGINES = {"sglang": SGLANG, "vllm": VLLM}
