"""``kvarena verify``: every check, run to completion, one summary, an honest exit status.

With no flags every part runs to the end, in this order:

1. **self-checks**: the spec's contract-checked scenarios and ``WALKS``
   seeded random walks of ``STEPS`` steps (``kvarena.verification.selfcheck``);
2. **z3**: every obligation in the registry with its vacuity and
   tautology checks, ``--jobs`` solver processes (``kvarena.proofs``); a
   verdict found before for the same formula, z3 and budget comes from the
   proof cache (``kvarena.proofs.cache``: ``--cache``, ``--no-cache``), and
   the summary counts those apart from the ones proved now;
3. **CrossHair**: ``crosshair check`` of the spec's contracts and
   ``diffbehavior`` of every spec/implementation twin, at ``kvarena
   prove``'s settings (``kvarena.proofs.crosshair_runs``);
4. **vectors**: every shipped conformance vector replayed on the
   implementation (``kvarena.verification.vectors``);
5. **differential**: each differential machine (``fuzz.MACHINES``, every
   policy it takes) in seeded rounds of ``ROUND_EXAMPLES`` examples (seeds
   ``--seed``, ``--seed + 1``, ...): at least ``MIN_ROUNDS`` rounds, then
   until every coverage event the machine requires (its ``REQUIRED``) has
   been seen.  Counted in examples, not seconds, so the verdict does not
   depend on the machine's speed or load; a machine that has not seen them
   all after ``MAX_EXAMPLES`` examples fails.  A disagreement is shrunk
   (``fuzz.shrink_trace``: bounded by a count of replays) and saved as a
   vector with a pytest reproduction.  With ``--jobs`` of 2 or
   more the machines run side by side, each in a process of its own.

Everything is read from the registries (the obligations, the CrossHair
lists, the vectors on disk, the machines and their ``REQUIRED``), so an
obligation or event added there is checked here with no change.

``--budget SECONDS`` is the smoke mode.  Each part may run until its
cumulative share of the budget (``SHARES``; time a part leaves unused goes
to the next), and what it has not done by then is cut: a solver process is
stopped, a CrossHair run killed, a differential round sized to what is
left.  No check is weakened to fit (a part runs at full strength or stops),
and the summary lists everything the budget, or a ``--skip-*`` option,
left out.

Exit status (``EXIT_*``):

- 0: every check ran to completion and passed;
- 1: a check failed: an obligation refuted or not proved, a CrossHair
  counterexample, a vector or differential disagreement, a required
  coverage event never reached in ``MAX_EXAMPLES`` examples;
- 2: a bad argument (a ``--device`` or ``--cache`` that cannot be used);
- 3: nothing failed, but not everything ran (a budget or a ``--skip-*``
  option): the summary's "not run" rows say what.
"""

import argparse
import math
import multiprocessing
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
WALKS, STEPS = 20, 300
ROUND_EXAMPLES = 30  # examples in one seeded differential round
MIN_ROUNDS = 2  # rounds per machine policy, at least: 60 examples, the fixed-seed pass verify always ran
MAX_EXAMPLES = 600  # a machine that has not reached its required events by then fails
# Under --budget: the share of the budget by which each part must be done,
# cumulative, so that each part is sure of some time and what one leaves goes to the next.
# The machines stop at 93%: a round they start cannot be stopped, and on a loaded two-core
# machine the last one overran a 60 s budget by up to 11% with 100% (kvarena verify --json's part_ends_s).
SHARES = {"self-checks": 0.10, "z3": 0.45, "crosshair": 0.65, "vectors": 0.70, "differential": 0.93}
MIN_START_S = 3.0  # under a budget, a CrossHair run or a differential round starts only with this much left
PROBE_EXAMPLES = 2  # under a budget, a machine's first round: it times an example on this machine, under its load
EXAMPLE_MARGIN = 1.5  # examples vary: a round under a budget plans for each costing this times the mean so far


