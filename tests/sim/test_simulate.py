"""The serving simulator (``kvarena simulate``): small traces, behaviour only.

Conservation of requests, no admitted request lost (with a planted evictor
that drops one, caught), the static split's walls, the report's fields
against each other, the real composites underneath, the anchor's window
rule, the traces and their JSONL form, and the command itself.
"""

import json
import math
import statistics

import pytest

from kvarena import cli, impl
from kvarena.sim import backends, engine, presets, simulate, stats, traces

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, as the commands use

CFG = engine.Config()
SMALL = 5.0  # GiB: a small buffer keeps the runs short while memory still limits


def sizes(name, gib=SMALL):
    return presets.Sizes.of(presets.preset(name), gib)


def run(backend, s, trace, cfg=CFG, setup="t"):
    return engine.run(backend, s, trace, cfg, setup)


def unified(s, policy="anchor"):
    return backends.Unified(s, policy=policy)


def static(s, **kw):
    return backends.StaticSplit(s, presets.static_split(s, **kw))


def check_report(res, trace, s):
    """The report's fields agree with each other and with the trace."""
    assert res.requests == len(trace)
    assert res.finished + res.rejected + res.stuck == res.requests  # conservation
    assert res.lost == 0 and res.stuck == 0  # every admitted request finished
    served = sum(r.prompt_len + r.output_len for r in trace)
    assert res.rejected == 0  # these traces fit every setup
    assert math.isclose(res.tokens_per_step * res.steps, served)
    assert 0 < res.mean_concurrency <= res.peak_concurrency
    assert res.mean_concurrency_all <= res.peak_concurrency
    assert 0 <= res.utilisation <= 1
    assert 0 <= res.false_oom <= res.refusals
    assert 0 < res.memory_bound_steps <= res.steps
    assert res.recomputed_tokens % s.page_tokens == 0
    assert (res.recomputed_tokens > 0) == (res.retractions > 0)
    assert res.bytes_allocated > 0
    assert math.isclose(res.moved_per_allocated, res.bytes_moved / res.bytes_allocated)
    # every memory-bound step is one admission refusal, or SGLang's mamba cap, under a named cause
    assert set(res.blocked) <= set(engine.BLOCK_CAUSES)
    capped = res.blocked.get("running cap", 0)
    assert sum(res.blocked.values()) == res.memory_bound_steps <= res.refusals + capped
    for cause in ("gate after relief", "state slot", "extend"):  # the gate is exact
        assert res.blocked.get(cause, 0) == 0, (cause, res.blocked)


@pytest.mark.parametrize("name", ["gpt-oss-120b", "qwen3-next-80b-a3b", "tri-synthetic"])
@pytest.mark.parametrize("setup", ["unified", "static"])
def test_conservation_and_report(name, setup):
    s = sizes(name)
    trace = traces.generate("shift", 160, seed=3)
    b = unified(s) if setup == "unified" else static(s)
    res = run(b, s, trace)
    check_report(res, trace, s)
    assert b.live_bytes() == 0  # everything released at the end
    b.verify()


def test_unified_makes_the_real_composite_calls():
    kinds = {"gpt-oss-120b": impl.HybridSWA, "qwen3-next-80b-a3b": impl.MambaHybrid, "tri-synthetic": impl.TriPool}
    for name, cls in kinds.items():
        s = sizes(name)
        b = unified(s)
        assert type(b.c) is cls and b.c.page_size == 1
        assert b.arena.total_bytes == s.total
        g = b.arena.geometry("full")
        assert g.epp == s.unit_full  # one unit is one page of page_tokens tokens


def test_a_planted_evictor_that_drops_requests_is_caught(monkeypatch):
    """An evictor that frees a request but never puts it back in the queue:
    conservation and the lost count must both see it."""
    s = sizes("gpt-oss-120b")
    trace = traces.generate("balanced", 300, seed=1)
    good = run(unified(s), s, trace, engine.Config(reserve_ratio=0.0))
    assert good.retractions > 0  # the bug below is reached
    check_report(good, trace, s)

    real = engine._Sim._evict

    def dropping(self, shortfall):
        freed = real(self, shortfall)
        if freed:
            self.queue.popleft()  # the retracted request, lost
        return freed

    monkeypatch.setattr(engine._Sim, "_evict", dropping)
    bad = run(unified(s), s, trace, engine.Config(reserve_ratio=0.0))
    assert bad.lost > 0
    assert bad.finished + bad.rejected + bad.stuck < bad.requests


