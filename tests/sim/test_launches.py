"""How the simulator's clock prices the allocator (``kvarena.sim.launches``):
by default as a GPU runs it, each unified call at its Triton path's launches
(``TRITON_OPS``, recounted here on the code), the ladder counted in the run,
the static setups at a torch free list's; ``--alloc-cost torch`` keeps the
CPU torch path's count."""

import math
import types

import pytest
import torch

from kvarena.impl import kernels
from kvarena.sim import backends, bench, engine, launches, presets, timing, traces

pytestmark = pytest.mark.usefixtures("one_thread")

COMPOSITES = {"HybridSWA": "gpt-oss-120b", "MambaHybrid": "nemotron-h-8b", "TriPool": "tri-synthetic"}
needs_triton = pytest.mark.skipif(
    kernels.unavailable(torch.device("cpu")) is not None, reason="Triton cannot run on this machine"
)


def sizes(kind):
    return presets.Sizes.of(presets.preset(COMPOSITES[kind]), 2.0)


def unified(kind, **kw):
    return backends.Unified(sizes(kind), **kw)


# ------------------------------------------------------------ the tables


@needs_triton
@pytest.mark.parametrize("kind", sorted(launches.TRITON_OPS))
def test_the_triton_table_is_what_the_triton_path_launches_at_any_batch(kind):
    """Each composite's table is what its calls launch on Triton, counted
    afresh (``count_triton_ops``, bench ops' rule), the same at a batch of 1
    and of 64: nothing in it grows with the batch."""
    one, _ = launches.count_triton_ops(kind, batches=(1,))
    many, _ = launches.count_triton_ops(kind, batches=(64,))
    assert one == many == launches.TRITON_OPS[kind]
    assert launches.TRITON_OPS[kind]["decode"] == 1  # one fused launch: bind and slots


@needs_triton
@pytest.mark.parametrize("batch", [1, 64])
def test_a_decode_is_priced_at_what_bench_ops_counts_on_the_trusted_triton_step(batch):
    """``alloc_decode`` in bench ops' trusted Triton step (HybridSWA, page
    size 16, the engine's host copies), counted by its own counter, is the
    table's decode on every composite."""
    args = types.SimpleNamespace(start=200, warmup=0, steps=0, batch=batch)
    ours, _, ps = bench._decode_pair("lazy", args, "cpu", batch, "triton")
    alloc = ours()
    loop = bench.DecodeLoop(alloc, batch, ps, 127, args.start, 3 * ps, "cpu")
    loop.step()
    counter = bench._OpCounter(alloc)
    with counter.counter.triton():
        assert counter.alloc_decode(loop.seq + 1, loop.last, seq_lens_cpu=loop.seq_cpu + 1) is not None
    assert {t["decode"] for t in launches.TRITON_OPS.values()} == {counter.launches}


def test_the_free_list_table_counts_launches_by_bench_ops_rule_under_gpu():
    """Under ``gpu`` a free list's views and host-copy work are no launch,
    so it is below the every-operation count ``torch`` keeps (whose figures
    are the ones published before ``gpu``)."""
    gpu, torch_ = launches.free_list_ops("gpu"), launches.free_list_ops("torch")
    assert (torch_["extend"], torch_["decode"], torch_["free_window"], torch_["release"]) == (35, 28, 16, 4)
    assert 0 < gpu["decode"] < torch_["decode"] and 0 < gpu["free_window"] < torch_["free_window"]
    assert gpu["release"] == gpu["alloc_state"] > 0


# ------------------------------------------------------------- Counted


@pytest.mark.parametrize("kind", sorted(launches.TRITON_OPS))
def test_the_default_prices_a_unified_decode_at_the_triton_path(kind):
    """A unified decode of 1 or 40 requests costs the table's decode under
    the default; under ``torch`` it costs every operation it dispatches, as
    counted around the same call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    assert engine.Config().alloc_cost == "gpu"
    for batch in (1, 40):
        b = launches.Counted(unified(kind))
        seqs = [len(b.extend(0, 3, -1)) + 1 for _ in range(batch)]
        b.take_launches()
        assert b.decode(seqs, [2] * batch) is not None  # a decode's slots are whatever it gives
        assert b.take_launches() == launches.TRITON_OPS[kind]["decode"]

    n = [0]

    class Every(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            n[0] += 1
            return func(*args, **(kwargs or {}))

    plain, counted = unified(kind), launches.Counted(unified(kind), "torch")
    lasts = [plain.extend(0, 3, -1)[-1] for _ in range(8)]
    assert [counted.extend(0, 3, -1)[-1] for _ in range(8)] == lasts
    counted.take_launches()
    with Every():
        plain.decode([4] * 8, lasts)
    counted.decode([4] * 8, lasts)
    assert counted.take_launches() == n[0] > 5 * launches.TRITON_OPS[kind]["decode"]


def one_of_each(b):
    """A static split's calls, one of each: a slot, an extend, a decode, a
    window free (and an empty one, which costs nothing), a release."""
    slot = b.alloc_state()
    ids = b.extend(0, 4, -1)
    ids += b.decode([5], [ids[-1]])
    b.free_window(ids[:2])
    b.free_window([])
    b.release(ids, [slot])


def test_on_a_gpu_a_static_setup_is_priced_as_the_arenas_triton_path():
    """``gpu``: a static split's calls cost what the unified arena's Triton
    path launches for the same call on the same model (the arena cannot win
    the allocator term but by its relocation); a full-attention-only pool
    (Gemma at full length) takes HybridSWA's."""
    s = sizes("TriPool")
    table = launches.TRITON_OPS["TriPool"]
    assert launches.free_list_table(s.preset) is table
    full_only = presets.preset("gemma-3-27b").at_full_length()
    assert launches.free_list_table(full_only) is launches.TRITON_OPS["HybridSWA"]
    b = launches.Counted(backends.StaticSplit(s, presets.static_split(s)), "gpu")
    one_of_each(b)
    want = table["alloc_state"] + table["extend"] + table["decode"] + table["free_window"]
    assert b.take_launches() == want + table["release"] + table["release_state"]
    assert launches.free_list_ops("gpu")["decode"] > 5 * table["decode"]  # the torch twin would charge far more


