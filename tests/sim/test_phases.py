"""The ``phases`` trace family and the per-phase oracle (issue 56): phases
alternate, are balanced in work, cycle their rate over equal spans, keep a
seed's lengths under every arrival process; the other kinds are unchanged;
the oracle re-splits per phase and combines the phases' runs soundly."""

import hashlib
import itertools
import math

import pytest

from kvarena.sim import engine, oracle, presets, simulate, traces

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, as the commands use

FOOTPRINTS = {
    "tokens": None,
    "gemma-3-27b": traces.footprint(presets.preset("gemma-3-27b")),
    "qwen3-next-80b-a3b": traces.footprint(presets.preset("qwen3-next-80b-a3b")),
    "gpt-oss-120b": traces.footprint(presets.preset("gpt-oss-120b")),
}


def by_phase(trace):
    out = {}
    for r in trace:
        out.setdefault(r.phase, []).append(r)
    return [out[k] for k in sorted(out)]


def work(reqs, fp):
    f = fp or traces._tokens_held
    return sum(r.output_len * f(r.prompt_len, r.output_len) for r in reqs)


# ------------------------------------------------------------------ traces


@pytest.mark.parametrize("fp", list(FOOTPRINTS))
def test_phases_alternate_chat_and_long(fp):
    trace = traces.generate("phases", 400, seed=1, footprint=FOOTPRINTS[fp])
    phases = [r.phase for r in trace]
    assert phases == sorted(phases)  # queued in phase order
    assert sorted(set(phases)) == list(range(2 * traces.PHASE_REPEATS))
    assert traces.PHASE_REPEATS >= 2  # chat, long, chat, long at least
    chat, long = traces.PHASE_MIXES["chat"], traces.PHASE_MIXES["long"]
    for k, reqs in enumerate(by_phase(trace)):
        mix = chat if k % 2 == 0 else long
        assert all(mix.prompt_range[0] <= r.prompt_len <= mix.prompt_range[1] for r in reqs)
        assert all(mix.output_range[0] <= r.output_len <= mix.output_range[1] for r in reqs)
    # the chats fit a 1,024-token window; the documents are 12k-32k tokens
    assert chat.prompt_range[1] + chat.output_range[1] <= 1024
    assert long.prompt_range == (12_288, 32_768)


@pytest.mark.parametrize("fp", list(FOOTPRINTS))
@pytest.mark.parametrize("n", [200, 2000])
def test_each_long_phase_matches_its_chat_phase_in_work(fp, n):
    """Within half of the largest document's work (the stopping rule), and
    within 10% once the long phases have a few documents."""
    f = FOOTPRINTS[fp]
    trace = traces.generate("phases", n, seed=2, footprint=f)
    phases = by_phase(trace)
    for chats, docs in zip(phases[::2], phases[1::2]):
        wc, wd = work(chats, f), work(docs, f)
        biggest = max(work([d], f) for d in docs)
        assert abs(wd - wc) <= biggest / 2 + 1e-6 * wc, (fp, wc, wd, biggest)
        if len(docs) >= 10:
            assert abs(wd - wc) <= 0.1 * wc
    assert abs(len(trace) - n) <= 0.1 * n  # n requests in all, about


def test_a_footprint_changes_the_balance():
    """Sized by work, not count: on a model with large state the chats weigh
    more, so the long phases take more documents."""
    tokens = traces.generate("phases", 1000, seed=0)
    qwen = traces.generate("phases", 1000, seed=0, footprint=FOOTPRINTS["qwen3-next-80b-a3b"])
    docs = [sum(r.phase % 2 == 1 for r in t) for t in (tokens, qwen)]
    assert docs[1] > 2 * docs[0]


@pytest.mark.parametrize("arrivals", ["poisson", "bursty"])
def test_the_rate_cycles_over_equal_spans(arrivals):
    rate = 4.0
    trace = traces.generate("phases", 600, seed=3, arrivals=arrivals, rate=rate)
    phases = by_phase(trace)
    span = len(trace) / rate / len(phases)  # the mean rate is the given rate
    for k, reqs in enumerate(phases):
        assert all(k * span <= r.arrival <= (k + 1) * span for r in reqs), k
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(trace))
    # each phase's own rate is its requests over the span: the chats' is far higher
    assert len(phases[0]) / span > 5 * len(phases[1]) / span
    assert max(r.arrival for r in trace) <= len(phases) * span  # the run spans len(trace) / rate