def test_retracted_requests_come_back_and_finish():
    s = sizes("qwen3-next-80b-a3b", 2.0)
    trace = traces.generate("long", 60, seed=2)
    res = run(unified(s), s, trace, engine.Config(reserve_ratio=0.0))
    assert res.retractions > 0 and res.evictions > 0
    check_report(res, trace, s)


def test_static_split_respects_its_walls():
    s = sizes("tri-synthetic")
    split = presets.static_split(s)
    res = run(backends.StaticSplit(s, split), s, traces.generate("shift", 160, seed=4), CFG, "static")
    assert res.capacity == {"full": split.full_units, "swa": split.swa_units, "state": split.slots}
    for kind, cap in res.capacity.items():
        assert res.peak_live[kind] <= cap
    assert res.peak_live["state"] == split.slots  # the state wall is what limited it
    # The walls hold with room elsewhere: an empty SWA pool refuses past its own size.
    b = backends.StaticSplit(s, presets.Split(0.1, 0.0, 100, 10, 1))
    assert b.extend(0, 11, -1) is None and b.extend(0, 10, -1) is not None
    assert b.alloc_state() is not None and b.alloc_state() is None
    assert b.extend(0, 1, -1) is None  # SWA's wall, while full has 90 free pages:
    assert b.free_bytes() >= b.demand_bytes(1, 0) + b.slack_bytes  # bytes exist, behind the walls


def test_static_default_sizing_is_the_anchors():
    for name in ("gpt-oss-120b", "gemma-3-27b"):
        s = sizes(name, 40)
        sp = presets.static_split(s)
        assert sp.swa_units == int(0.8 * sp.full_units)
        used = sp.full_units * s.unit_full + sp.swa_units * s.unit_swa
        assert s.total - (s.unit_full + s.unit_swa) < used <= s.total
    s = sizes("nemotron-h-8b", 40)
    sp = presets.static_split(s)
    assert sp.slots == int(s.total * 0.9 / 1.9) // s.slot
    assert sp.full_units == (s.total - sp.slots * s.slot) // s.unit_full
    with pytest.raises(ValueError, match="swa_ratio"):
        presets.static_split(sizes("gpt-oss-120b"), swa_ratio=0)


def test_false_oom_counts_bytes_behind_walls_not_in_one_buffer():
    s = sizes("gpt-oss-120b")
    trace = traces.generate("long", 120, seed=5)
    st = run(static(s), s, trace)
    un = run(unified(s), s, trace)
    assert st.false_oom > 0  # the default split's SWA pool sits idle while full refuses
    assert un.false_oom == 0  # two ENDs: the ladder's flush recovers every free byte
    assert un.mean_concurrency > 1.3 * st.mean_concurrency


def test_unified_admits_more_than_the_default_split_on_a_skewed_trace():
    s = sizes("qwen3-next-80b-a3b")
    trace = traces.generate("short", 600, seed=6)
    un, st = run(unified(s), s, trace), run(static(s), s, trace)
    assert un.mean_concurrency > 1.3 * st.mean_concurrency
    assert un.peak_concurrency > st.peak_concurrency


def test_admission_gate_is_the_composites_exact_fit():
    """A state slot costs what extending the state END takes from the joint
    view, to the page; a free slot (a lazy hole) costs nothing."""
    s = sizes("qwen3-next-80b-a3b")
    b = unified(s)
    room = b.available()
    assert b.admits(room, 0, 0) and not b.admits(room + 1, 0, 0)
    assert b.admits(room - 1, 0, 1) and not b.admits(room, 0, 1)  # empty: every free byte is in the view
    with_slot = max(u for u in range(room + 1) if b.c.fits(u, 1))
    assert b.admits(with_slot, 1, 0) and not b.admits(with_slot + 1, 1, 0)
    assert room - with_slot <= b.c.state_slot_token_cost()  # never more than the conversion
    slot = b.alloc_state()
    b.release([], [slot])  # a lazy hole now: reusing it takes nothing from the view
    assert b.arena.counts("state").holes == 1
    assert b.admits(b.available(), 1, 0)


