"""``kvarena prove [--only NAME] [--json PATH] [--no-crosshair] [--jobs N]``.

Runs every z3 obligation (with its vacuity and tautology checks) and the
CrossHair runs, prints a table of each with its result and time, and a
one-line total.
Exits non-zero on any failure.  ``run_all`` returns the rows for
``kvarena verify``.
"""

import argparse
import json
import multiprocessing
import sys
import time


def registry():
    """Import every obligation module; return the registry (name -> Obligation)."""
    from .obligations import REGISTRY

    return REGISTRY


def run_one(name):
    """Run one obligation by name in this process: its result row."""
    from .core import run_obligation

    return run_obligation(registry()[name])


def selected(only):
    """The names ``--only`` selects: each comma-separated prefix (or name)."""
    names = list(registry())
    if only:
        prefixes = [p for p in only.split(",") if p]
        names = [n for n in names if any(n == p or n.startswith(p) for p in prefixes)]
    return names


def detail(r):
    if r.get("result") == "counterexample" and r.get("counterexample"):
        cex = ", ".join(f"{k}={v}" for k, v in list(r["counterexample"].items())[:12])
        return f"{r['result']}: {cex}"
    bits = [r.get("result", "")]
    if r.get("vacuity") not in (None, "n/a"):
        bits.append(f"vacuity {r['vacuity']}")
    if r.get("tautology") not in (None, "n/a", "none"):
        bits.append(f"tautology {r['tautology']}")
    if r.get("expect") == "counterexample":
        bits.append("refutation (finding)")
    if r.get("reason"):
        bits.append(str(r["reason"])[:100])
    return "; ".join(bits)