class Clock:
    """The run's deadlines: none without a budget.  A few seconds of the
    budget (3%, at most 5 s) are kept for the summary."""

    def __init__(self, budget):
        self.t0 = time.perf_counter()
        self.budget = budget
        self.usable = None if budget is None else budget - min(5.0, 0.03 * budget)

    def deadline(self, part):
        return None if self.usable is None else self.t0 + SHARES[part] * self.usable

    @staticmethod
    def left(deadline):
        return math.inf if deadline is None else deadline - time.perf_counter()

    def wall(self):
        return time.perf_counter() - self.t0


def cut(part, what, why):
    """A "not run" entry: ``what`` of ``part`` did not run, because of ``why``."""
    return {"part": part, "what": what, "why": why}


# ------------------------------------------------------------------ parts


def selfcheck_rows(walks=WALKS, steps=STEPS, seed=0, deadline=None):
    """The scenarios and the seeded walks, walk by walk until ``deadline``; the rows and what was cut."""
    from kvarena.verification import selfcheck

    checks = selfcheck.run_scenarios()
    done = 0
    for s in range(seed, seed + walks):
        if Clock.left(deadline) <= 0:
            break
        checks += selfcheck.run_walks([s], steps)
        done += 1
    rows = [
        {"part": "self-checks", "name": c.name, "ok": c.ok, "detail": c.detail, "seconds": c.seconds} for c in checks
    ]
    not_run = []
    if done < walks:
        not_run.append(cut("self-checks", f"{walks - done} of {walks} random walks", "the budget"))
    if walks < WALKS:
        not_run.append(cut("self-checks", f"{WALKS - walks} of {WALKS} random walks", f"--walks {walks}"))
    if steps < STEPS:
        not_run.append(cut("self-checks", f"walks of {steps} steps, not {STEPS}", f"--steps {steps}"))
    return rows, not_run


def z3_rows(deadline=None, jobs=2, cache=None, progress=None, names=None):
    """Every obligation (or ``names``), ``jobs`` fresh solver processes, until
    ``deadline``; the rows in registry order, and the names not run.
    ``cache``: the proof cache's location, or None."""
    from kvarena.proofs import cli as prove_cli

    names = list(names) if names is not None else prove_cli.selected(None)
    if progress:
        progress(0, len(names))
    done = {}
    pool = prove_cli.solver_pool(jobs)  # a fresh process per obligation, as kvarena prove
    try:
        results = pool.imap_unordered(prove_cli.run_task, [(n, None, cache) for n in prove_cli.slowest_first(names)])
        for _ in names:
            try:
                r = results.next(timeout=None if deadline is None else max(0.0, Clock.left(deadline)))
            except multiprocessing.TimeoutError:
                break
            r["seconds"], r["detail"] = r.get("time_s", 0.0), prove_cli.detail(r)
            done[r["name"]] = {"part": "z3", **r}
            if progress:
                progress(len(done), len(names))
    finally:
        pool.terminate()  # a budget cut stops the solvers still running
        pool.join()
    return [done[n] for n in names if n in done], [n for n in names if n not in done]


def crosshair_rows(deadline=None, jobs=2, progress=None):
    """Every CrossHair check and diff at ``kvarena prove``'s settings, ``jobs``
    at a time; a run is started only with ``MIN_START_S`` left before
    ``deadline`` and killed at it ("not finished").  The rows, and what was cut."""
    from concurrent.futures import ThreadPoolExecutor

    from kvarena.proofs import crosshair_runs as ch

    tasks = [("check", m) for m in ch.CHECK_MODULES] + [("diff", p) for p in ch.DIFF_PAIRS]
    done = []

    def name(t):
        return f"crosshair.check.{t[1]}" if t[0] == "check" else f"crosshair.diff.{t[1][0].rsplit('.', 1)[1]}"

    def run(t):
        own = ch.MODULE_WALL_S if t[0] == "check" else ch.DIFF_WALL_S
        left = Clock.left(deadline)
        if left < MIN_START_S:
            return [], [name(t)]
        wall = min(own, left)
        if t[0] == "check":
            rs = ch.check_module(t[1], wall_s=wall)
        else:
            rs = [ch.diff_pair(*t[1], wall_s=wall)]
        stopped = []
        for r in rs:
            if wall < own and r["result"] == "error" and "wall-clock cap" in str(r.get("reason", "")):
                r["result"], r["ok"] = "not finished", True  # the budget stopped it: not a finding, not a pass
                stopped.append(r["name"])
        done.append(t)
        if progress:
            progress(len(done), len(tasks))
        return rs, stopped

    if progress:
        progress(0, len(tasks))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        out = list(ex.map(run, tasks))
    rows, not_run = [], []
    for rs, stopped in out:
        for r in rs:
            r["seconds"] = r.get("time_s", 0.0)
            r["detail"] = f"{r['result']}: {str(r.get('reason', ''))[:160]}"
            rows.append({"part": "crosshair", **r})
        not_run += stopped
    unstarted = [n for n in not_run if not any(r["name"] == n for r in rows)]
    unfinished = [n for n in not_run if n not in unstarted]
    what = "; ".join(
        f"{len(names)} {kind}: {', '.join(names)}"
        for kind, names in (("not started", unstarted), ("not finished", unfinished))
        if names
    )
    return rows, [cut("crosshair", what, "the budget")] if what else []


