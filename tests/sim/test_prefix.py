"""The simulator's prefix cache (``kvarena.sim.prefix``), its traces, and
the engine with it on: matching by the hybrid rules, locking, LRU eviction
and tombstones, no leak on any setup, later turns after their earlier ones,
SGLang's one-third running cap on the static mamba splits, and the
published-statistics traces against their sources' figures."""

import json
import statistics

import pytest

from kvarena.sim import backends, engine, engines, padded, prefix, presets, traces

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ the tree


def _insert(c, blocks, n_ids, start=0, swa_from=0, slot=None, path=()):
    ids = list(range(start, start + n_ids))
    return ids, c.insert(list(path), blocks, ids, swa_from, slot)


def test_match_takes_the_deepest_node_it_can_resume_from():
    c = prefix.PrefixCache(block_units=2, window_units=0, has_swa=False, has_state=False)
    _ids, (release, window, slots) = _insert(c, ("a", "b", "c"), 7)
    assert release == [6] and window == [] and slots == []  # the partial tail is not cached
    assert [n.key for n in c.match(("a", "b", "x"), 100)] == ["a", "b"]
    assert [n.key for n in c.match(("a", "b", "c"), 5)] == ["a", "b"]  # leaves a token to compute
    assert c.match(("z",), 100) == []
    c.check()


def test_state_needs_a_checkpoint_and_swa_its_window():
    st = prefix.PrefixCache(2, 0, has_swa=False, has_state=True)
    _insert(st, ("a", "b"), 4, slot=9)
    assert [n.key for n in st.match(("a", "b", "c"), 100)] == ["a", "b"]  # the checkpoint is at b
    assert st.match(("a", "x"), 100) == []  # a has no checkpoint: nothing to resume from
    sw = prefix.PrefixCache(2, window_units=3, has_swa=True, has_state=False)
    # SWA held from unit 3 on: block [2, 4) only half, so it keeps none and frees unit 3's
    _, (release, window, _) = _insert(sw, ("a", "b", "c"), 6, swa_from=3)
    assert window == [3] and release == []
    assert sw.match(("a", "b", "c", "d"), 100) == []  # c's window reaches into b, which has no SWA
    _insert(sw, ("p", "q", "r"), 6, start=100, swa_from=2)
    assert [n.key for n in sw.match(("p", "q", "r", "s"), 100)] == ["p", "q", "r"]
    assert sw.match(("p", "q", "x"), 100) == []  # q's window reaches into p, which holds no SWA
    sw.check()


def test_locked_nodes_stay_and_eviction_goes_least_recent_first():
    c = prefix.PrefixCache(1, 0, has_swa=False, has_state=True)
    _insert(c, ("a",), 1, start=0, slot=1)
    _insert(c, ("b",), 1, start=1, slot=2)
    path = c.match(("a", "z"), 100)
    c.lock(path)
    assert c.evict_one() == ([1], [], [2])  # b: a is locked
    assert c.evict_one() is None
    c.unlock(path)
    assert c.evict_one() == ([0], [], [1])
    assert c.evict_one() is None and c.nodes == c.units == c.slots == 0
    c.check()


def test_an_inner_node_is_tombstoned_and_a_duplicate_is_freed():
    c = prefix.PrefixCache(1, 1, has_swa=True, has_state=True)
    _insert(c, ("a",), 1, start=0, slot=1)
    path = c.match(("a", "b"), 100)
    c.lock(path)
    _ids, (release, _, slots) = _insert(c, ("a", "b"), 2, start=0, slot=2, path=path)  # a turn that continues a
    assert release == [] and slots == []
    both = c.match(("a", "b", "c"), 100)
    c.lock(both)
    c.unlock(both)  # a and b last used together; a is older in the queue
    assert c.evict_one() == ([], [0], [1])  # a: its checkpoint and SWA go, its KV stays (b needs it)
    assert c.match(("a", "z"), 100) == []  # a cannot be resumed from now
    _, (release, _, slots) = _insert(c, ("a", "b"), 2, start=50, slot=3)  # the same blocks again
    assert release == [50, 51] and slots == [3]  # the older copies stay
    c.check()


# ----------------------------------------------------------------- the traces


