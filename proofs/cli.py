"""``kvarena prove [--only NAME] [--json PATH] [--no-crosshair] [--jobs N] [--cache LOCATION | --no-cache]``.

Runs every z3 obligation (with its vacuity and tautology checks) and the
CrossHair runs, prints a table of each with its result and time, and a
one-line total.  A verdict found before for the same formula, z3 and
budget comes from the proof cache (``proofs.cache``; the table marks it).
Exits non-zero on any failure (2: a cache that cannot be used).
``run_all`` returns the rows for ``kvarena verify``.
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


def _lookup(name, cache):
    from . import cache as proof_cache
    from .core import cache_lookup

    return cache_lookup(registry()[name], proof_cache.open_store(cache))


def run_one(name, cache=None):
    """Run one obligation by name in this process (a fresh one: ``solver_pool``): its result row.

    ``cache``: the proof cache's location (``proofs.cache``), or None.  The
    key is computed and the cache read in a forked child
    (``cache.in_child``), so that this process proves exactly as it does
    with no cache: a verdict stored there is returned (``"cache": "hit"``),
    else the obligation is proved here and its verdict, if it passes,
    stored (``"cache": "new"``)."""
    import z3

    from . import cache as proof_cache
    from .core import describe, passes, run_obligation

    ob = registry()[name]
    if cache is None:
        return run_obligation(ob)
    t0 = time.perf_counter()
    key, row, warning = proof_cache.in_child(_lookup, name, cache) or (None, None, None)
    if row is not None:
        res = describe(ob)
        res.update(row)
        res.update(cache="hit", proved_s=row.get("time_s"), time_s=round(time.perf_counter() - t0, 3))
        res["ok"] = passes(ob, res)
        return res
    res = run_obligation(ob)
    res["cache"] = "new"
    if warning:
        res["cache_warning"] = warning
    if key is not None and res["ok"]:
        proof_cache.save(proof_cache.open_store(cache), key, name, z3.get_full_version(), res)
    return res


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


def run_task(task):
    """``run_one`` for a ``(name, patch, cache)`` task, in a solver process:
    ``patch`` (or None) is called first."""
    name, patch, cache = task
    if patch is not None:
        patch()
    return run_one(name, cache)


def slowest_first(names):
    """``names`` with the largest limits (the slowest obligations) first, so
    that no long one is left running alone at the end."""
    limits = {n: ob.timeout_s for n, ob in registry().items()}
    return sorted(names, key=lambda n: -limits[n])


def run_fresh(names, patch=None, jobs=1, cache=None):
    """Run the obligations ``names``, each in a fresh solver process; their
    result rows, in the order given.

    ``patch``, when given, is called in each process before its obligation
    runs: a function defined at module level (the process imports it by
    name) that mutates the spec there, as the mutation tests do.  The
    caller's process is never changed, and a verdict does not depend on
    what it ran before.  ``cache``: the proof cache's location, or None
    (``proofs.cache``: a patched spec builds another formula, so it never
    meets the unpatched verdicts)."""
    order = slowest_first(names)
    with solver_pool(max(1, jobs)) as pool:
        rows = dict(zip(order, pool.map(run_task, [(n, patch, cache) for n in order], chunksize=1)))
    return [rows[n] for n in names]


def run_z3(only=None, jobs=2, cache=None):
    return run_fresh(selected(only), jobs=jobs, cache=cache)


def run_all(only=None, crosshair=True, jobs=2, cache=None):
    """Every obligation (and, with ``crosshair``, every CrossHair run) as result dicts.

    Each dict has ``name``, ``group``, ``kind``, ``statement``, ``result``,
    ``ok``, ``time_s``, ``limit_s``, ``vacuity``, ``tautology`` (z3 rows;
    ``cache``: ``hit`` or ``new`` when a cache is used) and, for ``kvarena
    verify``'s table, ``seconds`` and ``detail``.
    """
    results = run_z3(only, jobs, cache)
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


def _print(results, wall, cache=None):
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
        res += " (cached)" if r.get("cache") == "hit" else ""
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
    hits = sum(1 for r in results if r.get("cache") == "hit")
    cached = f"{z3n - hits} checked now, {hits} from the cache at {cache}" if cache else "no cache"
    colour = "red" if failed else "green"
    console.print(
        f"[{colour}]kvarena prove: {len(results) - len(failed)}/{len(results)} ok, {len(failed)} failed "
        f"-- z3: {z3n} obligations ({cached}), {on_spec} on the spec's own code ({proved} proved, {lemmas} of them "
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
    add_cache_arguments(parser)


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cache LOCATION`` and ``--no-cache``, as ``kvarena prove`` and ``kvarena verify`` take them."""
    parser.add_argument(
        "--cache",
        metavar="DIR|redis://HOST:PORT/N",
        default=None,
        help="the proof cache: verdicts keyed by each obligation's SMT-LIB text, the z3 version and the budget "
        "(default: $KVARENA_PROOF_CACHE or .kvarena-cache/proofs; a redis:// URL shares it)",
    )
    parser.add_argument("--no-cache", action="store_true", help="prove every obligation afresh, reading no cache")


def cache_location(args):
    """The cache the arguments name (None: ``--no-cache``), and why it cannot be used (None if it can)."""
    from . import cache as proof_cache

    if args.no_cache:
        return None, None
    where = args.cache or proof_cache.default_location()
    return where, proof_cache.check_location(where)


def cache_warnings(results):
    """The cache's warnings (a corrupt or foreign entry) in ``results``."""
    return [r["cache_warning"] for r in results if r.get("cache_warning")]


def run(args: argparse.Namespace) -> int:
    """``kvarena prove``: the table, the JSON, the exit code."""
    if args.list:  # name, kind (property/lemma/finding/demo), source (spec/anchor), limit, statement
        for name, ob in registry().items():
            print(f"{name}\t{ob.kind}\t{ob.source}\t{ob.timeout_s:g}s\t{ob.statement}")
        return 0
    cache, why = cache_location(args)
    if why:
        print(f"kvarena prove: {why}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = run_all(only=args.only, crosshair=not args.no_crosshair, jobs=args.jobs, cache=cache)
    wall = time.perf_counter() - t0
    if not results:
        print(f"kvarena prove: no obligation matches {args.only!r}", file=sys.stderr)
        return 2
    for w in cache_warnings(results):
        print(f"warning: {w}", file=sys.stderr)
    _print(results, wall, cache)
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
