"""Figures over seeds (``kvarena.sim.stats``): the t interval against values
worked by hand, and the flag a ratio gets when its interval crosses 1."""

import math
import random

import pytest

from kvarena.sim import stats


def test_t_quantiles():
    assert stats.t975(1) == 12.706 and stats.t975(4) == 2.776 and stats.t975(30) == 2.042
    assert stats.t975(11) == stats.t975(10)  # between tabled ones: the wider
    assert stats.t975(31) == 1.960 and stats.t975(10_000) == 1.960
    for df in range(1, 40):  # shrinks toward the normal's as df grows
        assert stats.t975(df) >= stats.t975(df + 1) >= 1.96
    with pytest.raises(ValueError, match="degrees of freedom"):
        stats.t975(0)


def test_mean_ci_by_hand():
    m, h = stats.mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert m == 3.0
    assert math.isclose(h, 2.776 * math.sqrt(2.5) / math.sqrt(5))  # s^2 = 2.5 over 4 df
    assert stats.mean_ci([7]) == (7.0, None)
    assert stats.mean_ci([None, None]) == (None, None)
    assert stats.mean_ci([None, 2, 4])[0] == 3.0  # a seed without the figure is left out
    assert stats.mean_ci([2, 2, 2]) == (2.0, 0.0)


def test_interval_covers_the_mean_about_95_percent_of_the_time():
    """Seeded: 2,000 samples of five draws from N(1, 0.1); the t interval
    must hold 1 in about 95% of them (a z interval would hold it in ~88%)."""
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        m, h = stats.mean_ci(rng.gauss(1.0, 0.1) for _ in range(5))
        hits += stats.crosses(m, h)
    assert 0.93 <= hits / 2000 <= 0.97


def test_ratio_format_flags_an_interval_crossing_one():
    assert stats.fmt_ratio(1.23, 0.04) == "1.23x ±0.04"
    assert stats.fmt_ratio(1.02, 0.05) == "1.02x ±0.05 (interval crosses 1: no clear difference)"
    assert stats.fmt_ratio(0.97, 0.02) == "0.97x ±0.02"
    assert stats.fmt_ratio(1.5, None) == "1.50x"
    assert stats.fmt_ratio(None, None) == "n/a"
    assert not stats.crosses(1.0, None)
