"""vLLM v1's padded block pool as a simulator setup (``kvarena.sim.padded``):
the layout worked by hand from vLLM's rules, the block accounting, and the
one case where padding costs nothing (gpt-oss: equal layers, equal pages),
where it must admit what the unified arena admits."""

import math

import pytest

from kvarena.sim import backends, engine, padded, presets, traces

pytestmark = pytest.mark.usefixtures("one_thread")

EXACT = engine.Config(record=False, reserve_ratio=0.3)  # a constant reserve: these tests compare layouts alone


def layout(name):
    return padded.Layout(presets.preset(name), 16)


def test_layouts_by_hand():
    g = layout("gpt-oss-120b")  # 18 full + 18 SWA layers of 2,048 B a token: one group each, no padding
    assert (g.block_tokens, g.group_layers, g.groups) == (16, 18, {"full": 1, "swa": 1})
    assert g.block_bytes == 18 * 16 * 2048 and g.padding == {"full": 0.0, "swa": 0.0}
    gem = layout("gemma-3-27b")  # 10 full + 52 SWA: groups of 10, the sixth SWA group 8 layers empty
    assert gem.groups == {"full": 1, "swa": 6} and math.isclose(gem.padding["swa"], 60 / 52 - 1)
    nem = layout("nemotron-h-8b")  # a mamba2 layer's state 4,255,744 B; attention 4,096 B a token a layer
    assert nem.block_tokens == 16 * math.ceil(4_255_744 / (16 * 4096)) == 1040
    assert nem.group_layers == 4 and nem.groups == {"full": 1, "state": 6}
    assert nem.layer_page == 1040 * 4096 >= 4_255_744  # the state page padded up to the attention page
    tri = layout("tri-synthetic")  # a 128-token window in 2,080-token blocks
    assert tri.block_tokens == 2080 and tri.groups == {"full": 1, "swa": 1, "state": 2}


def test_blocks_follow_requests_and_come_back():
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 4.0)
    b = padded.PaddedPool(s)
    assert b.blocks == s.budget_bytes // b.layout.block_bytes
    slot = b.alloc_state()
    assert b.used == 6  # one block per state group
    ids = b.extend(0, 1, -1)  # 16 tokens take a whole 1,040-token block
    assert b.used == 7 and len(ids) == 1
    more = b.extend(1, 64, ids[-1])  # to 65 units = 1,040 tokens: still one block
    assert b.used == 7
    (nxt,) = b.decode([66], [more[-1]])  # the 1,041st token opens the second block
    assert b.used == 8
    b.verify()
    b.release([*ids, *more, nxt], [slot])
    assert b.used == 0 and b.free_bytes() == s.total
    b.verify()


def test_a_refused_decode_asks_relief_for_what_it_needed():
    """Each decoding request opens its own block: relief must price the
    batch's blocks, not its units as one new request (which would say yes
    and leave the simulator asking forever)."""
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 1.0)
    b = padded.PaddedPool(s)
    reqs = []
    while b.free >= 4:  # each fills one 2,080-token block per KV group
        reqs.append(b.extend(0, 130, -1))
    assert 2 <= b.free < 2 * len(reqs)
    assert b.decode([131] * len(reqs), [r[-1] for r in reqs]) is None
    assert not b.relieve(len(reqs), 0)  # no evictor: the batch's blocks are not there
    assert b._new_blocks(len(reqs)) <= b.free  # what the units alone would have said


@pytest.mark.parametrize("name", ["gemma-3-27b", "nemotron-h-8b", "tri-synthetic"])
def test_serves_every_request_and_returns_every_block(name):
    s = presets.Sizes.of(presets.preset(name), 5.0)
    trace = traces.generate("shift", 160, seed=3)
    b = padded.PaddedPool(s)
    res = engine.run(b, s, trace, EXACT, "vllm-padded")
    assert res.finished + res.rejected == len(trace) and res.lost == res.stuck == 0
    assert res.bytes_moved == 0 and b.used == 0
    b.verify()


def test_without_padding_it_admits_what_the_unified_arena_admits():
    """gpt-oss: full and SWA layers alike, 16-token blocks, no padded layer:
    one pool of interchangeable blocks, as the arena is, and neither moves
    a byte here; the two admit the same."""
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 5.0)
    trace = traces.generate("balanced", 300, seed=4)
    v = engine.run(padded.PaddedPool(s), s, trace, EXACT, "v")
    u = engine.run(backends.Unified(s), s, trace, EXACT, "u")
    assert v.mean_concurrency == pytest.approx(u.mean_concurrency, rel=0.01)
    assert v.finished == u.finished == 300


def test_padding_costs_admissions_where_it_pads():
    """Nemotron-H on short requests: each holds a 1,040-token block for
    about 256 tokens, so the padded pool admits far fewer than the arena."""
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 5.0)
    trace = traces.generate("short", 300, seed=5)
    v = engine.run(padded.PaddedPool(s), s, trace, EXACT, "v")
    u = engine.run(backends.Unified(s), s, trace, EXACT, "u")
    assert v.mean_concurrency < 0.9 * u.mean_concurrency