def test_on_the_torch_path_a_static_setup_is_priced_at_the_free_list_table():
    """``torch``: a static split's calls cost the torch free list's table: a
    decode, a window free, a release (a put per pool it returns to), a slot."""
    s = sizes("TriPool")
    table = launches.free_list_ops("torch")
    b = launches.Counted(backends.StaticSplit(s, presets.static_split(s)), "torch")
    one_of_each(b)
    want = table["alloc_state"] + table["extend"] + table["decode"] + table["free_window"] + 3 * table["release"]
    assert b.take_launches() == want


class _Arena:
    chain = ("state", "swa", "full")

    def __init__(self, grow="up"):
        self.grow = grow

    def is_lazy(self, name):
        return self.grow != "eager"

    def pool(self, name):
        return types.SimpleNamespace(grow="float" if name == "swa" else "up")


class TriPool:  # a stand-in composite: its type's name picks the table
    pass


class _Fake:
    """A unified setup whose relief does three known operations (one a view)
    and evicts through the counted setup, whose release does its own."""

    static = False
    has_swa = True

    def __init__(self, lazy=True):
        self.arena, self.c, self.outer = _Arena("up" if lazy else "eager"), TriPool(), None

    def relieve(self, units, slots, evict=None, reserve=0):
        x = torch.ones(4)
        x.view(2, 2)  # a view: no launch on a GPU
        evict(1)
        x.add_(1)
        return True

    def release(self, ids, slots):
        torch.ones(8).sum()  # its own operations: the table prices it under gpu


def test_under_gpu_the_ladder_is_counted_in_the_run_and_its_evictions_priced_from_the_table():
    def run(alloc_cost, lazy=True):
        fake = _Fake(lazy)
        b = launches.Counted(fake, alloc_cost)
        b.relieve(1, 0, lambda short: b.release([1, 2], [3]))
        return b.take_launches()

    table = launches.TRITON_OPS["TriPool"]
    assert run("gpu") == 2 + table["release"] + table["release_state"]  # ones, add_; the view is no launch
    assert run("torch") == 3 + 2  # every operation, the eviction's included
    assert run("gpu", lazy=False) == 2 + 2  # an eager arena: every call counted in the run


def test_an_eager_arena_is_counted_in_the_run_under_gpu():
    b = launches.Counted(unified("TriPool", lazy=False))
    b.extend(0, 3, -1)
    assert b.take_launches() > launches.TRITON_OPS["TriPool"]["extend"]


# ------------------------------------------------------------- the run


def test_a_run_is_charged_its_priced_launches_and_less_under_gpu_than_torch():
    """With every request arriving at once the schedule does not depend on
    the clock: both rules take the same steps; each run's allocator time is
    its launches at the launch cost, and the GPU path launches fewer."""
    s = presets.Sizes.of(presets.preset("tri-synthetic"), 2.0)
    trace = traces.generate("balanced", 120, seed=2)
    gpu = engine.run(backends.Unified(s), s, trace, engine.Config(record=False), "u")
    cpu_torch = engine.run(backends.Unified(s), s, trace, engine.Config(record=False, alloc_cost="torch"), "u")
    assert (gpu.steps, gpu.finished) == (cpu_torch.steps, cpu_torch.finished)
    for res in (gpu, cpu_torch):
        assert math.isclose(res.alloc_seconds, res.launches * timing.ACCELERATORS["h200"].launch_seconds)
    assert 0 < gpu.launches < cpu_torch.launches / 2  # most of what is left is the ladder, on torch in both


def test_the_rule_is_one_sentence_for_each_alloc_cost():
    t = launches.TRITON_OPS["TriPool"]
    gpu = launches.rule("gpu")
    assert "kvarena bench --only ops" in gpu and f"a decode {t['decode']}," in gpu and "5 µs" in gpu
    assert "Triton" in gpu and "the same launches per call" in gpu and "cannot favour the arena" in gpu
    assert "CPU torch path" in launches.rule("torch") and "measured" in launches.rule("cpu")
    for cost in engine.ALLOC_COSTS:
        text = launches.rule(cost)
        assert text.endswith(".") and text.count(". ") == 0, text
    with pytest.raises(ValueError, match="alloc_cost must be gpu, torch or cpu"):
        launches.rule("launches")


def test_counting_the_bytes_moved_is_not_charged_to_the_allocator():
    """``backends.count_moves`` reads each move's live pages on the host;
    those reads are the simulator's instrumentation, so a launch-counting
    mode around the move sees none of them (it once charged them: about 5%
    of the ladder's launches)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    b = unified("HybridSWA")
    band = b.arena.bands["full"]
    b.arena._move = lambda *args: None  # the move itself: not what is measured here
    moved = backends.count_moves(b.arena)
    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    dst, src = torch.tensor([0, 1]), torch.tensor([2, 3])
    with Count():
        b.arena._move(band, dst, src)
    assert seen == [] and moved == [0]
