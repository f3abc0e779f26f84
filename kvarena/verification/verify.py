"""``kvarena verify``: every suite in one budgeted run, with one summary.

The parts run in a fixed order, each within a share of the budget
(``plan``), and the differential campaign gets whatever is left:

1. **self-checks**: the spec's contract-checked scenarios and seeded
   random walks (``kvarena.verification.selfcheck``; 20 walks, fewer under 120 s);
2. **z3**: the obligations with their vacuity and tautology checks
   (``kvarena.proofs``), two solver processes, until half the budget is
   spent; the summary names any obligation left unrun (``kvarena prove``
   runs them all);
3. **CrossHair**: ``crosshair check`` of the spec's contracts within 15%
   of the budget, the per-condition time scaled down to fit (``kvarena
   prove`` gives 2 s), plus ``diffbehavior`` of the spec/impl twins when
   the share gives each of those runs 15 s (a budget of 500 s and more;
   ``kvarena prove`` runs them at 4 s per condition); a run cut off by its
   cap is reported "not finished", not passed as confirmed;
4. **vectors**: the shipped conformance vectors replayed on the
   implementation (``kvarena.verification.vectors``);
5. **differential**: a fixed-seed pass of each differential machine (arena
   and composites, each policy the machines take), 60 examples each;
6. **campaign**: fresh random examples of the same machines until the
   budget is spent (``kvarena.verification.fuzz``).

Every required coverage event (``differential.REQUIRED`` and the
composites') must be seen somewhere in 5 and 6.  A failure in 5 or 6 is
shrunk and saved as a vector with a pytest reproduction.  The budget is a
target: a part in progress finishes its current step (one obligation, one
round of examples), and a failure can run past it while Hypothesis
shrinks it.
"""

import argparse
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_BUDGET = 240.0  # four minutes: every obligation within the z3 share, a campaign after the fixed seeds
# Shares of the budget.  The differential campaign gets whatever is left.
Z3_SHARE, CROSSHAIR_SHARE = 0.5, 0.15
CROSSHAIR_FULL_PER_CONDITION = 2.0  # what kvarena prove gives each condition
DIFFERENTIAL_EXAMPLES = 60  # per machine and policy: reaches every required event (docs/guides/verifying.md)


@dataclass
class Plan:
    budget: float
    walks: int
    steps: int
    z3_s: float
    crosshair_s: float
    differential_examples: int
    notes: list


def plan(budget, walks=None, steps=300, skip_proofs=False, skip_fuzz=False, fuzz_examples=None):
    """How the budget is shared between the parts (see the module docstring)."""
    notes = []
    if walks is None:
        walks = 20 if budget >= 120 else max(2, int(budget / 6))
    z3_s = 0.0 if skip_proofs else round(Z3_SHARE * budget, 1)
    crosshair_s = 0.0 if skip_proofs else round(CROSSHAIR_SHARE * budget, 1)
    if fuzz_examples is None:
        fuzz_examples = 0 if skip_fuzz else max(5, min(DIFFERENTIAL_EXAMPLES, int(budget / 3)))
    if skip_proofs:
        notes.append("proofs skipped (--skip-proofs)")
    if skip_fuzz:
        notes.append("differential fuzz and campaign skipped (--skip-fuzz)")
    return Plan(budget, walks, steps, z3_s, crosshair_s, fuzz_examples, notes)


# ------------------------------------------------------------------ parts


def selfcheck_rows(p, seed=0):
    from kvarena.verification import selfcheck

    checks = selfcheck.run_scenarios() + selfcheck.run_walks(range(seed, seed + p.walks), p.steps)
    return [
        {"part": "self-checks", "name": c.name, "ok": c.ok, "detail": c.detail, "seconds": c.seconds} for c in checks
    ]


def z3_rows(seconds, jobs=2, progress=None):
    """The obligations, ``jobs`` solver processes, one row each, until
    ``seconds`` are spent; a list of rows and the names not run."""
    from kvarena.proofs import cli as prove_cli

    names = prove_cli.selected(None)
    if progress:
        progress(0, len(names))
    deadline = time.perf_counter() + seconds
    rows = []
    pool = prove_cli.solver_pool(jobs)  # a fresh process per obligation, as kvarena prove
    try:
        pending = [(n, pool.apply_async(prove_cli.run_one, (n,))) for n in names]
        for _n, res in pending:
            left = deadline - time.perf_counter()
            try:
                r = res.get(timeout=max(0.0, left))
            except multiprocessing.TimeoutError:
                break
            r["seconds"], r["detail"] = r.get("time_s", 0.0), prove_cli.detail(r)
            rows.append({"part": "z3", **r})
            if progress:
                progress(len(rows), len(names))
    finally:
        pool.terminate()
        pool.join()
    done = {r["name"] for r in rows}
    return rows, [n for n in names if n not in done]


