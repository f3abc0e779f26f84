"""The simulator's clock (``kvarena.sim.timing``) and the latencies the
scheduler stamps with it: the roofline worked by hand, one request's TTFT
and ITL to the step, the relocation and SLO accounting."""

import dataclasses
import math

import pytest

from kvarena.sim import backends, engine, presets, timing, traces

pytestmark = pytest.mark.usefixtures("one_thread")

EXACT = engine.Config(record=False)


def test_the_roofline_by_hand():
    c = timing.clock("gpt-oss-120b")
    m, a = timing.MODELS["gpt-oss-120b"], timing.ACCELERATORS["h200"]
    one = max(m.active_weight_bytes / a.memory_bandwidth, 2 * m.params_active / a.peak_flops)
    assert math.isclose(c.iteration_seconds(1, 0), one)  # bytes-bound: the active weights
    assert c.iteration_seconds(0, 10**12) == 0.0  # nothing to run
    big = c.iteration_seconds(100_000, 0)  # a big prefill: all experts read, and FLOPs bind
    assert big == 2 * m.params_active * 100_000 / a.peak_flops
    assert c.step_seconds(4, 0, 10**9) == 16 * c.iteration_seconds(4, 10**9)
    assert math.isclose(c.copy_seconds(10**9), 2 * 10**9 / (0.8 * a.memory_bandwidth))
    q = timing.clock("qwen3-next-80b-a3b")  # two GPUs: twice the bandwidth and FLOPs
    assert q.bandwidth == 2 * a.memory_bandwidth and q.flops == 2 * a.peak_flops
    with pytest.raises(ValueError, match="unknown accelerator"):
        timing.clock("gpt-oss-120b", "tpu")


def test_moe_weight_reads_follow_expected_expert_coverage():
    """gpt-oss-120b, 4 of 128 experts a token: at 23 tokens a batch is
    expected to touch 52% of a layer's experts (1 - (31/32)^23), not the
    whole checkpoint the active share times 23 would read."""
    m = timing.MODELS["gpt-oss-120b"]
    assert math.isclose(m.coverage(1), 4 / 128)
    assert math.isclose(m.coverage(23), 1 - (1 - 4 / 128) ** 23) and 0.51 < m.coverage(23) < 0.53
    assert math.isclose(m.weights_read(1), m.active_weight_bytes)  # one token: the active share
    dense = m.weight_bytes * (m.params_total - m.expert_params) / m.params_total
    assert math.isclose(m.weights_read(23), dense + (m.weight_bytes - dense) * m.coverage(23))
    assert m.weights_read(23) < 0.6 * m.weight_bytes < m.active_weight_bytes * 23
    assert math.isclose(m.weights_read(10**6), m.weight_bytes)  # every expert
    reads = [m.weights_read(b) for b in (1, 2, 8, 64, 512)]
    assert reads == sorted(reads) and len(set(reads)) == len(reads)
    g = timing.MODELS["gemma-3-27b"]  # dense: the whole checkpoint at any batch
    assert g.weights_read(1) == g.weights_read(512) == g.weight_bytes


def test_sglang_runs_a_prefill_chunk_as_a_pass_of_its_own():
    """SGLang's default (``enable_mixed_chunk`` False): 20,000 prefill tokens
    are two full chunks of 8,192 and one of 3,616, each a forward pass that
    reads no decode KV, and the 16 decode iterations are unchanged: the
    prefill's FLOPs add to the decodes' bytes, never hide under them."""
    c = timing.clock("gpt-oss-120b")
    kv = 10**9
    decode = 16 * c.iteration_seconds(64, kv)
    alone = 2 * c.iteration_seconds(8192, 0) + c.iteration_seconds(20_000 - 2 * 8192, 0)
    assert math.isclose(c.step_seconds(64, 20_000, kv), decode + alone)
    assert c.step_seconds(64, 20_000, kv) > 16 * c.iteration_seconds(64 + 20_000 / 16, kv)  # the old spread
    assert c.step_seconds(0, 8192, 0) == c.iteration_seconds(8192, 0)
    big = timing.clock("gpt-oss-120b", layers=36, prefill_graph=4096)  # a pass above the prefill graphs: eager
    eager = 36 * timing.EAGER_LAUNCHES_PER_LAYER * timing.ACCELERATORS["h200"].launch_seconds
    assert math.isclose(big.step_seconds(0, 8192, 0), c.step_seconds(0, 8192, 0) + eager)
    assert big.step_seconds(0, 4096, 0) == c.step_seconds(0, 4096, 0)