def test_the_unified_gate_prices_the_reserve_in_free_bytes():
    """The chunk and its slot must be served now; the reserve only needs the
    free bytes, which the ladder of the decodes that take it places then.
    A freed state slot is a hole no token can use before a flush: its bytes
    back the reserve, not the chunk."""
    s = sizes("qwen3-next-80b-a3b")
    b = unified(s)
    slots = [b.alloc_state() for _ in range(4)]
    b.release([], [slots[1]])
    room = b.available()
    behind = (b.free_bytes() - room * b.unit_bytes) // b.unit_bytes  # the hole's units, outside the view
    assert behind == b.c.state_slot_token_cost() > 0
    assert b.admits(room, 0, behind) and not b.admits(room, 0, behind + 1)
    assert not b.c.fits(room + 1, 0)  # a reserve placed now would not fit
    assert not b.admits(room + 1, 0, 0)  # the chunk itself is exact
    # Behind walls a reserve is a demand on the pools as they stand.
    st = static(s)
    free = st.available()
    assert st.admits(free - 1, 0, 1) and not st.admits(free, 0, 1)
    assert not st.relieve(free, 0, reserve=1) and st.relieve(free, 0)


def test_admission_moves_nothing_for_the_reserve():
    """Admission relieves for the chunk and its slot, never for the reserve:
    on tri-synthetic, whose state slots cross the SWA float, that keeps
    relocation under 0.1 of the bytes allocated with both policies (0.17 and
    0.15 when the ladder also made room for the reserve), no retraction,
    and no false OOM for the planner."""
    s = sizes("tri-synthetic", 10.0)
    trace = traces.generate("balanced", 300, seed=1)
    for policy in ("anchor", "planner"):
        res = run(unified(s, policy), s, trace)
        check_report(res, trace, s)
        assert res.bytes_moved > 0
        assert res.moved_per_allocated < 0.1, policy
        assert res.retractions == 0
    assert res.false_oom == 0


def test_a_gate_that_overprices_state_slots_is_counted_not_hidden(monkeypatch):
    """The old price gate charged a whole slot even when the state END had a
    free one, so after a successful relief it still said no: the step was
    memory-bound with no refusal.  Planted back, the cause is counted."""
    s = sizes("tri-synthetic")
    trace = traces.generate("balanced", 300, seed=1)

    def overpriced(self, units, slots, reserve):
        return units + reserve + slots * self.c.state_slot_token_cost() <= self.available()

    good = run(unified(s, "planner"), s, trace)
    check_report(good, trace, s)
    monkeypatch.setattr(backends.Unified, "admits", overpriced)
    bad = run(unified(s, "planner"), s, trace)
    assert bad.blocked.get("gate after relief", 0) > 0
    assert sum(bad.blocked.values()) == bad.memory_bound_steps


def test_window_rule_is_the_anchors():
    for name in ("gpt-oss-120b", "gemma-3-27b"):
        s = sizes(name)
        w = s.preset.window
        for units in range(200):
            ours = max(0, units - s.window_units)
            assert ours == impl.swa_window_end(units * s.page_tokens, w, s.page_tokens) // s.page_tokens


def test_swa_held_per_request_is_a_window_not_the_prompt():
    s = sizes("gemma-3-27b", 10)
    trace = [traces.Request(0, 0.0, 20_000, 64)]
    res = run(unified(s), s, trace)
    assert res.finished == 1 and res.lost == 0
    chunk = s.units(CFG.chunk_tokens)
    assert res.peak_live["swa"] <= s.window_units + chunk < res.peak_live["full"]


def test_best_static_is_at_least_every_grid_point_it_tried():
    s = sizes("nemotron-h-8b")
    trace = traces.generate("balanced", 120, seed=7)
    best, split, runs = simulate.best_static(s, trace, engine.Config(record=False))
    assert runs >= len(simulate.STATE_GRID)
    for share in (0.2, 0.5, 0.8):  # grid points
        other, _ = simulate._static(s, trace, engine.Config(record=False), 0.8, share, "x")
        assert best.output_tokens_per_s >= other.output_tokens_per_s
    assert best.capacity["state"] == split.slots


