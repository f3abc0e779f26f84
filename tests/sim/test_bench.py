"""``kvarena bench``: what the comparisons compare, never how fast.

The static twin follows the anchor's slot rules; the decode loop gives both
allocators the same page work; the eager arena's moved bytes are counted;
the arena's memo is keyed on one arena-wide clock (a memoised read no
longer walks the chain: planted back, the walk is caught); and the command
runs and writes every section's numbers.
"""

import copy
import json
import types

import pytest
import torch

from kvarena import cli
from kvarena.impl import Arena, SubPool
from kvarena.impl.arena import VIEWS
from kvarena.sim import bench, freelist
from kvarena.sim.backends import count_moves

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, as the commands use
PS = 16


def loop_args(**kw):
    base = {"batch": 32, "start": 200, "warmup": 2, "steps": 40}
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_static_twin_follows_the_anchor_slot_rules():
    s = freelist.StaticFreeList(64, 64, 4, "cpu")
    toks = s.alloc_extend(torch.tensor([0, 0]), torch.tensor([5, 3]), torch.tensor([-1, -1]))
    assert toks.tolist() == [4, 5, 6, 7, 8, 12, 13, 14]  # pages 1, 2 for request 0; 3 for request 1
    # seq 6 continues page 2 at last+1; seq 5 opens a new page (5 % 4 == 1): page 4, offset 0.
    out = s.alloc_decode(torch.tensor([6, 5]), torch.tensor([8, 14]))
    assert out.tolist() == [9, 16]
    swa = s.translate(torch.tensor([4, 9, -1]), "swa")
    assert swa.tolist()[:2] == [4, 9] and swa.tolist()[2] == 0  # swa pages 1, 2 mirror; -1 -> slot 0
    s.free_swa(torch.tensor([4, 5, 6, 7]), 0)
    assert s.translate(torch.tensor([4]), "swa").tolist() == [0]  # freed: the sink
    before = s.swa.count
    s.free_swa(torch.tensor([4, 5, 6, 7]), 0)  # already freed: skipped
    assert s.swa.count == before
    assert s.translate(torch.tensor([9]), "full").tolist() == [9]


