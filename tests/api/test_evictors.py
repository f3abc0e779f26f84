"""The eviction callback's contract (``spec.evict``; issue 24, item 2), on
the Arena and the composites of both packages.

What a scheduler's ``evict`` may return (a count: an int >= 0, or anything
``operator.index`` reads exactly) and what else is a ``ValueError`` naming
the call, with the arena consistent and the callback's frees kept; a
callback that raises; and a callback that calls the arena back (frees pages
of another pool, allocates, runs a nested ``relieve``): supported, the
verdict read afresh after it."""

import numpy as np
import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import SubPool
from tests.support import live_ids

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

PKGS = [pytest.param(spec, id="spec"), pytest.param(impl, id="impl")]
BAD = [-1, 1.5, True, False, None, "3", torch.tensor([1, 2]), torch.tensor(2.0)]
COUNTS = [0, 3, np.int64(3), torch.tensor(3), torch.tensor([3])]


def full_ends(pkg):
    """Two ENDs, ``u`` full, ``d`` holding 40 pages: ``u`` is short until ``d`` frees."""
    a = pkg.Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")])
    a.alloc("d", 40)
    a.alloc("u", a.available_pages("u"))
    assert a.available_pages("u") == 0
    return a


def freeing(a, pool, ids, returns):
    """An evictor that frees ``ids`` of ``pool`` (once) and returns ``returns``."""
    calls = []

    def evict(shortfall):
        calls.append(shortfall)
        if len(calls) == 1:
            a.free(pool, ids)
        return returns

    return evict, calls


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("returns", BAD, ids=repr)
def test_a_return_that_is_no_count_is_a_value_error_naming_the_pool(pkg, returns):
    a = full_ends(pkg)
    victims = live_ids(a, "d")[:10]
    evict, calls = freeing(a, "d", victims, returns)
    with pytest.raises(ValueError, match=r"pool 'u': relieve: evict must return the count it freed"):
        a.relieve("u", 20, evict)
    assert len(calls) == 1  # no round after the bad return
    a.verify()  # consistent, and the round's frees kept
    assert not set(victims) & set(live_ids(a, "d")) and len(live_ids(a, "d")) == 30


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("returns", COUNTS, ids=repr)
def test_a_count_is_read_exactly_and_0_ends_the_rounds(pkg, returns):
    a = full_ends(pkg)
    evict, calls = freeing(a, "d", live_ids(a, "d")[:10], returns)
    assert a.relieve("u", 20, evict) is False  # 10 freed, 20 asked
    assert len(calls) == (1 if int(returns) == 0 else spec.MAX_EVICT_ROUNDS)
    assert calls[0] == 20 and all(k == 10 for k in calls[1:])  # each round asked the shortfall afresh
    a.verify()


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("evict", [3, "evict", [0]], ids=repr)
def test_an_evictor_that_is_not_callable_changes_nothing(pkg, evict):
    a = full_ends(pkg)
    a.free("d", live_ids(a, "d")[:5])
    before = a.snapshot()
    with pytest.raises(ValueError, match=r"pool 'u': relieve: evict must be callable"):
        a.relieve("u", 20, evict)
    assert a.snapshot() == before


@pytest.mark.parametrize("pkg", PKGS)
def test_an_exception_from_the_evictor_is_the_callers(pkg):
    a = full_ends(pkg)

    def evict(shortfall):
        a.free("d", live_ids(a, "d")[:4])
        raise KeyError("the scheduler's own error")

    with pytest.raises(KeyError, match="the scheduler's own error"):
        a.relieve("u", 20, evict)
    a.verify()
    assert len(live_ids(a, "d")) == 36


# ------------------------------------------------------------ calling back


def floated(pkg, policy):
    """lo (up END), f (float, parked in the middle), hi (down END), 64 pages each grid."""
    pools = [SubPool("lo", 8, 1, "up"), SubPool("f", 8, 1, "float"), SubPool("hi", 8, 1, "down")]
    a = pkg.Arena(8 * 64, pools, policy=policy)
    a.alloc("lo", 16)
    a.alloc("f", 8)
    a.alloc("hi", 16)
    return a


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("policy", spec.POLICIES)
def test_the_evictor_may_call_the_arena_back(pkg, policy):
    """Rounds that free another pool's pages, allocate in the pool being
    relieved, and run a nested relieve for a third: the ladder holds nothing
    across the call, so its verdict is the view read afresh, and both
    packages end in the same state."""
    twins = {}
    for p in (spec, impl):
        a = floated(p, policy)
        need = a.available_pages("lo") + 12
        rounds = iter(
            [
                lambda a=a: (a.free("hi", live_ids(a, "hi")[:6]), 6)[1],  # another pool
                lambda a=a: (a.alloc("lo", 2), 0 + 1)[1],  # makes the shortfall worse
                lambda a=a: (a.relieve("f", a.available_pages("f") + 3), a.free("hi", live_ids(a, "hi")[:8]), 8)[2],
            ]
        )
        asked = []

        def evict(shortfall, a=a, rounds=rounds, asked=asked):
            asked.append(shortfall)
            return next(rounds, lambda: 0)()

        ok = a.relieve("lo", need, evict)
        assert ok == (need <= a.available_pages("lo"))
        a.verify()
        twins[p] = (ok, asked, a.snapshot())
    assert len(twins[spec][1]) >= 2  # the callback did run more than once
    assert twins[spec] == twins[impl]


# ------------------------------------------------------------ the composites


def tri(pkg, ps=1):
    c = pkg.TriPool(8 * ps * 20, 8, 8, 8 * ps, ps)
    reqs = [c.alloc_extend([0], [2 * ps], [-1]) for _ in range(3)]
    return c, reqs


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("returns", BAD, ids=repr)
def test_a_composite_names_itself_on_a_bad_count(pkg, returns):
    c, reqs = tri(pkg)
    n = c.available_size() + 2

    def evict(shortfall):
        c.free(reqs.pop())
        return returns

    with pytest.raises(ValueError, match=r"TriPool.relieve: evict must return the count it freed"):
        c.relieve(tokens=n, evict=evict)
    assert len(reqs) == 2
    c.verify()


@pytest.mark.parametrize("pkg", PKGS)
def test_a_composite_evictor_may_allocate_and_free(pkg):
    """The callback frees two requests and admits a new one in the same round:
    the verdict is the gate read afresh."""
    c, reqs = tri(pkg)
    n = c.available_size() + 3

    def evict(shortfall):
        c.free(reqs.pop())
        c.free(reqs.pop())
        got = c.alloc_extend([0], [1], [-1])
        assert got is not None
        return 2

    ok = c.relieve(tokens=n, evict=evict)
    assert ok == c.fits(n)
    c.verify()
