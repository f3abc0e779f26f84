"""``kvarena conform``: the campaign against the anchor, or one case's replay."""

import argparse
import json
import sys
from pathlib import Path

CASES_DIR = Path(__file__).resolve().parents[2] / "tests" / "anchor_cases"


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--steps", type=int, default=2000, help="page-level operations (default 2000)")
    c.add_argument(
        "--composite-steps",
        type=int,
        default=None,
        help="composite calls, HybridSWA/MambaHybrid/TriPool on CPU (default: a quarter of --steps)",
    )
    c.add_argument(
        "--boot",
        type=int,
        default=300,
        help="boot-time layouts drawn across the anchor's whole domain, built on both sides (default 300)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--walk-steps", type=int, default=60, help="operations per walk (default 60)")
    c.add_argument("--json", metavar="PATH", help="write the report (counts per class and operation, cases)")
    c.add_argument("--no-shrink", action="store_true", help="keep each class's first case as found")
    c.add_argument(
        "--no-install",
        action="store_true",
        help="fail instead of running `pip install --no-deps sglang==0.5.23` when it is missing",
    )
    c.add_argument(
        "--replay",
        metavar="CASE",
        nargs="+",
        help="replay case files (tests/anchor_cases/*.json) instead of a campaign",
    )


def run(args: argparse.Namespace) -> int:
    """``kvarena conform``: the campaign (page level, then composites) or the replay of case files."""
    from .loader import AnchorUnavailable, anchor_modules, ensure_installed

    try:
        ensure_installed(allow_install=not args.no_install)
        anchor_modules()
    except AnchorUnavailable as e:
        print(f"kvarena conform: {e}", file=sys.stderr)
        return 2
    if args.replay:
        return _replay(args.replay)
    from .boot import run_boot
    from .campaign import run
    from .composites import run_composites

    boot = run_boot(geometries=args.boot, seed=args.seed)
    _print_boot(boot)
    report = run(steps=args.steps, seed=args.seed, walk_steps=args.walk_steps, shrink_cases=not args.no_shrink)
    report["boot"] = boot
    _print(report)
    steps = args.steps // 4 if args.composite_steps is None else args.composite_steps
    report["composites"] = run_composites(steps=steps, seed=args.seed)
    _print(report["composites"], level="composite")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    unclassified = sum(r["differences"]["unclassified"] for r in (boot, report, report["composites"]))
    print(f"kvarena conform: {'FAIL' if unclassified else 'ok'}: {unclassified} unclassified differences")
    return 1 if unclassified else 0


def _print(report, level="page"):
    d = report["differences"]
    print(
        f"kvarena conform, {level} level: {report['steps']} operations in {report['walks']} walks against "
        f"{report['anchor']} (seed {report['seed']}, {report['seconds']} s)"
    )
    print("operations: " + ", ".join(f"{k} {v}" for k, v in sorted(report["operations"].items())))
    print(f"{'class':28} {'kind':11} {'steps':>6}  by operation")
    for name, c in d["by_class"].items():
        ops = ", ".join(f"{k} {v}" for k, v in sorted(c["by_operation"].items()))
        print(f"{name:28} {c['kind']:11} {c['count']:>6}  {ops}")
    print(f"unclassified: {d['unclassified']}")
    for case in report.get("unclassified_cases", []):
        last = (case.get("ops") or case.get("calls"))[-1]
        print("  unclassified:", json.dumps(case["config"]), last, case.get("detail") or case.get("fields"))


def _print_boot(boot):
    print(
        f"kvarena conform, boot: {boot['geometries']} layouts across the anchor's domain against {boot['anchor']} "
        f"(seed {boot['seed']}, {boot['seconds']} s)"
    )
    for outcome, n in sorted(boot["outcomes"].items(), key=lambda kv: -kv[1]):
        print(f"  {outcome:34} {n:>5}")
    for case in boot["unclassified_cases"]:
        print("  unclassified:", json.dumps(case["config"]), case["detail"])


def _replay(paths):
    from .boot import replay_boot
    from .campaign import replay

    bad = 0
    for path in paths:
        case = json.loads(Path(path).read_text())
        classes, detail = replay_boot(case) if case.get("boot") else replay(case)[:2]
        ok = classes is not None and case["class"] in classes
        bad += not ok
        print(
            f"{path}: {case['class']} ({case.get('kind', '?')}): last step shows {classes} "
            f"{'as recorded' if ok else 'NOT as recorded'}; {detail}"
        )
    return 1 if bad else 0
