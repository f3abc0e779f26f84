"""``kvarena simulate``: the unified arena against static splits, one trace.

Four setups serve the same trace, with the same buffer and model geometry:

- ``unified``: the preset's composite (``kvarena.impl``), anchor policy, lazy;
- ``planner``: the same with ``policy="planner"`` (reported as unavailable
  where this build does not have the planner);
- ``static-default``: a static split at the engine defaults (SWA-to-full
  token ratio 0.8, mamba-to-full memory ratio 0.9; ANCHOR section 2);
- ``static-best``: the static split that, in hindsight, admitted the most
  (mean admitted concurrency over its memory-bound steps), found by a grid
  search over the ratios with two rounds of refinement around the best
  point; a split that has to reject a request the unified arena served, or
  that memory hardly bound, is not a candidate.

Ratios of mean admitted concurrency are reported only where memory bound
both sides in at least 5% of their steps (``MIN_BOUND_SHARE``); elsewhere
memory was not the limit and the ratio would compare ramps.

Prints a markdown table per (preset, trace) and the ratios; ``--json PATH``
writes every number, ``--plot PATH`` a PNG of the unified arena's band
boundaries over time with the static walls drawn.
"""

import argparse
import json
import time

SETUPS = ("unified", "planner", "static-default", "static-best")
SWA_GRID = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0)
STATE_GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # state's share of the buffer
TRI_SWA_GRID = (0.05, 0.1, 0.2, 0.4, 0.8)
TRI_STATE_GRID = (0.1, 0.3, 0.5, 0.7, 0.9)
REFINE_ROUNDS = 2


# ----------------------------------------------------------------- setups


def _static(sizes, trace, cfg, swa_ratio, state_share, name):
    from kvarena.sim import backends, engine, presets

    split = presets.static_split(sizes, swa_ratio, state_share / (1 - state_share))
    res = engine.run(backends.StaticSplit(sizes, split), sizes, trace, cfg, name)
    res.split = {
        "swa_ratio": split.swa_ratio,
        "state_share": round(state_share, 4) if "state" in sizes.preset.kinds else 0.0,
    }
    return res, split


def _better(a, b):
    """Is result ``a`` a better static split than ``b``?"""
    return (a.mean_concurrency, a.tokens_per_step) > (b.mean_concurrency, b.tokens_per_step)


def best_static(sizes, trace, cfg, max_rejected=0, progress=None):
    """Grid search over the split's ratios, then ``REFINE_ROUNDS`` rounds of
    midpoints around the best; returns ``(result, split, runs)``."""
    kinds = sizes.preset.kinds
    tri = "swa" in kinds and "state" in kinds
    axes = []
    if "swa" in kinds:
        axes.append(sorted(TRI_SWA_GRID if tri else SWA_GRID))
    if "state" in kinds:
        axes.append(sorted(TRI_STATE_GRID if tri else STATE_GRID))
    seen = {}

    def point(p):
        p = tuple(round(x, 6) for x in p)
        if p not in seen:
            swa = p[0] if "swa" in kinds else 0.8
            state = p[-1] if "state" in kinds else 0.5
            seen[p] = _static(sizes, trace, cfg, swa, state, "static-best")
            if progress:
                progress(f"static split {p}: mean concurrency {seen[p][0].mean_concurrency:.1f}")
        return seen[p]

    def ok(r):
        return r.rejected <= max_rejected and r.stuck == 0 and _bound(r)

    grid = [()]
    for axis in axes:
        grid = [g + (x,) for g in grid for x in axis]
    best = None
    for p in grid:
        r, _ = point(p)
        if ok(r) and (best is None or _better(r, seen[best][0])):
            best = tuple(round(x, 6) for x in p)
    if best is None:  # no split qualifies: the one that rejects least, then admits most
        best = min(seen, key=lambda k: (seen[k][0].rejected, -seen[k][0].mean_concurrency_all))
    for _ in range(REFINE_ROUNDS):
        for d, axis in enumerate(axes):
            vals = sorted({q[d] for q in seen} | set(axis))
            i = vals.index(best[d])
            for j in (i - 1, i + 1):
                if 0 <= j < len(vals):
                    p = list(best)
                    p[d] = (vals[i] + vals[j]) / 2
                    r, _ = point(p)
                    if ok(r) and _better(r, seen[best][0]):
                        best = tuple(round(x, 6) for x in p)
    r, split = seen[best]
    return r, split, len(seen)