def test_neighbours_reach_toward_an_open_bound():
    rng = simulate.STATE_RANGE  # (0, 1), both open
    assert simulate._neighbours([0.1, 0.5, 0.9], 0.5, rng) == pytest.approx([0.3, 0.7])
    assert simulate._neighbours([0.1, 0.5, 0.9], 0.9, rng) == pytest.approx([0.7, 0.95])  # past the grid: toward 1
    assert simulate._neighbours([0.1, 0.5, 0.9], 0.1, rng) == pytest.approx([0.05, 0.3])  # toward 0
    swa = simulate.SWA_RANGE  # (0, 1]: 1 is a split, nothing past it
    assert simulate._neighbours([0.5, 1.0], 1.0, swa) == pytest.approx([0.75])


def test_best_static_searches_past_the_grid_and_says_when_it_stops_on_an_edge(monkeypatch):
    """Nemotron-H on short requests wants nearly all of the buffer for state:
    the search goes past the grid's 95% toward 100%, and with the
    refinement cut off it reports the optimum on the edge it stopped at."""
    s = sizes("nemotron-h-8b", 2.0)
    trace = traces.generate("short", 300, seed=0)
    cfg = engine.Config(record=False)
    best, _, _ = simulate.best_static(s, trace, cfg)
    assert best.split["state_share"] > max(simulate.STATE_GRID)
    assert best.split["edge"] == []  # bracketed: a share further out was tried and was worse
    monkeypatch.setattr(simulate, "REFINE_ROUNDS", 0)
    cut, _, _ = simulate.best_static(s, trace, cfg)
    assert cut.split["state_share"] == max(simulate.STATE_GRID)
    assert cut.split["edge"] == ["state"]
    assert "(edge: state)" in simulate._split_label(cut.split)


def test_planner_setup_runs_or_says_it_is_missing():
    s = sizes("tri-synthetic")
    trace = traces.generate("balanced", 100, seed=8)
    out, _, _ = simulate.run_one(s, trace, engine.Config(record=False), ("planner",))
    res = out["planner"]
    if isinstance(res, dict):
        assert "planner" in res["unavailable"]
        with pytest.raises(ValueError, match="policy"):
            impl.TriPool(4096, 8, 8, 64, policy="planner")
    else:
        check_report(res, trace, s)
        assert res.false_oom == 0


# ------------------------------------------------------------------ traces


def test_traces_follow_their_documented_mixes():
    n = 2000
    for kind in ("balanced", "long", "short"):
        tr = traces.generate(kind, n, seed=0)
        mix = traces.MIXES[kind]
        assert tr == traces.generate(kind, n, seed=0)  # seeded
        med = statistics.median(r.prompt_len for r in tr)
        assert 0.8 * mix.prompt_median <= med <= 1.25 * mix.prompt_median
        assert all(mix.prompt_range[0] <= r.prompt_len <= mix.prompt_range[1] for r in tr)
        assert all(r.arrival == 0.0 for r in tr)  # saturating: all queued at once
        for arrivals in ("poisson", "bursty"):
            at = traces.generate(kind, n, seed=0, arrivals=arrivals, rate=50.0)
            assert [(r.prompt_len, r.output_len) for r in at] == [(r.prompt_len, r.output_len) for r in tr]
            assert [r.arrival for r in at] == sorted(r.arrival for r in at)
            assert 0.8 * 50 <= n / at[-1].arrival <= 1.25 * 50
    shift = traces.generate("shift", n, seed=0)
    first, second = shift[: n // 2], shift[n // 2 :]
    assert statistics.median(r.prompt_len for r in second) > 20 * statistics.median(r.prompt_len for r in first)
    with pytest.raises(ValueError, match="unknown trace"):
        traces.generate("nope", 5)
    with pytest.raises(ValueError, match="rate must be"):
        traces.generate("short", 5, arrivals="poisson")
    with pytest.raises(ValueError, match="unknown arrivals"):
        traces.generate("short", 5, arrivals="nope", rate=1.0)


def test_bursty_gaps_are_burstier_than_poisson():
    """Same mean gap; the squared coefficient of variation near 1 (Poisson)
    and near ``BURST_CV2`` (bursty)."""
    for arrivals, cv2 in (("poisson", 1.0), ("bursty", traces.BURST_CV2)):
        t = traces.arrival_times(20_000, arrivals, 10.0, seed=1)
        gaps = [b - a for a, b in zip([0.0, *t], t)]
        m = statistics.fmean(gaps)
        assert 0.09 <= m <= 0.11
        assert 0.85 * cv2 <= statistics.pvariance(gaps) / m**2 <= 1.15 * cv2


def test_jsonl_round_trip_and_bad_lines(tmp_path):
    tr = traces.generate("balanced", 30, seed=9)
    p = tmp_path / "t.jsonl"
    traces.write_jsonl(tr, p)
    back = traces.read_jsonl(p)
    assert [(r.arrival, r.prompt_len, r.output_len) for r in back] == [
        (r.arrival, r.prompt_len, r.output_len) for r in tr
    ]
    bad = tmp_path / "bad.jsonl"
    for line, msg in (
        ("{nope", "line 2: not JSON"),
        ('{"arrival": 1, "prompt_len": 5}', "line 2: needs"),
        ('{"arrival": -1, "prompt_len": 5, "output_len": 1}', "line 2: arrival"),
        ('{"arrival": 1, "prompt_len": 0, "output_len": 1}', "line 2: prompt_len"),
        ('{"arrival": 1, "prompt_len": 5, "output_len": true}', "line 2: output_len"),
    ):
        bad.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 1}\n' + line + "\n")
        with pytest.raises(ValueError, match=msg):
            traces.read_jsonl(bad)


