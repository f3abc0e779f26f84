"""One table of what a GPU run measured (``tools/cuda_checks.sh`` prints it last).

    python tools/cuda_table.py [--steps STEPS.tsv] RESULT.json ...

Each JSON is a ``kvarena bench --json`` file (any sections; several may
hold a ``copy`` section, one per ``--copy-mb``) or a ``python -m
kvarena.anchor.gpu --json`` report; ``--steps`` is the script's record of
its steps (``name<TAB>status<TAB>seconds`` a line).  Rows, in order: the
steps, the device, the lazy trusted decode step against the static free
list per batch, the launches a decode step makes (with the engine's host
copies) per batch, make_room's relocation copy as a share of ``copy_``'s
bandwidth per size and page envelope (the torch path, and the Triton
relocation kernel where the JSON has it), the decode step in SGLang's own
stack per batch (kvarena on Triton, on torch, SGLang's allocator), and the
anchor's Triton paths.  A measurement missing from every file is a row
saying so, never a silent gap.  A Markdown table, to paste into
docs/results/bench.md.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

Row = tuple[str, str, str]
OPS_LABELS = {"triton": "Triton", "trusted": "torch", "checked": "checked (torch)", "static": "static free list"}
SGLANG_LABELS = {
    "kvarena_triton": "kvarena (Triton)",
    "kvarena_torch": "kvarena (torch)",
    "sglang": "SGLang's allocator",
}


def _x(s: dict[str, float]) -> str:
    """A ratio summary: the median, with the min and the spread."""
    return f"{s['median']:.2f}x (min {s['min']:.2f}, spread {s['spread']:.2f})"


def _share(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} (min {s['min']:.2f})"


def _us(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} µs"


def _gbps(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def _batch(key: str) -> str:
    n = key.removeprefix("batch ").strip()
    return f"batch {int(n):,}" if n.isdigit() else key


def load(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Row]]:
    """The bench JSONs, the anchor reports, and a row for each file that could not be read."""
    bench, anchor, rows = [], [], []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            rows.append(("result file", str(path), f"NOT READ: {type(e).__name__}: {e}"))
            continue
        if isinstance(doc, dict) and "by_class" in doc:
            anchor.append(doc)
        elif isinstance(doc, dict) and "device" in doc:
            bench.append(doc)
        else:
            rows.append(("result file", str(path), "NOT READ: neither a kvarena bench JSON nor an anchor report"))
    return bench, anchor, rows


def step_rows(path: Path | None) -> list[Row]:
    if path is None:
        return []
    if not path.exists():
        return [("steps", str(path), "no record of the steps")]
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            name, status, seconds = parts
            rows.append((f"step: {name}", "", f"{status} ({seconds} s)"))
    return rows


def device_rows(bench: list[dict[str, Any]]) -> list[Row]:
    seen = dict.fromkeys(f"{d['device']}, torch {d.get('torch', '?')}; Triton: {d.get('triton', '?')}" for d in bench)
    return [("device", "", s) for s in seen]


def decode_rows(bench: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for d in bench:
        kernels = d.get("decode_kernels", "?")
        for batch, modes in d.get("decode", {}).items():
            r = modes.get("lazy")
            if r is None:
                continue
            what = f"decode step / static free list, lazy trusted ({kernels})"
            rows.append((what, _batch(batch), f"{_x(r['ratio'])}; {_us(r['ours_us'])} against {_us(r['static_us'])}"))
    return rows or [("decode step / static free list, lazy trusted", "", "NOT RUN (no decode section)")]


def ops_rows(bench: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for d in bench:
        ops = d.get("ops")
        if ops is None:
            continue
        for side, why in ops.get("unavailable", {}).items():
            rows.append(("launches a decode step", OPS_LABELS.get(side, side), f"NOT RUN: {why}"))
        for batch, sides in ops.get("with host copies", {}).items():
            order = [s for s in OPS_LABELS if s in sides] + [s for s in sides if s not in OPS_LABELS]
            cells = ", ".join(
                f"{OPS_LABELS.get(s, s)} {sides[s]['launches_max']}"
                + (f" ({sides[s]['reads_max']} host reads)" if sides[s].get("reads_max") else "")
                for s in order
            )
            rows.append(("launches a decode step (with host copies)", _batch(batch), cells))
    return rows or [("launches a decode step", "", "NOT RUN (no ops section)")]


def copy_rows(bench: list[dict[str, Any]]) -> list[Row]:
    """Per size and envelope: the torch path's share (``share_of_copy_bandwidth``,
    ``ours_GBps``), then the Triton relocation kernel's where the JSON has it
    (``kernel_share_of_copy_bandwidth``, ``kernel_GBps``)."""
    found: list[tuple[tuple[int, int, int], Row]] = []
    for d in bench:
        copy = d.get("copy")
        if copy is None:
            continue
        envelopes = list(copy.get("envelopes", {}).values())
        kernel = any("kernel_share_of_copy_bandwidth" in r for r in envelopes)
        paths = copy.get("paths")  # bench's copy paths, where it says them: ["torch"] or ["torch", "triton"]
        for r in envelopes:
            where = f"{r['bytes'] / 2**20:,.0f} MiB, {r['page_bytes'] // 1024:,} KiB pages"
            plain = f"{_gbps(r['copy_GBps']['median'])} GB/s"
            ours = f"{_share(r['share_of_copy_bandwidth'])}: {_gbps(r['ours_GBps']['median'])} against {plain}"
            what = "relocation copy / copy_ bandwidth, " + ("torch path" if kernel or paths else "make_room")
            found.append(((r["bytes"], r["page_bytes"], 0), (what, where, ours)))
            if "kernel_share_of_copy_bandwidth" in r:
                k = _share(r["kernel_share_of_copy_bandwidth"])
                k += f": {_gbps(r['kernel_GBps']['median'])} against {plain}" if "kernel_GBps" in r else ""
                found.append(
                    ((r["bytes"], r["page_bytes"], 1), ("relocation copy / copy_ bandwidth, Triton kernel", where, k))
                )
        if not kernel:
            size = copy.get("bytes", 0)
            why = (
                "NOT RUN: bench ran the torch path only (Triton does not compile there)"
                if paths
                else "not in this JSON"
            )
            row = ("relocation copy, Triton kernel", f"{size / 2**20:,.0f} MiB", why)
            found.append(((size, 1 << 62, 1), row))
    rows = [row for _, row in sorted(found, key=lambda t: t[0])]
    return rows or [("relocation copy / copy_ bandwidth", "", "NOT RUN (no copy section)")]


def sglang_rows(bench: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for d in bench:
        res = d.get("sglang")
        if res is None:
            continue
        for side, why in res.get("unavailable", {}).items():
            rows.append(("SGLang-stack decode step", SGLANG_LABELS.get(side, side), f"NOT RUN: {why}"))
        for batch, r in res.items():
            if batch == "unavailable":
                continue
            cells = []
            for side, label in SGLANG_LABELS.items():
                if f"{side}_us" in r:
                    ratio = f" ({r[f'{side}_ratio']['median']:.2f}x SGLang's)" if f"{side}_ratio" in r else ""
                    cells.append(f"{label} {_us(r[f'{side}_us'])}{ratio}")
            rows.append(("SGLang-stack decode step", _batch(batch), "; ".join(cells) + f" ({r.get('timer', '?')})"))
            launches = ", ".join(
                f"{SGLANG_LABELS.get(s, s)} {n['min']} to {n['max']}" for s, n in r.get("launches", {}).items()
            )
            if launches:
                rows.append(("SGLang-stack launches a step", _batch(batch), launches))
    return rows or [("SGLang-stack decode step", "", "NOT RUN (no sglang section)")]


def anchor_rows(anchor: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for a in anchor:
        classes = ", ".join(f"{k} {v}" for k, v in sorted(a.get("by_class", {}).items())) or "none"
        rows.append(
            (
                "anchor's Triton paths against kvarena's composites",
                f"{a.get('steps', 0):,} steps",
                f"{a.get('unclassified', '?')} unclassified; classified differences: {classes}",
            )
        )
    return rows or [("anchor's Triton paths", "", "NOT RUN (no anchor report)")]


def rows(paths: list[Path], steps: Path | None = None) -> list[Row]:
    bench, anchor, unread = load(paths)
    return (
        step_rows(steps)
        + unread
        + device_rows(bench)
        + decode_rows(bench)
        + ops_rows(bench)
        + copy_rows(bench)
        + sglang_rows(bench)
        + anchor_rows(anchor)
    )


def render(table: list[Row]) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| result | at | value |", "| --- | --- | --- |"]
    lines += [f"| {cell(a)} | {cell(b)} | {cell(c)} |" for a, b, c in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/cuda_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="*", type=Path, help="kvarena bench --json files and anchor reports")
    p.add_argument("--steps", type=Path, help="the steps' record: name<TAB>status<TAB>seconds a line")
    args = p.parse_args(argv)
    print(render(rows(args.results, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