def test_a_mixing_engine_puts_each_chunk_in_a_decode_iteration():
    """vLLM (and SGLang's ``--enable-mixed-chunk``): 64 decodes take 64 of
    each pass's 8,192 tokens, so 20,000 prefill tokens ride three of the 16
    iterations (8,128 + 8,128 + 3,744 tokens besides the decodes); the other
    13 decode alone."""
    c = timing.clock("gpt-oss-120b", mixed=True)
    kv = 10**9
    assert c.chunk_budget(64) == 8192 - 64 and c.chunk_budget(10**5) == 1
    want = (
        13 * c.iteration_seconds(64, kv)
        + 2 * c.iteration_seconds(64 + 8128, kv)
        + c.iteration_seconds(64 + 20_000 - 2 * 8128, kv)
    )
    assert math.isclose(c.step_seconds(64, 20_000, kv), want)
    assert c.step_seconds(64, 0, kv) == timing.clock("gpt-oss-120b").step_seconds(64, 0, kv)
    eager = timing.clock("gpt-oss-120b", layers=36, prefill_graph=512, mixed=True)  # vLLM's graphs: 512 tokens
    launches = 36 * timing.EAGER_LAUNCHES_PER_LAYER * timing.ACCELERATORS["h200"].launch_seconds
    assert math.isclose(eager.step_seconds(64, 20_000, kv), want + 3 * launches)


def test_a_batch_no_cuda_graph_holds_pays_eager_launches():
    c = timing.clock("gpt-oss-120b", layers=36, graph_batch=256)
    free = timing.clock("gpt-oss-120b")  # no graph limit
    eager = 36 * timing.EAGER_LAUNCHES_PER_LAYER * timing.ACCELERATORS["h200"].launch_seconds
    assert c.eager_seconds(256) == 0.0 and c.eager_seconds(257) == eager
    assert c.step_seconds(256, 0, 10**9) == free.step_seconds(256, 0, 10**9)
    assert math.isclose(c.step_seconds(257, 0, 10**9), free.step_seconds(257, 0, 10**9) + 16 * eager)


def test_mem_fraction_static_is_sglangs_own_default():
    """SGLang 0.5.23, ``srt/arg_groups/memory_hook.py``: on an H200 (143,771
    MiB) the reserve is 512 + 8192 x 1.5 + TP x 128 + (2 x 256 + 8 x 58) MiB,
    0.903 of the device at TP 1 and 0.902 at TP 2; on an H100 it is held at
    the 10 GiB floor."""
    assert timing.sglang_mem_fraction_static("h200", 1) == 0.903
    assert timing.sglang_mem_fraction_static("h200", 2) == 0.902
    assert timing.sglang_mem_fraction_static("h100", 1) == round((81_559 - 13_904) / 81_559, 3)


def test_the_kv_budget_is_what_the_accelerator_leaves_after_the_weights():
    mem = 143_771 * 2**20  # an H200 as nvidia-smi reports it
    q = timing.MODELS["qwen3-next-80b-a3b"]
    assert timing.kv_budget_bytes("qwen3-next-80b-a3b") == 2 * mem * 0.902 - q.weight_bytes
    assert timing.kv_budget_bytes("gpt-oss-120b", mem_fraction_static=0.5) == mem * 0.5 - 65.3e9
    with pytest.raises(ValueError, match=r"gemma-3-27b.*leaves no memory"):
        timing.kv_budget_bytes("gemma-3-27b", mem_fraction_static=0.3)
    with pytest.raises(ValueError, match="mem_fraction_static must be in"):
        timing.kv_budget_bytes("gemma-3-27b", mem_fraction_static=1.5)


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_every_preset_has_a_kv_budget_on_its_gpus(name):
    m = timing.MODELS[name]
    kv = timing.kv_budget_bytes(name)
    frac = timing.sglang_mem_fraction_static("h200", m.gpus)
    assert 0 < kv and m.weight_bytes + kv <= m.gpus * timing.ACCELERATORS["h200"].memory * frac + 1
    assert 0 < m.params_active <= m.params_total