def test_presets_are_exact_at_the_default_scale():
    for p in presets.PRESETS.values():
        s = presets.Sizes.of(p)
        assert s.unit_full * s.byte_scale == p.full_bytes * s.page_tokens
        assert s.unit_swa * s.byte_scale == p.swa_bytes * s.page_tokens
        assert s.slot * s.byte_scale == p.state_bytes
    assert presets.PRESETS["tri-synthetic"].synthetic and "SYNTHETIC" in presets.PRESETS["tri-synthetic"].note
    with pytest.raises(ValueError, match="not a multiple of byte_scale"):
        presets.Sizes.of(presets.preset("gpt-oss-120b"), byte_scale=1 << 20)
    with pytest.raises(ValueError, match="unknown preset"):
        presets.preset("llama")


# --------------------------------------------------------------------- CLI


def test_simulate_command_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "bands.png"
    rc = cli.main(
        [
            "simulate",
            "--preset",
            "tri-synthetic",
            "--trace",
            "shift",
            "--requests",
            "120",
            "--budget-gib",
            str(SMALL),
            "--setups",
            "unified,static-default",
            "--seeds",
            "2",
            "--jobs",
            "2",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "| unified | one buffer |" in text and "unified / static-default" in text
    assert "tri-synthetic / shift / saturating, cache (120 requests, 2 seeds: [0, 1])" in text
    data = json.loads(out.read_text())
    assert data["seeds"] == [0, 1] and [r["seed"] for r in data["runs"]] == [0, 1]
    per_seed = {m: [] for m, _ in simulate.METRICS}
    for run_ in data["runs"]:
        assert run_["preset"] == "tri-synthetic" and run_["requests"] == 120
        assert run_["budget"]["source"] == "--budget-gib" and run_["budget"]["gib"] == SMALL
        u, d = run_["setups"]["unified"], run_["setups"]["static-default"]
        for m, _ in simulate.METRICS:
            assert math.isclose(run_["ratios"][m]["unified / static-default"], u[m] / d[m])
            per_seed[m].append(run_["ratios"][m]["unified / static-default"])
        assert "series" not in u
    agg = simulate.aggregate(data["runs"])
    for m, _label in simulate.METRICS:
        assert per_seed[m][0] != per_seed[m][1]  # two traces, not one run twice
        mean, half = agg["ratios"][m]["unified / static-default"]
        assert math.isclose(mean, statistics.fmean(per_seed[m])) and half > 0
        assert f"unified / static-default: {stats.fmt_ratio(mean, half)}" in text
    mean, half = agg["ratios"]["output_tokens_per_s"]["unified / static-default"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000
    # in one process, the same numbers: the runs do not depend on where they ran
    out1 = tmp_path / "r1.json"
    args = ["simulate", "--preset", "tri-synthetic", "--trace", "shift", "--requests", "120"]
    args += ["--budget-gib", str(SMALL), "--setups", "unified,static-default"]
    args += ["--seeds", "2", "--jobs", "1"]
    assert cli.main([*args, "--json", str(out1)]) == 0
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(out1.read_text())["runs"]]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in data["runs"]]
    # a cluster's jobs, one seed each, merged: the same report
    capsys.readouterr()
    parts = []
    for seed in (0, 1):
        parts.append(tmp_path / f"part{seed}.json")
        argv = [*args[:-4], "--seed", str(seed), "--seeds", "1", "--jobs", "1", "--json", str(parts[-1])]
        assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(["simulate", "--merge", *map(str, parts)]) == 0
    assert f"unified / static-default: {stats.fmt_ratio(mean, half)}" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["simulate", "--merge", str(tmp_path / "bad.json")]) == 2
    assert "not a --json file" in capsys.readouterr().err


