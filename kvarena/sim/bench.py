"""``kvarena bench``: ratios measured side by side in one run.

Every comparison times its two sides in the same process, alternating which
goes first, after warm-up, over ``--repeats`` repeats; it prints the
minimum, the median and the spread (max - min) of the ratio, never a
threshold test.  The decode rows time the two sides' steps interleaved, one
step each in turn, and take each side's median step (``_paired_steps``).
Sections (``--only``):

- ``decode``: one decode step (``alloc_decode`` + ``free_swa`` +
  ``translate`` of both pools) at every batch of ``--decode-batches``, on
  ``HybridSWA`` against ``StaticFreeList``, a plain static free-list
  allocator doing the same page work with the same host reads, which
  trusts its input; both are given the engine's host copies: the lengths
  (``seq_lens_cpu``) and how many pages the window free releases
  (``num_live``).  Rows: lazy on the composite's trusted decode path
  (``check=False``), lazy on the checked default path, and eager on the
  trusted path; eager also reports the bytes it moves (compaction on every
  free, by design);
- ``ops``: the kernel launches and host reads one decode step makes, at
  every batch of ``--ops-batches``, with and without the host copy: the
  trusted path on torch and on Triton (under its interpreter on the CPU;
  left out, saying why, where Triton cannot run), the checked path and the
  static twin, counted the same way (``kvarena.sglang.bench.LaunchCounter``:
  one per torch operation that launches device work, one per Triton
  kernel, work on the engine's host copies on the host); the most in a
  page's worth of steps (flat in the batch is the goal);
- ``memo``: memoised capacity reads against fresh recomputation, 2 to 5
  pools, and the memoised read's cost per pool count (flat is the goal);
  only the reads are timed, not the step that invalidates the memo between
  batches of reads (the same alloc on both sides);
- ``oracle``: the spec's speed as an oracle, simple operations a second;
- ``churn``: relocation traffic under steady serving churn (the simulator
  on a balanced trace at full memory), bytes moved per byte allocated, both
  policies;
- ``copy``: ``make_room``'s copy bandwidth against a plain device-to-device
  copy of the same bytes, at every page envelope of ``--copy-page-kib``
  (4, 64 and 1024 KiB by default) in one run (targets: 0.5 on CPU, 0.8 on
  CUDA);
- ``sglang``: one decode step on SGLang's own SWA stack (sglang 0.5.23,
  installed on first use) with kvarena's allocator, on torch and on Triton,
  against SGLang's (``kvarena.sglang.bench``), at every batch of
  ``--sglang-batches`` (default 1, 64 and ``--batch``): the time ratios
  (CUDA events on a CUDA device), and the kernel launches a step, counted
  the same way on every side (each torch operation that launches device
  work, each Triton kernel, kvarena's or SGLang's, as one).

``--kernels`` picks the decode section's kernels (default: the device's,
Triton on CUDA); the ops and sglang sections run both.  Triton runs on the
CPU under its interpreter (``run`` turns it on before anything imports
Triton): there, its launch counts are meaningful and its times are not.
"""

import argparse
import bisect
import gc
import json
import random
import statistics
import time

from kvarena.sim.freelist import StaticFreeList

SECTIONS = ("decode", "ops", "memo", "oracle", "churn", "copy", "sglang")


# ------------------------------------------------------------------ timing


def _sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _summary(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "spread": max(xs) - min(xs)}


def _fmt_ratio(s, unit="x"):
    return f"{s['median']:.2f}{unit} median (min {s['min']:.2f}, spread {s['spread']:.2f})"


# ------------------------------------------------------------------ decode