def test_lengths_are_the_same_under_every_arrival_process():
    def lengths(t):
        return [(r.rid, r.prompt_len, r.output_len, r.phase) for r in t]

    f = FOOTPRINTS["gemma-3-27b"]
    base = lengths(traces.generate("phases", 300, seed=4, footprint=f))
    assert all(r.arrival == 0 for r in traces.generate("phases", 300, seed=4, footprint=f))
    for arrivals, rate in (("poisson", 1.0), ("poisson", 50.0), ("bursty", 3.0)):
        assert lengths(traces.generate("phases", 300, 4, arrivals, rate, footprint=f)) == base
    assert lengths(traces.generate("phases", 300, seed=5, footprint=f)) != base


# The other kinds, pinned: a digest of their requests for three seeds under
# every arrival process, taken before the phases kind existed.
PINNED = {
    "balanced": "517c1b70fabd1fafcf492556f56308bc8e6a41e89315061108112d881011b115",
    "long": "4bf8f4108825c28d1ab49ed260023a998fda633d71b3345a937e5361aede0e96",
    "short": "3e893620d9ae20ad9832073dcde943cedd979f2d6dc699adca53304d83bd302b",
    "shift": "36e35807b801a1e840f64e80de488bb31dbf7d9760228438c50207ff724e6ecd",
    "sharegpt": "893e02db439b34c3f4ea93c738bf2f6e9009ce928d3d74bdfc14ec80c040d3a6",
    "lmsys": "791170ea3eb3155f790ad4ce50b47f85449ee7301853a91c1349d6820648ddd7",
    "mooncake": "0a4f81712e336f89bb1bef64dcf6eef4e639c9f6bdc58964c7765d31fb4d144a",
}


def digest(kind):
    h = hashlib.sha256()
    for seed in (0, 1, 7):
        for arrivals, rate in (("saturating", None), ("poisson", 3.0), ("bursty", 5.0)):
            for r in traces.generate(kind, 97, seed, arrivals, rate):
                assert r.phase == -1
                h.update(
                    repr((r.rid, r.arrival, r.prompt_len, r.output_len, r.blocks, r.block_tokens, r.after)).encode()
                )
    return h.hexdigest()


@pytest.mark.parametrize("kind", list(PINNED))
def test_other_kinds_are_unchanged(kind):
    assert digest(kind) == PINNED[kind]
    assert set(PINNED) | {"phases"} == set(traces.KINDS)


def test_phases_round_trip_through_jsonl(tmp_path):
    trace = traces.generate("phases", 120, seed=6, arrivals="poisson", rate=2.0)
    path = tmp_path / "t.jsonl"
    traces.write_jsonl(trace, path)
    assert traces.read_jsonl(path) == trace
    path.write_text('{"arrival": 0, "prompt_len": 4, "output_len": 4, "phase": "x"}\n')
    with pytest.raises(ValueError, match="phase must be an int"):
        traces.read_jsonl(path)


# ------------------------------------------------------------------ oracle

CFG = engine.Config(record=False)


def test_phases_of_rebases_each_phase():
    trace = traces.generate("phases", 200, seed=1, arrivals="poisson", rate=5.0)
    parts = oracle.phases_of(trace)
    assert [len(p) for p in parts] == [len(p) for p in by_phase(trace)]
    for part, orig in zip(parts, by_phase(trace)):
        assert part[0].arrival == 0 and [r.rid for r in part] == list(range(len(part)))
        assert [r.arrival for r in part] == pytest.approx([r.arrival - orig[0].arrival for r in orig])
    with pytest.raises(ValueError, match="no phase"):
        oracle.phases_of(traces.generate("short", 10))


def test_combine_adds_the_phases_up():
    """Two runs end to end: counts and seconds add, throughput is the tokens
    over the seconds, means are weighted by their steps, quantiles the worst."""
    a = engine.Result("a", requests=3, finished=3, steps=10, memory_bound_steps=4, seconds=2.0, slo_met=2)
    a.output_tokens_per_s, a.mean_concurrency, a.mean_concurrency_all, a.ttft_p99 = 100.0, 8.0, 5.0, 1.0
    a.blocked, a.split = {"full": 4}, {"state_share": 0.9}
    b = engine.Result("b", requests=5, finished=5, steps=30, memory_bound_steps=12, seconds=6.0, slo_met=5)
    b.output_tokens_per_s, b.mean_concurrency, b.mean_concurrency_all, b.ttft_p99 = 20.0, 4.0, 3.0, 3.0
    b.blocked, b.split = {"full": 10, "ladder": 2}, {"state_share": 0.2}
    r = oracle.combine([a, b])
    assert (r.requests, r.finished, r.steps, r.seconds) == (8, 8, 40, 8.0)
    assert r.output_tokens_per_s == pytest.approx((100 * 2 + 20 * 6) / 8)
    assert r.goodput == pytest.approx(7 / 8)
    assert r.mean_concurrency == pytest.approx((8 * 4 + 4 * 12) / 16)
    assert r.mean_concurrency_all == pytest.approx((5 * 10 + 3 * 30) / 40)
    assert r.ttft_p99 == 3.0
    assert r.blocked == {"full": 14, "ladder": 2} and sum(r.blocked.values()) == r.memory_bound_steps
    assert [p["state_share"] for p in r.split["phases"]] == [0.9, 0.2]
    assert oracle.fixed(r.split) == [(0.8, 0.9), (0.8, 0.2)]


