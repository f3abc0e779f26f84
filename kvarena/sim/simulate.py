"""``kvarena simulate``: the unified arena against static splits and vLLM's
padded pool, on the same traces, buffer and model geometry.

Seven setups, each under its engine's own defaults (``kvarena.sim.engines``),
SGLang's running cap on a model with recurrent state included
(``Engine.running_cap``: its mamba slots over a request's share):

- ``unified``: the preset's composite (``kvarena.impl``), anchor policy,
  lazy, as kvarena runs inside SGLang: with the cap SGLang sizes from its
  default split, which the drop-in inherits;
- ``unified-uncapped``: the same with that cap lifted, to show what it costs
  (only where it exists; not how SGLang 0.5.23 runs);
- ``planner``: ``unified`` with ``policy="planner"`` (reported as unavailable
  where this build does not have the planner);
- ``static-default``: what SGLang runs by default: a static split at its
  defaults (SWA-to-full token ratio 0.8, mamba-to-full memory ratio 0.9;
  docs/anchor.md §2), capped from its own slots; on a model whose hybrid SWA
  memory SGLang turns off (Gemma 2 and 3), one pool with every layer's KV at
  full length, where kvarena cannot engage;
- ``static-best``: the configuration that, in hindsight, served best
  (output tokens a second, then goodput, then mean admitted concurrency),
  found by a grid search over each ratio's whole range (SWA tokens per full
  token in (0, 1], state's share in (0, 1)) and ``REFINE_ROUNDS`` rounds of
  midpoints around the best point, a range's open end counting as a
  neighbour, so an optimum near an edge is approached; where the best is
  still the outermost value tried toward an open end, the report says
  ``edge``.  Every split that serves the trace (rejects no request the
  unified arena served) competes, and so does ``static-default``, so
  ``static-best`` is never below it.  It is chosen once for the whole
  trace, as a deployment chooses its split at boot;
- ``static-phase-oracle``: on a trace with phases (``traces``' ``phases``
  kind), the best split of each phase on its own, as if the engine drained
  and re-split at every phase boundary (``kvarena.sim.oracle``; it loses
  the overlap of one phase's tail with the next one's head, so it can fall
  below ``static-best``);
- ``vllm-padded``: vLLM v1's hybrid allocator, one block pool with every
  kind's page padded to one size (``kvarena.sim.padded``).

Each (preset, trace) runs on ``--seeds`` seeds (five by default), each seed
its own trace; every figure is the mean over the seeds, and each ratio has
its 95% interval (``kvarena.sim.stats``), flagged where it crosses 1.0.
The runs are independent and run in parallel, one process per core
(``--jobs``); ``--merge`` reports the ``--json`` files of runs made
elsewhere (one job per seed on a cluster) as one.

The prefix cache is on by default, as both engines ship it: every setup
gets the same radix-style prefix cache (``kvarena.sim.prefix``), with each
engine's own mamba checkpoints (``kvarena.sim.engines``: SGLang's
``--mamba-radix-cache-strategy``, ``extra_buffer`` by default; vLLM's
``align`` mode); ``--prefix-cache off`` runs without it, and ``both`` runs
each trace off and on.

Saturating runs queue every request at time 0; ``--rates`` adds, per seed,
one run per arrival rate (``--arrivals poisson`` or ``bursty``), with
``static-best`` keeping the split the saturating search found.  Times come
from ``kvarena.sim.timing`` (a roofline on ``--accelerator``, relocation at
copy bandwidth, and the allocator's kernel launches, ``--alloc-cost``).

Ratios of mean admitted concurrency are reported only where memory bound
both sides in at least 5% of their steps (``MIN_BOUND_SHARE``); elsewhere
memory was not the limit and the ratio would compare ramps.

Prints a markdown table per (preset, trace, load) and a summary; ``--json
PATH`` writes every number, ``--plot PATH`` a PNG of the unified arena's
band boundaries over time with the static walls drawn (and with
``--rates`` the throughput-latency and goodput curves).
"""

import argparse
import copy
import json
import time

SETUPS = (
    "unified",
    "unified-uncapped",
    "planner",
    "static-default",
    "static-best",
    "static-phase-oracle",
    "vllm-padded",
)
ENGINE_OF = {"vllm-padded": "vllm"}  # every other setup runs under SGLang's defaults
# The best split's search covers each ratio's whole range: SWA tokens per full
# token in (0, 1] (a request never holds more SWA than full KV), state's share
# of the buffer in (0, 1).  Refinement halves the gap to the best point's
# neighbours, a range's open bound counting as a neighbour, so an optimum near
# an edge is approached, not cut off by the grid.
SWA_RANGE = (0.0, 1.0, True)  # low, high, high reachable
STATE_RANGE = (0.0, 1.0, False)
SWA_GRID = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0)
STATE_GRID = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
TRI_SWA_GRID = (0.05, 0.1, 0.2, 0.4, 0.8)
TRI_STATE_GRID = (0.1, 0.3, 0.5, 0.7, 0.9)
REFINE_ROUNDS = 3


# ----------------------------------------------------------------- setups


class Unbootable(ValueError):
    """A split SGLang refuses to start with."""


def _sglang_static(sizes, split, trace, cfg, name):
    """``split`` under SGLang's defaults, its running capped as SGLang caps
    it from the split's own mamba slots (``engines.Engine.running_cap``)."""
    from kvarena.sim import backends, engine, engines

    sglang = engines.SGLANG
    cap = sglang.running_cap(sizes.preset, split.slots, cfg.prefix_cache, cfg.mamba_strategy)
    if cap is not None and cap < 1:  # SGLang refuses to start ("state cache is too small to serve any requests")
        raise Unbootable(f"{split.slots} state slots cap running requests at {cap}")
    res = engine.run(backends.StaticSplit(sizes, split, max_running=cap), sizes, trace, cfg, name, sglang)
    res.split = {
        "swa_ratio": split.swa_ratio,
        "state_share": _share(split.mamba_ratio) if "state" in sizes.preset.kinds else 0.0,
    }
    return res


