"""SGLang's decaying decode reserve (issue 56): ``engine.NewTokenRatio``
starts at 0.7, falls each decode iteration to 0.098 over 600 iterations, is
re-estimated after a retraction and reset when idle; the simulator applies
it per step of ``page_tokens`` iterations, for SGLang only (vLLM holds no
reserve), and ``Config.reserve_ratio`` forces a constant one.  A planted
constant ratio is caught."""

import pytest

from kvarena.sim import backends, engine, engines, presets, traces

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, as the commands use

INIT, MIN = 0.7, 0.7 * 0.14


def test_sglang_defaults():
    t = engine.NewTokenRatio()
    assert (t.init, t.current) == (INIT, INIT)
    assert t.min == pytest.approx(MIN)
    assert t.decay == pytest.approx((INIT - MIN) / 600)


def test_the_ratio_reaches_its_floor_after_the_decay_steps():
    t = engine.NewTokenRatio()
    for _ in range(599):
        t.decay_step()
    assert t.current > t.min and t.current == pytest.approx(t.min + t.decay)
    t.decay_step()
    assert t.current == pytest.approx(t.min)
    t.decay_step(1000)
    assert t.current == t.min  # the floor holds
    t.reset()
    assert t.current == INIT


def test_the_estimate_after_a_retraction():
    """``(decoded + 20 x requests) / (max_new_tokens + 1)``, at most 1."""
    t = engine.NewTokenRatio()
    t.decay_step(600)
    t.after_retract(decoded_tokens=300, max_new_tokens=999, requests=5)
    assert t.current == pytest.approx((300 + 20 * 5) / 1000)
    t.after_retract(decoded_tokens=990, max_new_tokens=999, requests=5)
    assert t.current == 1.0


def observe(monkeypatch):
    """The reserve ratio each step's admission used, with the retractions so far."""
    seen = []
    real = engine._Sim._admit

    def admit(self):
        seen.append((self.reserve_ratio, self.res.retractions))
        return real(self)

    monkeypatch.setattr(engine._Sim, "_admit", admit)
    return seen


def steady(n=20, output=1024):
    """Requests that all start at step 0 and decode together for ``output /
    16`` steps: no retraction, no idle spell."""
    return [traces.Request(i, 0.0, 128, output) for i in range(n)]


def check_decay(seen, pt):
    """Step 0 admits at the start, 0.7; each later step follows ``pt``
    decode iterations of decay, down to the floor, which it reaches after
    ``ceil(600 / pt)`` steps."""
    d = (INIT - MIN) / 600
    assert seen[0][0] == INIT
    for k, (ratio, retractions) in enumerate(seen[1:], 1):
        assert retractions == 0
        assert ratio == pytest.approx(max(INIT - k * pt * d, MIN)), k
    floor_at = -(-600 // pt)
    assert seen[floor_at - 1][0] > MIN + 1e-9 and seen[floor_at][0] == pytest.approx(MIN)


def test_sglang_decays_per_step_of_page_tokens(monkeypatch):
    seen = observe(monkeypatch)
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)
    res = engine.run(backends.Unified(s), s, steady(), engine.Config(record=False), "u", engines.SGLANG)
    assert res.finished == 20 and res.retractions == 0
    assert len(seen) > 50
    check_decay(seen, s.page_tokens)


def test_a_planted_constant_ratio_fails_the_decay_check(monkeypatch):
    seen = observe(monkeypatch)
    monkeypatch.setattr(engine.NewTokenRatio, "decay_step", lambda self, iterations=1: None)
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)
    engine.run(backends.Unified(s), s, steady(), engine.Config(record=False), "u", engines.SGLANG)
    with pytest.raises(AssertionError):
        check_decay(seen, s.page_tokens)


def test_a_given_reserve_ratio_is_held_constant(monkeypatch):
    seen = observe(monkeypatch)
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)
    engine.run(backends.Unified(s), s, steady(), engine.Config(record=False, reserve_ratio=0.3), "u", engines.SGLANG)
    assert {r for r, _ in seen} == {0.3}
    with pytest.raises(AssertionError):
        check_decay(seen, s.page_tokens)
    with pytest.raises(ValueError, match="reserve_ratio"):
        engine.Config(reserve_ratio=1.5).check()


def test_vllm_holds_no_reserve(monkeypatch):
    seen = observe(monkeypatch)
    calls = []
    real = engine.NewTokenRatio.__init__

    def init(self, *a, **kw):
        calls.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(engine.NewTokenRatio, "__init__", init)
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)
    for cfg in (engine.Config(record=False), engine.Config(record=False, reserve_ratio=0.3)):
        engine.run(backends.Unified(s), s, steady(), cfg, "v", engines.VLLM)
    assert seen and {r for r, _ in seen} == {0.0} and not calls


def test_a_retraction_resets_the_ratio_to_the_batch_estimate(monkeypatch):
    """Qwen3-Next on 2 GiB with long prompts retracts; each step that
    retracted sets the ratio to the estimate from the batch that remains,
    then decays it for the step's other ``page_tokens - 1`` iterations."""
    seen = observe(monkeypatch)
    estimates = []
    real = engine.NewTokenRatio.after_retract

    def after_retract(self, decoded_tokens, max_new_tokens, requests):
        real(self, decoded_tokens, max_new_tokens, requests)
        assert self.current == pytest.approx(min(1.0, (decoded_tokens + 20 * requests) / (max_new_tokens + 1)))
        estimates.append(self.current)

    monkeypatch.setattr(engine.NewTokenRatio, "after_retract", after_retract)
    s = presets.Sizes.of(presets.preset("qwen3-next-80b-a3b"), 2.0)
    trace = traces.generate("long", 60, seed=2)
    res = engine.run(backends.Unified(s), s, trace, engine.Config(record=False), "u", engines.SGLANG)
    assert res.retractions > 0 and res.finished == len(trace)
    pt, d = s.page_tokens, (INIT - MIN) / 600
    retracting = [k for k in range(1, len(seen)) if seen[k][1] > seen[k - 1][1]]
    assert retracting and len(estimates) == len(retracting)
    for k, est in zip(retracting, estimates):
        assert seen[k][0] == pytest.approx(max(est - (pt - 1) * d, MIN))
    # a step that neither retracted nor followed an idle spell only decays
    jumps = [k for k in range(1, len(seen)) if seen[k][0] > seen[k - 1][0] + 1e-12]
    assert set(jumps) <= set(retracting) | {k for k in range(1, len(seen)) if seen[k][0] == INIT}
    assert any(seen[k][0] > seen[k - 1][0] for k in retracting)  # it jumps back up, as SGLang's does


def test_the_ratio_resets_after_an_idle_spell(monkeypatch):
    """Requests far apart: each finds the server idle, so its admission sees
    SGLang's starting ratio, not one decayed by the request before."""
    seen = observe(monkeypatch)
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)
    trace = [traces.Request(i, 1000.0 * i, 128, 1024) for i in range(3)]
    res = engine.run(backends.Unified(s), s, trace, engine.Config(record=False), "u", engines.SGLANG)
    assert res.finished == 3
    starts = [k for k in range(1, len(seen)) if seen[k][0] > seen[k - 1][0]]
    assert len(starts) == 2 and all(seen[k][0] == INIT for k in starts)
    assert min(r for r, _ in seen) == pytest.approx(MIN)  # each decayed to the floor in between
