"""The simulator's clock (``kvarena.sim.timing``) and the latencies the
scheduler stamps with it: the roofline worked by hand, one request's TTFT
and ITL to the step, the relocation and SLO accounting."""

import math

import pytest

from kvarena.sim import backends, engine, presets, timing, traces

pytestmark = pytest.mark.usefixtures("one_thread")

EXACT = engine.Config(record=False, alloc_time=False)


def test_the_roofline_by_hand():
    c = timing.clock("gpt-oss-120b")
    m, a = timing.MODELS["gpt-oss-120b"], timing.ACCELERATORS["h200"]
    one = max(m.active_weight_bytes / a.memory_bandwidth, 2 * m.params_active / a.peak_flops)
    assert c.iteration_seconds(1, 0) == one  # bytes-bound: the active weights
    assert c.iteration_seconds(0, 10**12) == 0.0  # nothing to run
    big = c.iteration_seconds(100_000, 0)  # a big prefill: all experts read, and FLOPs bind
    assert big == max(m.weight_bytes / a.memory_bandwidth, 2 * m.params_active * 100_000 / a.peak_flops)
    assert big == 2 * m.params_active * 100_000 / a.peak_flops
    assert c.step_seconds(4, 32, 10**9) == 16 * c.iteration_seconds(4 + 2, 10**9)
    assert math.isclose(c.copy_seconds(10**9), 2 * 10**9 / (0.8 * a.memory_bandwidth))
    q = timing.clock("qwen3-next-80b-a3b")  # two GPUs: twice the bandwidth and FLOPs
    assert q.bandwidth == 2 * a.memory_bandwidth and q.flops == 2 * a.peak_flops
    with pytest.raises(ValueError, match="unknown accelerator"):
        timing.clock("gpt-oss-120b", "tpu")


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_every_preset_fits_its_gpus_at_the_default_budget(name):
    m = timing.MODELS[name]
    assert m.weight_bytes + presets.Sizes.of(presets.preset(name)).budget_bytes <= m.gpus * 141e9
    assert 0 < m.params_active <= m.params_total


def test_one_request_ttft_and_itl_to_the_step():
    """One request of 16 prompt tokens (one page) and 32 output (two pages)
    on gpt-oss: a prefill step, then two decode steps."""
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


def test_latencies_reproduce_without_the_measured_allocator_time():
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    trace = traces.generate("balanced", 120, seed=2, arrivals="poisson", rate=20.0)
    a = engine.run(backends.Unified(s), s, trace, EXACT, "u").numbers()
    b = engine.run(backends.Unified(s), s, trace, EXACT, "u").numbers()
    assert a == b and a["alloc_seconds"] == 0.0
    timed = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_time=True), "u")
    assert timed.alloc_seconds > 0
    # No order between timed.seconds and a["seconds"] holds here: a slower
    # clock admits more Poisson arrivals a step, and bigger batches can end
    # sooner (one CI run saw 20.326 s timed against 20.351 s exact).


def test_the_measured_allocator_time_adds_to_the_clock():
    """With every request arriving at once the schedule does not depend on
    the clock, so the timed run takes the same steps and its clock is the
    exact one plus the allocator's measured time."""
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    trace = traces.generate("balanced", 120, seed=2)
    exact = engine.run(backends.Unified(s), s, trace, EXACT, "u")
    timed = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_time=True), "u")
    assert timed.alloc_seconds > 0
    assert (timed.steps, timed.finished, timed.bytes_moved) == (exact.steps, exact.finished, exact.bytes_moved)
    assert math.isclose(timed.seconds, exact.seconds + timed.alloc_seconds, rel_tol=1e-9)


def test_relocation_is_charged_at_copy_bandwidth():
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    res = engine.run(backends.Unified(s), s, traces.generate("shift", 160, seed=3), EXACT, "u")
    assert res.bytes_moved > 0
    assert math.isclose(res.copy_seconds, timing.clock("tri-synthetic").copy_seconds(res.bytes_moved))


def test_goodput_follows_the_slos():
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 2.0)
    trace = traces.generate("short", 80, seed=1, arrivals="poisson", rate=5.0)
    loose = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_time=False, slo_ttft=1e9), "u")
    tight = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_time=False, slo_ttft=1e-9), "u")
    assert loose.slo_met == loose.finished == 80 and math.isclose(loose.goodput, 80 / loose.seconds)
    assert tight.slo_met == 0 and tight.goodput == 0
    assert 0 < loose.ttft_p50 <= loose.ttft_p99 and 0 < loose.itl_p50 <= loose.itl_p99
    with pytest.raises(ValueError, match="SLOs must be > 0"):
        engine.Config(slo_itl=0).check()