def _static(sizes, trace, cfg, swa_ratio, state_share, name):
    from kvarena.sim import presets

    split = presets.static_split(sizes, swa_ratio, state_share / (1 - state_share))
    res = _sglang_static(sizes, split, trace, cfg, name)
    if "state" in sizes.preset.kinds:
        res.split["state_share"] = round(state_share, 4)
    return res, split


FULL_LENGTH = "full-length"  # run_one's best_split where the full-length pool won the search


def _full_length(sizes, trace, cfg, name):
    """What SGLang runs on a model whose hybrid SWA memory it turns off
    (``engines.Engine.runs_hybrid``): one full-attention pool, every
    layer's KV at full length, on the same budget."""
    from kvarena.sim import presets

    own = presets.Sizes.of(
        sizes.preset.at_full_length(), page_tokens=sizes.page_tokens, budget_bytes=sizes.budget_bytes
    )
    split = presets.static_split(own)
    res = _sglang_static(own, split, trace, cfg, name)
    res.split = {"full_length": True}
    return res, split


def _better(a, b):
    """Is result ``a`` a better static split than ``b``?  Output throughput
    first (what users buy), then goodput, then admitted concurrency."""
    return (a.output_tokens_per_s, a.goodput, a.mean_concurrency) > (
        b.output_tokens_per_s,
        b.goodput,
        b.mean_concurrency,
    )


def _neighbours(vals, x, rng):
    """The midpoints between ``x`` and its nearest tried values on each side;
    past the last tried value, the range's bound, if it is not itself a
    value a split can take (then ``x`` on it has no neighbour that side)."""
    lo, hi, hi_reachable = rng
    below = [v for v in vals if v < x]
    above = [v for v in vals if v > x]
    out = [(x + (below[-1] if below else lo)) / 2]
    if above:
        out.append((x + above[0]) / 2)
    elif not (hi_reachable and x >= hi):
        out.append((x + hi) / 2)
    return out


def best_static(sizes, trace, cfg, max_rejected=0, progress=None, others=()):
    """Grid search over the split's ratios, then ``REFINE_ROUNDS`` rounds of
    midpoints around the best (``_neighbours``); returns ``(result, split,
    runs)``.  Every split that serves the trace (rejects no more than
    ``max_rejected`` requests and leaves none stuck) competes, ranked by
    ``_better``; the engine's default split is one of the points tried, and
    ``others`` (``(result, split)`` pairs, e.g. what the engine runs where
    it runs no split) compete too, so the best is never below any of them.
    Where no split serves the trace, the one that rejects least, then admits
    most, is returned.  ``result.split["edge"]`` names each ratio whose best
    value is the outermost one tried toward an open end of its range: there
    the optimum may lie further out than the search went."""
    from kvarena.sim import presets

    kinds = sizes.preset.kinds
    tri = "swa" in kinds and "state" in kinds
    axes, ranges, names = [], [], []
    default = []
    if "swa" in kinds:
        axes.append(sorted(TRI_SWA_GRID if tri else SWA_GRID))
        ranges.append(SWA_RANGE)
        names.append("swa")
        default.append(presets.DEFAULT_SWA_RATIO)
    if "state" in kinds:
        axes.append(sorted(TRI_STATE_GRID if tri else STATE_GRID))
        ranges.append(STATE_RANGE)
        names.append("state")
        default.append(_share(presets.DEFAULT_MAMBA_RATIO))
    seen = {}

    def key(p):
        return tuple(round(x, 6) for x in p)

    def point(p):
        p = key(p)
        if p not in seen:
            swa = p[0] if "swa" in kinds else 0.8
            state = p[-1] if "state" in kinds else 0.5
            try:
                seen[p] = _static(sizes, trace, cfg, swa, state, "static-best")
            except Unbootable:
                seen[p] = (None, None)  # tried, and not a candidate
            if progress and seen[p][0] is not None:
                progress(f"static split {p}: {seen[p][0].output_tokens_per_s:,.0f} output tok/s")
        return seen[p]

    def ok(r):
        return r is not None and r.rejected <= max_rejected and r.stuck == 0

    grid = [()]
    for axis in axes:
        grid = [g + (x,) for g in grid for x in axis]
    best = None
    for p in [*grid, tuple(default)]:
        r, _ = point(p)
        if ok(r) and (best is None or _better(r, seen[best][0])):
            best = key(p)
    if best is None:  # no split serves the trace: the one that rejects least, then admits most
        booted = [k for k in seen if seen[k][0] is not None]
        if not booted:
            raise ValueError(f"simulate: preset {sizes.preset.name!r}: SGLang starts with no split of this buffer")
        best = min(booted, key=lambda k: (seen[k][0].rejected, -seen[k][0].mean_concurrency_all))
    for _ in range(REFINE_ROUNDS):
        for d, rng in enumerate(ranges):
            vals = sorted({q[d] for q in seen})
            for x in _neighbours(vals, best[d], rng):
                p = list(best)
                p[d] = x
                r, _ = point(p)
                if ok(r) and _better(r, seen[best][0]):
                    best = key(p)
    r, split = seen[best]
    edge = []
    for d, rng in enumerate(ranges):
        vals = sorted({q[d] for q in seen})
        if best[d] == vals[0] or (best[d] == vals[-1] and not (rng[2] and best[d] >= rng[1])):
            edge.append(names[d])
    r.split["edge"] = edge
    for other, other_split in others:
        if ok(other) and (not ok(r) or _better(other, r)):
            r, split = copy.copy(other), other_split  # its own split dict: the caller annotates it
            r.split = dict(other.split, edge=[])
    return r, split, len(seen)


