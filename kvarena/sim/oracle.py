"""The per-phase oracle: how far a perfect re-split at each phase boundary
could go on a phased trace (``traces``' ``phases`` kind).

``static-best`` chooses one split for the whole trace, as a deployment must
choose it at boot.  The oracle instead runs, for each phase alone,
``simulate.best_static`` on that phase's requests (saturating: arrivals at
0 as they are; at a rate: rebased to the phase's first arrival), and
combines the phases' best results into one ``engine.Result``: the phases
run one after another, so the times and counts add up, the throughputs are
output tokens over the sum of the phases' seconds, and the means are
weighted by the steps (or memory-bound steps) they are means over.

It bounds what re-splitting **at drained boundaries** could do, not a
setup an engine runs today: each phase's split is chosen in hindsight, and
moving the walls costs nothing.  It ignores the drain and refill a real
re-split would add on top of what the phases' own runs hold: a static
split's walls can move only once the buffer is empty, and here each phase
starts on an empty buffer and ends when its last request finishes, so its
own tail (the drain, at falling concurrency) is counted, but no wait for
the old phase's requests to leave, no copy and no restart is.  It is not
guaranteed to beat the whole trace's best split: a whole-trace run
overlaps one phase's tail with the next one's head, which the phases, run
apart, cannot; where phases are small next to the buffer (a few batches of
work), that overlap can outweigh the better split, and the oracle falls
below ``static-best``.  Size the phases well above the buffer (``n`` in
the thousands at the default budgets) for the bound to mean something.

Latency quantiles cannot be combined from the phases' own: the oracle
reports each as its worst phase's, which bounds the whole's from above (if
no phase has more than a share ``1 - q`` of its samples above ``x``, the
whole has not either), so the oracle's latency is never flattered.
"""

import dataclasses

from kvarena.sim import engine

# Summed over the phases.
SUMS = (
    "requests",
    "finished",
    "rejected",
    "stuck",
    "lost",
    "steps",
    "memory_bound_steps",
    "capped_steps",
    "eager_steps",
    "retractions",
    "evictions",
    "recomputed_tokens",
    "bytes_allocated",
    "bytes_moved",
    "refusals",
    "false_oom",
    "seconds",
    "slo_met",
    "alloc_seconds",
    "launches",
    "copy_seconds",
    "prompt_tokens",
    "cache_hit_tokens",
    "cache_evictions",
)
# The worst phase's.
MAXES = ("peak_concurrency", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")


def phases_of(trace):
    """``trace``'s requests by phase, in phase order, each rebased to start
    at 0 (its first arrival) and numbered from 0; a ``ValueError`` where a
    request has no phase or a request follows another (``after``)."""
    by = {}
    for r in trace:
        if r.phase < 0:
            raise ValueError(f"oracle: request {r.rid} has no phase (the oracle needs a phased trace)")
        if r.after >= 0:
            raise ValueError(f"oracle: request {r.rid} follows request {r.after}: phases must stand alone")
        by.setdefault(r.phase, []).append(r)
    out = []
    for k in sorted(by):
        reqs = sorted(by[k], key=lambda r: (r.arrival, r.rid))
        start = reqs[0].arrival
        out.append([dataclasses.replace(r, rid=i, arrival=r.arrival - start) for i, r in enumerate(reqs)])
    return out


def combine(results, setup="static-phase-oracle"):
    """One ``engine.Result`` for ``results`` run one after another (the
    module docstring); ``split`` is ``{"phases": [each phase's split]}``."""
    res = engine.Result(setup)
    for f in SUMS:
        setattr(res, f, sum(getattr(r, f) for r in results))
    for f in MAXES:
        setattr(res, f, max((getattr(r, f) for r in results), default=0))
    first = results[0]
    res.max_running, res.graph_batch, res.mixed_chunk = first.max_running, first.graph_batch, first.mixed_chunk
    steps, bound = res.steps, res.memory_bound_steps
    res.mean_concurrency_all = sum(r.mean_concurrency_all * r.steps for r in results) / max(1, steps)
    if bound:
        res.mean_concurrency = sum(r.mean_concurrency * r.memory_bound_steps for r in results) / bound
        res.utilisation = sum(r.utilisation * r.memory_bound_steps for r in results) / bound
    else:
        res.mean_concurrency = res.mean_concurrency_all
    res.tokens_per_step = sum(r.tokens_per_step * r.steps for r in results) / max(1, steps)
    res.decode_tokens_per_step = sum(r.decode_tokens_per_step * r.steps for r in results) / max(1, steps)
    res.moved_per_allocated = res.bytes_moved / res.bytes_allocated if res.bytes_allocated else 0.0
    if res.seconds > 0:
        res.output_tokens_per_s = sum(r.output_tokens_per_s * r.seconds for r in results) / res.seconds
        res.tokens_per_s = sum(r.tokens_per_s * r.seconds for r in results) / res.seconds
        res.goodput = res.slo_met / res.seconds
    res.cache_hit_rate = res.cache_hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    for r in results:
        for k, v in r.blocked.items():
            res.blocked[k] = res.blocked.get(k, 0) + v
        for k, v in r.peak_live.items():
            res.peak_live[k] = max(res.peak_live.get(k, 0), v)
    res.split = {"phases": [dict(r.split, seconds=r.seconds) for r in results]}
    return res


def per_phase(sizes, trace, cfg, progress=None, max_rejected=0, setup="static-phase-oracle", splits=None):
    """The per-phase oracle on a phased ``trace``: ``simulate.best_static``
    on each phase alone (``max_rejected`` a phase, as there), combined
    (``combine``).  ``result.split["phases"]`` holds each phase's split
    (``swa_ratio``, ``state_share``, ``edge``, ``grid_runs``, or
    ``full_length``, and the phase's ``seconds``); ``progress`` takes a line
    of text a run, as ``best_static``'s.  ``splits`` (``fixed(split)`` of an
    earlier result: one ``(swa_ratio, state_share)`` or
    ``simulate.FULL_LENGTH`` a phase) runs those splits instead of
    searching, as a rate sweep keeps the saturating trace's."""
    from kvarena.sim import simulate

    phases = phases_of(trace)
    if splits is not None and len(splits) != len(phases):
        raise ValueError(f"oracle: {len(splits)} splits for {len(phases)} phases")
    results = []
    for k, phase in enumerate(phases):
        if splits is not None:
            if splits[k] == getattr(simulate, "FULL_LENGTH", None):
                r, _ = simulate._full_length(sizes, phase, cfg, setup)
            else:
                r, _ = simulate._static(sizes, phase, cfg, *splits[k], setup)
            r.split["from"] = "the saturating trace's search"
        else:
            say = (lambda line, k=k: progress(f"phase {k}: {line}")) if progress else None
            r, _, runs = simulate.best_static(sizes, phase, cfg, max_rejected, say)
            r.split["grid_runs"] = runs
        results.append(r)
    return combine(results, setup)


def fixed(split):
    """An oracle result's ``split`` (a ``Result``'s, or its ``--json``
    form) as ``per_phase``'s ``splits``: each phase's ``(swa_ratio,
    state_share)`` (0.8 and 0.5 where the model has no such pool, as
    ``simulate._best_split``), or ``simulate.FULL_LENGTH``."""
    from kvarena.sim import simulate

    out = []
    for p in split["phases"]:
        if p.get("full_length"):
            out.append(simulate.FULL_LENGTH)
        else:
            out.append((p.get("swa_ratio") or 0.8, p.get("state_share") or 0.5))
    return out