MIN_CROSSHAIR_RUN_S = 15.0  # below this a CrossHair subprocess does little beyond starting up


def crosshair_budget(seconds, tasks, jobs):
    """``(cap, per_check, per_diff)``: a wall-clock cap per CrossHair
    subprocess so ``tasks`` runs, ``jobs`` at a time, fit ``seconds``, and
    per-condition times scaled to it (about 40 conditions fit a cap),
    never above ``kvarena prove``'s 2 s and 4 s."""
    waves = -(-tasks // jobs)
    cap = max(5.0, seconds / waves)
    per = round(min(CROSSHAIR_FULL_PER_CONDITION, max(0.25, cap / 40)), 2)
    return cap, per, round(min(2 * CROSSHAIR_FULL_PER_CONDITION, 2 * per), 2)


def crosshair_tasks(seconds, jobs, checks, pairs):
    """The contract checks always; the ``diffbehavior`` pairs only when the
    share still gives every run ``MIN_CROSSHAIR_RUN_S`` (each pair imports
    torch and the implementation, a few seconds before any condition)."""
    tasks = [("check", m) for m in checks]
    with_pairs = tasks + [("diff", pr) for pr in pairs]
    if seconds / -(-len(with_pairs) // jobs) >= MIN_CROSSHAIR_RUN_S:
        return with_pairs, []
    return tasks, list(pairs)


def crosshair_rows(seconds, jobs=2, progress=None):
    """The CrossHair checks and diffs with per-condition times scaled so the
    part fits ``seconds`` (at most the full run's 2 s and 4 s)."""
    from concurrent.futures import ThreadPoolExecutor

    from kvarena.proofs import crosshair_runs as ch

    tasks, skipped = crosshair_tasks(seconds, jobs, ch.CHECK_MODULES, ch.DIFF_PAIRS)
    cap, per, per_diff = crosshair_budget(seconds, len(tasks), jobs)
    done = []

    def run(t):
        rs = (
            ch.check_module(t[1], per_condition_s=per, wall_s=cap)
            if t[0] == "check"
            else [ch.diff_pair(*t[1], per_condition_s=per_diff, wall_s=cap)]
        )
        done.append(t)
        if progress:
            progress(len(done), len(tasks))
        return rs

    if progress:
        progress(0, len(tasks))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        out = [r for rs in ex.map(run, tasks) for r in rs]
    rows = []
    for r in out:
        capped = r["result"] == "error" and "wall-clock cap" in str(r.get("reason", ""))
        if capped:  # the shortened run ran out of time: not a finding, and not a pass either
            r["result"], r["ok"] = "not finished", True
        r["seconds"] = r.get("time_s", 0.0)
        r["detail"] = f"{r['result']}: {str(r.get('reason', ''))[:160]}"
        rows.append({"part": "crosshair", **r})
    note = (
        f"{per}s per condition (check), {per_diff}s (diffbehavior), {cap:.0f}s cap per run; "
        f"kvarena prove runs 2s and 4s"
    )
    if skipped:
        note = (
            f"{per}s per condition, {cap:.0f}s cap per run (kvarena prove: 2s); the {len(skipped)} "
            f"diffbehavior pairs skipped: a {seconds:.0f}s share cannot give each {MIN_CROSSHAIR_RUN_S:.0f}s "
            f"(kvarena prove runs them, and verify does from a budget of "
            f"{MIN_CROSSHAIR_RUN_S * -(-(len(tasks) + len(skipped)) // jobs) / CROSSHAIR_SHARE:.0f}s)"
        )
    return rows, note


def vector_rows(device="cpu", progress=None):
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
        ]
    cases = vectors.load_cases(root)
    t = time.perf_counter()
    results = []
    for c in cases:
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
    return [
        {
            "part": "vectors",
            "name": f"vectors replay on impl ({device})",
            "ok": not failed,
            "detail": detail,
            "seconds": time.perf_counter() - t,
            "cases": len(results),
        }
    ]


def differential_rows(examples, device="cpu", progress=None, out_dir="fuzz-failures"):
    """A fixed-seed pass of every machine and policy; each row fails on a
    disagreement, which is shrunk and saved as a vector.  Coverage is judged
    over the whole run (``coverage_row``)."""
    from kvarena.verification import fuzz

    rows, cases, stats, failures = [], Counter(), Counter(), []
    todo = fuzz.targets()
    for i, (label, policy) in enumerate(todo):
        r = fuzz.run_round(label, policy, device, examples=examples, shrink=True, derandomize=True)
        cases.update(r["cases"])
        stats["examples"] += r["examples"]
        stats["steps"] += r["steps"]
        f = r["failure"]
        if f:
            f = fuzz.save_failure(f, label, out_dir, device)
            f.update(machine=label, policy=r["policy"], device=device)
            failures.append(f)
        rows.append(
            {
                "part": "differential",
                "name": f"{label} impl vs spec ({r['policy']}) on {device}",
                "ok": f is None,
                "seconds": r["seconds"],
                "examples": r["examples"],
                "steps": r["steps"],
                "detail": f"{r['examples']} examples, {r['steps']} steps" if f is None else f["error"][:300],
            }
        )
        if progress:
            progress(i + 1, len(todo))
    return rows, cases, stats, failures


def campaign_rows(seconds, device="cpu", out_dir="fuzz-failures"):
    from kvarena.verification import fuzz

    if seconds < 1:
        return [], Counter(), Counter(), []
    s = fuzz.campaign(seconds, workers=1, device=device, out_dir=out_dir, min_rounds=0)
    stats = Counter(examples=s["examples"], steps=s["steps"])
    ok = not s["failures"]
    rows = [
        {
            "part": "campaign",
            "name": f"campaign on {device}",
            "ok": ok,
            "seconds": s["seconds"],
            "examples": s["examples"],
            "steps": s["steps"],
            "detail": f"{s['rounds']} rounds, {s['examples']} examples, {s['steps']} steps; "
            f"{', '.join(f'{k}: {v}' for k, v in s['per_target'].items())}",
        }
    ]
    return rows, Counter(s["cases"]), stats, s["failures"]


def coverage_row(cases, campaign_s, budget):
    """Every required event must be seen, unless the budget left the campaign
    under a sixth of it: then the row passes and says what was not reached
    (``tests/test_differential*.py::test_*coverage`` require every event at
    their fixed sizes)."""
    from kvarena.verification import fuzz

    required = fuzz.required_cases()
    missing = [c for c in required if cases[c] == 0]
    short = campaign_s < budget / 6
    detail = f"{len(required) - len(missing)}/{len(required)} reached"
    if missing:
        detail += (
            f"; not reached within this budget (the campaign ran {campaign_s:.0f}s): {missing}"
            if short
            else f"; never reached: {missing}"
        )
    return {
        "part": "coverage",
        "name": "required coverage events",
        "ok": not missing or short,
        "seconds": 0.0,
        "detail": detail,
    }


# -------------------------------------------------------------- the run


def run_suites(
    budget: float = DEFAULT_BUDGET,
    device: str = "cpu",
    json_path: str | None = None,
    console: "Console | None" = None,
    seed: int = 0,
    walks: int | None = None,
    steps: int = 300,
    skip_proofs: bool = False,
    skip_fuzz: bool = False,
    skip_vectors: bool = False,
    fuzz_examples: int | None = None,
    verbose: bool = False,
    out_dir: str = "fuzz-failures",
) -> int:
    """Run every part; print progress, the part tables and one summary. Returns the exit code."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    t0 = time.perf_counter()
    p = plan(budget, walks, steps, skip_proofs, skip_fuzz, fuzz_examples)
    rows, failures, notes = [], [], list(p.notes)
    cases: Counter[str] = Counter()  # coverage events seen
    stats: Counter[str] = Counter()
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
        rows += selfcheck_rows(p, seed)
        bar.update(tid, completed=1)
        if p.z3_s:
            _, up = task("proofs: z3 obligations")
            zrows, not_run = z3_rows(p.z3_s, progress=up)
            rows += zrows
            if not_run:
                notes.append(
                    f"z3: {len(not_run)} of {len(zrows) + len(not_run)} obligations not run within "
                    f"their {p.z3_s:.0f}s share (first: {', '.join(not_run[:3])}); "
                    f"kvarena prove runs them all"
                )
        if p.crosshair_s:
            _, up = task("proofs: CrossHair")
            ch, note = crosshair_rows(p.crosshair_s, progress=up)
            rows += ch
            notes.append("CrossHair shortened: " + note)
        if not skip_vectors:
            _, up = task("vectors (impl)")
            rows += vector_rows(device, progress=up)
        if not skip_fuzz:
            _, up = task("differential (fixed seeds)")
            drows, dcases, dstats, failures = differential_rows(p.differential_examples, device, up, out_dir)
            rows += drows
            cases.update(dcases)
            stats.update(differential=dstats["examples"], differential_steps=dstats["steps"])
            left = budget - (time.perf_counter() - t0) - 2
            if not any(not r["ok"] for r in drows) and left >= 1:
                tid, _ = task("campaign (random seeds)")
                bar.update(tid, total=None)
                crows, ccases, cstats, cfail = campaign_rows(left, device, out_dir)
                failures += cfail
                bar.update(tid, total=1, completed=1)
                rows += crows
                cases.update(ccases)
                stats.update(campaign=cstats["examples"], campaign_steps=cstats["steps"])
            elif left < 1:
                notes.append("campaign skipped: the budget was spent before it")
            crow = coverage_row(cases, sum(r["seconds"] for r in rows if r["part"] == "campaign"), budget)
            rows.append(crow)
            if crow["ok"] and "not reached" in crow["detail"]:
                notes.append("coverage: " + crow["detail"])
    wall = time.perf_counter() - t0
    failed = [r for r in rows if not r["ok"]]
    _print_parts(console, rows, verbose)
    summary = _summary(rows, stats, cases, failures, budget, wall, device, notes)
    _print_summary(console, summary)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1, default=str)
    colour = "red" if failed else "green"
    console.print(
        f"[{colour}]kvarena verify: {len(rows) - len(failed)} passed, {len(failed)} failed"
        f" in {wall:.1f}s (budget {budget:.0f}s)[/{colour}]"
    )
    return 1 if failed else 0


def _summary(rows, stats, cases, failures, budget, wall, device, notes):
    def part(name):
        return [r for r in rows if r["part"] == name]

    z3 = part("z3")
    ch = part("crosshair")
    res = Counter(r.get("result") for r in ch)
    vec = part("vectors")
    return {
        "budget_s": budget,
        "wall_s": round(wall, 1),
        "device": device,
        "self_checks": {"passed": sum(r["ok"] for r in part("self-checks")), "total": len(part("self-checks"))},
        "z3": {
            "obligations": len(z3),
            "proved": sum(r.get("result") == "proved" and r["ok"] for r in z3),
            "valid_no_hypotheses": sum(r.get("tautology") == "goal" and r["ok"] for r in z3),
            "refuted_findings": sum(r.get("expect") == "counterexample" and r["ok"] for r in z3),
            "failed": sum(not r["ok"] for r in z3),
        },
        "crosshair": {"runs": len(ch), **dict(res.items()), "failed": sum(not r["ok"] for r in ch)},
        "vectors": {"cases": sum(r.get("cases", 0) for r in vec), "failed": sum(not r["ok"] for r in vec)},
        "fuzz": {
            "differential_examples": stats["differential"],
            "differential_steps": stats["differential_steps"],
            "campaign_examples": stats["campaign"],
            "campaign_steps": stats["campaign_steps"],
        },
        "coverage": dict(sorted(cases.items())),
        "failures": [{k: v for k, v in f.items() if k != "traceback"} for f in failures]
        + [
            {"name": r["name"], "detail": str(r["detail"])[:500]}
            for r in rows
            if not r["ok"] and r["part"] not in ("campaign", "differential")
        ],
        "notes": notes,
    }


def _print_parts(console, rows, verbose):
    from rich.table import Table

    shown = (
        rows
        if verbose
        else [r for r in rows if not r["ok"] or r["part"] in ("vectors", "differential", "campaign", "coverage")]
    )
    if not shown:
        return
    t = Table(title="checks" if verbose else "fuzz, vectors and every failure (--verbose: every check)")
    for col in ("part", "check", "result", "seconds", "detail"):
        t.add_column(col, overflow="fold", no_wrap=col == "check", justify="right" if col == "seconds" else "left")
    for r in shown:
        mark = "[green]pass[/green]" if r["ok"] else "[red]FAIL[/red]"
        t.add_row(r["part"], r["name"], mark, f"{r['seconds']:.1f}", str(r["detail"])[:300])
    console.print(t)


def _print_summary(console, s):
    from rich.table import Table

    t = Table(title=f"kvarena verify: summary ({s['wall_s']}s of a {s['budget_s']:.0f}s budget, {s['device']})")
    t.add_column("what")
    t.add_column("result", overflow="fold")
    z, c, f = s["z3"], s["crosshair"], s["fuzz"]
    t.add_row("spec self-checks", f"{s['self_checks']['passed']}/{s['self_checks']['total']} passed")
    t.add_row(
        "z3 obligations",
        f"{z['obligations']} run: {z['proved']} proved, {z['refuted_findings']} refuted "
        f"as documented findings, {z['failed']} failed"
        if z["obligations"]
        else "not run",
    )
    if c["runs"]:
        kinds = ", ".join(f"{v} {k}" for k, v in c.items() if k not in ("runs", "failed"))
        t.add_row("CrossHair conditions", f"{c['runs']} runs: {kinds}; {c['failed']} failed")
    else:
        t.add_row("CrossHair conditions", "not run")
    t.add_row(
        "conformance vectors",
        f"{s['vectors']['cases']} cases replayed on impl, {s['vectors']['failed']} failing rows"
        if s["vectors"]["cases"]
        else "not run",
    )
    t.add_row(
        "differential fuzz",
        f"fixed seeds: {f['differential_examples']} examples, "
        f"{f['differential_steps']} steps; campaign: {f['campaign_examples']} examples, "
        f"{f['campaign_steps']} steps",
    )
    seen = s["coverage"]
    t.add_row(
        "coverage events seen",
        f"{len(seen)} kinds: " + ", ".join(f"{k} {v}" for k, v in seen.items()) if seen else "none",
    )
    for note in s["notes"]:
        t.add_row("note", note)
    for fl in s["failures"]:
        if "vector" in fl:
            t.add_row(
                "[red]FAILURE[/red]",
                f"{fl.get('machine')} ({fl.get('policy')}): {fl['error'][:300]}\n"
                f"vector: {fl.get('vector')} (reproduces on impl: {fl.get('reproduces')})\n"
                f"{fl.get('hypothesis', '')[-1500:]}\n{fl.get('pytest', '')}",
            )
        else:
            t.add_row("[red]FAILURE[/red]", f"{fl['name']}: {fl['detail']}")
    console.print(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvarena.verification import command_line as cl

    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        metavar="SECONDS",
        help="time to aim for; the differential campaign gets what the other parts leave (default 240)",
    )
    cl.add_device(parser, help="device of the implementation")
    cl.add_json(parser, "also write the summary and every result as JSON")
    parser.add_argument("--seed", type=int, default=0, help="first random-walk seed")
    parser.add_argument(
        "--walks", type=int, default=None, help="random walks to run (default: 20, fewer on a small budget)"
    )
    parser.add_argument("--steps", type=int, default=300, help="operations per walk")
    parser.add_argument("--skip-proofs", action="store_true", help="leave out the z3/CrossHair obligations")
    parser.add_argument("--skip-fuzz", action="store_true", help="leave out the differential fuzz and the campaign")
    parser.add_argument("--skip-vectors", action="store_true", help="leave out the conformance vectors")
    parser.add_argument(
        "--fuzz-examples",
        type=int,
        default=None,
        help="fixed-seed examples per differential machine (default: from the budget)",
    )
    cl.add_failures_dir(parser)
    parser.add_argument("--verbose", action="store_true", help="a row for every check, not only failures")


def run(args: argparse.Namespace) -> int:
    """``kvarena verify``."""
    from kvarena.verification import command_line as cl

    if cl.no_device("verify", args.device):
        return 2
    # the options named as run_suites' parameters; --json and --failures are not
    same = [
        "budget",
        "device",
        "seed",
        "walks",
        "steps",
        "skip_proofs",
        "skip_fuzz",
        "skip_vectors",
        "fuzz_examples",
        "verbose",
    ]
    return run_suites(
        **{k: getattr(args, k) for k in same},
        json_path=args.json,
        console=cl.console(),
        out_dir=args.failures,
    )