def run_one(sizes, trace, cfg, setups=SETUPS, progress=None, best_split=None, oracle_split=None):
    """Every setup on one trace: ``{setup: Result or {"unavailable": why}}``,
    the default and best splits, and timings.  ``best_split`` (``(swa_ratio,
    state_share)``) fixes ``static-best`` instead of searching: a sweep over
    arrival rates uses the split found on the saturating trace.  Each setup
    runs under its engine's defaults (``ENGINE_OF``, ``kvarena.sim.engines``),
    SGLang's running cap included (``Engine.running_cap``: the unified setups
    inherit the default split's, as kvarena's drop-in does);
    ``unified-uncapped`` runs only where that cap exists, and
    ``static-phase-oracle`` only on a trace with phases (``oracle_split``,
    the oracle's ``split`` from the saturating trace, fixes its phases'
    splits instead of searching, as ``best_split`` does static-best's)."""
    from kvarena.sim import backends, engine, engines, presets

    sglang = engines.SGLANG
    p = sizes.preset
    default_slots = presets.static_split(sizes).slots
    out, splits, seconds = {}, {}, {}
    for name in setups:
        t = time.perf_counter()
        if name in ("unified", "planner", "unified-uncapped"):
            policy = "planner" if name == "planner" else "anchor"
            cap = sglang.running_cap(p, default_slots, cfg.prefix_cache, cfg.mamba_strategy)
            if name == "unified-uncapped":
                if cap is None:
                    continue  # the same as unified
                cap = None
            if cap is not None and cap < 1:
                out[name] = {
                    "unavailable": f"SGLang refuses to start: its default split's {default_slots} state slots "
                    f"cap running requests at {cap}"
                }
                continue
            try:
                backend = backends.Unified(sizes, policy=policy, max_running=cap)
            except ValueError as e:
                if "policy" not in str(e):
                    raise
                out[name] = {"unavailable": f"policy={policy!r} is not in this build ({e})"}
                continue
            out[name] = engine.run(backend, sizes, trace, cfg, name, sglang)
        elif name == "static-default":
            try:
                if sglang.runs_hybrid(p) or not p.swa_bytes:
                    split = presets.static_split(sizes)
                    out[name] = _sglang_static(sizes, split, trace, cfg, name)
                else:
                    out[name], split = _full_length(sizes, trace, cfg, name)
            except Unbootable as e:
                out[name] = {"unavailable": f"SGLang refuses to start: {e}"}
                continue
            splits[name] = split
        elif name == "vllm-padded":
            from kvarena.sim import padded

            vllm = engines.VLLM
            own = presets.Sizes.of(vllm.preset(p), page_tokens=sizes.page_tokens, budget_bytes=sizes.budget_bytes)
            out[name] = engine.run(padded.PaddedPool(own, cfg.prefix_cache), own, trace, cfg, name, vllm)
        elif name == "static-best" and best_split == FULL_LENGTH:
            out[name], splits[name] = _full_length(sizes, trace, cfg, name)
            out[name].split["from"] = "the saturating trace's search"
        elif name == "static-best" and best_split is not None:
            out[name], splits[name] = _static(sizes, trace, cfg, *best_split, name)
            out[name].split["from"] = "the saturating trace's search"
        elif name == "static-best":
            unified = out.get("unified")
            limit = unified.rejected if hasattr(unified, "rejected") else 0
            default = out.get("static-default")
            others = [(default, splits["static-default"])] if hasattr(default, "steps") else []
            out[name], splits[name], runs = best_static(sizes, trace, cfg, limit, progress, others)
            out[name].split["grid_runs"] = runs
        elif name == "static-phase-oracle":
            if not any(r.phase >= 0 for r in trace):
                continue  # a trace without phases
            from kvarena.sim import oracle

            fixed = oracle.fixed(oracle_split) if oracle_split else None
            out[name] = oracle.per_phase(sizes, trace, cfg, progress=progress, splits=fixed)
        else:
            raise ValueError(f"unknown setup {name!r}; setups: {', '.join(SETUPS)}")
        seconds[name] = time.perf_counter() - t
        if progress:
            progress(f"{name}: {seconds[name]:.1f}s")
    return out, splits, seconds


def _share(mamba_ratio):
    return round(mamba_ratio / (1 + mamba_ratio), 4) if mamba_ratio else 0.0


MIN_BOUND_SHARE = 0.05  # a concurrency ratio needs memory to have bound in this share of each side's steps

# The ratios, in the order every report gives them: what users buy first
# (output tokens a second, goodput), then admitted concurrency, which
# explains them.  A concurrency ratio is kept only where memory bound both
# sides (``_bound``); the others wherever the denominator is not 0.
METRICS = (
    ("output_tokens_per_s", "output tokens/s"),
    ("goodput", "goodput"),
    ("mean_concurrency", "mean admitted concurrency"),
)
BASELINES = ("static-default", "static-best", "static-phase-oracle", "vllm-padded")
UNIFIED = ("unified", "unified-uncapped", "planner")


def _bound(res):
    return res.memory_bound_steps >= MIN_BOUND_SHARE * res.steps


def ratios(results):
    """Each metric of ``METRICS`` for each unified setup over each baseline:
    ``{metric: {"unified / static-best": ratio or None}}``; None where the
    baseline's figure is 0, and for concurrency where memory hardly bound
    one side (the ratio would compare ramps)."""
    out = {m: {} for m, _ in METRICS}
    for u in UNIFIED:
        for b in BASELINES:
            x, y = results.get(u), results.get(b)
            if not (hasattr(x, "steps") and hasattr(y, "steps")):
                continue
            for m, _ in METRICS:
                num, den = getattr(x, m), getattr(y, m)
                ok = den > 0 and (m != "mean_concurrency" or (_bound(x) and _bound(y)))
                out[m][f"{u} / {b}"] = num / den if ok else None
    return out


