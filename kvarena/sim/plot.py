"""The simulator's picture: band boundaries over time, static walls drawn.

Top: the unified arena's buffer, byte 0 at the bottom, each band filled
between its frontiers at every step; the default static split's walls are
dashed, the best split's dotted.  Bottom: admitted concurrency of every
setup over time.  Needs matplotlib (``pip install -e ".[test]"`` brings it).
"""

COLOURS = {"state": "#4c9a2a", "swa": "#f28e2b", "full": "#4e79a7"}
MAX_POINTS = 1500  # columns drawn: keeps the PNG small


def _thin(n):
    step = max(1, -(-n // MAX_POINTS))
    return range(0, n, step)


def bands(path, sizes, results, splits, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e '.[test]'") from None

    unified = next(
        (results[k] for k in ("unified", "planner") if hasattr(results.get(k), "series") and results[k].series), None
    )
    if unified is None:
        raise ValueError("--plot needs a unified or planner run")
    s = unified.series
    idx = _thin(len(s["step"]))
    steps = [s["step"][i] for i in idx]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.2), dpi=80, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    for pool in ("state", "swa", "full"):
        if pool not in sizes.preset.kinds:
            continue
        lo = [s["bands"][i][pool][0] if s["bands"][i][pool] else float("nan") for i in idx]
        hi = [s["bands"][i][pool][1] if s["bands"][i][pool] else float("nan") for i in idx]
        top.fill_between(steps, lo, hi, color=COLOURS[pool], alpha=0.75, linewidth=0, label=f"{pool} band")
    for name, style in (("static-default", "--"), ("static-best", ":")):
        split = splits.get(name)
        if split is None:
            continue
        for k, w in enumerate(split.walls(sizes)):
            top.axhline(
                w,
                color="black",
                linestyle=style,
                linewidth=1.2,
                label=f"{name} wall{'s' if len(split.walls(sizes)) > 1 else ''}" if k == 0 else None,
            )
    top.set_ylim(0, 1)
    top.set_ylabel("buffer (fraction, byte 0 at the bottom)")
    top.set_title(f"{title}: unified arena bands vs static walls", fontsize=10)
    top.legend(loc="upper right", fontsize=7, framealpha=0.9)
    for name, res in results.items():
        if not hasattr(res, "series") or not res.series:
            continue
        c = res.series["concurrency"]
        ti = _thin(len(c))
        bottom.plot([res.series["step"][i] for i in ti], [c[i] for i in ti], linewidth=1, label=name)
    bottom.set_xlabel("step (one page of decode per running request)")
    bottom.set_ylabel("admitted requests")
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def curves(path, runs, title, slo_ttft, slo_itl):
    """The throughput-latency picture of a rate sweep, one line per setup
    (each point the mean over the seeds at one rate): p99 time to first
    token and p99 inter-token latency against output tokens a second, and
    goodput against the offered rate, the SLOs drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e '.[test]'") from None
    from statistics import fmean

    rates = sorted({r["rate"] for r in runs})
    names = [n for n in runs[0]["setups"] if "unavailable" not in runs[0]["setups"][n]]

    def mean(name, rate, key, scale=1.0):
        return fmean(r["setups"][name][key] for r in runs if r["rate"] == rate) * scale

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), dpi=80)
    for name in names:
        tput = [mean(name, q, "output_tokens_per_s") for q in rates]
        axes[0].plot(tput, [mean(name, q, "ttft_p99") for q in rates], marker="o", markersize=3, label=name)
        axes[1].plot(tput, [mean(name, q, "itl_p99", 1000) for q in rates], marker="o", markersize=3, label=name)
        axes[2].plot(rates, [mean(name, q, "goodput") for q in rates], marker="o", markersize=3, label=name)
    axes[0].axhline(slo_ttft, color="grey", linestyle=":", linewidth=1, label="TTFT SLO")
    axes[1].axhline(slo_itl * 1000, color="grey", linestyle=":", linewidth=1, label="ITL SLO (on the mean)")
    axes[2].plot(rates, rates, color="grey", linestyle=":", linewidth=1, label="offered")
    for ax, x, y in (
        (axes[0], "output tokens / s", "TTFT p99 (s)"),
        (axes[1], "output tokens / s", "ITL p99 (ms)"),
        (axes[2], "offered rate (requests / s)", "goodput (requests / s within SLO)"),
    ):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    fig.suptitle(f"{title}: mean of {len({r['seed'] for r in runs})} seeds per point", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
