"""The ``kvarena`` command.

- ``kvarena verify``: the main job.  The spec's contract-checked scenarios
  and seeded random walks, then every proof (``kvarena prove``), then the
  differential fuzz of the implementation against the spec.
- ``kvarena prove``: the z3 obligations and CrossHair runs alone.

Each prints a table and exits non-zero on any failure.
"""

import argparse
import importlib
import json
import shutil
import sys
import time
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from kvarena import selfcheck

console = Console(width=max(120, shutil.get_terminal_size().columns))


def _mark(ok):
    return "[green]pass[/green]" if ok else "[red]FAIL[/red]"


def _table(title, rows):
    t = Table(title=title)
    t.add_column("check", no_wrap=True)
    t.add_column("result")
    t.add_column("seconds", justify="right")
    t.add_column("detail", overflow="fold")
    for r in rows:
        t.add_row(r["name"], _mark(r["ok"]), f"{r['seconds']:.2f}", str(r["detail"])[:200])
    console.print(t)


def _group_table(title, rows):
    """One line per group of checks (the name up to its first dot), then every failure."""
    groups = defaultdict(list)
    for r in rows:
        groups[r["name"].split(".")[0].split(" ")[0]].append(r)
    t = Table(title=title)
    for col in ("group", "checks", "passed", "seconds"):
        t.add_column(col, justify="left" if col == "group" else "right")
    t.add_column("result")
    for g, rs in groups.items():
        ok = sum(r["ok"] for r in rs)
        t.add_row(g, str(len(rs)), str(ok), f"{sum(r['seconds'] for r in rs):.1f}", _mark(ok == len(rs)))
    console.print(t)
    failed = [r for r in rows if not r["ok"]]
    if failed:
        _table(f"{title}: failures", failed)


def _spec_rows(args):
    checks = selfcheck.run_scenarios()
    checks += selfcheck.run_walks(range(args.seed, args.seed + args.walks), args.steps)
    return [{"part": "spec", "name": c.name, "ok": c.ok, "detail": c.detail, "seconds": c.seconds}
            for c in checks]


def _optional_rows(part, module, func, **kw):
    """Rows from another part (proofs, fuzz); a part that fails to load is a failed row."""
    try:
        mod = importlib.import_module(module)
        run = getattr(mod, func)
    except (ImportError, AttributeError) as e:
        return [{"part": part, "name": part, "ok": False, "detail": f"unavailable: {e}", "seconds": 0.0}]
    t = time.perf_counter()
    try:
        rows = run(**kw)
    except Exception as e:  # report, never crash the summary
        return [{"part": part, "name": part, "ok": False, "detail": f"{type(e).__name__}: {e}",
                 "seconds": time.perf_counter() - t}]
    return [{"part": part, **r} for r in rows]


def cmd_verify(args):
    t = time.perf_counter()
    rows = _spec_rows(args)
    _table("spec self-checks", rows)
    if not args.skip_proofs:
        proofs = _optional_rows("proofs", "kvarena.proofs.cli", "run_all")
        (_table if args.verbose else _group_table)("proofs (z3 obligations, CrossHair)", proofs)
        rows += proofs
    if not args.skip_fuzz:
        fuzz = _optional_rows("fuzz", "kvarena.differential", "run_differential", examples=args.fuzz_examples)
        fuzz += _optional_rows("fuzz", "kvarena.differential_composites", "run_differential",
                               examples=args.fuzz_examples)
        _table("differential fuzz (impl vs spec: arena, composites)", fuzz)
        rows += fuzz
    failed = [r for r in rows if not r["ok"]]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    colour = "red" if failed else "green"
    console.print(f"[{colour}]kvarena verify: {len(rows) - len(failed)} passed, {len(failed)} failed"
                  f" in {time.perf_counter() - t:.1f}s[/{colour}]")
    return 1 if failed else 0


def cmd_prove(argv):
    from kvarena.proofs import cli as prove_cli

    return prove_cli.main(argv)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prove"]:
        return cmd_prove(argv[1:])
    p = argparse.ArgumentParser(prog="kvarena", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="spec self-checks, proofs and differential fuzz")
    v.add_argument("--seed", type=int, default=0, help="first random-walk seed")
    v.add_argument("--walks", type=int, default=20, help="random walks to run")
    v.add_argument("--steps", type=int, default=300, help="operations per walk")
    v.add_argument("--skip-proofs", action="store_true", help="leave out the z3/CrossHair obligations")
    v.add_argument("--skip-fuzz", action="store_true", help="leave out the differential fuzz")
    v.add_argument("--fuzz-examples", type=int, default=150, help="differential machine runs per device")
    v.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    v.add_argument("--verbose", action="store_true", help="a row for every proof, not one per group")
    sub.add_parser("prove", help="z3 obligations and CrossHair runs (see kvarena prove --help)")
    args = p.parse_args(argv)
    return cmd_verify(args)


if __name__ == "__main__":
    sys.exit(main())