def test_published_traces_follow_their_sources():
    n = 4000
    share = traces.generate("sharegpt", n, seed=0)
    assert share == traces.generate("sharegpt", n, seed=0)  # seeded
    # Means of the published summary within 10% (the clipping moves them a little).
    assert abs(statistics.fmean(r.prompt_len for r in share) / 161.31 - 1) < 0.1
    assert abs(statistics.fmean(r.output_len for r in share) / 337.99 - 1) < 0.1
    chat = traces.generate("lmsys", n, seed=0)
    firsts = [r for r in chat if r.after < 0]
    assert abs(len(chat) / len(firsts) / 2.0 - 1) < 0.1  # 2.0 turns a conversation
    assert abs(statistics.fmean(r.prompt_len for r in firsts) / 69.5 - 1) < 0.1
    assert abs(statistics.fmean(r.output_len for r in chat) / 214.5 - 1) < 0.1
    for r in chat:  # a later turn carries the conversation so far: its blocks extend the last turn's
        if r.after >= 0:
            prev = chat[r.after]
            assert r.prompt_len > prev.prompt_len + prev.output_len - 1
            assert r.blocks[: len(prev.blocks)] == prev.blocks
    moon = traces.generate("mooncake", n, seed=0)
    assert 0.9 * 6909 <= statistics.median(r.prompt_len for r in moon) <= 1.1 * 6909
    assert 0.9 * 350 <= statistics.median(r.output_len for r in moon) <= 1.1 * 350
    assert all(p.source for p in traces.PUBLISHED.values())


def test_mooncake_lines_and_prefix_fields_read_back(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(
        '{"timestamp": 2000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]}\n'
        '{"timestamp": 500, "input_length": 600, "output_length": 3, "hash_ids": [7, 4]}\n'
    )
    a, b = traces.read_jsonl(p)
    assert (a.arrival, a.prompt_len, a.blocks, a.block_tokens) == (0.5, 600, (7,), 512)  # whole blocks only
    assert (b.arrival, b.blocks) == (2.0, (7, 8))
    chat = traces.generate("lmsys", 40, seed=3)
    q = tmp_path / "c.jsonl"
    traces.write_jsonl(chat, q)
    assert traces.read_jsonl(q) == chat
    for line, msg in (
        ('{"arrival": 1, "prompt_len": 5, "output_len": 1, "after": 1}', "follows request 1"),
        ('{"arrival": 1, "prompt_len": 5, "output_len": 1, "blocks": [1]}', "block_tokens"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": 3}', "hash_ids"),
    ):
        p.write_text('{"arrival": 0, "prompt_len": 5, "output_len": 1}\n' + line + "\n")
        with pytest.raises(ValueError, match=msg):
            traces.read_jsonl(p)


# ----------------------------------------------------------------- the engine

SETUPS = {
    "unified": lambda s, cache: backends.Unified(s),
    "static": lambda s, cache: backends.StaticSplit(s, presets.static_split(s)),
    "padded": lambda s, cache: padded.PaddedPool(s),
    "capped": lambda s, cache: backends.StaticSplit(
        s, presets.static_split(s), engines.SGLANG.running_cap(s.preset, presets.static_split(s).slots, cache)
    ),
}


def _engine_sim(name, setup, trace, strategy="extra_buffer", gib=1.0):
    """``setup`` under its engine's own rules (SGLang's for the arena and the
    split, vLLM's for the padded pool), the cache on."""
    eng = engines.VLLM if setup == "padded" else engines.SGLANG
    s = presets.Sizes.of(eng.preset(presets.preset(name)), gib)
    b = padded.PaddedPool(s, True) if setup == "padded" else SETUPS[setup](s, True)
    cfg = engine.Config(record=False, prefix_cache=True, mamba_strategy=strategy)
    sim = engine._Sim(b, s, trace, cfg, setup, eng)
    return sim, sim.run(), b


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "tri-synthetic"])
@pytest.mark.parametrize("setup", ["unified", "static", "padded"])
def test_each_engines_checkpoints_serve_later_turns_and_leak_nothing(name, setup):
    trace = traces.generate("lmsys", 200, seed=1, arrivals="poisson", rate=2.0)
    sim, res, b = _engine_sim(name, setup, trace)
    assert sim.ckpt is not None and sim.track_slots == (1 if setup == "padded" else 2)
    assert res.finished == res.requests and res.lost == res.stuck == 0
    if sim.ckpt.prefill_grid > 2000:  # tri-synthetic in vLLM's 2,080-token blocks: no chat here reaches one
        assert res.cache_hit_tokens == 0
    else:
        assert res.cache_hit_tokens > 0
    b.verify()
    sim.cache.check()
    grid = sim.ckpt.prefill_grid // 16
    stack = list(sim.cache.root.children.values())
    while stack:  # every checkpoint sits on the engine's grid
        n = stack.pop()
        assert n.slot is None or n.depth % grid == 0, (n.depth, grid)
        stack += n.children.values()
    while sim._evict_cache():
        pass
    assert sim.cache.nodes == sim.cache.units == sim.cache.slots == 0
    assert b.live_bytes() == 0