def test_oracle_resplits_each_phase_and_beats_one_split():
    """Qwen3-Next on a small buffer: the chat phases want the buffer mostly
    for state, the long phases mostly for KV, so the oracle's splits differ
    by phase and its throughput beats the whole trace's best split.  Not
    guaranteed in general (``kvarena.sim.oracle``): phases run apart lose
    the overlap at each boundary, which matters where phases are small."""
    p = presets.preset("qwen3-next-80b-a3b")
    s = presets.Sizes.of(p, 5.0)
    trace = traces.generate("phases", 400, seed=0, footprint=traces.footprint(p))
    lines = []
    res = oracle.per_phase(s, trace, CFG, progress=lines.append)
    best, _, _ = simulate.best_static(s, trace, CFG)
    shares = [ph["state_share"] for ph in res.split["phases"]]
    assert len(shares) == 2 * traces.PHASE_REPEATS
    assert min(shares[0::2]) > max(shares[1::2]) + 0.3  # chats: state; documents: KV
    assert res.output_tokens_per_s > best.output_tokens_per_s
    assert res.requests == res.finished == len(trace) and res.rejected == res.stuck == res.lost == 0
    assert res.seconds == pytest.approx(sum(ph["seconds"] for ph in res.split["phases"]))
    out = sum(r.output_len for r in trace)
    assert res.output_tokens_per_s == pytest.approx(out / res.seconds)  # every token over every phase's seconds
    assert any(line.startswith("phase 3: ") for line in lines)
    assert math.isclose(sum(res.blocked.values()), res.memory_bound_steps)
    # the splits found, fixed (as a rate sweep keeps them): the same runs again
    again = oracle.per_phase(s, trace, CFG, splits=oracle.fixed(res.split))
    assert again.output_tokens_per_s == pytest.approx(res.output_tokens_per_s)
    assert [ph["from"] for ph in again.split["phases"]] == ["the saturating trace's search"] * len(shares)


# ------------------------------------------------------------- the command


def test_the_command_runs_the_oracle_on_phases_and_keeps_its_splits_under_load(tmp_path, capsys):
    """``kvarena simulate --trace phases``: the oracle's row with its per-phase
    splits; a rate sweep keeps each phase's saturating split, as static-best
    keeps its; a trace without phases has no oracle row."""
    import json

    from kvarena import cli

    out = tmp_path / "r.json"
    argv = ["simulate", "--preset", "qwen3-next-80b-a3b", "--trace", "phases", "--requests", "160"]
    argv += ["--budget-gib", "3", "--seeds", "1", "--jobs", "1", "--rates", "400", "--json", str(out)]
    argv += ["--setups", "unified,static-best,static-phase-oracle"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "| static-phase-oracle | per phase: state " in text
    assert "unified / static-phase-oracle" in text
    saturating, swept = json.loads(out.read_text())["runs"]
    first = saturating["setups"]["static-phase-oracle"]["split"]["phases"]
    again = swept["setups"]["static-phase-oracle"]["split"]["phases"]
    assert len(first) == 2 * traces.PHASE_REPEATS
    assert [p["state_share"] for p in again] == [p["state_share"] for p in first]
    argv[argv.index("phases")] = "short"
    assert cli.main([*argv[:-2], "--setups", "unified,static-phase-oracle", "--rates", ""]) == 0
    assert "static-phase-oracle" not in capsys.readouterr().out.split("### ")[-1]


def test_sglang_refusing_to_start_is_reported_not_run():
    """A buffer whose default split's slots cap SGLang's running requests
    at 0: SGLang raises at boot, so the SGLang setups are unavailable
    (kvarena inside SGLang included) and only the uncapped row runs."""
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 1.0)
    trace = traces.generate("short", 20, seed=0)
    cfg = engine.Config(record=False, prefix_cache=True)
    out, _, _ = simulate.run_one(s, trace, cfg, setups=("unified", "unified-uncapped", "static-default"))
    assert "SGLang refuses to start" in out["unified"]["unavailable"]
    assert "SGLang refuses to start" in out["static-default"]["unavailable"]
    assert out["unified-uncapped"].finished == 20