def vector_rows(device="cpu", deadline=None, progress=None):
    """Every shipped vector replayed on the implementation, case by case until ``deadline``."""
    from kvarena.verification import vectors

    root = vectors.default_dir()
    if not root.exists():
        return [
            {
                "part": "vectors",
                "name": "vectors",
                "ok": False,
                "seconds": 0.0,
                "detail": f"no vectors at {root} (kvarena vectors generate {root})",
            }
        ], []
    cases = vectors.load_cases(root)
    t = time.perf_counter()
    results = []
    for c in cases:
        if Clock.left(deadline) <= 0:
            break
        results.append(vectors.replay_case(c, vectors.get_target("impl", device=device)))
        if progress:
            progress(len(results), len(cases))
    failed = [r for r in results if r.status != "pass"]
    detail = (
        f"{len(results) - len(failed)}/{len(results)} cases pass on impl ({device}), "
        f"{sum(r.compared for r in results)} comparisons"
    )
    if failed:
        detail += "; " + "; ".join(f"{r.name}: {r.detail}" for r in failed[:3])
    not_run = []
    if len(results) < len(cases):
        not_run.append(cut("vectors", f"{len(cases) - len(results)} of {len(cases)} cases", "the budget"))
    row = {
        "part": "vectors",
        "name": f"vectors replay on impl ({device})",
        "ok": not failed,
        "detail": detail,
        "seconds": time.perf_counter() - t,
        "cases": len(results),
        "total": len(cases),
    }
    return [row], not_run


def machine_rows(label, device="cpu", seed=0, deadline=None, shrink=True, out_dir="fuzz-failures", progress=None):
    """Machine ``label`` in seeded rounds (the module docstring's step 5):
    its row, the events seen, its stats, its failure (or None) and what was cut."""
    from kvarena.verification import fuzz
    from kvarena.verification.differential import kernel_events

    mod = fuzz.MACHINES[label]
    targets = [(label, p) for p in fuzz.policies_for(mod)]
    required = tuple(getattr(mod, "REQUIRED", ())) + kernel_events(device)  # a step on each kernel choice
    seen, stats = Counter(), Counter()  # events seen; examples and steps
    failure, rounds, t = None, 0, time.perf_counter()
    whole = 0  # rounds of ROUND_EXAMPLES examples: only these count towards MIN_ROUNDS (a budget's are shorter)
    per_example = None  # seconds per example, once a round has timed one
    status = "covered"
    while True:
        missing = [c for c in required if seen[c] == 0]
        if whole >= MIN_ROUNDS * len(targets) and not missing:
            break
        if stats["examples"] >= MAX_EXAMPLES:
            status = "exhausted"
            break
        left = Clock.left(deadline)
        if left < MIN_START_S:
            status = "cut"
            break
        if deadline is None:
            n = ROUND_EXAMPLES
        elif per_example is None:
            n = PROBE_EXAMPLES
        else:
            n = max(1, min(ROUND_EXAMPLES, int(left / (EXAMPLE_MARGIN * per_example))))
        _, policy = targets[whole % len(targets)]
        started = time.perf_counter()
        r = fuzz.run_round(label, policy, device, examples=n, shrink=shrink, seed=seed + rounds)
        rounds += 1
        whole += n == ROUND_EXAMPLES
        seen.update(r["cases"])
        stats.update(examples=r["examples"], steps=r["steps"])
        if r["examples"]:
            per_example = (time.perf_counter() - started) / r["examples"]
        if progress:
            progress(label, stats["examples"], len(required) - len([c for c in required if seen[c] == 0]))
        if r["failure"]:
            failure = fuzz.save_failure(r["failure"], label, out_dir, device)
            failure.update(machine=label, policy=r["policy"], device=device, shrunk=shrink)
            status = "failed"
            break
    missing = [c for c in required if seen[c] == 0]
    detail = (
        f"{stats['examples']} examples, {stats['steps']} steps in {rounds} seeded rounds; "
        f"{len(required) - len(missing)}/{len(required)} required events reached"
    )
    not_run = []
    if status == "exhausted":
        detail += f"; never reached in {MAX_EXAMPLES} examples: {missing}"
    elif status == "cut" and missing:
        not_run.append(cut("differential", f"{label}: required events not reached: {', '.join(missing)}", "the budget"))
    elif status == "cut":
        short = MIN_ROUNDS * len(targets) - whole
        not_run.append(
            cut("differential", f"{label}: {short} of its {MIN_ROUNDS * len(targets)} whole rounds", "the budget")
        )
    elif status == "failed":
        detail = str(failure["error"])[:300]
    row = {
        "part": "differential",
        "name": f"{label} impl vs spec (every policy) on {device}",
        "ok": status in ("covered", "cut"),
        "seconds": time.perf_counter() - t,
        "examples": stats["examples"],
        "steps": stats["steps"],
        "required": len(required),
        "reached": len(required) - len(missing),
        "missing": missing,
        "detail": detail,
    }
    return row, seen, stats, failure, not_run