# ----------------------------------------------------------------- report

# (header, result field(s), format, scale, with its interval)
COLUMNS = (
    ("out tok/s", "output_tokens_per_s", "{:,.0f}", 1, True),
    ("goodput req/s", "goodput", "{:,.2f}", 1, True),
    ("TTFT p50 / p99 s", ("ttft_p50", "ttft_p99"), "{:,.2f}", 1, False),
    ("ITL p50 / p99 ms", ("itl_p50", "itl_p99"), "{:,.1f}", 1000, False),
    ("mean conc", "mean_concurrency", "{:,.1f}", 1, True),
    ("peak conc", "peak_concurrency", "{:,.0f}", 1, False),
    ("cache hit", "cache_hit_rate", "{:.0%}", 1, False),
    ("retractions", "retractions", "{:,.0f}", 1, False),
    ("evictions", "evictions", "{:,.0f}", 1, False),
    ("util", "utilisation", "{:.0%}", 1, False),
    ("moved/alloc", "moved_per_allocated", "{:.3f}", 1, False),
    ("alloc launches/step", "launches_per_step", "{:,.0f}", 1, False),
    ("alloc time", "alloc_share", "{:.2%}", 1, False),
    ("refusals", "refusals", "{:,.0f}", 1, False),
    ("false OOM", "false_oom", "{:,.0f}", 1, False),
)
# The summary's ratio columns: throughput and goodput first.
SUMMARY_RATIOS = (
    ("output_tokens_per_s", "unified / static-best", "out tok/s: unified / static best"),
    ("goodput", "unified / static-best", "goodput: unified / static best"),
    ("output_tokens_per_s", "unified / static-default", "out tok/s: unified / static default"),
    ("output_tokens_per_s", "unified / vllm-padded", "out tok/s: unified / vLLM padded"),
    ("goodput", "unified / vllm-padded", "goodput: unified / vLLM padded"),
    ("output_tokens_per_s", "unified-uncapped / static-default", "out tok/s: cap lifted / static default"),
    ("output_tokens_per_s", "unified / static-phase-oracle", "out tok/s: unified / per-phase oracle"),
    ("mean_concurrency", "unified / static-best", "concurrency: unified / static best"),
)
LABELS = {
    "unified": "one buffer",
    "planner": "one buffer, planner policy",
    "static-default": "engine default",
    "unified-uncapped": "one buffer, SGLang's mamba running cap lifted (not how SGLang 0.5.23 runs)",
    "static-phase-oracle": "each phase's best split, the phases run apart (a re-split at every drained boundary)",
    "vllm-padded": "one padded block pool",
}


def _keys(col):
    """The result fields a column shows (one, or a pair like p50 / p99)."""
    return col[1] if isinstance(col[1], tuple) else (col[1],)


def _figures(row):
    """A setup's figures from its result, with the derived ones the columns show."""
    out = dict(row)
    out["launches_per_step"] = row.get("launches", 0) / max(1, row.get("steps", 0))
    out["alloc_share"] = row.get("alloc_seconds", 0.0) / row["seconds"] if row.get("seconds") else 0.0
    return out


def _cell(col, cols):
    """A column's cell from ``{key: (mean, half)}``, with its interval where the column has one."""
    text = " / ".join(col[2].format(cols[k][0] * col[3]) for k in _keys(col))
    half = cols[col[1]][1] if col[4] else None
    if half is None:
        return text
    return text + " ±" + col[2].format(half * col[3]).replace("%", "") + ("%" if "%" in col[2] else "")


def _split_label(split):
    if split.get("full_length"):  # engines.Engine.runs_hybrid
        return "every layer at full length (SGLang turns hybrid SWA memory off here)"
    if split.get("phases"):  # oracle.per_phase: one split a phase
        return "per phase: " + " | ".join(_split_label(x) for x in split["phases"])
    parts = []
    if split.get("swa_ratio"):
        parts.append(f"swa {split['swa_ratio']:.3g}")
    if split.get("state_share"):
        parts.append(f"state {split['state_share']:.1%}".replace(".0%", "%"))
    label = ", ".join(parts) or "-"
    return label + (f" (edge: {', '.join(split['edge'])})" if split.get("edge") else "")


def _load(run):
    """How a run's requests arrived, and whether a prefix cache served them:
    ``saturating``, ``poisson 8/s``, ``trace file`` (its own arrivals),
    ``saturating, cache``."""
    a = run.get("arrivals", "saturating")
    load = a if run.get("rate") is None else f"{a} {run['rate']:g}/s"
    return load + (", cache" if run.get("prefix_cache") else "")


def _groups(dump):
    """``dump``'s runs grouped by (preset, trace, load), in first-seen order."""
    out = {}
    for run in dump:
        out.setdefault((run["preset"], run["trace"], _load(run)), []).append(run)
    return out


