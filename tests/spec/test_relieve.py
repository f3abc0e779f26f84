"""relieve: the order of the ladder, checked by recording every call."""

import pytest

from kvarena.spec import MAX_EVICT_ROUNDS, Arena, SubPool
from tests.support import check_all

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

U = SubPool("u", 16, 1, "up")
F1 = SubPool("f1", 16, 1, "float")
F2 = SubPool("f2", 16, 1, "float")
D = SubPool("d", 16, 1, "down")


def mk(lazy=False):
    """Two opaque floats between the ENDs; all grids 16 bytes, 200 pages."""
    a = Arena(3200, [U, F1, F2, D], lazy=lazy)
    a.alloc("f1", 10)  # parks mid-region
    a.alloc("f2", 10)  # parks mid-way between f1 and the top
    return a


def record(a, log):
    """Route flush, open_short_side and the recheck (available_pages) through ``log``."""
    flush, oss, avail = a.flush, a.open_short_side, a.available_pages

    def rec_flush(name, max_moves=None):
        log.append(("flush", name))
        return flush(name, max_moves)

    def rec_oss(name, demand):
        log.append(("slide", name, dict(demand)))
        return oss(name, demand)

    def rec_avail(name):
        log.append(("check", name))
        return avail(name)

    a.flush, a.open_short_side, a.available_pages = rec_flush, rec_oss, rec_avail


def evictor(log, returns, action=None):
    it = iter(returns)

    def evict(k):
        log.append(("evict", k))
        if action:
            action()
        return next(it)

    return evict


def ladder(name, need):
    c = ("check", name)
    return [("flush", t) for t in TARGETS[name]] + [
        c,
        ("slide", "f1", {name: need}),
        c,
        ("slide", "f2", {name: need}),
        c,
    ]


TARGETS = {"u": ["f1"], "d": ["f2"], "f1": ["u", "f2"], "f2": ["f1", "d"]}


@pytest.mark.parametrize("name", ["u", "d", "f1", "f2"])
def test_flush_targets(name):
    assert mk().flush_targets(name) == TARGETS[name]


def test_flush_target_skips_transparent_floats():
    a = Arena(3200, [U, F1, F2, D])
    assert a.flush_targets("u") == ["d"] and a.flush_targets("d") == ["u"]
    assert a.flush_targets("f1") == ["u", "d"]


@pytest.mark.parametrize("name", ["u", "d", "f1"])
def test_full_ladder_then_four_evict_rounds(name):
    a = mk()
    need = 199  # never fits, and exceeds every index room: slides are skipped
    short = need - a.available_pages(name)
    log = []
    record(a, log)
    ev = evictor(log, [1] * 10)  # claims progress, frees nothing
    assert a.relieve(name, need, ev) is False
    c = ("check", name)
    expected = [c] + ladder(name, need)
    for _ in range(MAX_EVICT_ROUNDS):
        expected += [c, ("evict", short)] + ladder(name, need)
    assert log == expected + [c]  # the verdict, judged after the last step
    assert MAX_EVICT_ROUNDS == 4
    check_all(a)


def test_without_evict_the_ladder_runs_once():
    a = mk()
    log = []
    record(a, log)
    assert a.relieve("u", 199) is False
    assert log == [("check", "u")] + ladder("u", 199) + [("check", "u")]


def test_a_return_of_0_ends_the_rounds():
    """(None and False ended them too, until they became no count: tests/api/test_evictors.py.)"""
    a = mk()
    short = 199 - a.available_pages("d")
    log = []
    record(a, log)
    assert a.relieve("d", 199, evictor(log, [0])) is False
    assert log == [("check", "d")] + ladder("d", 199) + [("check", "d"), ("evict", short), ("check", "d")]


def test_fits_at_once_touches_nothing():
    a = mk()
    log = []
    record(a, log)
    before = a.snapshot()
    assert a.relieve("u", 3, evictor(log, [1])) is True
    assert log == [("check", "u")]
    assert a.snapshot() == before


def test_flush_alone_relieves_and_stops_the_ladder():
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")], lazy=True)
    a.alloc("d", 60)  # pages 40..99
    a.free("d", list(range(1, 31)))  # ids 1..30 sit on the frontier pages 40..69: a flush absorbs them
    a.alloc("u", 39)  # gap 0
    assert a.available_pages("u") == 0
    log = []
    record(a, log)
    assert a.relieve("u", 20, evictor(log, [1])) is True
    assert log == [("check", "u"), ("flush", "d"), ("check", "u")]
    assert a.alloc("u", 20) is not None
    check_all(a)


def test_first_slide_relieves_and_skips_the_second_float():
    a = mk()
    a.alloc("u", a.available_pages("u"))  # up against f1
    assert a.available_pages("u") == 0
    log = []
    record(a, log)
    assert a.relieve("u", 5) is True
    assert log == [("check", "u"), ("flush", "f1"), ("check", "u"), ("slide", "f1", {"u": 5}), ("check", "u")]
    assert a.alloc("u", 5) is not None
    check_all(a)


def test_evict_round_that_frees_enough_ends_in_success():
    a = Arena(3200, [U, F1, D])
    a.alloc("f1", 10)
    a.alloc("u", a.available_pages("u"))
    a.alloc("f1", a.available_pages("f1"))  # f1 fills to the top: it cannot slide for u
    assert a.available_pages("u") == 0 and a.available_pages("f1") == 0
    log = []
    record(a, log)
    victims = [v for v, p in enumerate(a.v2p("u")) if v > 0 and p >= 0]

    def free_some():
        a.free("u", victims[:20])
        del victims[:20]

    assert a.relieve("u", 30, evictor(log, [20, 20, 20], action=free_some)) is True
    c, one = ("check", "u"), [("flush", "f1"), ("check", "u"), ("slide", "f1", {"u": 30}), ("check", "u")]
    assert log == (
        [c]
        + one
        + [c, ("evict", 30)]
        + one  # 20 freed: still 10 short
        + [c, ("evict", 10), ("flush", "f1"), c]
    )  # 40 available: done, no third round
    assert a.alloc("u", 30) is not None
    check_all(a)


def test_slides_offered_to_every_float_in_chain_order():
    """A float that is not u's neighbour may still slide for u (here f2 leapfrogs
    away from f1), which is what lets f1 slide later."""
    a = mk()
    a.alloc("u", a.available_pages("u"))
    a.alloc("f1", a.available_pages("f1"))  # f1 now touches f2
    assert a.frontiers("f1")[1] == a.frontiers("f2")[0]
    f2_before = a.frontiers("f2")
    assert a.relieve("u", 30) is False
    assert a.frontiers("f2") != f2_before and a.frontiers("f2")[1] == 3200  # f2 moved to the top
    check_all(a)


def test_relieve_never_raises_on_a_shortfall():
    a = mk()
    for name in a.chain:
        assert a.relieve(name, 10**6) is False
        assert a.relieve(name, 10**6, lambda k: 1) is False
    check_all(a)


def test_relieve_result_matches_the_gate():
    a = mk(lazy=True)
    for name in a.chain:
        for need in (0, 1, 5, 50, 150, 400):
            ok = a.relieve(name, need)
            assert ok == (need <= a.available_pages(name))
            check_all(a)
