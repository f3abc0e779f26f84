"""The documentation's figures, drawn from real arena states of the spec.

``python -m kvarena.figures DIR`` writes them as SVG files; the docs build
draws the same figures into the site (``docs/hooks.py``), so a figure cannot
drift from the code that it pictures.

- ``bands.svg``: the band layout of a tri-pool arena mid-serving: the sink,
  mamba state growing up from byte 0, the SWA float with its holes, full KV
  growing down from the top (docs/design.md §3);
- ``relief.svg``: one relief, before and after: full runs short, the float
  slides out of its way, and full's allocation then fits (docs/design.md §4).
"""

import io
import sys
from pathlib import Path

from kvarena.spec import Arena, SubPool

COLOURS = {"mamba": "#4c72b0", "swa": "#55a868", "full": "#c44e52"}
POOLS = [SubPool("mamba", 4096, 1, "up", "state"), SubPool("swa", 256, 16, "float"), SubPool("full", 512, 16, "down")]
TOTAL = 1 << 18  # 256 KiB: 64 mamba slots, 64 SWA pages, 32 full pages


def serving_arena() -> Arena:
    """A tri-pool arena after some admissions and window frees: every band holds live pages and holes."""
    a = Arena(TOTAL, POOLS, lazy=True)
    slots = a.alloc("mamba", 12)
    swa = a.alloc("swa", 14)
    full = a.alloc("full", 9)
    assert slots and swa and full
    a.free("mamba", slots[2:5])
    a.free("swa", swa[1:7:2])
    a.free("full", full[3:5])
    return a


def _draw(ax, arena: Arena, title: str) -> None:
    """One arena state as a horizontal bar, byte 0 on the left."""
    from matplotlib.patches import Rectangle

    sink = max(arena.geometry(p.name).epp for p in POOLS)
    ax.add_patch(Rectangle((0, 0), sink, 1, facecolor="#999999", edgecolor="white", linewidth=0.5))
    ax.text(sink / 2, 1.08, "sink", ha="center", va="bottom", fontsize=7)
    for pool in POOLS:
        epp = arena.geometry(pool.name).epp
        colour = COLOURS[pool.name]
        for page, vid in enumerate(arena.p2v(pool.name)):
            if vid > 0:
                ax.add_patch(Rectangle((page * epp, 0), epp, 1, facecolor=colour, edgecolor="white", linewidth=0.5))
        for page in arena.holes(pool.name):
            ax.add_patch(
                Rectangle((page * epp, 0), epp, 1, facecolor="white", edgecolor=colour, hatch="////", linewidth=0.5)
            )
        lo, hi = arena.frontiers(pool.name)
        if hi > lo:
            ax.text((lo + hi) / 2, 1.08, pool.name, ha="center", va="bottom", fontsize=8, color=colour)
            for x in (lo, hi):
                ax.plot([x, x], [-0.12, 1.12], color=colour, linewidth=1)
    ax.set_xlim(0, TOTAL)
    ax.set_ylim(-0.3, 1.5)
    ax.set_yticks([])
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xticks([0, TOTAL // 4, TOTAL // 2, 3 * TOTAL // 4, TOTAL])
    ax.set_xticklabels(["0", "64 KiB", "128 KiB", "192 KiB", "256 KiB"], fontsize=7)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _svg(fig) -> str:
    """The figure as SVG text, the same bytes on every run (no date, fixed ids, text kept as text)."""
    import matplotlib.pyplot as plt

    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


def _figure(rows: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "kvarena", "svg.fonttype": "none"})
    return plt.subplots(rows, 1, figsize=(9, 1.6 * rows), squeeze=False, gridspec_kw={"hspace": 0.9})


def bands() -> str:
    """``bands.svg``: the layout of ``serving_arena()``; hatched pages are holes."""
    fig, axes = _figure(1)
    _draw(
        axes[0][0], serving_arena(), "one buffer: mamba state (up END), SWA float, full KV (down END); hatched: holes"
    )
    return _svg(fig)


def relief() -> str:
    """``relief.svg``: full asks for more pages than its gap holds; ``relieve`` slides the float down."""
    a = serving_arena()
    fig, axes = _figure(2)
    holes = len(a.holes("full"))
    need = a.gap_bytes("full") // a.geometry("full").epp + holes + 2
    _draw(axes[0][0], a, f"before: full needs {need} pages; its holes and its gap hold {need - 2}")
    assert a.alloc("full", need) is None
    assert a.relieve("full", need)
    assert a.alloc("full", need) is not None
    a.verify()
    _draw(axes[1][0], a, f"after relieve('full', {need}): the float slid down and the {need} pages are bound")
    return _svg(fig)


def draw_all() -> dict[str, str]:
    """Every figure, by file name."""
    return {"bands.svg": bands(), "relief.svg": relief()}


def main(argv: list[str]) -> int:
    """Write every figure into the folder ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m kvarena.figures DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, svg in draw_all().items():
        (out / name).write_text(svg)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