def aggregate(runs):
    """One (preset, trace)'s seeds: for each setup and column, and each
    ratio, ``(mean, half_width)`` over the seeds (``kvarena.sim.stats``);
    the best splits found, one per seed."""
    from kvarena.sim import stats

    setups = {}
    for name in runs[0]["setups"]:
        rows = [r["setups"][name] for r in runs]
        if "unavailable" in rows[0]:
            setups[name] = {"unavailable": rows[0]["unavailable"]}
            continue
        figs = [_figures(row) for row in rows]
        keys = {key for col in COLUMNS for key in _keys(col)} | {"false_oom", "retractions", "moved_per_allocated"}
        setups[name] = {key: stats.mean_ci(f.get(key, 0.0) for f in figs) for key in keys}
    ratios_ = {
        m: {k: stats.mean_ci(r["ratios"].get(m, {}).get(k) for r in runs) for k in runs[0]["ratios"].get(m, {})}
        for m, _ in METRICS
    }
    splits = [r["setups"]["static-best"]["split"] for r in runs if "static-best" in r["setups"]]
    # A setup whose configuration is not its label's: the full-length pool, the oracle's splits.
    labels = {
        name: "; ".join(sorted({_split_label(r["setups"][name]["split"]) for r in runs}))
        for name in ("static-default", "static-phase-oracle")
        if name in runs[0]["setups"] and (runs[0]["setups"][name].get("split") or {}).keys() & {"full_length", "phases"}
    }
    return {
        "seeds": [r["seed"] for r in runs],
        "setups": setups,
        "ratios": ratios_,
        "best_splits": splits,
        "splits": labels,
    }


