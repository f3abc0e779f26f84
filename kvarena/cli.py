"""The ``kvarena`` command (thin: each job lives in its own module).

- ``kvarena verify [--budget S] [--device D] [--json P]``: every suite in one
  budgeted run (``kvarena.verification.verify``): self-checks, proofs, vectors, the
  differential machines, then a fuzz campaign with what is left.
- ``kvarena prove``: the z3 obligations and CrossHair runs alone.
- ``kvarena vectors generate DIR`` / ``replay DIR [--target T]``: the
  conformance vectors (``kvarena.verification.vectors``).
- ``kvarena fuzz [--minutes N] [--workers K] [--db PATH]``: the
  differential campaign over processes (``kvarena.verification.fuzz``).
- ``kvarena planted [--json P]``: named planted bugs and the suites that
  catch them (``kvarena.verification.planted``).

Each prints a table and exits non-zero on any failure.
"""

import argparse
import json
import os
import shutil
import sys
import time
from collections import defaultdict

from rich.console import Console
from rich.table import Table

console = Console(width=max(120, shutil.get_terminal_size().columns))


def _no_device(device):
    """A message when ``device`` is not usable here, else None."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: no CUDA device is available here"
    return None


def cmd_verify(args):
    from kvarena.verification import verify

    if _no_device(args.device):
        console.print(f"[red]kvarena verify: {_no_device(args.device)}[/red]")
        return 2

    return verify.run(
        budget=args.budget,
        device=args.device,
        json_path=args.json,
        console=console,
        seed=args.seed,
        walks=args.walks,
        steps=args.steps,
        skip_proofs=args.skip_proofs,
        skip_fuzz=args.skip_fuzz,
        skip_vectors=args.skip_vectors,
        fuzz_examples=args.fuzz_examples,
        verbose=args.verbose,
        out_dir=args.failures,
    )


def cmd_vectors(args):
    from kvarena.verification import vector_cases, vectors

    if args.action == "generate":
        cases = vector_cases.generate()
        n = vectors.write_cases(args.dir, cases)
        pols = sorted({t.split(":")[1] for c in cases for t in c["tags"] if t.startswith("policy:")})
        console.print(f"kvarena vectors: wrote {n} cases to {args.dir} (policies: {', '.join(pols)})")
        return 0
    if _no_device(args.device):
        console.print(f"[red]kvarena vectors: {_no_device(args.device)}[/red]")
        return 2
    t = time.perf_counter()
    results = vectors.replay_dir(args.dir, args.target, args.device)
    status = defaultdict(int)
    for r in results:
        status[r.status] += 1
    bad = [r for r in results if r.status != "pass"]
    if bad:
        tab = Table(title=f"vectors not passing on {args.target}")
        for col in ("case", "status", "detail"):
            tab.add_column(col, overflow="fold")
        for r in bad[: args.show]:
            tab.add_row(r.name, r.status, r.detail)
        console.print(tab)
    unobserved = sorted(set().union(*(r.unobserved for r in results))) if results else []
    colour = "red" if status["fail"] or not results else "green"
    console.print(
        f"[{colour}]kvarena vectors replay ({args.target}, {args.device}): {status['pass']} passed, "
        f"{status['fail']} failed, {status['unsupported']} unsupported of {len(results)} cases; "
        f"{sum(r.compared for r in results)} comparisons"
        + (f"; not observed by the target: {', '.join(unobserved)}" if unobserved else "")
        + f" in {time.perf_counter() - t:.1f}s[/{colour}]"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        "name": r.name,
                        "status": r.status,
                        "detail": r.detail,
                        "compared": r.compared,
                        "unobserved": sorted(r.unobserved),
                    }
                    for r in results
                ],
                f,
                indent=1,
            )
    return 1 if status["fail"] or not results else 0


def cmd_fuzz(args):
    from kvarena.verification import fuzz

    if _no_device(args.device):
        console.print(f"[red]kvarena fuzz: {_no_device(args.device)}[/red]")
        return 2
    targets = ", ".join(f"{m}/{p or 'every policy'}" for m, p in fuzz.targets())
    console.print(
        f"kvarena fuzz: {args.workers} worker(s) for {args.minutes:g} min on {args.device}; "
        f"machines {targets}; database {args.db or '(none)'}"
    )
    s = fuzz.campaign(
        args.minutes * 60,
        workers=args.workers,
        db=args.db,
        device=args.device,
        examples=args.examples,
        out_dir=args.failures,
    )
    tab = Table(title=f"kvarena fuzz: {s['seconds']:.0f}s, {s['workers']} worker(s)")
    tab.add_column("what")
    tab.add_column("result", overflow="fold")
    tab.add_row("rounds", str(s["rounds"]))
    tab.add_row("examples", f"{s['examples']} ({', '.join(f'{k} {v}' for k, v in s['per_target'].items())})")
    tab.add_row("steps", str(s["steps"]))
    tab.add_row("coverage events", ", ".join(f"{k} {v}" for k, v in s["cases"].items()))
    missing = [c for c in fuzz.required_cases() if not s["cases"].get(c)]
    if missing:
        tab.add_row("never reached", ", ".join(missing))
    console.print(tab)
    for f in s["failures"]:
        console.print(f"[red]FAILURE in {f['machine']} ({f['policy']}):[/red] {f['error']}")
        console.print(f.get("hypothesis", ""), markup=False, highlight=False)
        console.print(f"vector: {f.get('vector')} (reproduces on impl: {f.get('reproduces')}; {f.get('replay', '')})")
        console.print(f.get("pytest", ""), markup=False, highlight=False)
    if args.json:
        fuzz.write_json(args.json, s)
    colour = "red" if s["failures"] else "green"
    console.print(f"[{colour}]kvarena fuzz: {s['examples']} examples, {len(s['failures'])} failure(s)[/{colour}]")
    return 1 if s["failures"] else 0


def cmd_planted(args):
    from kvarena.verification import planted

    return planted.main(args, console)


def cmd_prove(argv):
    from kvarena.proofs import cli as prove_cli

    return prove_cli.main(argv)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prove"]:
        return cmd_prove(argv[1:])
    p = argparse.ArgumentParser(
        prog="kvarena", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="self-checks, proofs, vectors and differential fuzz, within a budget")
    v.add_argument(
        "--budget",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="time to aim for; the differential campaign gets what the other parts leave (default 180)",
    )
    v.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device of the implementation")
    v.add_argument("--json", metavar="PATH", help="also write the summary and every result as JSON")
    v.add_argument("--seed", type=int, default=0, help="first random-walk seed")
    v.add_argument("--walks", type=int, default=None, help="random walks to run (default: 20, fewer on a small budget)")
    v.add_argument("--steps", type=int, default=300, help="operations per walk")
    v.add_argument("--skip-proofs", action="store_true", help="leave out the z3/CrossHair obligations")
    v.add_argument("--skip-fuzz", action="store_true", help="leave out the differential fuzz and the campaign")
    v.add_argument("--skip-vectors", action="store_true", help="leave out the conformance vectors")
    v.add_argument(
        "--fuzz-examples",
        type=int,
        default=None,
        help="fixed-seed examples per differential machine (default: from the budget)",
    )
    v.add_argument(
        "--failures", default="fuzz-failures", metavar="DIR", help="where failing cases are saved as vectors"
    )
    v.add_argument("--verbose", action="store_true", help="a row for every check, not only failures")
    sub.add_parser("prove", help="z3 obligations and CrossHair runs (see kvarena prove --help)")
    vec = sub.add_parser("vectors", help="conformance vectors: generate from the spec, replay on a target")
    vsub = vec.add_subparsers(dest="action", required=True)
    g = vsub.add_parser("generate", help="write the cases to DIR (replacing its *.json)")
    g.add_argument("dir")
    r = vsub.add_parser("replay", help="replay every case under DIR on a target")
    r.add_argument("dir")
    r.add_argument("--target", default="impl", help="spec, impl, anchor, or module:factory (default impl)")
    r.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    r.add_argument("--json", metavar="PATH", help="also write every case's result as JSON")
    r.add_argument("--show", type=int, default=20, help="failing cases to print (default 20)")
    f = sub.add_parser("fuzz", help="the differential machines as a campaign over processes")
    f.add_argument("--minutes", type=float, default=10.0)
    f.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)), help="processes (default: cores)")
    f.add_argument("--db", metavar="PATH", help="shared Hypothesis example database: a directory or redis://...")
    f.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    f.add_argument("--examples", type=int, default=20, help="examples per round (default 20)")
    f.add_argument(
        "--failures", default="fuzz-failures", metavar="DIR", help="where failing cases are saved as vectors"
    )
    f.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    pl = sub.add_parser("planted", help="apply each named planted bug and report which suite catches it")
    pl.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    pl.add_argument("--only", metavar="NAME", help="only mutations whose name starts with NAME")
    pl.add_argument("--list", action="store_true", help="list the mutations and exit")
    pl.add_argument(
        "--all-suites",
        action="store_true",
        help="run every suite on every mutation (the full matrix), not only until one catches it",
    )
    from kvarena.sim import bench, simulate  # subcommands that live in their own modules

    simulate.add_parser(sub), bench.add_parser(sub)
    from kvarena.sim import policies  # kvarena policies: anchor vs planner on the same traces

    policies.add_parser(sub)
    from kvarena.anchor import cli as anchor_cli  # kvarena conform

    anchor_cli.add_parser(sub)
    args = p.parse_args(argv)
    return {"verify": cmd_verify, "vectors": cmd_vectors, "fuzz": cmd_fuzz, "planted": cmd_planted}.get(
        args.cmd, getattr(args, "func", None)
    )(args)


if __name__ == "__main__":
    sys.exit(main())
