"""Input handling the spec and implementation composites must share (found
by review): lengths no arena could ever hold are a ValueError in both (the
implementation used to wrap int64 sums and crash), and any ordered
sequence of ints is accepted where a list is."""

import pytest

from kvarena import impl, spec

PACKAGES = [pytest.param(spec, id="spec"), pytest.param(impl, id="impl")]


def make(pkg, ps=1):
    return pkg.HybridSWA(1 << 16, 64, 32, page_size=ps)


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("ps,seq", [(1, [2 ** 62] * 4), (1, [2 ** 63 - 1, 2 ** 63 - 1, 3]),
                                    (16, [2 ** 63 - 1]), (1, [0, 2 ** 62])])
def test_a_length_no_arena_could_hold_is_a_value_error(pkg, ps, seq):
    c = make(pkg, ps)
    before = c.snapshot()
    with pytest.raises(ValueError, match="could ever hold"):
        c.alloc_extend([0] * len(seq), seq, [-1] * len(seq))
    assert c.snapshot() == before


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_longest_request_that_could_fit_is_a_shortfall_not_an_error(pkg):
    c = make(pkg, 4)
    g = c.arena.geometry("full")
    most = (g.num_pages - g.min_page) * 4
    assert c.alloc_extend([0], [most], [-1]) is None  # swa needs room too: a shortfall
    with pytest.raises(ValueError):
        c.alloc_extend([0], [most + 1], [-1])


@pytest.mark.parametrize("pkg", PACKAGES)
def test_any_ordered_sequence_of_ints(pkg):
    c = make(pkg, 4)
    toks = list(c.alloc_extend(range(1), range(6, 7), (-1,)))
    assert len(toks) == 6
    assert list(c.translate(range(toks[0], toks[0] + 2))) == list(c.translate(toks[:2]))
    c.free_swa(tuple(toks[:4]), 0)
    c.free(range(toks[0], toks[0] + 6))
    c.verify()
    for bad in ("abc", {1, 2}, {1: 2}, 5):
        with pytest.raises(ValueError):
            c.free(bad)