def _machine_job(args):
    """``machine_rows`` in a worker process: one torch thread (the machines'
    tensors are small), the deadline given in wall-clock time."""
    import torch

    label, device, seed, wall_deadline, shrink, out_dir = args
    torch.set_num_threads(1)
    deadline = None if wall_deadline is None else time.perf_counter() + (wall_deadline - time.time())
    return machine_rows(label, device, seed, deadline, shrink, out_dir)


def differential_rows(
    labels, device="cpu", seed=0, deadline=None, shrink=True, out_dir="fuzz-failures", jobs=2, progress=None
):
    """``machine_rows`` of each machine in ``labels``: with ``jobs`` >= 2,
    each in a process of its own, side by side (a machine runs on one core);
    else one after another here.  The results in ``labels``' order."""
    if jobs < 2 or len(labels) < 2:
        out = []
        for label in labels:
            out.append(machine_rows(label, device, seed, deadline, shrink, out_dir))
            if progress:
                progress(len(out), len(labels))
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    wall_deadline = None if deadline is None else time.time() + Clock.left(deadline)
    # spawn, not fork: a forked child of a process whose torch thread pool ran can deadlock (fuzz.campaign)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(labels)), mp_context=ctx) as pool:
        futures = {
            pool.submit(_machine_job, (label, device, seed, wall_deadline, shrink, out_dir)): label for label in labels
        }
        done = {}
        for f in as_completed(futures):
            done[futures[f]] = f.result()
            if progress:
                progress(len(done), len(labels))
    return [done[label] for label in labels]


# -------------------------------------------------------------- the run