def test_one_request_ttft_and_itl_to_the_step(monkeypatch):
    """One request of 16 prompt tokens (one page) and 32 output (two pages)
    on gpt-oss: a prefill step, then two decode steps (the launches free
    here: the roofline alone)."""
    h200 = timing.ACCELERATORS["h200"]
    monkeypatch.setitem(timing.ACCELERATORS, "h200", dataclasses.replace(h200, launch_seconds=0.0))
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 1.0)
    c = timing.clock("gpt-oss-120b")
    p = s.preset
    res = engine.run(backends.Unified(s), s, [traces.Request(0, 0.0, 16, 32)], EXACT, "u")
    t0 = c.step_seconds(0, 16, 0)

    def kv(tokens):
        return tokens * p.full_bytes + min(tokens, p.window + 1) * p.swa_bytes

    t1, t2 = c.step_seconds(1, 0, kv(32)), c.step_seconds(1, 0, kv(48))
    assert res.steps == 3 and res.finished == 1
    assert res.ttft_p50 == res.ttft_p99 == t0
    assert math.isclose(res.seconds, t0 + t1 + t2)
    assert math.isclose(res.itl_p50, t1 / 16) and math.isclose(res.itl_p99, t2 / 16)
    assert math.isclose(res.output_tokens_per_s, 32 / res.seconds)
    assert res.slo_met == 1 and math.isclose(res.goodput, 1 / res.seconds)
    late = traces.Request(0, 5.0, 16, 32)  # an idle start is skipped, not charged
    res5 = engine.run(backends.Unified(s), s, [late], EXACT, "u")
    assert math.isclose(res5.seconds, 5.0 + res.seconds) and math.isclose(res5.ttft_p50, t0)


def test_latencies_reproduce_with_the_launch_cost_model():
    """The default clock charges the allocator's counted launches: a run
    reproduces exactly, and its allocator time is its launches' cost."""
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    trace = traces.generate("balanced", 120, seed=2, arrivals="poisson", rate=20.0)
    a = engine.run(backends.Unified(s), s, trace, EXACT, "u").numbers()
    b = engine.run(backends.Unified(s), s, trace, EXACT, "u").numbers()
    assert a == b and a["launches"] > 0
    assert math.isclose(a["alloc_seconds"], a["launches"] * timing.ACCELERATORS["h200"].launch_seconds)
    cpu = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_cost="cpu"), "u")
    assert cpu.alloc_seconds > 0 and cpu.launches == 0
    with pytest.raises(ValueError, match="alloc_cost must be one of gpu, torch, cpu"):
        engine.Config(alloc_cost="free").check()


def test_the_measured_allocator_time_replaces_the_launch_cost():
    """With every request arriving at once the schedule does not depend on
    the clock, so the measured run takes the same steps, and its clock less
    its allocator time is the launch-costed clock less its own."""
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    trace = traces.generate("balanced", 120, seed=2)
    counted = engine.run(backends.Unified(s), s, trace, EXACT, "u")
    timed = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_cost="cpu"), "u")
    assert timed.alloc_seconds > 0
    assert (timed.steps, timed.finished, timed.bytes_moved) == (counted.steps, counted.finished, counted.bytes_moved)
    assert math.isclose(timed.seconds - timed.alloc_seconds, counted.seconds - counted.alloc_seconds, rel_tol=1e-9)


def test_relocation_is_charged_at_copy_bandwidth():
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    res = engine.run(backends.Unified(s), s, traces.generate("shift", 160, seed=3), EXACT, "u")
    assert res.bytes_moved > 0
    assert math.isclose(res.copy_seconds, timing.clock("tri-synthetic").copy_seconds(res.bytes_moved))


def test_goodput_follows_the_slos():
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 2.0)
    trace = traces.generate("short", 80, seed=1, arrivals="poisson", rate=5.0)
    loose = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, slo_ttft=1e9), "u")
    tight = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, slo_ttft=1e-9), "u")
    assert loose.slo_met == loose.finished == 80 and math.isclose(loose.goodput, 80 / loose.seconds)
    assert tight.slo_met == 0 and tight.goodput == 0
    assert 0 < loose.ttft_p50 <= loose.ttft_p99 and 0 < loose.itl_p50 <= loose.itl_p99
    with pytest.raises(ValueError, match="SLOs must be > 0"):
        engine.Config(slo_itl=0).check()


@pytest.mark.parametrize("mixed", [False, True])
def test_mixed_decodes_share_the_prefill_budget(mixed):
    """32 short requests and one prompt of 96 pages (chunk 64 tokens: 4
    pages, 64 a step).  Step 1 prefills the 32 and 32 pages of the long one.
    Step 2: unmixed, the other 64 pages; mixed, the 32 decodes take 32 of
    the budget and the prompt needs a third step."""
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 4.0)
    trace = [traces.Request(i, 0.0, 16, 256) for i in range(32)] + [traces.Request(32, 0.0, 96 * 16, 16)]
    cfg = engine.Config(chunk_tokens=64, enable_mixed_chunk=mixed)
    res = engine.run(backends.Unified(s), s, trace, cfg, "u")
    assert res.mixed_chunk is mixed and res.finished == 33
    prefill = res.series["prefill"]
    assert prefill[:3] == ([64 * 16, 64 * 16, 0] if not mixed else [64 * 16, 32 * 16, 32 * 16])