def _turns(*specs, bt=16):
    """Requests one after another (each ``after`` the one before): ``(prompt
    blocks, prompt tokens, output tokens)``; a prompt's blocks are its keys."""
    out = []
    for i, (blocks, prompt, output) in enumerate(specs):
        out.append(traces.Request(i, 0.0, prompt, output, tuple(blocks), bt, after=i - 1))
    return out


def test_extra_buffer_keeps_the_last_tracked_state_and_frees_the_kv_past_it():
    """SGLang's extra_buffer (engines.Checkpoints; schedule_batch.py,
    unified_radix_cache.py checkpoint_into_tree): on Nemotron-H (chunk 256,
    track interval 256) a request of 512 prompt and 300 output tokens
    tracks its state at 768 tokens, and the tree keeps 768 tokens of KV and
    that state; no_buffer keeps the whole 816 (51 pages) and the state
    there.  While it runs it holds three slots, then one."""
    (r,) = _turns((range(32), 512, 300))
    sim, res, b = _engine_sim("nemotron-h-8b", "static", [r])
    assert res.finished == 1 and sim.cache.units == 768 // 16 and sim.cache.slots == 1
    assert len(b.pools["state"].free) == b.pools["state"].pages - 1
    assert res.peak_live["state"] == 3  # its own slot and two tracking slots
    sim, res, b = _engine_sim("nemotron-h-8b", "static", [r], strategy="no_buffer")
    assert sim.ckpt is None and sim.cache.units == 51 and sim.cache.slots == 1
    assert res.peak_live["state"] == 1


def test_a_branch_point_checkpoint_lets_the_third_request_resume():
    """Three requests share a 512-token beginning and then part.  The first
    leaves its state at 768 tokens (its decode's last tracked state), so
    the second finds the shared KV but no state there; under extra_buffer
    its prefill snapshots at the branch point (schedule_batch.py,
    mamba_branching_seqlen), which, its decode crossing no 256-token
    boundary, it leaves in the tree, and the third resumes from it: 512
    cached tokens.  Under no_buffer (states only where requests end) the
    third recomputes it all."""
    shared = list(range(32))
    trace = _turns(
        (shared + [100, 101], 544, 300),
        (shared + list(range(200, 208)), 640, 64),  # without the branch point it would snapshot at 640
        (shared + [300, 301], 544, 64),
    )
    for setup in ("unified", "static"):
        _, res, _ = _engine_sim("qwen3-next-80b-a3b", setup, trace)
        assert res.cache_hit_tokens == 512, setup
        _, res, _ = _engine_sim("qwen3-next-80b-a3b", setup, trace, strategy="no_buffer")
        assert res.cache_hit_tokens == 0, setup


def _sim(name, setup, trace, cache=True, gib=1.0):
    s = presets.Sizes.of(presets.preset(name), gib)
    b = SETUPS[setup](s, cache)
    sim = engine._Sim(b, s, trace, engine.Config(record=False, prefix_cache=cache), setup)
    return sim, sim.run(), b


@pytest.mark.parametrize("name", ["gpt-oss-120b", "qwen3-next-80b-a3b", "tri-synthetic"])
@pytest.mark.parametrize("setup", ["unified", "static", "padded"])
def test_cache_serves_later_turns_and_leaks_nothing(name, setup):
    trace = traces.generate("lmsys", 240, seed=1, arrivals="poisson", rate=2.0)
    sim, res, b = _sim(name, setup, trace)
    assert res.finished + res.rejected + res.stuck == res.requests == len(trace)
    assert res.lost == res.stuck == res.rejected == 0
    assert res.cache_hit_tokens > 0 and 0 < res.cache_hit_rate < 1
    assert sum(res.blocked.values()) == res.memory_bound_steps
    b.verify()
    sim.cache.check()
    done = {r.rid: r for r in sim.done_reqs}
    for r in trace:  # a later turn arrives once its earlier one finished
        if r.after >= 0:
            assert done[r.rid].arrival >= done[r.after].last_token
    while sim._evict_cache():  # with the cache emptied, nothing is left live: no leak
        pass
    assert sim.cache.nodes == sim.cache.units == sim.cache.slots == 0
    assert b.live_bytes() == 0


def test_cache_off_hits_nothing_and_a_cache_that_never_matches_is_seen(monkeypatch):
    trace = traces.generate("lmsys", 160, seed=2, arrivals="poisson", rate=2.0)
    _, off, _ = _sim("gpt-oss-120b", "unified", trace, cache=False)
    _, on, _ = _sim("gpt-oss-120b", "unified", trace)
    assert off.cache_hit_tokens == 0 and on.cache_hit_tokens > 0
    assert on.ttft_p50 <= off.ttft_p50  # a hit computes less prefill
    monkeypatch.setattr(prefix.PrefixCache, "match", lambda self, blocks, max_units: [])
    _, never, _ = _sim("gpt-oss-120b", "unified", trace)
    assert never.cache_hit_tokens == 0


