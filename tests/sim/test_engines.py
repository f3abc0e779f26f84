"""Each engine's own defaults (``kvarena.sim.engines``, ``kvarena.sim.padded``),
each test naming the source the rule comes from."""

import dataclasses

import pytest

from kvarena.sim import engines, padded, presets


def test_sglang_running_limit_is_resolve_max_num_reqs():
    """SGLang 0.5.23, mem_cache/kv_cache_configurator.py resolve_max_num_reqs:
    ``token_capacity / context_len x 512``, held to [2048, 4096], at most
    half the token capacity."""
    q = presets.Sizes.of(presets.preset("qwen3-next-80b-a3b"), 104.0)
    tokens = q.total // q.unit_full * 16
    assert tokens / 262_144 * 512 > 4096 and engines.SGLANG.running_limit(q) == 4096
    long_ctx = dataclasses.replace(presets.preset("qwen3-next-80b-a3b"), context_len=100 * tokens)
    assert engines.SGLANG.running_limit(dataclasses.replace(q, preset=long_ctx)) == 2048  # the floor
    tiny = presets.Sizes.of(presets.preset("nemotron-h-8b"), 0.01)
    assert engines.SGLANG.running_limit(tiny) == tiny.total // tiny.unit_full * 16 // 2  # half the capacity


def test_vllm_limits_are_its_serve_defaults_on_an_h200():
    """vLLM 0.34.0: engine/arg_utils.py get_batch_defaults (max_num_seqs 1024
    for ``vllm serve`` on an H100/H200); config/vllm.py _set_cudagraph_sizes
    (graphs up to min(2 x 1024, 512)); SGLang: memory_hook.py (decode graphs
    to 256 below TP 4 on a 90 to 160 GiB device)."""
    q = presets.Sizes.of(presets.preset("qwen3-next-80b-a3b"), 10.0)
    assert engines.VLLM.running_limit(q) == 1024 and engines.VLLM.graph_batch == 512
    assert engines.SGLANG.graph_batch == 256
    assert engines.SGLANG.decode_reserve and not engines.VLLM.decode_reserve


def test_state_dtypes_follow_each_engines_model_hooks():
    """SGLang keeps the SSM state in fp32 (configs/mamba_utils.py); vLLM 0.34.0
    in the model's bf16 (MambaStateDtypeCalculator), but Nemotron-H's hook
    keeps fp32 (models/config.py NemotronHForCausalLMConfig,
    DEFAULT_MAMBA_SSM_CACHE_DTYPE), and so does the synthetic preset that
    carries its state."""
    q, n, t = (presets.preset(x) for x in ("qwen3-next-80b-a3b", "nemotron-h-8b", "tri-synthetic"))
    assert engines.SGLANG.preset(q) == q and engines.SGLANG.preset(n) == n
    assert engines.VLLM.preset(q).state_bytes == 36 * 1_097_728  # bf16: 24,576 conv + 524,288 SSM a layer
    assert engines.VLLM.preset(n) == n and engines.VLLM.preset(t) == t


def test_vllm_block_size_with_and_without_prefix_caching():
    """vLLM 0.34.0, platforms/interface.py _align_hybrid_block_size: the
    attention block rises to hold one layer's state, in steps of 16 tokens,
    or, with prefix caching (mamba_cache_mode 'align'), of lcm(16, 64) for a
    gated delta net (gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT)."""
    q, n = (engines.VLLM.preset(presets.preset(x)) for x in ("qwen3-next-80b-a3b", "nemotron-h-8b"))
    assert padded.Layout(q, 16).block_tokens == 544
    assert padded.Layout(q, 16, prefix_cache=True).block_tokens == 576
    assert padded.Layout(n, 16).block_tokens == padded.Layout(n, 16, prefix_cache=True).block_tokens == 1040


def test_vllm_groups_by_the_largest_count_below_one_and_a_half_times_the_smallest():
    """vLLM 0.34.0, v1/core/kv_cache_planning.py
    _get_kv_cache_groups_uniform_page_size: 12 sliding and 13 full layers
    group 13 a group (two groups, one padded); 12 and 18 group 12 (three)."""
    base = presets.preset("gpt-oss-120b")
    per = base.full_bytes // 18

    def with_layers(swa, full):
        return dataclasses.replace(base, full_bytes=per * full, swa_bytes=per * swa, layers=(full, swa, 0))

    lay = padded.Layout(with_layers(12, 13), 16)
    assert lay.group_layers == 13 and lay.groups == {"full": 1, "swa": 1}
    lay = padded.Layout(with_layers(12, 18), 16)
    assert lay.group_layers == 12 and lay.groups == {"full": 2, "swa": 1}


def test_checkpoint_rules():
    """SGLang's extra_buffer: two tracking slots with the overlap scheduler
    (allocation_sizing.py get_mamba_tracking_slots), a prefill snapshot on
    the kernel's chunk (64 for Qwen3-Next, FLA's; Nemotron-H's 256), a
    decode snapshot every lcm(chunk, 256) (runtime_context.py
    mamba_track_grid); no_buffer: none.  vLLM's align: two state blocks a
    request, states on its block size."""
    q, n = presets.preset("qwen3-next-80b-a3b"), presets.preset("nemotron-h-8b")
    assert engines.SGLANG.checkpoints(q) == engines.Checkpoints(2, 64, 256)
    assert engines.SGLANG.checkpoints(n) == engines.Checkpoints(2, 256, 256)
    assert engines.SGLANG.checkpoints(q, "no_buffer") is None
    assert engines.SGLANG.checkpoints(presets.preset("gpt-oss-120b")) is None  # no state
    assert engines.VLLM.checkpoints(q, block_tokens=576) == engines.Checkpoints(1, 576, 576)
    with pytest.raises(ValueError, match="mamba strategy"):
        engines.SGLANG.checkpoints(q, "lazy")


def test_prefill_passes_as_each_engine_runs_them():
    """SGLang runs a prefill chunk as a pass of its own (``enable_mixed_chunk``
    False, srt/arg_groups/fields/schedule.py: ``tests/sglang`` reads it from
    the installed SGLang), its prefill graphs to ``chunked_prefill_size``
    tokens (memory_hook.py); vLLM 0.34.0 always mixes
    (v1/core/sched/scheduler.py), its graphs to 512 tokens (config/vllm.py)."""
    assert engines.SGLANG.mixed_chunk is False and engines.SGLANG.prefill_graph == 8192
    assert engines.VLLM.mixed_chunk is True and engines.VLLM.prefill_graph == 512