def solver_pool(jobs):
    """``jobs`` solver processes, a fresh one for each obligation, none forked
    from this process.

    z3's search depends on the terms a process built before (``proofs.core``
    says how much), so each obligation starts in a clean interpreter: from a
    fork server where the platform has one (it imports the obligations once,
    building no z3 term, so a worker starts in milliseconds), else spawned."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=1)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__.rpartition(".")[0] + ".obligations"])
    return ctx.Pool(jobs, maxtasksperchild=1)


def _run_patched(task):
    name, patch = task
    if patch is not None:
        patch()
    return run_one(name)


def run_fresh(names, patch=None, jobs=1):
    """Run the obligations ``names``, each in a fresh solver process; their
    result rows, in the order given.

    ``patch``, when given, is called in each process before its obligation
    runs: a function defined at module level (the process imports it by
    name) that mutates the spec there, as the mutation tests do.  The
    caller's process is never changed, and a verdict does not depend on
    what it ran before."""
    # the largest limits (the slowest obligations) first, so that no long one
    # is left running alone at the end
    limits = {n: ob.timeout_s for n, ob in registry().items()}
    order = sorted(names, key=lambda n: -limits[n])
    with solver_pool(max(1, jobs)) as pool:
        rows = dict(zip(order, pool.map(_run_patched, [(n, patch) for n in order], chunksize=1)))
    return [rows[n] for n in names]


def run_z3(only=None, jobs=2):
    return run_fresh(selected(only), jobs=jobs)


def run_all(only=None, crosshair=True, jobs=2):
    """Every obligation (and, with ``crosshair``, every CrossHair run) as result dicts.

    Each dict has ``name``, ``group``, ``kind``, ``statement``, ``result``,
    ``ok``, ``time_s``, ``limit_s``, ``vacuity``, ``tautology`` (z3 rows)
    and, for ``kvarena verify``'s table, ``seconds`` and ``detail``.
    """
    results = run_z3(only, jobs)
    if crosshair:
        from .crosshair_runs import run_crosshair

        results += (
            run_crosshair(jobs=jobs, only=only if only and only.startswith("crosshair") else None)
            if not only or only.startswith("crosshair")
            else []
        )
    for r in results:
        r["seconds"] = r.get("time_s", 0.0)
        r["detail"] = detail(r)
    return results


def _print(results, wall):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    t = Table(title="kvarena prove")
    t.add_column("#", justify="right")
    t.add_column("obligation", no_wrap=True)
    t.add_column("result")
    t.add_column("vacuity")
    t.add_column("taut")
    t.add_column("s", justify="right")
    t.add_column("limit", justify="right")
    t.add_column("z3 units (M)", justify="right")
    t.add_column("statement / detail", overflow="fold")
    for k, r in enumerate(results, 1):
        colour = "green" if r["ok"] else "red"
        res = r["result"] + (" (expected)" if r.get("expect") == "counterexample" and r["ok"] else "")
        text = r.get("statement", "")
        if len(text) > 110:
            text = text[:107] + "..."
        if not r["ok"] or r["result"] == "counterexample":
            text += " | " + detail(r)
        t.add_row(
            str(k),
            r["name"],
            f"[{colour}]{res}[/{colour}]",
            str(r.get("vacuity", "")),
            str(r.get("tautology", "")),
            f"{r.get('time_s', 0):.2f}",
            str(r.get("limit_s", "")),
            f"{r['units'] / 1e6:.1f} of {r['limit_units'] / 1e6:.0f}" if "units" in r else "",
            text,
        )
    console.print(t)
    failed = [r for r in results if not r["ok"]]
    z3n = sum(1 for r in results if r.get("kind") == "z3")
    proved = sum(1 for r in results if r.get("kind") == "z3" and r["result"] == "proved" and r["ok"])
    refuted = sum(1 for r in results if r.get("kind") == "z3" and r.get("expect") == "counterexample" and r["ok"])
    lemmas = sum(1 for r in results if r.get("obligation_kind") == "lemma" and r["ok"])
    demos = sum(1 for r in results if r.get("obligation_kind") == "demo" and r["ok"])
    on_spec = sum(1 for r in results if r.get("source") == "spec")
    ch = [r for r in results if r.get("kind", "").startswith("crosshair")]
    colour = "red" if failed else "green"
    console.print(
        f"[{colour}]kvarena prove: {len(results) - len(failed)}/{len(results)} ok, {len(failed)} failed "
        f"-- z3: {z3n} obligations, {on_spec} on the spec's own code ({proved} proved, {lemmas} of them "
        f"lemmas; {refuted} refuted on purpose: {refuted - demos} findings, {demos} bug-class demos); "
        f"crosshair: {len(ch)} checks "
        f"({sum(1 for r in ch if r['result'] == 'skipped')} skipped) -- {wall:.1f}s wall[/{colour}]"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument(
        "--only",
        metavar="NAME",
        help="run only obligations whose name is NAME or starts with it (several: comma-separated)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write machine-readable results to PATH")
    parser.add_argument("--no-crosshair", action="store_true", help="skip the CrossHair runs")
    parser.add_argument("--jobs", type=int, default=2, help="parallel solver processes (default 2)")
    parser.add_argument("--list", action="store_true", help="list the obligations and exit")


def run(args: argparse.Namespace) -> int:
    """``kvarena prove``: the table, the JSON, the exit code."""
    if args.list:  # name, kind (property/lemma/finding/demo), source (spec/anchor), limit, statement
        for name, ob in registry().items():
            print(f"{name}\t{ob.kind}\t{ob.source}\t{ob.timeout_s:g}s\t{ob.statement}")
        return 0
    t0 = time.perf_counter()
    results = run_all(only=args.only, crosshair=not args.no_crosshair, jobs=args.jobs)
    wall = time.perf_counter() - t0
    if not results:
        print(f"kvarena prove: no obligation matches {args.only!r}", file=sys.stderr)
        return 2
    _print(results, wall)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"wall_s": round(wall, 3), "ok": all(r["ok"] for r in results), "results": results},
                f,
                indent=1,
                default=str,
            )
    return 0 if all(r["ok"] for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    """``kvarena prove ARGV`` without the rest of the ``kvarena`` command."""
    parser = argparse.ArgumentParser(prog="kvarena prove")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