def table(agg):
    """One (preset, trace)'s setups: the mean over its seeds of each column
    (throughput, goodput and concurrency with their 95% intervals)."""
    lines = ["| setup | split | " + " | ".join(c[0] for c in COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for name, cols in agg["setups"].items():
        if "unavailable" in cols:
            lines.append(f"| {name} | {cols['unavailable']} |" + " |" * len(COLUMNS))
            continue
        if name == "static-best":
            label = "; ".join(sorted({_split_label(c) for c in agg["best_splits"]}))
        elif agg["splits"].get(name):
            label = agg["splits"][name]
        else:
            label = LABELS[name]
        cells = [_cell(col, cols) for col in COLUMNS]
        lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_lines(agg):
    """The ratios in words, throughput first: one line a metric."""
    from kvarena.sim import stats

    out = []
    for m, label in METRICS:
        cells = []
        for name, (mean, half) in agg["ratios"][m].items():
            if mean is None:
                why = "memory hardly bound" if m == "mean_concurrency" else "the baseline's figure is 0"
                cells.append(f"{name}: n/a ({why})")
            else:
                cells.append(f"{name}: {stats.fmt_ratio(mean, half)}")
        if cells:
            out.append(f"{label} (95% interval over seeds): " + "; ".join(cells))
    return out


def _limits_line(run):
    """The budget and each engine's limits a run had."""
    b = run.get("budget")
    if not b:
        return []
    text = f"KV budget {b['gib']:.1f} GiB ({b['source']})"
    lim = []
    for name, x in run["setups"].items():
        if "unavailable" in x:
            continue
        eng = ENGINE_OF.get(name, "sglang")
        cap = x.get("max_running") or "none"
        graph = x.get("graph_batch") or "none"
        mixing = "prefill mixed into decode" if x.get("mixed_chunk") else "prefill in passes of its own"
        lim.append(f"{eng}: max running {cap}, CUDA graphs to batch {graph}, {mixing}")
    line = text + "; " + "; ".join(dict.fromkeys(lim))
    if run.get("prefix_cache") and run.get("mamba_strategy"):
        line += f"; mamba checkpoints: sglang {run['mamba_strategy']}, vllm align"
    return [line]


def report(preset, trace_name, n, runs, seconds):
    agg = aggregate(runs)
    k = len(runs)
    load = _load(runs[0])
    from kvarena.sim import engines, presets

    p = presets.preset(preset)
    hybrid_off = (
        [
            f"SGLang 0.5.23 turns hybrid SWA memory off for {preset} and its --enable-unified-memory refuses a "
            "model that is not hybrid: kvarena cannot engage here today.  static-default is what SGLang runs; "
            "unified and static-best are what a hybrid layout would serve.",
            "",
        ]
        if p.swa_bytes and not engines.SGLANG.runs_hybrid(p)
        else []
    )
    head = f"### {preset} / {trace_name} / {load} ({n:,} requests, {k} seed{'s' if k > 1 else ''}: {agg['seeds']})"
    bad = [
        f"seed {r['seed']}, {name}: finished {x['finished']}, rejected {x['rejected']}, stuck {x['stuck']}, "
        f"lost {x['lost']}"
        for r in runs
        for name, x in r["setups"].items()
        if "unavailable" not in x and (x["stuck"] or x["lost"])
    ]
    blocked = {}
    for r in runs:
        for name, x in r["setups"].items():
            for cause, c in x.get("blocked", {}).items():
                if cause not in ("full", "ladder", "running cap"):
                    blocked[f"{name} {cause}"] = blocked.get(f"{name} {cause}", 0) + c
    secs = ", ".join(f"{name} {v:.0f}s" for name, v in seconds.items())
    return "\n".join(
        [head, ""]
        + hybrid_off
        + ratio_lines(agg)
        + ["", table(agg), ""]
        + _limits_line(runs[0])
        + [f"time: {secs}"]
        + (
            ["blocked steps outside the gate and the ladder: " + ", ".join(f"{a} {b}" for a, b in blocked.items())]
            if blocked
            else []
        )
        + (["PROBLEM: " + "; ".join(bad)] if bad else [])
    )


def summary(dump):
    """One row per (preset, trace, load): the throughput and goodput ratios
    first, with their 95% intervals over the seeds, then the concurrency
    ratio, the best splits, false OOMs, retractions and relocation (means
    over the seeds), from ``--json``'s runs."""
    from kvarena.sim import stats

    def get(cols, key, fmt):
        return format(cols[key][0], fmt) if key in cols and cols[key][0] is not None else "-"

    lines = [
        "| preset | trace | load | seeds | KV GiB | "
        + " | ".join(c[2] for c in SUMMARY_RATIOS)
        + " | best split | false OOM: unified, planner, default | retractions: unified, default | "
        "moved/alloc: unified, planner |",
        "|---|---|---|---:|---:|" + "---:|" * len(SUMMARY_RATIOS) + "---|---|---|---|",
    ]
    for (preset, trace_name, load), runs in _groups(dump).items():
        agg = aggregate(runs)
        st, ra = agg["setups"], agg["ratios"]
        u, p, d = (st.get(k, {}) for k in ("unified", "planner", "static-default"))
        split = "; ".join(sorted({_split_label(c) for c in agg["best_splits"]})) or "-"
        cells = [stats.fmt_ratio(*ra[m].get(k, (None, None))) for m, k, _ in SUMMARY_RATIOS]
        gib = f"{runs[0]['budget']['gib']:.1f}" if runs[0].get("budget") else "-"
        lines.append(
            f"| {preset} | {trace_name} | {load} | {len(runs)} | {gib} | " + " | ".join(cells) + f" | {split} | "
            f"{get(u, 'false_oom', ',.0f')}, {get(p, 'false_oom', ',.0f')}, {get(d, 'false_oom', ',.0f')} | "
            f"{get(u, 'retractions', ',.0f')}, {get(d, 'retractions', ',.0f')} | "
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
        "--trace",
        default="balanced",
        help="trace kind(s), comma-separated, or 'all' (balanced, long, short, shift, sharegpt, lmsys, mooncake, "
        "phases)",
    )
    p.add_argument("--trace-file", metavar="JSONL", help="read the trace from a JSONL file instead (one seed)")
    p.add_argument("--requests", type=int, default=10_000, help="requests per generated trace")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument(
        "--seeds", type=int, default=5, help="seeds per preset and trace (seed, seed+1, ...): each figure is their mean"
    )
    p.add_argument(
        "--jobs", type=int, default=0, help="runs in parallel, one process each (0: one per core; 1: in this process)"
    )
    p.add_argument(
        "--arrivals",
        default="poisson",
        choices=("poisson", "bursty"),
        help="the arrival process of a --rates sweep (saturating runs queue every request at time 0)",
    )
    p.add_argument(
        "--rates",
        default="",
        help="requests a second, comma-separated: after the saturating run, one run per rate "
        "(static-best keeps the split the saturating search found)",
    )
    p.add_argument(
        "--prefix-cache",
        default="on",
        choices=("off", "on", "both"),
        help="a radix-style prefix cache on every setup (kvarena.sim.prefix), on by default as both engines "
        "ship it; both: each run twice, off and on",
    )
    p.add_argument(
        "--mamba-radix-cache-strategy",
        default="extra_buffer",
        choices=("extra_buffer", "no_buffer"),
        help="SGLang's mamba checkpoints with the cache on, for the SGLang setups (vLLM's padded pool keeps "
        "vLLM's 'align' mode): extra_buffer (SGLang's default on an H200): two tracking slots a running request, "
        "a state at its prefill's last chunk multiple and every 256 decode tokens, the last one cached; "
        "no_buffer: one slot, the state of the whole length cached",
    )
    p.add_argument(
        "--enable-mixed-chunk",
        action="store_true",
        help="SGLang's flag, on the SGLang setups: a prefill chunk rides a decode iteration, the decodes "
        "sharing its token budget (default off, as SGLang ships: a chunk is a forward pass of its own and "
        "the decodes wait for it); vLLM's padded pool always mixes, as vLLM does",
    )
    p.add_argument("--accelerator", default="h200", help="the time model's accelerator profile (h200, h100)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput's time-to-first-token SLO, seconds")
    p.add_argument(
        "--slo-itl", type=float, default=0.05, help="goodput's SLO on a request's mean inter-token latency, s"
    )
    p.add_argument(
        "--alloc-cost",
        default="gpu",
        choices=("gpu", "torch", "cpu"),
        help="how the clock charges the allocator, on every setup (kvarena.sim.launches): 'gpu' (default): the "
        "kernel launches each setup makes as a GPU runs it, counted as `kvarena bench --only ops` counts them "
        "(the unified arena's calls on their Triton path, its ladder's moves on torch, the static and padded "
        "pools as a torch free list's), at the accelerator's launch cost (h200 and h100: 5 us a launch, a "
        "stated assumption); 'torch': every torch operation each setup's calls dispatch on the CPU torch path "
        "(the rule before 'gpu'), at the same cost; 'cpu': the allocator's CPU time measured in this process "
        "(times then vary run to run; on a CPU it includes the moves the copy term already prices)",
    )
    p.add_argument(
        "--budget-gib",
        type=float,
        default=None,
        help="KV memory budget (GiB); default: the accelerator's memory on the model's tensor-parallel group "
        "times --mem-fraction-static, less the weights (printed per run)",
    )
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="SGLang's share of memory for weights and KV (default: SGLang's for the accelerator)",
    )
    p.add_argument("--page-tokens", type=int, default=16, help="tokens a page (one simulated unit)")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="chunked-prefill chunk")
    p.add_argument(
        "--reserve-ratio",
        type=float,
        default=None,
        help="hold the share of the running requests' remaining output reserved at admission constant at this "
        "value (default: SGLang's decaying new_token_ratio, 0.7 to 0.098 over 600 decode iterations, "
        "engine.NewTokenRatio)",
    )
    p.add_argument("--setups", default=",".join(SETUPS), help="setups to run, comma-separated")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG: the band boundaries over time (the first seed's saturating run), and with "
        "--rates the throughput-latency and goodput curves (PATH with -curves)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="simulate nothing: report the runs of these --json files together (one job per seed on a cluster); "
        "with --plot, redraw a rate sweep's curves from them",
    )


def _names(arg, known, what):
    names = list(known) if arg == "all" else [x.strip() for x in arg.split(",") if x.strip()]
    for n in names:
        if n not in known:
            raise ValueError(f"unknown {what} {n!r}; {what}s: {', '.join(known)}")
    return names