class DecodeLoop:
    """``batch`` requests decoding in lock step, as an engine drives them:
    a ``req_to_token`` table on the device, lengths staggered (request
    ``i`` starts at ``start + i % M``, ``M`` a multiple of the page size up
    to 256, so memory grows with the batch, not its square) so that every
    step some requests open a page and some free an SWA page (the anchor's
    window rule, ``window`` tokens).  Everything the loop computes on the
    host is host ints, and it passes the allocator the host copy of the
    lengths an engine keeps (``seq_lens_cpu``; ``host_copies=False``
    leaves it out): it adds no device read of its own."""

    def __init__(self, alloc, batch, page_size, window, start, steps, device, host_copies=True):
        import torch

        self.a, self.ps, self.window, self.device = alloc, page_size, window, device
        self.batch, self.host_copies = batch, host_copies
        self.seq0 = start
        span = -(-min(batch, 256) // page_size) * page_size
        self.stagger = torch.arange(batch, dtype=torch.int64, device=device) % span
        lens = start + self.stagger
        self.r2t = torch.zeros(batch, start + span + steps + 1, dtype=torch.int64, device=device)
        toks = alloc.alloc_extend(torch.zeros_like(lens), lens, torch.full_like(lens, -1))
        rows = torch.repeat_interleave(torch.arange(batch, device=device), lens)
        cols = torch.arange(toks.numel(), device=device) - (torch.cumsum(lens, 0) - lens)[rows]
        self.r2t[rows, cols] = toks
        self.seq = lens
        self.seq_cpu = lens.cpu()  # the engine's host copy (setup: one copy, untimed)
        self.last = self.r2t[torch.arange(batch, device=device), lens - 1]
        self.rows = torch.arange(batch, device=device)
        self.t = 0
        self.offsets = torch.arange(page_size, device=device)
        # Requests whose window edge crosses a page at step t: i = c (mod ps).
        self.by_residue = [torch.arange(c, max(c, batch), page_size, device=device) for c in range(page_size)]
        # their staggers, sorted, on the host: the engine's count of requests with a page to free
        self.stagger_by_residue = [sorted(self.stagger[r].tolist()) for r in self.by_residue]
        self.free_all_behind()

    def free_all_behind(self):
        """Setup: free every SWA page already out of the window (untimed)."""
        for i, off in enumerate(self.stagger.tolist()):
            end = max(0, (self.seq0 + off - self.window - self.ps) // self.ps * self.ps)
            if end:
                self.a.free_swa(self.r2t[i, :end].contiguous(), 0)

    def step(self):
        import torch

        self.t += 1
        self.seq = self.seq + 1
        self.seq_cpu = self.seq_cpu + 1
        if self.host_copies:
            out = self.a.alloc_decode(self.seq, self.last, seq_lens_cpu=self.seq_cpu)
        else:
            out = self.a.alloc_decode(self.seq, self.last)
        if out is None:
            raise RuntimeError("bench: decode ran out of memory; raise the buffer")
        self.r2t[self.rows, self.seq - 1] = out
        self.last = out
        # seq_i = seq0 + (i % M) + t, and M is a multiple of ps: request i's
        # window end crosses a page when (seq_i - window - ps) % ps == 0,
        # the same residue of i for every row; its page [end - ps, end) leaves.
        c = (self.window + self.ps - self.seq0 - self.t) % self.ps
        rows = self.by_residue[c]
        if rows.numel():
            end = (self.seq0 + self.t - self.window - self.ps) + self.stagger.index_select(0, rows)
            ok = end >= self.ps
            start = torch.where(ok, end - self.ps, 0)
            toks = self.r2t[rows.unsqueeze(1), start.unsqueeze(1) + self.offsets]
            toks = torch.where(ok.unsqueeze(1), toks, -1)
            if self.host_copies:  # rows whose window end is past the first page: end >= ps
                low = self.ps - (self.seq0 + self.t - self.window - self.ps)
                staggers = self.stagger_by_residue[c]
                self.a.free_swa(toks.reshape(-1), 0, num_live=len(staggers) - bisect.bisect_left(staggers, low))
            else:
                self.a.free_swa(toks.reshape(-1), 0)
        self.a.translate(out)
        self.a.translate(out, "swa")


class Trusted:
    """A composite driven on its trusted decode path (``check=False``), as a
    scheduler that guarantees its input calls it; setup calls stay checked."""

    def __init__(self, composite):
        self.c, self.arena = composite, composite.arena

    def alloc_extend(self, prefix, seq, last):
        return self.c.alloc_extend(prefix, seq, last)

    def alloc_decode(self, seq, last, **host):
        return self.c.alloc_decode(seq, last, check=False, **host)

    def free_swa(self, tokens, start_pos, **host):
        return self.c.free_swa(tokens, start_pos, check=False, **host)

    def translate(self, tokens, pool="full"):
        return self.c.translate(tokens, pool, check=False)

    def verify(self):
        self.c.verify()


# (row, lazy, trusted): the target's row first
DECODE_ROWS = (("lazy", True, True), ("lazy_checked", True, False), ("eager", False, True))
DECODE_LABELS = {"lazy": "lazy (check=False)", "lazy_checked": "lazy (checked)", "eager": "eager (check=False)"}


def _decode_pair(mode, args, device, batch=None, kernels=None):
    """Makers of the two sides of one decode row at ``batch`` (default
    ``args.batch``), on buffers sized for the loop's steps; the composite
    runs ``kernels`` (default ``args.kernels``, else the device's default)."""
    from kvarena.impl import HybridSWA

    _, lazy, trusted = next(r for r in DECODE_ROWS if r[0] == mode)
    ps, e = 16, 64  # 64 bytes a token in each pool
    batch = args.batch if batch is None else batch
    span = -(-min(batch, 256) // ps) * ps  # DecodeLoop's stagger
    steps_total = args.warmup + args.steps
    pages = batch * (-(-(args.start + span + steps_total) // ps) + 1) + 8
    total = pages * ps * e * 2 + (1 << 16)

    if kernels is None:
        kernels = getattr(args, "kernels", None)

    def ours():
        c = HybridSWA(total, e, e, ps, lazy=lazy, device=device, kernels=kernels)
        return Trusted(c) if trusted else c

    def static():
        return StaticFreeList(pages, pages, ps, device)

    return ours, static, ps


def _batches(text):
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"bench: --decode-batches {text!r}: give positive batch sizes, comma-separated")
    return out


def _paired_steps(loops, steps, device):
    """Time ``steps`` steps of each loop in ``loops`` (name -> loop), one
    step of each in turn, the first alternating step by step, with the
    garbage collector off: each side's median seconds a step.  Interleaved,
    the two sides see the same machine moment by moment, so a slow spell
    (another process, a frequency step) lands on both; the median drops the
    steps a collection or a preemption hit."""
    names = list(loops)
    times = {name: [] for name in names}
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for i in range(steps):
            for name in names if i % 2 == 0 else names[::-1]:
                _sync(device)
                t = time.perf_counter()
                loops[name].step()
                _sync(device)
                times[name].append(time.perf_counter() - t)
    finally:
        if was_enabled:
            gc.enable()
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_decode(args, device):
    """Every decode row at every batch of ``--decode-batches``: each repeat
    builds both sides afresh (alternating which first), warms them up, and
    times their steps interleaved (``_paired_steps``); its ratio is the
    ratio of their median steps."""
    out = {}
    for batch in _batches(args.decode_batches):
        rows = {}
        for mode, _, _ in DECODE_ROWS:
            ours_mk, static_mk, ps = _decode_pair(mode, args, device, batch)
            ratios, t_ours, t_static = [], [], []
            for rep in range(args.repeats):
                makers = {"ours": ours_mk, "static": static_mk}
                order = ("ours", "static") if rep % 2 == 0 else ("static", "ours")
                loops = {
                    side: DecodeLoop(makers[side](), batch, ps, 127, args.start, args.warmup + args.steps, device)
                    for side in order
                }
                for _ in range(args.warmup):
                    for loop in loops.values():
                        loop.step()
                times = _paired_steps(loops, args.steps, device)
                ratios.append(times["ours"] / times["static"])
                t_ours.append(times["ours"] * 1e6)
                t_static.append(times["static"] * 1e6)
            row = {"ratio": _summary(ratios), "ours_us": _summary(t_ours), "static_us": _summary(t_static)}
            if mode == "eager":
                row.update(_eager_moves(ours_mk, args, ps, device, batch))
            rows[mode] = row
        out[str(batch)] = rows
    return out


def _eager_moves(ours_mk, args, ps, device, batch=None):
    """Bytes an eager arena moves over the same steps (an untimed pass)."""
    from kvarena.sim.backends import count_moves

    batch = args.batch if batch is None else batch
    alloc = ours_mk()
    moved = count_moves(alloc.arena)
    loop = DecodeLoop(alloc, batch, ps, 127, args.start, args.warmup + args.steps, device)
    before = moved[0]
    epp = alloc.arena.geometry("full").epp + alloc.arena.geometry("swa").epp
    for _ in range(args.steps):
        loop.step()
    new_pages = batch * args.steps // ps
    return {
        "bytes_moved_per_step": (moved[0] - before) / args.steps,
        "moved_per_allocated": (moved[0] - before) / max(1, new_pages * epp),
    }


# --------------------------------------------------------------------- ops

# side -> (decode row, kernels): the trusted step on each kernel choice, the checked one, the static twin
OPS_SIDES = {
    "trusted": ("lazy", "torch"),
    "triton": ("lazy", "triton"),
    "checked": ("lazy_checked", "torch"),
    "static": ("lazy", None),
}
OPS_LABELS = {
    "trusted": "ours (check=False, torch)",
    "triton": "ours (check=False, triton)",
    "checked": "ours (checked, torch)",
    "static": "static free list",
}


class _OpCounter:
    """Counts the kernel launches an allocator's calls make (each call
    counted by a ``LaunchCounter``, so the loop's own tensor work is not
    counted: one per torch operation that launches device work, one per
    Triton kernel, the engine's host copies on the host) and its host
    reads: calls of the composites' one read (``impl.composites._host_read``;
    ``tests/impl/test_host_sync.py`` shows the decode path reads nothing
    else) and of the static twin's."""

    def __init__(self, alloc, device="cpu"):
        from kvarena.sglang.bench import LaunchCounter

        self.a, self.counter, self.reads = alloc, LaunchCounter(device), 0

    @property
    def launches(self):
        return self.counter.count

    def __getattr__(self, name):
        return self.counter.counted(getattr(self.a, name))


def _count_step(loop, counter):
    """One decode step's launches and host reads."""
    from kvarena.impl import composites

    real = composites._host_read

    def read(t):
        counter.reads += 1
        return real(t)

    counter.counter.count = counter.reads = 0
    composites._host_read = read
    try:
        with counter.counter.triton():
            loop.step()
    finally:
        composites._host_read = real
    return counter.launches, counter.reads


def ops_sides(device):
    """The ops sides that run on ``device``, and why each other one does not."""
    import torch

    from kvarena.impl.kernels import unavailable

    why = unavailable(torch.device(device))
    sides = [s for s in OPS_SIDES if s != "triton" or why is None]
    return sides, ({} if why is None else {"triton": why})


def bench_ops(args, device):
    """Kernel launches and host reads of one decode step (``alloc_decode``
    + ``free_swa`` + ``translate`` of both pools) at every batch of
    ``--ops-batches``, with and without the engine's host copies (the
    lengths, the window free's count): the worst step of a page's worth
    (every step frees some window pages once the batch reaches the page
    size).  The trusted step on both kernel choices (Triton where it runs:
    on the CPU under its interpreter), the checked one, the static twin,
    all counted the same way (``_OpCounter``)."""
    sides, missing = ops_sides(device)
    out = {}
    for copies in ("with host copies", "without"):
        by_batch = {}
        for batch in _batches(args.ops_batches):
            row = {}
            for side in sides:
                mode, kernels = OPS_SIDES[side]
                ours_mk, static_mk, ps = _decode_pair(mode, args, device, batch, kernels)
                alloc = static_mk() if side == "static" else ours_mk()
                if side != "static":  # the loop's setup on torch: Triton's interpreter is slow at 4,096 prefills
                    alloc.arena.kernels = "torch"
                loop = DecodeLoop(alloc, batch, ps, 127, args.start, 3 * ps, device, host_copies=copies != "without")
                if side != "static":  # the steps on the side's kernels (the two leave the same state)
                    alloc.arena.kernels = kernels
                loop.step()  # warm
                counter = _OpCounter(alloc, device)
                if side == "static":
                    alloc.counter = counter  # the twin counts its own reads into it
                loop.a = counter
                steps = [_count_step(loop, counter) for _ in range(ps)]
                row[side] = {
                    "launches_max": max(n for n, _ in steps),
                    "launches_min": min(n for n, _ in steps),
                    "reads_max": max(r for _, r in steps),
                }
            by_batch[str(batch)] = row
        out[copies] = by_batch
    if missing:
        out["unavailable"] = missing
    return out


# -------------------------------------------------------------------- memo


def _memo_arena(floats):
    from kvarena.impl import Arena, SubPool

    pools = [SubPool("state", 4096, 1, "up", "state"), SubPool("full", 64, 16, "down")]
    pools += [SubPool(f"swa{i}", 32, 16, "float") for i in range(floats)]
    a = Arena(64 << 20, pools)
    for name in a.chain:
        a.alloc(name, 8)
    return a


def bench_memo(args, device):
    from kvarena.impl.arena import VIEWS

    out = {}
    for floats in range(4):
        a, b = _memo_arena(floats), _memo_arena(floats)
        names = a.chain

        def timed(arena, read, names=names):
            # Only the reads are timed: the step between batches (the same
            # alloc on both sides) is not a read, and timing it would pull
            # any ratio toward 1.  The first read of each batch after it is
            # a miss, and that is timed.
            spent = 0.0
            for start in range(0, args.reads, args.batch_reads):
                arena.alloc(names[-1], 1)  # a step: every memo entry is now stale
                t = time.perf_counter()
                for _ in range(min(args.batch_reads, args.reads - start)):
                    for name in names:
                        for view in VIEWS:
                            read(view, name)
                spent += time.perf_counter() - t
            return spent

        ratios, memo_ns = [], []
        for rep in range(args.repeats):
            if rep % 2 == 0:
                tm, tf = timed(a, a._view), timed(b, b.fresh_view)
            else:
                tf, tm = timed(b, b.fresh_view), timed(a, a._view)
            ratios.append(tf / tm)
            memo_ns.append(tm / (args.reads * len(names) * len(VIEWS)) * 1e9)
        for name in names:  # same answers, or the ratio means nothing
            for v in VIEWS:
                if a._view(v, name) != b.fresh_view(v, name):
                    raise AssertionError(f"bench memo: {v}({name}) memo and fresh disagree")
        out[f"{len(names)} pools"] = {"speedup": _summary(ratios), "memo_ns_per_read": _summary(memo_ns)}
    return out


# ------------------------------------------------------------------ oracle


def bench_oracle(args, device):
    from kvarena.spec import Arena, SubPool

    out = {}
    for lazy in (False, True):
        rates = []
        for rep in range(args.repeats):
            rng = random.Random(rep)
            a = Arena(
                16384,
                [SubPool("mamba", 64, 1, "up", "state"), SubPool("swa", 8, 4, "float"), SubPool("full", 16, 4, "down")],
                lazy=lazy,
            )
            live = {n: [] for n in a.chain}
            t = time.perf_counter()
            for _ in range(args.oracle_ops):
                name = rng.choice(a.chain)
                r = rng.random()
                if r < 0.45:
                    got = a.alloc(name, rng.randint(1, 4))
                    if got is None:
                        a.free(name, live[name])
                        live[name] = []
                    else:
                        live[name] += got
                elif r < 0.8 and live[name]:
                    k = rng.randint(1, min(4, len(live[name])))
                    a.free(name, live[name][-k:])
                    del live[name][-k:]
                else:
                    a.available_size(name)
            rates.append(args.oracle_ops / (time.perf_counter() - t))
        out["lazy" if lazy else "eager"] = _summary(rates)
    return out


# ------------------------------------------------------------------- churn


def bench_churn(args, device):
    from kvarena.sim import backends, engine, presets, traces

    out = {}
    trace = traces.generate("balanced", args.churn_requests, seed=1)
    cfg = engine.Config(record=False)  # bytes only: no clock needed
    for name in ("gpt-oss-120b", "gemma-3-27b", "qwen3-next-80b-a3b", "tri-synthetic"):
        sizes = presets.Sizes.of(presets.preset(name))
        row = {}
        for policy in ("anchor", "planner"):
            try:
                backend = backends.Unified(sizes, policy=policy)
            except ValueError as e:
                row[policy] = {"unavailable": str(e)}
                continue
            res = engine.run(backend, sizes, trace, cfg, policy)
            row[policy] = {
                "moved_per_allocated": res.moved_per_allocated,
                "bytes_moved": res.bytes_moved,
                "bytes_allocated": res.bytes_allocated,
            }
        out[name] = row
    return out


# -------------------------------------------------------------------- copy


def copy_envelopes(spec):
    """``--copy-page-kib``: envelope sizes in KiB, comma-separated."""
    try:
        kib = [int(x) for x in str(spec).split(",") if x.strip()]
    except ValueError:
        kib = []
    if not kib or min(kib) < 1:
        raise ValueError(f"bench: --copy-page-kib must be positive KiB counts, comma-separated, got {spec!r}")
    return list(dict.fromkeys(kib))


def copy_paths(device):
    """The slide's paths ``bench_copy`` times on ``device``: the torch path,
    and the Triton path (its plan on the device, one launch; ``kernels.move``)
    where Triton compiles for it (under the interpreter a launch runs as
    Python, no measure of a copy)."""
    import torch

    from kvarena.impl import kernels

    compiled = kernels.unavailable(torch.device(device)) is None and not kernels.interpreting()
    return ("torch", "triton") if compiled else ("torch",)


def bench_copy(args, device):
    """A float of ``L`` live pages leapfrogs across its region
    (``make_room``): every page moves once, ``L * epp`` bytes.  Against
    ``dst.copy_(src)`` of as many bytes in the same buffer, at every
    envelope size of ``--copy-page-kib`` in the same run, on each path of
    ``copy_paths``: each repeat visits every size, in turn, and rotates
    which side goes first."""
    from kvarena.impl import Arena, SubPool

    sizes = [k * 1024 for k in copy_envelopes(args.copy_page_kib)]
    paths = copy_paths(device)
    times = {epp: {side: [] for side in (*paths, "plain")} for epp in sizes}
    for rep in range(args.repeats + 1):  # the first is warm-up
        for epp in sizes[rep % len(sizes) :] + sizes[: rep % len(sizes)]:
            live = max(1, args.copy_mb * (1 << 20) // epp)
            nbytes = live * epp
            sides = {}
            for path in paths:
                a = Arena(
                    epp * (3 * live + 8),
                    [SubPool("lo", epp, 1, "up"), SubPool("f", epp, 1, "float"), SubPool("hi", epp, 1, "down")],
                    device=device,
                    kernels=path,
                )
                a.alloc("f", live)  # parks mid-region
                lo, hi = a.region("f")
                target = (hi - lo - live) * epp  # the low band the whole region less the float: a leapfrog

                def ours(a=a, target=target, live=live):
                    moved = a.make_room("f", "low", target)
                    if moved != live:
                        raise AssertionError(f"bench copy: make_room moved {moved} pages, expected {live}")

                sides[path] = ours
                if path == paths[0]:  # the plain copy: as many bytes, in the first arena's buffer
                    src, dst = a.buffer[:nbytes], a.buffer[nbytes : 2 * nbytes]
                    sides["plain"] = lambda dst=dst, src=src: dst.copy_(src)
            order = list(sides)
            for side in order[rep % len(order) :] + order[: rep % len(order)]:
                _sync(device)
                t = time.perf_counter()
                sides[side]()
                _sync(device)
                if rep:
                    times[epp][side].append(time.perf_counter() - t)
            del sides
    out = {"bytes": max(1, args.copy_mb * (1 << 20) // sizes[0]) * sizes[0], "paths": list(paths), "envelopes": {}}
    for epp in sizes:
        nbytes = max(1, args.copy_mb * (1 << 20) // epp) * epp
        plain_t = times[epp]["plain"]
        row = {"page_bytes": epp, "bytes": nbytes, "copy_GBps": _summary([nbytes / p / 1e9 for p in plain_t])}
        for path, share, rate in (
            ("torch", "share_of_copy_bandwidth", "ours_GBps"),
            ("triton", "kernel_share_of_copy_bandwidth", "kernel_GBps"),
        ):
            if path in paths:  # the path's bandwidth as a share of the plain copy's, repeat by repeat
                row[share] = _summary([p / o for o, p in zip(times[epp][path], plain_t)])
                row[rate] = _summary([nbytes / o / 1e9 for o in times[epp][path]])
        out["envelopes"][f"{epp // 1024} KiB"] = row
    return out


def sglang_batches(args):
    """The sglang section's batches: ``--sglang-batches``, else 1, 64 and ``--batch``."""
    spec = getattr(args, "sglang_batches", None)
    return _batches(spec) if spec else sorted({1, 64, args.batch})


def bench_sglang(args, device):
    """kvarena's allocator (on each kernel choice) against SGLang's own in
    SGLang's stack, one decode step: seconds a step (CUDA events on a CUDA
    device), and kernel launches a step counted the same way on every side."""
    from kvarena.anchor.loader import ensure_installed
    from kvarena.sglang.bench import SIDES, decode_step, decode_step_launches, unavailable

    ensure_installed(allow_install=True)
    missing = {side: why for side in SIDES if (why := unavailable(side, device)) is not None}
    sides = tuple(side for side in SIDES if side not in missing)
    out = {}
    for batch in sglang_batches(args):
        t = decode_step(batch, args.steps, args.warmup, args.repeats, device, _sync, sides)
        row = {"timer": "cuda events" if str(device).startswith("cuda") else "host clock"}
        for side in sides:
            row[f"{side}_us"] = _summary([x * 1e6 for x in t[side]])
            if side != "sglang":
                row[f"{side}_ratio"] = _summary([a / b for a, b in zip(t[side], t["sglang"])])
        row["launches"] = {}
        for side in sides:
            n = decode_step_launches(batch, side, device)
            row["launches"][side] = {"min": min(n), "max": max(n), "steps": n}
        out[f"batch {batch}"] = row
    if missing:
        out["unavailable"] = missing
    return out


# --------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch", type=int, default=256, help="sglang: requests a step (with 1 and 64)")
    p.add_argument(
        "--sglang-batches", default=None, help="sglang: requests a step, comma-separated (instead of 1, 64, --batch)"
    )
    p.add_argument(
        "--kernels",
        choices=("torch", "triton"),
        default=None,
        help="decode: the composite's kernels (default: the device's, triton on CUDA); ops and sglang run both",
    )
    p.add_argument("--decode-batches", default="16,256,1024,4096", help="decode: requests a step, comma-separated")
    p.add_argument("--ops-batches", default="1,64,256,4096", help="ops: requests a step, comma-separated")
    p.add_argument("--steps", type=int, default=128, help="decode: timed steps a repeat, each side")
    p.add_argument("--warmup", type=int, default=16, help="decode: untimed steps first")
    p.add_argument("--start", type=int, default=512, help="decode: prompt length of the first request")
    p.add_argument("--reads", type=int, default=4000, help="memo: read rounds (every view of every pool)")
    p.add_argument("--batch-reads", type=int, default=64, help="memo: read rounds per invalidating step")
    p.add_argument("--oracle-ops", type=int, default=20_000)
    p.add_argument("--churn-requests", type=int, default=1500)
    p.add_argument("--copy-mb", type=int, default=64, help="copy: bytes a leapfrog moves (MiB)")
    p.add_argument(
        "--copy-page-kib", default="4,64,1024", help="copy: page envelopes (KiB, comma-separated), all in one run"
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides alike)")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")


def _print_decode_row(batch, mode, r):
    line = (
        f"decode step, batch {int(batch):,}, {DECODE_LABELS[mode]}: ours / static free list "
        f"{_fmt_ratio(r['ratio'])}; {r['ours_us']['median']:,.0f} us against {r['static_us']['median']:,.0f} us a step"
    )
    if "bytes_moved_per_step" in r:
        line += f"; moves {r['bytes_moved_per_step']:,.0f} B a step ({r['moved_per_allocated']:.2f} per byte allocated)"
    print(line)


def _print_ops(res):
    for side, why in res.get("unavailable", {}).items():
        print(f"ops a decode step, {OPS_LABELS[side]}: not run: {why}")
    for copies in ("with host copies", "without"):
        by_batch = res[copies]
        for side in OPS_LABELS:
            if side not in next(iter(by_batch.values())):
                continue
            n = ", ".join(f"{by_batch[b][side]['launches_max']}" for b in by_batch)
            reads = ", ".join(f"{by_batch[b][side]['reads_max']}" for b in by_batch)
            print(
                f"ops a decode step, {copies}, {OPS_LABELS[side]}, batch {', '.join(by_batch)}: "
                f"launches {n} (the most in a page's worth of steps); host reads {reads}"
            )


def _print_sglang(res):
    from kvarena.sglang.bench import LABELS

    for side, why in res.get("unavailable", {}).items():
        print(f"sglang decode step, {LABELS[side]}: not run: {why}")
    for k, r in res.items():
        if k == "unavailable":
            continue
        for side in r["launches"]:
            if side != "sglang":
                print(
                    f"sglang decode step, {k}: {LABELS[side]} / SGLang's allocator {_fmt_ratio(r[f'{side}_ratio'])}; "
                    f"{r[f'{side}_us']['median']:,.0f} us against {r['sglang_us']['median']:,.0f} us a step "
                    f"({r['timer']})"
                )
        cells = ", ".join(f"{LABELS[side]} {n['min']} to {n['max']}" for side, n in r["launches"].items())
        print(f"sglang decode step, {k}: launches a step (a page's worth of steps, min to max), {cells}")


def _print(section, res):
    if section == "decode":
        for batch, rows in res.items():
            for mode, r in rows.items():
                _print_decode_row(batch, mode, r)
    elif section == "ops":
        _print_ops(res)
    elif section == "memo":
        for k, r in res.items():
            print(
                f"memo, {k}: memoised / fresh {_fmt_ratio(r['speedup'])}; "
                f"{r['memo_ns_per_read']['median']:,.0f} ns a memoised read"
            )
    elif section == "oracle":
        for k, r in res.items():
            print(f"spec oracle, {k:5s}: {r['median']:,.0f} simple ops/s median (min {r['min']:,.0f})")
    elif section == "churn":
        for name, row in res.items():
            cells = [
                f"{pol} " + (f"{r['moved_per_allocated']:.3f}" if "moved_per_allocated" in r else "unavailable")
                for pol, r in row.items()
            ]
            print(f"churn, {name}: bytes moved per byte allocated: " + ", ".join(cells))
    elif section == "sglang":
        _print_sglang(res)
    elif section == "copy":
        for r in res["envelopes"].values():
            paths = [("torch", "share_of_copy_bandwidth", "ours_GBps")]
            paths += [("Triton", "kernel_share_of_copy_bandwidth", "kernel_GBps")] if "kernel_GBps" in r else []
            for path, share, rate in paths:
                print(
                    f"copy, {r['bytes'] / (1 << 20):,.0f} MiB in {r['page_bytes'] // 1024} KiB pages: make_room on "
                    f"{path} at {_fmt_ratio(r[share], '')} of a plain copy's bandwidth "
                    f"({r[rate]['median']:.2f} against {r['copy_GBps']['median']:.2f} GB/s)"
                )
        if res["paths"] == ["torch"]:
            print("copy: the Triton path (a relocation kernel) runs only where Triton compiles: on CUDA")


def run(args: argparse.Namespace) -> int:
    """``kvarena bench``; a bad argument raises ``ValueError`` (the CLI prints it, exit code 2)."""
    from kvarena.impl import kernels

    kernels.interpret_without_cuda()  # before anything imports triton: its kernels run on the CPU, interpreted
    import torch

    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    for s in sections:
        if s not in SECTIONS:
            raise ValueError(f"bench: unknown section {s!r}; sections: {', '.join(SECTIONS)}")
    if "copy" in sections:
        copy_envelopes(args.copy_page_kib)  # a bad list fails before any section runs
    if "sglang" in sections:
        sglang_batches(args)  # likewise
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("bench: --device cuda, but torch sees no CUDA device")
    decode_kernels = kernels.choose(args.kernels, torch.device(args.device))  # Triton where it cannot run: why
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"cpu, {args.threads} thread(s)"
    triton = kernels.unavailable(torch.device(args.device))
    triton = "interpreted (its times are not a GPU's)" if triton is None and kernels.interpreting() else triton
    triton = triton or "compiled"
    print(f"kvarena bench on {where}, torch {torch.__version__}, {args.repeats} repeats; Triton: {triton}")
    runners = {
        "decode": bench_decode,
        "ops": bench_ops,
        "memo": bench_memo,
        "oracle": bench_oracle,
        "churn": bench_churn,
        "copy": bench_copy,
        "sglang": bench_sglang,
    }
    out = {"device": where, "torch": torch.__version__, "repeats": args.repeats, "triton": triton}
    if "decode" in sections:
        out["decode_kernels"] = decode_kernels
    for s in sections:
        out[s] = runners[s](args, args.device)
        _print(s, out[s])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"json: {args.json}")
    return 0
