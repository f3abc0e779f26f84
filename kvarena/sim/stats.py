"""Figures over seeds: a mean and its 95% confidence interval.

Each seed is one independent run (its own trace), so a figure's seeds are a
sample; the interval is Student's t on their mean (two-sided, 95%), which is
what a handful of seeds calls for.  One seed has no interval.
"""

import math
import statistics

# t quantiles, two-sided 95% (0.975), by degrees of freedom; past 30, the normal's.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t975(df):
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (a
    df between tabled ones takes the smaller df's, the wider interval)."""
    if df < 1:
        raise ValueError(f"stats: degrees of freedom must be >= 1, got {df}")
    if df > 30:
        return 1.960
    return _T975[max(k for k in _T975 if k <= df)]


def mean_ci(values):
    """``(mean, half_width)`` of the 95% interval; ``half_width`` is None
    for one value.  None values (a figure a seed did not have) are left
    out; all None gives ``(None, None)``."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    return m, t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def crosses(mean, half, at=1.0):
    """Does the interval ``mean +- half`` contain ``at``?"""
    return mean is not None and half is not None and mean - half <= at <= mean + half


CROSSES = " (interval crosses 1: no clear difference)"


def fmt_ratio(mean, half):
    """``1.23x +-0.04`` (``1.23x`` for one seed; ``n/a`` without a value),
    and where the interval crosses 1.0, that said in words (``CROSSES``)."""
    if mean is None:
        return "n/a"
    text = f"{mean:.2f}x" if half is None else f"{mean:.2f}x ±{half:.2f}"
    return text + (CROSSES if crosses(mean, half) else "")