def run_one(sizes, trace, cfg, setups=SETUPS, progress=None):
    """Every setup on one trace: ``{setup: Result or {"unavailable": why}}``,
    the default and best splits, and timings."""
    from kvarena.sim import backends, engine, presets

    out, splits, seconds = {}, {}, {}
    for name in setups:
        t = time.perf_counter()
        if name in ("unified", "planner"):
            policy = "anchor" if name == "unified" else "planner"
            try:
                backend = backends.Unified(sizes, policy=policy)
            except ValueError as e:
                if "policy" not in str(e):
                    raise
                out[name] = {"unavailable": f"policy={policy!r} is not in this build ({e})"}
                continue
            out[name] = engine.run(backend, sizes, trace, cfg, name)
        elif name == "static-default":
            split = presets.static_split(sizes)
            out[name] = engine.run(backends.StaticSplit(sizes, split), sizes, trace, cfg, name)
            out[name].split = {"swa_ratio": split.swa_ratio, "state_share": _share(split.mamba_ratio)}
            splits[name] = split
        elif name == "static-best":
            unified = out.get("unified")
            limit = unified.rejected if hasattr(unified, "rejected") else 0
            out[name], splits[name], runs = best_static(sizes, trace, cfg, limit, progress)
            out[name].split["grid_runs"] = runs
        else:
            raise ValueError(f"unknown setup {name!r}; setups: {', '.join(SETUPS)}")
        seconds[name] = time.perf_counter() - t
        if progress:
            progress(f"{name}: {seconds[name]:.1f}s")
    return out, splits, seconds


def _share(mamba_ratio):
    return round(mamba_ratio / (1 + mamba_ratio), 4) if mamba_ratio else 0.0


MIN_BOUND_SHARE = 0.05  # a ratio needs memory to have bound in this share of each side's steps


def _bound(res):
    return res.memory_bound_steps >= MIN_BOUND_SHARE * res.steps


def ratios(results):
    """Mean admitted concurrency of each unified setup over each static one;
    None where memory hardly bound one side (the ratio would compare ramps)."""
    out = {}
    for u in ("unified", "planner"):
        for s in ("static-default", "static-best"):
            a, b = results.get(u), results.get(s)
            if hasattr(a, "mean_concurrency") and hasattr(b, "mean_concurrency"):
                out[f"{u} / {s}"] = a.mean_concurrency / b.mean_concurrency if _bound(a) and _bound(b) else None
    return out


# ----------------------------------------------------------------- report

COLUMNS = (
    ("peak conc", "peak_concurrency", "{:,}"),
    ("mean conc", "mean_concurrency", "{:,.1f}"),
    ("tokens/step", "tokens_per_step", "{:,.0f}"),
    ("retractions", "retractions", "{:,}"),
    ("evictions", "evictions", "{:,}"),
    ("util", "utilisation", "{:.0%}"),
    ("moved/alloc", "moved_per_allocated", "{:.3f}"),
    ("refusals", "refusals", "{:,}"),
    ("false OOM", "false_oom", "{:,}"),
)


def _split_label(res):
    c = res.split
    parts = []
    if c.get("swa_ratio"):
        parts.append(f"swa {c['swa_ratio']:.3g}")
    if c.get("state_share"):
        parts.append(f"state {c['state_share']:.0%}")
    return ", ".join(parts) or "-"