def _rates(arg):
    out = []
    for x in (x.strip() for x in arg.split(",") if x.strip()):
        try:
            r = float(x)
        except ValueError:
            r = float("nan")
        if not (r > 0 and r != float("inf")):
            raise ValueError(f"simulate: --rates takes numbers > 0 (requests a second), got {x!r}")
        out.append(r)
    return out


SETTINGS = (
    "budget_gib",
    "mem_fraction_static",
    "page_tokens",
    "chunk_tokens",
    "reserve_ratio",
    "requests",
    "accelerator",
    "slo_ttft",
    "slo_itl",
    "alloc_cost",
    "mamba_radix_cache_strategy",
    "enable_mixed_chunk",
)


def budget(pname, settings):
    """The run's KV budget: ``{"bytes", "gib", "source"}``; ``--budget-gib``
    where given, else what the accelerator leaves after the weights
    (``timing.kv_budget_bytes``)."""
    from kvarena.sim import timing

    if settings.get("budget_gib") is not None:
        b = int(settings["budget_gib"] * (1 << 30))
        return {"bytes": b, "gib": b / (1 << 30), "source": "--budget-gib"}
    frac = settings.get("mem_fraction_static")
    b = int(timing.kv_budget_bytes(pname, settings["accelerator"], frac))
    m, a = timing.MODELS[pname], timing.ACCELERATORS[settings["accelerator"]]
    frac = timing.sglang_mem_fraction_static(a.name, m.gpus) if frac is None else frac
    source = (
        f"{m.gpus} x {a.name} {a.memory / timing.MIB:,.0f} MiB x mem_fraction_static {frac:g} "
        f"- {m.weight_bytes / timing.GB:.1f} GB of weights"
    )
    return {"bytes": b, "gib": b / (1 << 30), "source": source}


def run_unit(
    pname,
    tname,
    seed,
    settings,
    setups,
    trace_file=None,
    plot=False,
    load=None,
    best_split=None,
    cache=False,
    oracle_split=None,
):
    """One (preset, trace, seed, load, prefix cache on or off): every setup,
    as a ``--json`` run entry (and the results and splits the plot needs
    when ``plot``).  ``load`` is ``(arrivals, rate)``, None for saturating.
    Runs in a worker process; everything it returns pickles."""
    import torch

    from kvarena.sim import engine, presets, traces

    torch.set_num_threads(1)  # small tensors: threads cost more than they give on a loaded CPU
    arrivals, rate = load or ("trace file" if trace_file else "saturating", None)
    if trace_file:
        trace = traces.read_jsonl(trace_file)
    else:
        footprint = traces.footprint(presets.preset(pname))  # a phases trace's work, as SGLang keeps the state
        trace = traces.generate(tname, settings["requests"], seed, arrivals, rate, footprint=footprint)
    kv = budget(pname, settings)
    sizes = presets.Sizes.of(presets.preset(pname), page_tokens=settings["page_tokens"], budget_bytes=kv["bytes"])
    cfg = engine.Config(
        chunk_tokens=settings["chunk_tokens"],
        reserve_ratio=settings["reserve_ratio"],
        record=plot,
        accelerator=settings["accelerator"],
        alloc_cost=settings["alloc_cost"],
        slo_ttft=settings["slo_ttft"],
        slo_itl=settings["slo_itl"],
        prefix_cache=cache,
        mamba_strategy=settings.get("mamba_radix_cache_strategy", "extra_buffer"),
        enable_mixed_chunk=settings.get("enable_mixed_chunk", False),
    )
    results, splits, seconds = run_one(sizes, trace, cfg, setups, best_split=best_split, oracle_split=oracle_split)
    entry = {
        "preset": pname,
        "trace": tname,
        "seed": seed,
        "arrivals": arrivals,
        "rate": rate,
        "prefix_cache": cache,
        "mamba_strategy": cfg.mamba_strategy if presets.preset(pname).state_bytes else None,
        "requests": len(trace),
        "budget": kv,
        "setups": {k: (r if isinstance(r, dict) else r.numbers()) for k, r in results.items()},
        "ratios": ratios(results),
        "seconds": seconds,
    }
    return entry, ((sizes, results, splits) if plot else None)