@pytest.mark.parametrize("lazy", [True, False])
def test_decode_loop_gives_both_the_same_page_work(lazy):
    args = loop_args()
    ours_mk, static_mk, ps = bench._decode_pair("lazy" if lazy else "eager", args, "cpu")
    ours, static = ours_mk(), static_mk()
    lo = bench.DecodeLoop(ours, args.batch, ps, 127, args.start, args.steps, "cpu")
    ls = bench.DecodeLoop(static, args.batch, ps, 127, args.start, args.steps, "cpu")
    for _ in range(args.steps):
        lo.step()
        ls.step()
        full_live = ours.arena.live_pages("full")
        assert full_live == static.full.cap - static.full.count
        assert ours.arena.live_pages("swa") == static.swa.cap - static.swa.count
    # Every request keeps its whole sequence in full, and about a window in SWA.
    assert full_live == sum(-(-(args.start + i + args.steps) // ps) for i in range(args.batch))
    assert ours.arena.live_pages("swa") <= args.batch * (-(-(127 + 2 * ps) // ps))
    ours.verify()


@pytest.mark.parametrize("mode, trusted", [("lazy", True), ("lazy_checked", False), ("eager", True)])
def test_each_decode_row_drives_the_path_it_names(monkeypatch, mode, trusted):
    """The target's row runs the trusted path (``check=False``) and the
    checked row the default path, in all three calls; seen by spying on
    the trusted path's own helpers (``_decode_trusted``; the window free
    given its count, ``free_live``) and on the checked calls' validation
    (``_vec``, which no trusted call makes)."""
    from kvarena.impl import arena as impl_arena
    from kvarena.impl import composites

    seen = []
    for owner, name in (
        (composites._Composite, "_decode_trusted"),
        (composites._Composite, "_vec"),
        (impl_arena.Arena, "free_live"),
        (impl_arena.Arena, "free"),
    ):
        raw = vars(owner)[name]
        fn = getattr(raw, "__func__", raw)  # a staticmethod's function

        def spy(*a, _fn=fn, _n=name, **k):
            seen.append(_n)
            return _fn(*a, **k)

        monkeypatch.setattr(owner, name, staticmethod(spy) if isinstance(raw, staticmethod) else spy)
    args = loop_args(steps=4)
    ours_mk, _, ps = bench._decode_pair(mode, args, "cpu")
    loop = bench.DecodeLoop(ours_mk(), args.batch, ps, 127, args.start, args.steps, "cpu")
    del seen[:]
    for _ in range(args.steps):
        loop.step()
    if trusted:
        assert {"_decode_trusted", "free_live"} <= set(seen) and "_vec" not in seen
    else:
        assert "_decode_trusted" not in seen and "free_live" not in seen and "_vec" in seen
    assert "free" in seen  # window pages were freed


def test_eager_moves_are_counted_and_lazy_moves_nothing():
    args = loop_args(steps=24)
    for mode, expect_moves in (("eager", True), ("lazy", False)):
        ours_mk, _, ps = bench._decode_pair(mode, args, "cpu")
        r = bench._eager_moves(ours_mk, args, ps, "cpu")
        assert (r["bytes_moved_per_step"] > 0) == expect_moves
        assert 0 <= r["moved_per_allocated"] < 1


def test_count_moves_counts_live_pages_moved_only():
    a = Arena(4096, [SubPool("U", 8, 1, "up"), SubPool("D", 8, 1, "down")], lazy=True)
    ids = a.alloc("U", 6)
    a.free("U", ids[:3])  # three holes under three survivors
    moved = count_moves(a)
    assert a.flush("U") == 3 and moved[0] == 3 * 8
    e = Arena(4096, [SubPool("U", 8, 1, "up"), SubPool("D", 8, 1, "down")])
    ids = e.alloc("U", 4)
    moved = count_moves(e)
    e.free("U", ids[-2:])  # the frontier's own pages: eager compaction pads with self-copies
    assert moved[0] == 0
    e.free("U", ids[:1])  # one survivor moves down into the hole
    assert moved[0] == 8


# ------------------------------------------------------------------- ops


def ops_args(batches):
    return types.SimpleNamespace(start=200, warmup=0, steps=0, ops_batches=batches, batch=16)


def test_ops_per_decode_step_do_not_grow_with_the_batch():
    """The launches of a decode step are the same at 16 and 512 requests on
    every side; with the host copies the trusted step reads nothing back
    (the static twin neither), the checked one reads once in each of its
    two validating calls; without them free_swa and alloc_decode read once
    each, on either kernel choice."""
    res = bench.bench_ops(ops_args("16,512"), "cpu")
    assert "unavailable" not in res  # the suite runs Triton under its interpreter (tests/conftest.py)
    for copies in ("with host copies", "without"):
        for side in bench.OPS_SIDES:
            small, large = (res[copies][b][side] for b in ("16", "512"))
            assert small["launches_max"] == large["launches_max"] > 0, (copies, side)
    assert res["with host copies"]["512"]["trusted"]["reads_max"] == 0
    assert res["with host copies"]["512"]["triton"]["reads_max"] == 0
    assert res["with host copies"]["512"]["static"]["reads_max"] == 0
    assert res["with host copies"]["512"]["checked"]["reads_max"] == 2
    assert res["without"]["512"]["trusted"]["reads_max"] == 2
    assert res["without"]["512"]["triton"]["reads_max"] == 2
    assert res["without"]["512"]["static"]["reads_max"] == 2


def test_the_triton_step_is_at_most_six_launches_and_no_more_than_torch():
    """Issue 44's target, counted through ``kernels.launch``: the trusted
    step on Triton launches at most 6 kernels (one a call: alloc_decode,
    free_swa, two translations) and no more than on torch, whose count
    includes every torch operation."""
    res = bench.bench_ops(ops_args("1,64"), "cpu")["with host copies"]
    for batch in ("1", "64"):
        triton, torch_ = res[batch]["triton"]["launches_max"], res[batch]["trusted"]["launches_max"]
        assert 0 < triton <= 6 and triton <= torch_, (batch, triton, torch_)


def test_the_launch_counter_sees_a_planted_kernel_launch(monkeypatch):
    """Planted: every Triton launch goes twice through ``kernels.launch``
    (a second launch of the same kernel): the count goes up by the
    launches a step makes, so the counter reads the wrapped launch."""
    from kvarena.impl import kernels

    base = bench.bench_ops(ops_args("64"), "cpu")["with host copies"]["64"]["triton"]["launches_max"]
    real = kernels.launch

    def twice(kernel, grid, *args, **consts):
        real(kernel, grid, *args, **consts)
        if kernel is kernels._triton().translate_kernel:  # idempotent: run again, the same slots
            real(kernel, grid, *args, **consts)

    monkeypatch.setattr(kernels, "launch", twice)
    planted = bench.bench_ops(ops_args("64"), "cpu")["with host copies"]["64"]["triton"]["launches_max"]
    assert planted == base + 2  # two translations a step


def test_the_triton_side_is_left_out_saying_why_where_it_cannot_run(monkeypatch, capsys):
    from kvarena.impl import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: "no Triton here (planted)")
    res = bench.bench_ops(ops_args("16"), "cpu")
    assert res["unavailable"] == {"triton": "no Triton here (planted)"}
    assert "triton" not in res["with host copies"]["16"] and "trusted" in res["with host copies"]["16"]
    bench._print_ops(res)
    assert "ours (check=False, triton): not run: no Triton here (planted)" in capsys.readouterr().out


def test_op_count_sees_a_per_request_loop(monkeypatch):
    """Planted: a decode step that loops over its requests in Python is
    counted as growing with the batch."""
    from kvarena.impl import composites

    real = composites._Composite._decode_slots

    def looping(self, opens, ids, loc):
        out = real(self, opens, ids, loc)
        return torch.stack([x + 0 for x in out])  # one operation a request

    monkeypatch.setattr(composites._Composite, "_decode_slots", looping)
    res = bench.bench_ops(ops_args("16,64"), "cpu")["with host copies"]
    assert res["64"]["trusted"]["launches_max"] > res["16"]["trusted"]["launches_max"]


def test_op_counter_counts_the_allocator_only():
    """The loop's own tensor work is not counted: a do-nothing allocator
    call dispatches nothing."""
    s = freelist.StaticFreeList(64, 64, 4, "cpu")
    counter = bench._OpCounter(s)
    counter.translate(torch.tensor([4]), "full")  # one clone
    assert counter.launches == 1
    torch.arange(5) + 1  # outside the allocator: not counted
    assert counter.launches == 1


# ------------------------------------------------------------------ memo


def memo_arena():
    return bench._memo_arena(2)


def test_one_clock_for_the_whole_arena():
    a = memo_arena()
    clocks = {id(b.clock) for b in a.bands.values()}
    assert len(clocks) == 1 and a._memo.clock is a.bands["full"].clock
    for name in a.chain:
        a.available_pages(name)
    assert a._memo.entries()
    a.bands["swa1"].lo = a.bands["swa1"].lo  # any band's rebind ...
    assert not a._memo.entries()  # ... ticks the clock, which empties the memo
    b = copy.deepcopy(a)
    assert b._memo.clock is not a._memo.clock and b.bands["full"].clock is b._memo.clock
    assert b._cache is b._memo.cache and any(c is b._cache for c in b._memo.clock.caches)  # the copy's own dict
    want = a.available_pages("full")
    b.alloc("full", 1)  # the copy's clock ticks, not the original's
    assert a._memo.entries() == [("available_pages", "full", want)]


def test_a_memoised_read_does_not_walk_the_chain():
    """The old key summed every band's epoch on each read.  Reads that hit
    the memo must not touch the band list at all; plant the sum back and
    the same reads fail."""

    class NoWalk(list):
        def __iter__(self):
            raise AssertionError("a memoised read walked the chain")

    a = memo_arena()
    for name in a.chain:
        for v in VIEWS:
            a._view(v, name)  # fill
    a._order = NoWalk(a._order)
    misses = a._memo.misses
    for name in a.chain:
        for v in VIEWS:
            a._view(v, name)
    assert a._memo.misses == misses  # every read a hit

    planted = memo_arena()
    for name in planted.chain:
        for v in VIEWS:
            planted._view(v, name)

    def summed_key(view, name):  # the old read: key on the sum of the bands' epochs first
        sum(b.epoch for b in planted._order)
        return Arena._view(planted, view, name)

    planted._view = summed_key
    planted._order = NoWalk(planted._order)
    with pytest.raises(AssertionError, match="walked the chain"):
        planted._view("available_pages", "full")


def test_memo_stays_exact_under_operations():
    a = memo_arena()
    for step in range(30):
        name = a.chain[step % len(a.chain)]
        ids = a.alloc(name, 2)
        for n in a.chain:
            for v in VIEWS:
                assert a._view(v, n) == a.fresh_view(v, n)
        if ids is not None and step % 3 == 0:
            a.free(name, ids[:1])
    a.verify()


# ----------------------------------------------------------------- command


def test_bench_command_writes_every_section(tmp_path, capsys):
    out = tmp_path / "b.json"
    args = "bench --repeats 1 --batch 32 --steps 3 --warmup 1 --start 200 --reads 20 --oracle-ops 300"
    args += " --decode-batches 8,32 --ops-batches 1,32"
    args += " --churn-requests 40 --copy-mb 1 --copy-page-kib 4,16"  # every section, each as small as it goes
    rc = cli.main([*args.split(), "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    for word in (
        "decode step, batch 8, lazy (check=False)",
        "decode step, batch 32, lazy (checked)",
        "decode step, batch 32, eager",
        "ops a decode step, with host copies, ours (check=False, torch), batch 1, 32: launches",
        "ops a decode step, with host copies, ours (check=False, triton), batch 1, 32: launches",
        "memo, 2 pools",
        "memo, 5 pools",
        "spec oracle",
        "churn, tri-synthetic",
        "copy, 1 MiB in 4 KiB pages: make_room on torch at",
        "copy, 1 MiB in 16 KiB pages: make_room on torch at",
        "sglang decode step, batch 1:",
        "sglang decode step, batch 32:",
        "sglang decode step, batch 32: launches a step",
        "sglang decode step, batch 32: kvarena (triton) / SGLang's allocator",
    ):
        assert word in text
    data = json.loads(out.read_text())
    assert list(data["decode"]) == ["8", "32"]
    for batch in ("8", "32"):
        assert list(data["decode"][batch]) == ["lazy", "lazy_checked", "eager"]
        for mode in ("lazy", "lazy_checked", "eager"):
            r = data["decode"][batch][mode]
            assert r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"]
            assert r["ours_us"]["median"] > 0 and r["static_us"]["median"] > 0
        assert data["decode"][batch]["eager"]["bytes_moved_per_step"] > 0
    assert list(data["ops"]) == ["with host copies", "without"]  # every side ran: Triton interpreted
    assert data["triton"].startswith("interpreted")
    assert data["ops"]["with host copies"]["32"]["static"]["reads_max"] == 0  # the window free's count given
    assert set(data["memo"]) == {"2 pools", "3 pools", "4 pools", "5 pools"}
    assert data["copy"]["bytes"] == 1 << 20
    assert list(data["copy"]["envelopes"]) == ["4 KiB", "16 KiB"]
    assert set(data["sglang"]) == {"batch 1", "batch 32", "batch 64"}
    for r in data["sglang"].values():
        assert set(r["launches"]) == {"kvarena_torch", "kvarena_triton", "sglang"}
        assert all(r[f"{side}_us"]["median"] > 0 for side in r["launches"])
        assert all(0 < n["min"] <= n["max"] for n in r["launches"].values())
        assert r["launches"]["kvarena_triton"]["max"] <= r["launches"]["sglang"]["max"]  # issue 44's target
    churn = data["churn"]["gpt-oss-120b"]["anchor"]
    assert churn["moved_per_allocated"] == pytest.approx(churn["bytes_moved"] / churn["bytes_allocated"])
    assert cli.main(["bench", "--only", "nope"]) == 2
    assert cli.main(["bench", "--only", "copy", "--copy-page-kib", "4,0"]) == 2


def test_copy_measures_every_envelope_side_by_side(monkeypatch):
    """One run times every envelope size, each repeat visiting all of them;
    each ratio is the plain copy's time over the leapfrog's, repeat by repeat."""
    built = []
    args = types.SimpleNamespace(copy_page_kib="4,64,1024", copy_mb=1, repeats=2)
    orig_init = Arena.__init__

    def spy(self, total, pools, *a, **k):
        built.append(pools[1].entry_bytes)
        orig_init(self, total, pools, *a, **k)

    monkeypatch.setattr(Arena, "__init__", spy)
    res = bench.bench_copy(args, "cpu")
    assert list(res["envelopes"]) == ["4 KiB", "64 KiB", "1024 KiB"]
    assert built == [4096, 65536, 1 << 20, 65536, 1 << 20, 4096, 1 << 20, 4096, 65536]  # warm-up, then 2 repeats
    for name, r in res["envelopes"].items():
        assert r["bytes"] == 1 << 20 and r["page_bytes"] == int(name.split()[0]) * 1024
        for key in ("share_of_copy_bandwidth", "ours_GBps", "copy_GBps"):
            assert 0 < r[key]["min"] <= r[key]["median"] <= r[key]["max"]
    with pytest.raises(ValueError, match="copy-page-kib"):
        bench.copy_envelopes("4,-1")
    assert bench.copy_envelopes("4, 64,4") == [4, 64]


def test_copy_times_the_triton_path_beside_torchs(monkeypatch, capsys):
    """Where Triton compiles (CUDA) the slide is timed on both paths, each
    against the same plain copy; here, under the interpreter, forced on."""
    from kvarena.impl import kernels

    assert bench.copy_paths("cpu") == ("torch",)  # interpreted: no measure of a copy
    if kernels.unavailable(torch.device("cpu")) is not None:
        pytest.skip("Triton cannot run here")
    monkeypatch.setattr(bench, "copy_paths", lambda device: ("torch", "triton"))
    args = types.SimpleNamespace(copy_page_kib="64", copy_mb=1, repeats=2)
    res = bench.bench_copy(args, "cpu")
    assert res["paths"] == ["torch", "triton"]
    r = res["envelopes"]["64 KiB"]
    for key in ("share_of_copy_bandwidth", "ours_GBps", "kernel_share_of_copy_bandwidth", "kernel_GBps", "copy_GBps"):
        assert 0 < r[key]["min"] <= r[key]["median"] <= r[key]["max"], key
    bench._print("copy", res)
    out = capsys.readouterr().out
    assert "make_room on torch at" in out and "make_room on Triton at" in out