def run_suites(
    budget: float | None = None,
    device: str = "cpu",
    json_path: str | None = None,
    console: "Console | None" = None,
    seed: int = 0,
    walks: int = WALKS,
    steps: int = STEPS,
    skip_proofs: bool = False,
    skip_fuzz: bool = False,
    skip_vectors: bool = False,
    verbose: bool = False,
    out_dir: str = "fuzz-failures",
    cache: str | None = None,
    jobs: int = 2,
) -> int:
    """Run every part (within ``budget`` seconds, if given); print progress,
    the part tables and one summary.  Returns the exit status (``EXIT_*``)."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    clock = Clock(budget)
    rows: list[dict] = []
    failures: list[dict] = []
    not_run: list[dict] = []
    cases: Counter[str] = Counter()  # coverage events seen
    stats: Counter[str] = Counter()
    ends: dict[str, float] = {}  # when each part ended, seconds into the run (in --json: where a budget went)
    with Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as bar:

        def task(name, total=1):
            tid = bar.add_task(name, total=total)

            def update(done, total):
                bar.update(tid, completed=done, total=max(total, 1))

            return tid, update

        tid, _ = task("self-checks")
        srows, cuts = selfcheck_rows(walks, steps, seed, clock.deadline("self-checks"))
        rows += srows
        not_run += cuts
        bar.update(tid, completed=1)
        ends["self-checks"] = clock.wall()
        if skip_proofs:
            not_run += [cut("z3", "every obligation", "--skip-proofs"), cut("crosshair", "every run", "--skip-proofs")]
        else:
            _, up = task("proofs: z3 obligations")
            zrows, left_out = z3_rows(clock.deadline("z3"), jobs, cache, up)
            rows += zrows
            ends["z3"] = clock.wall()
            if left_out:
                not_run.append(
                    cut(
                        "z3",
                        f"{len(left_out)} of {len(zrows) + len(left_out)} obligations: {', '.join(left_out)}",
                        "the budget",
                    )
                )
            _, up = task("proofs: CrossHair")
            crows, cuts = crosshair_rows(clock.deadline("crosshair"), jobs, up)
            rows += crows
            not_run += cuts
            ends["crosshair"] = clock.wall()
        if skip_vectors:
            not_run.append(cut("vectors", "every case", "--skip-vectors"))
        else:
            _, up = task("vectors (impl)")
            vrows, cuts = vector_rows(device, clock.deadline("vectors"), up)
            rows += vrows
            not_run += cuts
            ends["vectors"] = clock.wall()
        if skip_fuzz:
            not_run.append(cut("differential", "every machine", "--skip-fuzz"))
        else:
            from kvarena.verification import fuzz

            labels = list(fuzz.MACHINES)
            tid, up = task("differential machines", len(labels))
            results = differential_rows(
                labels, device, seed, clock.deadline("differential"), budget is None, out_dir, jobs, up
            )
            for row, seen, mstats, failure, cuts in results:
                rows.append(row)
                cases.update(seen)
                stats.update(mstats)
                not_run += cuts
                if failure:
                    failures.append(failure)
            ends["differential"] = clock.wall()
    wall = clock.wall()
    failed = [r for r in rows if not r["ok"]]
    status = EXIT_FAILED if failed else EXIT_INCOMPLETE if not_run else EXIT_OK
    _print_parts(console, rows, verbose)
    summary = _summary(rows, stats, cases, failures, not_run, budget, wall, device, cache, status)
    _print_summary(console, summary)
    if json_path:
        with open(json_path, "w") as f:
            part_ends = {k: round(v, 1) for k, v in ends.items()}
            json.dump({"summary": summary, "part_ends_s": part_ends, "rows": rows}, f, indent=1, default=str)
    colour = "red" if failed else "yellow" if not_run else "green"
    verdict = {
        EXIT_OK: "complete: every check ran and passed",
        EXIT_FAILED: f"FAILED (exit {EXIT_FAILED})"
        + (f"; {len(not_run)} part(s) not run, listed above" if not_run else ""),
        EXIT_INCOMPLETE: f"INCOMPLETE (exit {EXIT_INCOMPLETE}): {len(not_run)} part(s) not run, listed above",
    }[status]
    budget_text = "no budget" if budget is None else f"budget {budget:.0f}s"
    console.print(
        f"[{colour}]kvarena verify: {len(rows) - len(failed)} passed, {len(failed)} failed"
        f" in {wall:.1f}s ({budget_text}); {verdict}[/{colour}]"
    )
    return status


def _summary(rows, stats, cases, failures, not_run, budget, wall, device, cache, status):
    from kvarena.proofs import cli as prove_cli
    from kvarena.verification import fuzz

    def part(name):
        return [r for r in rows if r["part"] == name]

    z3 = part("z3")
    ch = part("crosshair")
    vec = part("vectors")
    required = fuzz.required_cases()
    return {
        "budget_s": budget,
        "wall_s": round(wall, 1),
        "device": device,
        "exit": status,
        "self_checks": {"passed": sum(r["ok"] for r in part("self-checks")), "total": len(part("self-checks"))},
        "z3": {
            "obligations": len(prove_cli.registry()),
            "run": len(z3),
            "proved": sum(r.get("result") == "proved" and r["ok"] for r in z3),
            "refuted_findings": sum(r.get("expect") == "counterexample" and r["ok"] for r in z3),
            "failed": sum(not r["ok"] for r in z3),
            "from_cache": sum(r.get("cache") == "hit" for r in z3),
            "proved_now": sum(r.get("cache") != "hit" for r in z3),
            "cache": cache,
            "cache_warnings": prove_cli.cache_warnings(z3),
        },
        "crosshair": {
            "runs": len(ch),
            **dict(Counter(r.get("result") for r in ch).items()),
            "failed": sum(not r["ok"] for r in ch),
        },
        "vectors": {
            "cases": sum(r.get("cases", 0) for r in vec),
            "total": sum(r.get("total", 0) for r in vec),
            "failed": sum(not r["ok"] for r in vec),
        },
        "differential": {
            r["name"]: {k: r[k] for k in ("examples", "steps", "required", "reached", "missing")}
            for r in part("differential")
        },
        "fuzz": {"examples": stats["examples"], "steps": stats["steps"]},
        "required_events": {"total": len(required), "reached": sum(cases[c] > 0 for c in required)},
        "coverage": dict(sorted(cases.items())),
        "not_run": not_run,
        "failures": [{k: v for k, v in f.items() if k != "traceback"} for f in failures]
        + [
            {"name": r["name"], "detail": str(r["detail"])[:500]}
            for r in rows
            if not r["ok"] and r["part"] != "differential"
        ],
    }


def _print_parts(console, rows, verbose):
    from rich.table import Table

    shown = rows if verbose else [r for r in rows if not r["ok"] or r["part"] in ("vectors", "differential")]
    if not shown:
        return
    t = Table(
        title="checks" if verbose else "vectors, differential machines and every failure (--verbose: every check)"
    )
    for col in ("part", "check", "result", "seconds", "detail"):
        t.add_column(col, overflow="fold", no_wrap=col == "check", justify="right" if col == "seconds" else "left")
    for r in shown:
        mark = "[green]pass[/green]" if r["ok"] else "[red]FAIL[/red]"
        if r.get("result") == "not finished":
            mark = "[yellow]not finished[/yellow]"
        t.add_row(r["part"], r["name"], mark, f"{r['seconds']:.1f}", str(r["detail"])[:300])
    console.print(t)


def _print_summary(console, s):
    from rich.table import Table

    from kvarena.verification.fuzz import shrink_line

    budget = "no budget: every check to completion" if s["budget_s"] is None else f"a {s['budget_s']:.0f}s budget"
    t = Table(title=f"kvarena verify: summary ({s['wall_s']}s, {budget}, {s['device']})")
    t.add_column("what")
    t.add_column("result", overflow="fold")
    z, c, v = s["z3"], s["crosshair"], s["vectors"]
    t.add_row("spec self-checks", f"{s['self_checks']['passed']}/{s['self_checks']['total']} passed")
    if z["run"]:
        cached = f"{z['from_cache']} from the cache at {z['cache']}" if z["cache"] else "no cache (--no-cache)"
        t.add_row(
            "z3 obligations",
            f"{z['run']} of {z['obligations']} run: {z['proved']} proved, {z['refuted_findings']} refuted "
            f"as documented findings, {z['failed']} failed; {z['proved_now']} checked now, {cached}",
        )
    else:
        t.add_row("z3 obligations", f"0 of {z['obligations']} run")
    kinds = ", ".join(f"{n} {k}" for k, n in c.items() if k not in ("runs", "failed"))
    t.add_row("CrossHair", f"{c['runs']} runs: {kinds}; {c['failed']} failed" if c["runs"] else "not run")
    t.add_row(
        "conformance vectors",
        f"{v['cases']} of {v['total']} cases replayed on impl, {v['failed']} failing rows" if v["total"] else "not run",
    )
    for name, d in s["differential"].items():
        t.add_row(
            "differential",
            f"{name}: {d['examples']} examples, {d['steps']} steps; {d['reached']}/{d['required']} required events"
            + (f" (not reached: {', '.join(d['missing'])})" if d["missing"] else ""),
        )
    ev = s["required_events"]
    t.add_row("required events", f"{ev['reached']}/{ev['total']} reached")
    seen = s["coverage"]
    t.add_row("coverage events seen", ", ".join(f"{k} {n}" for k, n in seen.items()) if seen else "none")
    for w in z["cache_warnings"][:5]:
        t.add_row("[yellow]cache warning[/yellow]", w)
    if len(z["cache_warnings"]) > 5:
        t.add_row("[yellow]cache warning[/yellow]", f"and {len(z['cache_warnings']) - 5} more (--json has them all)")
    for n in s["not_run"]:
        what = n["what"] if len(n["what"]) <= 300 else n["what"][:300] + "... (--json lists them all)"
        t.add_row("[yellow]NOT RUN[/yellow]", f"{n['part']}: {what} ({n['why']})")
    for fl in s["failures"]:
        if "vector" in fl:
            t.add_row(
                "[red]FAILURE[/red]",
                f"{fl.get('machine')} ({fl.get('policy')}): {fl['error'][:300]}\n"
                f"vector: {fl.get('vector')} (reproduces on impl: {fl.get('reproduces')}"
                f"{'' if fl.get('shrunk') else '; not shrunk under --budget: rerun without one to shrink it'})\n"
                + (f"{shrink_line(fl['shrink'])}\n" if fl.get("shrink") else "")
                + f"{fl.get('hypothesis', '')[-1500:]}\n{fl.get('pytest', '')}",
            )
        else:
            t.add_row("[red]FAILURE[/red]", f"{fl['name']}: {fl['detail']}")
    console.print(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvarena.proofs import cli as prove_cli
    from kvarena.verification import command_line as cl

    parser.description = (
        "Run every check to completion (exit 0: all ran and passed; 1: a check failed; 2: a bad argument; "
        "3: nothing failed but a --budget or --skip-* option left checks out, which the summary lists)."
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="smoke mode: stop each part at its share of SECONDS; what did not run is listed and the exit "
        "status is 3 (default: no budget, every check to completion)",
    )
    cl.add_device(parser, help="device of the implementation")
    cl.add_json(parser, "also write the summary and every result as JSON")
    prove_cli.add_cache_arguments(parser)
    parser.add_argument("--jobs", type=int, default=2, help="solver processes and CrossHair runs at once (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="the first random-walk and differential-round seed")
    parser.add_argument("--walks", type=int, default=WALKS, help=f"random walks (default {WALKS}; fewer: exit 3)")
    parser.add_argument(
        "--steps", type=int, default=STEPS, help=f"operations per walk (default {STEPS}; fewer: exit 3)"
    )
    parser.add_argument("--skip-proofs", action="store_true", help="leave out the z3 and CrossHair runs (exit 3)")
    parser.add_argument("--skip-fuzz", action="store_true", help="leave out the differential machines (exit 3)")
    parser.add_argument("--skip-vectors", action="store_true", help="leave out the conformance vectors (exit 3)")
    cl.add_failures_dir(parser)
    parser.add_argument("--verbose", action="store_true", help="a row for every check, not only failures")


def run(args: argparse.Namespace) -> int:
    """``kvarena verify``."""
    from kvarena.proofs import cli as prove_cli
    from kvarena.verification import command_line as cl

    if cl.no_device("verify", args.device):
        return EXIT_USAGE
    if args.budget is not None and args.budget <= 0:
        cl.console().print(f"[red]kvarena verify: --budget must be > 0, got {args.budget:g}[/red]")
        return EXIT_USAGE
    cache, why = prove_cli.cache_location(args)
    if why:
        cl.console().print(f"[red]kvarena verify: {why}[/red]")
        return EXIT_USAGE
    # the options named as run_suites' parameters; --json and --failures are not
    same = ["budget", "device", "seed", "walks", "steps", "skip_proofs", "skip_fuzz", "skip_vectors", "verbose", "jobs"]
    return run_suites(
        **{k: getattr(args, k) for k in same},
        json_path=args.json,
        console=cl.console(),
        out_dir=args.failures,
        cache=cache,
    )