def test_simulate_command_reads_a_trace_file(tmp_path, capsys):
    p = tmp_path / "t.jsonl"
    traces.write_jsonl(traces.generate("short", 50, seed=1), p)
    rc = cli.main(
        [
            "simulate",
            "--preset",
            "nemotron-h-8b",
            "--trace-file",
            str(p),
            "--budget-gib",
            "2",
            "--setups",
            "static-default",
            "--seeds",
            "3",  # a fixed trace is one run, whatever --seeds says
        ]
    )
    assert rc == 0
    assert "/ trace file, cache (50 requests, 1 seed: [0])" in capsys.readouterr().out  # its own arrivals
    assert cli.main(["simulate", "--setups", "nope"]) == 2
    assert "unknown setup 'nope'" in capsys.readouterr().err


def test_simulate_command_summarises_many_runs(capsys):
    rc = cli.main(
        [
            "simulate",
            "--preset",
            "gpt-oss-120b,nemotron-h-8b",
            "--trace",
            "short",
            "--requests",
            "80",
            "--budget-gib",
            "1",
            "--setups",
            "unified,static-default",
            "--seeds",
            "1",
            "--jobs",
            "1",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    summary = text[text.index("### summary") :]
    assert "| gpt-oss-120b | short |" in summary and "| nemotron-h-8b | short |" in summary


def test_every_summary_leads_with_throughput_and_goodput_not_concurrency(capsys):
    """Issue 41: a report's first ratio line and the summary's first ratio
    columns are output tokens a second and goodput; admitted concurrency
    comes after, as the explanation."""
    argv = ["simulate", "--preset", "gpt-oss-120b,tri-synthetic", "--trace", "shift", "--requests", "80"]
    argv += ["--budget-gib", "1", "--setups", "unified,static-default", "--seeds", "2", "--jobs", "1"]
    argv += ["--prefix-cache", "off"]  # with it, SGLang's cap on 1 GiB of tri-synthetic is 0: it would not start
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    report = text[text.index("### tri-synthetic / shift") :]
    ratio_lines = [line for line in report.splitlines() if "(95% interval over seeds)" in line]
    assert [line.split(" (95%")[0] for line in ratio_lines] == [label for _, label in simulate.METRICS]
    assert simulate.METRICS[0][0] == "output_tokens_per_s" and simulate.METRICS[1][0] == "goodput"
    header = text[text.index("### summary") :].splitlines()[2]
    cells = [c.strip() for c in header.strip("|").split("|")]
    ratio_cells = [c for c in cells if " / " in c]
    assert ratio_cells[0].startswith("out tok/s:") and ratio_cells[1].startswith("goodput:")
    assert all(not c.startswith("concurrency") for c in ratio_cells[:-1])  # concurrency last, if at all
    table_header = report.splitlines()[
        next(i for i, line in enumerate(report.splitlines()) if line.startswith("| setup"))
    ]
    assert table_header.split("|")[3].strip() == "out tok/s" and table_header.split("|")[4].strip() == "goodput req/s"


def test_simulate_command_sweeps_rates(tmp_path, capsys):
    """A sweep: the saturating run, then one run per rate with the split its
    search found; a row per load, and the curves' PNG."""
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    argv = ["simulate", "--preset", "gpt-oss-120b", "--trace", "short", "--requests", "150", "--budget-gib", "1"]
    argv += ["--setups", "unified,static-best", "--seeds", "1", "--jobs", "1", "--rates", "2,400"]
    argv += ["--arrivals", "bursty", "--json", str(out), "--plot", str(png)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    for load in ("saturating, cache", "bursty 2/s, cache", "bursty 400/s, cache"):
        assert f"| gpt-oss-120b | short | {load} | 1 |" in text
    runs = json.loads(out.read_text())["runs"]
    assert [(r["arrivals"], r["rate"]) for r in runs] == [("saturating", None), ("bursty", 2.0), ("bursty", 400.0)]
    split = runs[0]["setups"]["static-best"]["split"]["swa_ratio"]
    assert all(r["setups"]["static-best"]["split"]["swa_ratio"] == split for r in runs[1:])
    slow, fast = runs[1]["setups"]["unified"], runs[2]["setups"]["unified"]
    assert slow["memory_bound_steps"] < fast["memory_bound_steps"]  # under load, memory rarely binds
    assert slow["ttft_p99"] < fast["ttft_p99"]  # queueing
    assert (tmp_path / "p-curves.png").read_bytes()[:4] == b"\x89PNG"
    # the curves redrawn from the saved runs are the same picture, byte for byte
    assert cli.main(["simulate", "--merge", str(out), "--plot", str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again-curves.png").read_bytes() == (tmp_path / "p-curves.png").read_bytes()
    saturating = tmp_path / "saturating.json"
    saturating.write_text(json.dumps({**json.loads(out.read_text()), "runs": runs[:1]}))
    assert cli.main(["simulate", "--merge", str(saturating), "--plot", str(tmp_path / "none.png")]) == 2
    assert "no run at a rate" in capsys.readouterr().err
    assert cli.main([*argv[:1], "--rates", "0"]) == 2
    assert "--rates takes numbers > 0" in capsys.readouterr().err


def test_a_backend_that_says_yes_and_refuses_fails_instead_of_spinning(monkeypatch):
    """Relief that retracts nothing and a decode still refused: the run
    stops with the setup named (it once spun forever on such a backend)."""
    s = sizes("gpt-oss-120b", 1.0)
    b = static(s)
    monkeypatch.setattr(b, "relieve", lambda units, slots, evict=None: True)
    real = b.decode
    monkeypatch.setattr(b, "decode", lambda seqs, lasts: None if len(seqs) > 3 else real(seqs, lasts))
    with pytest.raises(RuntimeError, match="spin-test: relief retracted nothing"):
        run(b, s, traces.generate("short", 40, seed=1), engine.Config(record=False), "spin-test")


def test_enable_mixed_chunk_reaches_the_sglang_setups(tmp_path, capsys):
    """``--enable-mixed-chunk``: the SGLang setups mix prefill into decode
    (the limits line says so, the runs record it, and their times change);
    vLLM's padded pool mixes either way and keeps its times."""
    base = ["simulate", "--preset", "tri-synthetic", "--trace", "balanced", "--requests", "150"]
    base += ["--setups", "unified,vllm-padded", "--seeds", "1", "--jobs", "1"]
    runs = {}
    for flag in ([], ["--enable-mixed-chunk"]):
        out = tmp_path / f"r{len(flag)}.json"
        assert cli.main([*base, *flag, "--json", str(out)]) == 0
        runs[bool(flag)] = json.loads(out.read_text())["runs"][0]["setups"]
        text = capsys.readouterr().out
        want = "prefill mixed into decode" if flag else "prefill in passes of its own"
        assert f"CUDA graphs to batch 256, {want}" in text
    assert runs[False]["unified"]["mixed_chunk"] is False and runs[True]["unified"]["mixed_chunk"] is True
    assert runs[False]["vllm-padded"]["mixed_chunk"] is True is runs[True]["vllm-padded"]["mixed_chunk"]
    assert runs[False]["unified"]["seconds"] != runs[True]["unified"]["seconds"]
    assert runs[False]["vllm-padded"]["seconds"] == runs[True]["vllm-padded"]["seconds"]
