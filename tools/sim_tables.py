"""Write docs/results/simulator-tables.md from the reports `tools/sim_results.sh` saved.

Usage: python tools/sim_tables.py OUT_DIR

Each section is one documented command's per-run reports (OUT_DIR/NAME.txt), as
`kvarena simulate` printed them: from the first run's heading to the summary
table, which the results page quotes instead.  Paths under OUT_DIR are
written as bare file names.
"""

import datetime
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "results" / "simulator-tables.md"

HEAD = """# `kvarena simulate`: every setup, every run

The per-setup tables behind [the simulator's results](simulator.md), as the commands printed them on {day}
(`tools/sim_results.sh` runs them all on this repo's 2-core machine; `tools/sim_tables.py` writes this page from
their reports).  Every figure is the mean over the seeds (with its 95% interval where there are several); the
ratios lead with output tokens a second and goodput; `alloc launches/step` and `alloc time` are the allocator's
kernel launches a step and their share of the clock, as a GPU runs it (`--alloc-cost gpu`, the default).  Each
report ends with the run's KV budget, computed from the accelerator, and each engine's limits, among them how it
runs a prefill chunk (SGLang: a pass of its own; vLLM: mixed into a decode iteration).
"""

# (report, title, what the section says before its command, the commands)
SECTIONS = (
    (
        "phases",
        "Phase-shift traces, three seeds",
        "Chat and long-context phases alternating, sized by work; the split is chosen once for the whole trace, "
        "and `static-phase-oracle` gives each phase its own best split, the phases run apart.",
        ["kvarena simulate --preset all --trace phases --requests 1000 --seeds 3"],
    ),
    (
        "grid",
        "A stationary trace, three seeds",
        "",
        [
            "kvarena simulate --preset gpt-oss-120b,gemma-3-27b,qwen3-next-80b-a3b --trace mooncake --requests 1000 "
            "--seeds 3"
        ],
    ),
)


def runs(report: str, out: Path) -> str:
    """The per-run reports of ``report``: from the first heading to the summary table."""
    lines = report.replace(f"{out}/", "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("### "))
    end = next((i for i, line in enumerate(lines) if line.startswith("| preset | trace")), len(lines))
    return "\n".join(lines[start:end]).rstrip() + "\n"


def page(out: Path, day: str) -> str:
    parts = [HEAD.format(day=day)]
    for name, title, intro, commands in SECTIONS:
        if not (out / f"{name}.txt").exists():
            print(f"sim_tables: no {name}.txt in {out}: section {title!r} left out", file=sys.stderr)
            continue
        parts.append(f"## {title}\n")
        if intro:
            parts.append(intro + "\n")
        parts.append("```bash\n" + "\n".join(commands) + "\n```\n")
        parts.append(runs((out / f"{name}.txt").read_text(), out))
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    day = datetime.date.fromtimestamp((out / "phases.txt").stat().st_mtime).isoformat()
    PAGE.write_text(page(out, day))
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