def _run_units(units, jobs, progress):
    """``run_unit`` over ``units`` (argument tuples), ``jobs`` at a time in
    worker processes (spawned: no torch state crosses a fork); results in
    ``units``' order."""
    if jobs <= 1 or len(units) == 1:
        out = []
        for u in units:
            out.append(run_unit(*u))
            progress(out[-1][0])
        return out
    import concurrent.futures as cf
    import multiprocessing

    with cf.ProcessPoolExecutor(min(jobs, len(units)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(run_unit, *u) for u in units]
        for f in cf.as_completed(futures):
            progress(f.result()[0])
        return [f.result() for f in futures]


def _print_reports(dump):
    for (pname, tname, _), runs in _groups(dump).items():
        seconds = {}
        for r in runs:
            for k, v in r["seconds"].items():
                seconds[k] = seconds.get(k, 0.0) + v
        print(report(pname, tname, runs[0]["requests"], runs, seconds), flush=True)
        print()
    if len(_groups(dump)) > 1:
        print("### summary\n\n" + summary(dump) + "\n")


def _best_split(entry):
    """The split a saturating run's search chose, as ``run_one``'s ``best_split``."""
    b = entry["setups"].get("static-best")
    if not b or "unavailable" in b:
        return None
    if b["split"].get("full_length"):
        return FULL_LENGTH
    share = b["split"]["state_share"] or 0.5  # 0.5: no state pool, the share is not used
    return (b["split"]["swa_ratio"] or 0.8, share)


def run(args: argparse.Namespace) -> int:
    """``kvarena simulate``; a bad argument raises ``ValueError`` (the CLI prints it, exit code 2)."""
    import os

    if args.merge:
        dump, first = [], None
        for path in args.merge:
            try:
                with open(path) as f:
                    saved = json.load(f)
                dump += saved["runs"]
                first = first or saved
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(f"simulate --merge: {path}: not a --json file of kvarena simulate ({e})") from None
        _print_reports(dump)
        if args.plot and first is not None:  # a rate sweep's curves, redrawn from the runs as saved
            cache = {"off": False, "on": True, "both": False}[first.get("prefix_cache", "off")]
            _plot_curves(args.plot, dump, first["arrivals"], first["slo_ttft"], first["slo_itl"], cache)
        return _status(dump)
    from kvarena.sim import engine, presets, timing, traces

    preset_names = _names(args.preset, presets.PRESETS, "preset")
    setups = _names(args.setups, SETUPS, "setup")
    if args.seeds < 1:
        raise ValueError(f"simulate: --seeds must be >= 1, got {args.seeds}")
    if args.jobs < 0:
        raise ValueError(f"simulate: --jobs must be >= 0, got {args.jobs}")
    if args.requests < 1:
        raise ValueError(f"simulate: --requests must be >= 1, got {args.requests}")
    timing.clock(preset_names[0], args.accelerator)  # an unknown accelerator fails here
    engine.Config(slo_ttft=args.slo_ttft, slo_itl=args.slo_itl).check()
    rates = _rates(args.rates)
    if args.trace_file:
        if rates:
            raise ValueError("simulate: --rates generates arrivals; a --trace-file brings its own")
        traces.read_jsonl(args.trace_file)  # a bad file fails here, before any worker starts
        trace_names, seeds = [args.trace_file], [args.seed]  # one fixed trace: one seed
    else:
        trace_names = _names(args.trace, traces.KINDS, "trace")
        seeds = list(range(args.seed, args.seed + args.seeds))
    settings = {k: getattr(args, k) for k in SETTINGS}
    for pname in preset_names:  # a budget that leaves nothing fails here, before any worker starts
        budget(pname, settings)
    jobs = args.jobs or os.cpu_count() or 1
    done = []
    total = (
        len(preset_names) * len(trace_names) * len(seeds) * (1 + len(rates)) * (2 if args.prefix_cache == "both" else 1)
    )

    def progress(entry):
        done.append(entry)
        print(
            f"[{len(done)}/{total}] {entry['preset']} / {entry['trace']} / {_load(entry)} / seed {entry['seed']}",
            flush=True,
        )

    caches = {"off": [False], "on": [True], "both": [False, True]}[args.prefix_cache]
    units = [
        (
            p,
            t,
            s,
            settings,
            tuple(setups),
            args.trace_file,
            bool(args.plot) and s == seeds[0] and c == caches[0],
            None,
            None,
            c,
        )
        for p in preset_names
        for t in trace_names
        for c in caches
        for s in seeds
    ]
    outs = _run_units(units, jobs, progress)
    dump = [e for e, _ in outs]
    if rates:  # the sweep: static-best keeps each seed's saturating split
        sweep = [
            (
                e["preset"],
                e["trace"],
                e["seed"],
                settings,
                tuple(setups),
                None,
                False,
                (args.arrivals, r),
                _best_split(e),
                e["prefix_cache"],
                (e["setups"].get("static-phase-oracle") or {}).get("split"),
            )
            for e in dump
            for r in rates
        ]
        dump += [e for e, _ in _run_units(sweep, jobs, progress)]
    _print_reports(dump)
    if args.plot:
        from kvarena.sim import plot

        many = len(preset_names) * len(trace_names) > 1
        for entry, extra in outs:
            if extra is not None:
                sizes, results, splits = extra
                path = _plot_path(args.plot, entry["preset"], entry["trace"], many)
                plot.bands(path, sizes, results, splits, f"{entry['preset']} / {entry['trace']}")
                print(f"plot: {path}")
        if rates:
            _plot_curves(args.plot, dump, args.arrivals, args.slo_ttft, args.slo_itl, caches[0], many)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    **settings,
                    "seeds": seeds,
                    "rates": rates,
                    "arrivals": args.arrivals,
                    "prefix_cache": args.prefix_cache,
                    "runs": dump,
                },
                f,
                indent=1,
            )
        print(f"json: {args.json}")
    return _status(dump)


def _plot_curves(base, dump, arrivals, slo_ttft, slo_itl, cache, many=None):
    """A rate sweep's throughput-latency and goodput curves, one PNG per (preset, trace) of ``dump``'s
    runs at a rate (with the prefix cache ``cache``); ``many``: name the files by preset and trace
    (default: when there is more than one pair)."""
    from kvarena.sim import plot

    swept = [e for e in dump if e.get("rate") and e.get("prefix_cache", False) == cache]
    pairs = list(dict.fromkeys((e["preset"], e["trace"]) for e in swept))
    if not pairs:
        raise ValueError("simulate --plot: no run at a rate to draw curves from (run with --rates)")
    many = len(pairs) > 1 if many is None else many
    for pname, tname in pairs:
        path = _plot_path(_curves_path(base), pname, tname, many)
        runs = [e for e in swept if e["preset"] == pname and e["trace"] == tname]
        plot.curves(path, runs, f"{pname} / {tname} ({arrivals})", slo_ttft, slo_itl)
        print(f"plot: {path}")


def _curves_path(base):
    stem, dot, ext = base.rpartition(".")
    return f"{stem}-curves.{ext}" if dot else f"{base}-curves"


def _status(dump):
    """1 if any run lost or dropped a request, else 0."""
    problems = [d for d in dump for r in d["setups"].values() if r.get("stuck") or r.get("lost")]
    return 1 if problems else 0