def table(results):
    lines = ["| setup | split | " + " | ".join(c[0] for c in COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for name, res in results.items():
        if isinstance(res, dict):
            lines.append(f"| {name} | {res['unavailable']} |" + " |" * len(COLUMNS))
            continue
        label = "one buffer" if name in ("unified", "planner") else _split_label(res)
        cells = [fmt.format(getattr(res, key)) for _, key, fmt in COLUMNS]
        lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(preset, trace_name, n, results, seconds):
    head = f"### {preset} / {trace_name} ({n:,} requests)"
    rat = ratios(results)
    tail = "; ".join(f"{k}: " + (f"{v:.2f}x" if v is not None else "n/a (memory hardly bound)") for k, v in rat.items())
    bad = [
        f"{k}: finished {r.finished}, rejected {r.rejected}, stuck {r.stuck}, lost {r.lost}"
        for k, r in results.items()
        if not isinstance(r, dict) and (r.stuck or r.lost)
    ]
    secs = ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items())
    return "\n".join(
        [head, "", table(results), "", f"mean admitted concurrency: {tail}", f"time: {secs}"]
        + (["PROBLEM: " + "; ".join(bad)] if bad else [])
    )


def summary(dump):
    """One row per (preset, trace): the ratios, the best split, false OOMs,
    retractions and relocation, from ``--json``'s runs."""

    def f(v):
        return "n/a" if v is None else f"{v:.2f}x"

    def get(r, k, fmt):
        return format(r[k], fmt) if k in r else "-"

    lines = [
        "| preset | trace | unified / static default | unified / static best | planner / static best | "
        "best split | false OOM: unified, planner, default | retractions: unified, default | "
        "moved/alloc: unified, planner |",
        "|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for run in dump:
        st, ra = run["setups"], run["ratios"]
        u, p, d, b = (st.get(k, {}) for k in ("unified", "planner", "static-default", "static-best"))
        c = b.get("split", {})
        split = (
            ", ".join(
                ([f"swa {c['swa_ratio']:.3g}"] if c.get("swa_ratio") else [])
                + ([f"state {c['state_share']:.0%}"] if c.get("state_share") else [])
            )
            or "-"
        )
        lines.append(
            f"| {run['preset']} | {run['trace']} | {f(ra.get('unified / static-default'))} | "
            f"{f(ra.get('unified / static-best'))} | {f(ra.get('planner / static-best'))} | {split} | "
            f"{get(u, 'false_oom', ',')}, {get(p, 'false_oom', ',')}, {get(d, 'false_oom', ',')} | "
            f"{get(u, 'retractions', ',')}, {get(d, 'retractions', ',')} | "
            f"{get(u, 'moved_per_allocated', '.3f')}, {get(p, 'moved_per_allocated', '.3f')} |"
        )
    return "\n".join(lines)


def _plot_path(base, preset, trace_name, many):
    if not many:
        return base
    stem, dot, ext = base.rpartition(".")
    return f"{stem}-{preset}-{trace_name}.{ext}" if dot else f"{base}-{preset}-{trace_name}"


# -------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.add_argument("--preset", default="gpt-oss-120b", help="model preset(s), comma-separated, or 'all'")
    p.add_argument(
        "--trace", default="balanced", help="trace kind(s), comma-separated, or 'all' (balanced, long, short, shift)"
    )
    p.add_argument("--trace-file", metavar="JSONL", help="read the trace from a JSONL file instead")
    p.add_argument("--requests", type=int, default=10_000, help="requests per generated trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-gib", type=float, default=40.0, help="KV memory budget (GiB)")
    p.add_argument("--page-tokens", type=int, default=16, help="tokens a page (one simulated unit)")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="chunked-prefill chunk")
    p.add_argument(
        "--reserve-ratio",
        type=float,
        default=0.3,
        help="share of the running requests' remaining output reserved at admission",
    )
    p.add_argument("--setups", default=",".join(SETUPS), help="setups to run, comma-separated")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of the band boundaries over time")


def _names(arg, known, what):
    names = list(known) if arg == "all" else [x.strip() for x in arg.split(",") if x.strip()]
    for n in names:
        if n not in known:
            raise ValueError(f"unknown {what} {n!r}; {what}s: {', '.join(known)}")
    return names


def run(args: argparse.Namespace) -> int:
    """``kvarena simulate``; a bad argument raises ``ValueError`` (the CLI prints it, exit code 2)."""
    import torch

    from kvarena.sim import engine, presets, traces

    torch.set_num_threads(1)  # small tensors: threads cost more than they give on a loaded CPU
    preset_names = _names(args.preset, presets.PRESETS, "preset")
    setups = _names(args.setups, SETUPS, "setup")
    if args.trace_file:
        trace_sets = [(args.trace_file, traces.read_jsonl(args.trace_file))]
    else:
        trace_sets = [
            (k, traces.generate(k, args.requests, args.seed)) for k in _names(args.trace, traces.KINDS, "trace")
        ]
    cfg = engine.Config(chunk_tokens=args.chunk_tokens, reserve_ratio=args.reserve_ratio, record=bool(args.plot))
    many = len(preset_names) * len(trace_sets) > 1
    dump = []
    for pname in preset_names:
        sizes = presets.Sizes.of(presets.preset(pname), args.budget_gib, args.page_tokens)
        for tname, trace in trace_sets:
            results, splits, seconds = run_one(sizes, trace, cfg, setups)
            print(report(pname, tname, len(trace), results, seconds), flush=True)
            print()
            dump.append(
                {
                    "preset": pname,
                    "trace": tname,
                    "requests": len(trace),
                    "setups": {k: (r if isinstance(r, dict) else r.numbers()) for k, r in results.items()},
                    "ratios": ratios(results),
                    "seconds": seconds,
                }
            )
            if args.plot:
                from kvarena.sim import plot

                path = _plot_path(args.plot, pname, tname, many)
                plot.bands(path, sizes, results, splits, f"{pname} / {tname}")
                print(f"plot: {path}")
    if many:
        print("### summary\n\n" + summary(dump) + "\n")
    if args.json:
        settings = {k: getattr(args, k) for k in ("budget_gib", "page_tokens", "chunk_tokens", "reserve_ratio", "seed")}
        with open(args.json, "w") as f:
            json.dump({**settings, "runs": dump}, f, indent=1)
        print(f"json: {args.json}")
    problems = [d for d in dump for r in d["setups"].values() if r.get("stuck") or r.get("lost")]
    return 1 if problems else 0