def test_sglangs_mamba_cap_holds_running_requests_at_a_fifth_of_the_slots_with_the_cache():
    """SGLang 0.5.23 caps running requests at its mamba slots over a
    request's share (``resolve_max_num_reqs``): 3 plus two tracking slots
    with the radix cache (extra_buffer), 1 without.  A split without the cap
    runs what its slots hold; with it, never more than the cap."""
    trace = traces.generate("lmsys", 200, seed=4)
    s = presets.Sizes.of(presets.preset("qwen3-next-80b-a3b"), 1.0)
    split = presets.static_split(s)
    cap = split.slots // (engines.MAMBA_RUNNING_RATIO + 2)
    assert cap >= 1 and engines.SGLANG.running_cap(s.preset, split.slots, True) == cap
    _, free, fb = _sim("qwen3-next-80b-a3b", "static", trace)
    assert fb.max_running is None and free.blocked.get("running cap", 0) == 0
    assert free.peak_concurrency > cap
    _, on, b = _sim("qwen3-next-80b-a3b", "capped", trace)
    assert b.max_running == cap and on.peak_concurrency <= cap
    assert on.blocked.get("running cap", 0) > 0
    # without the radix cache a request's share is one slot: the cap is the slots themselves
    assert engines.SGLANG.running_cap(s.preset, split.slots, False) == split.slots
    # no cap where the model keeps no state, nor under vLLM
    assert engines.SGLANG.running_cap(presets.preset("gpt-oss-120b"), 100, True) is None
    assert engines.VLLM.running_cap(s.preset, split.slots, True) is None


def test_a_dropped_turn_drops_the_turns_after_it():
    big = 10**6  # larger than any buffer here: rejected on arrival
    trace = [
        traces.Request(0, 0.0, big, 16),
        traces.Request(1, 0.0, big + 100, 16, after=0),
        traces.Request(2, 0.0, 64, 16),
    ]
    _, res, _ = _sim("gpt-oss-120b", "unified", trace)
    assert (res.finished, res.rejected, res.stuck) == (1, 2, 0)


def test_blocks_must_be_whole_pages():
    trace = [traces.Request(0, 0.0, 64, 16, blocks=(1, 2), block_tokens=24)]
    with pytest.raises(ValueError, match="not whole pages"):
        _sim("gpt-oss-120b", "unified", trace)


def test_simulate_reports_cache_on_and_off(tmp_path, capsys):
    from kvarena import cli

    out = tmp_path / "r.json"
    rc = cli.main(
        [
            "simulate",
            "--preset",
            "gpt-oss-120b",
            "--trace",
            "lmsys",
            "--requests",
            "60",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--budget-gib",
            "0.5",
            "--setups",
            "unified,static-default",
            "--prefix-cache",
            "both",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "saturating, cache" in text and "cache hit" in text
    runs = json.loads(out.read_text())["runs"]
    assert sorted(r["prefix_cache"] for r in runs) == [False, True]


@pytest.mark.parametrize("strategy, ratio", [("extra_buffer", 5), ("no_buffer", 3)])
def test_every_sglang_setup_is_capped_from_its_own_slots_and_unified_from_the_defaults(strategy, ratio):
    """SGLang 0.5.23, kv_cache_configurator.py _calculate_mamba_ratio: the
    running cap is the mamba slots over 3 plus a request's tracking slots
    (two under extra_buffer with the overlap scheduler, none under
    no_buffer).  ``run_one`` caps static-default from its split's slots,
    the unified arena from the default split's (the drop-in inherits
    SGLang's sizing), and unified-uncapped not at all."""
    from kvarena.sim import simulate

    trace = traces.generate("lmsys", 60, seed=4)
    s = presets.Sizes.of(presets.preset("qwen3-next-80b-a3b"), 4.0)
    cfg = engine.Config(record=False, prefix_cache=True, mamba_strategy=strategy)
    out, splits, _ = simulate.run_one(s, trace, cfg, setups=("unified", "unified-uncapped", "static-default"))
    cap = splits["static-default"].slots // ratio
    assert cap >= 2 and out["static-default"].peak_concurrency == cap  # a saturating trace reaches it
    assert out["unified"].peak_concurrency == cap  # the same cap: the default split's slots
    assert out["unified-uncapped"].peak_concurrency > cap
