"""Move holds in the proofs (docs/design.md §13; ``proofs/hold.py``): each
relation evaluated on the spec arena's own runs (``reserve``, ``cancel``,
the held ladder's step), the goals checked on the states those runs reach,
the findings replayed on the spec, and the registry.
"""

import copy
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvarena.proofs import abstract as A
from kvarena.proofs import cli
from kvarena.proofs import hold as H
from kvarena.spec import Arena, SubPool, chain
from kvarena.spec import transitions as T
from tests.proofs.test_fidelity import arenas as fidelity_arenas
from tests.support import live_ids

REG = cli.registry()
RUNS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def arenas():
    """``tests/proofs/test_fidelity.py``'s arenas, every END lazy (a hold needs it)."""
    return fidelity_arenas(laziness=(True,))


def churn(a, rng, steps):
    """Random allocs, frees and capped flushes: holes anywhere in every band."""
    for _ in range(steps):
        name = rng.choice(a.chain)
        op = rng.choice(("alloc", "alloc", "free", "free", "flush"))
        if op == "alloc":
            a.alloc(name, rng.randint(1, max(1, a.available_pages(name))))
        elif op == "free" and live_ids(a, name):
            live = live_ids(a, name)
            a.free(name, rng.sample(live, rng.randint(1, len(live))))
        elif op == "flush":
            a.flush(name, rng.choice((None, 0, 1)))


def pages_of(a, name, pages):
    return pages // a.pool(name).page_size


def holds(case):
    """Every conjunct of a relation's case, evaluated on ints, is True."""
    return all(c is True for c in case)


# ------------------------------------------------------------ the checks


def round_trip(a, i, n, gate):
    """Reserve ``n`` pages of pool ``i`` and cancel them on ``a`` (the gate
    closed first when ``gate``): each step is its relation, the views are
    the chain's, and the round trip's goals hold.  Then the step that takes
    a drop back (the other END's held step; the float's flush) is its
    relation with the page-level bound, and its goal holds.  What it saw."""
    name, seen = a.chain[i], set()
    if gate:
        a.close_gate()
    s = a.state()
    pages = a.reserve(name, n)
    u = a.state()
    assert H.reserved(s, u, i, n) is True and a.moves_held()
    for k, m in enumerate(a.chain):  # a reservation counts in every view; held, no credit
        assert a.available_pages(m) == chain.available(u, k)
        assert pages_of(a, m, a.schedulable_available_size(m)) == chain.available(u, k)
    a.cancel(name, pages)
    t = a.state()
    assert H.cancelled(u, t, i, n) is True
    ends = [e for e, _ in H.ends(len(a.chain))]
    assert chain.available(t, i) >= chain.available(s, i)  # hold.round_trip.*: the reserving pool
    if not a.moves_held():
        for e in ends:
            assert pages_of(a, a.chain[e], a.schedulable_available_size(a.chain[e])) == chain.schedulable(t, e)
    if s.pools[i].grow != "float":
        assert H.ends_schedulable_kept(s, t) is True  # hold.round_trip.{up,down}.*
        j = len(a.chain) - 1 - i
        if chain.available(t, j) < chain.available(s, j):
            seen.add("round trip lowers the other END's held view")
        c = copy.deepcopy(a)
        c.close_gate()
        c.urgent_flush(a.chain[j])  # the other END's held ladder step
        w = c.state()
        assert sum(holds(case) for case in H.held_step(t, w, j, bound=s)) == 1  # exactly its case, bound and all
        assert chain.available(w, j) >= chain.available(s, j)  # hold.round_trip.*.held.*
        assert c._placement() == a._placement()
    else:
        if H.ends_schedulable_kept(s, t) is not True:
            seen.add("float round trip lowers an END's schedulable view")  # the finding
        c = copy.deepcopy(a)
        c.flush(name)  # absorbs only, held or not
        w = c.state()
        assert A.rel_flush_float(t, w, i) is True and H.within(s, w, i) is True
        assert H.ends_schedulable_kept(s, w) is True  # hold.round_trip.float.flushed.*
    return seen


def held_step(a):
    """Close the gate on ``a``: each END's schedulable view is its available
    one, the ladder's END step (``urgent_flush``) is exactly one case of
    ``hold.held_step``, moves nothing and delivers the view.  What it saw."""
    a.close_gate()
    s, seen = a.state(), set()
    for i, _ in H.ends(len(a.chain)):
        name = a.chain[i]
        view = pages_of(a, name, a.schedulable_available_size(name))
        assert view == chain.available(s, i)
        c = copy.deepcopy(a)
        c.urgent_flush(name)
        t = c.state()
        cases = [holds(case) for case in H.held_step(s, t, i)]
        assert sum(cases) == 1
        seen.add("the other END absorbs" if cases[-1] else "a float refits")
        assert c._placement() == a._placement()
        assert chain.available(t, i) >= view  # hold.ladder.*.sound
        assert c.alloc(name, view) is not None
        j = len(a.chain) - 1 - i
        if cases[-1] and A.rel_flush_end(s, t, j) is True and chain.schedulable(s, i) > chain.available(t, i):
            seen.add("the unheld credit is undeliverable")  # hold.ladder.*.credit_unsound's counterexample
    return seen


@RUNS
@given(arenas(), st.integers(0, 2**32), st.booleans())
def test_a_reservations_round_trip_is_the_relation(a, seed, gate):
    rng = random.Random(seed)
    churn(a, rng, rng.randint(0, 25))
    i = rng.randrange(len(a.chain))
    avail = a.available_pages(a.chain[i])
    assume(avail > 0)
    round_trip(a, i, rng.randint(1, avail), gate)


@RUNS
@given(arenas(), st.integers(0, 2**32))
def test_the_held_ladder_step_is_the_relation_and_delivers_the_held_view(a, seed):
    rng = random.Random(seed)
    churn(a, rng, rng.randint(0, 25))
    held_step(a)


def test_the_checks_reach_every_case():
    """Seeded runs of the two checks above see each case they tell apart
    (else they check little): the drops the round trips cause, both flush
    targets, and the unheld credit a held flush cannot deliver."""
    rng = random.Random(7)
    want = {
        "round trip lowers the other END's held view",
        "float round trip lowers an END's schedulable view",
        "the other END absorbs",
        "a float refits",
        "the unheld credit is undeliverable",
    }
    seen = set()
    for _ in range(400):
        pools = [SubPool("u", rng.randint(1, 5), 1, "up")]
        pools += [SubPool(f"f{k}", rng.randint(1, 5), 1, "float") for k in range(rng.randint(0, 1))]
        a = Arena(rng.randint(120, 400), pools + [SubPool("d", rng.randint(1, 5), 1, "down")], lazy=True)
        churn(a, rng, 20)
        i = rng.randrange(len(a.chain))
        if a.available_pages(a.chain[i]):
            seen |= round_trip(copy.deepcopy(a), i, rng.randint(1, a.available_pages(a.chain[i])), rng.random() < 0.5)
        seen |= held_step(a)
        if seen >= want:
            break
    assert seen == want


def _eager_free(s, i, k):
    """``transitions.free`` as an eager END frees: the frontier retreats (a drifted encoding of cancel)."""
    a = s.bands[i]
    if s.pools[i].grow == "up":
        return chain.Counts(a.lo, a.hi - k, a.live - k, a.holes)
    return chain.Counts(a.lo + k, a.hi, a.live - k, a.holes)


class _Drifted:
    alloc, alloc_ok, free_ok = staticmethod(T.alloc), staticmethod(T.alloc_ok), staticmethod(T.free_ok)
    free = staticmethod(_eager_free)


def test_a_drifted_encoding_fails_the_check(monkeypatch):
    """An encoding that drifted from the spec fails on the spec's run: a
    cancel encoded as an eager END's free (its frontier retreats)."""
    a = Arena(640, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")], lazy=True)
    a.alloc("u", 2)
    round_trip(copy.deepcopy(a), 0, 3, False)
    monkeypatch.setattr(H, "T", _Drifted)
    with pytest.raises(AssertionError):
        round_trip(a, 0, 3, False)


# ------------------------------------------------------------ the findings


def test_finding_a_floats_round_trip_lowers_an_ends_schedulable_view():
    """``hold.round_trip.float.ends.n3``, refuted: the float extends toward
    its larger gap, and the cancelled pages are its own holes, which no
    END's view credits; the END's first rung (``urgent_flush``: its target is
    the float, whose flush absorbs boundary holes, held or not) gives them back."""
    u, f, d = SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")
    a = Arena(1600, [u, f, d], lazy=True)
    a.alloc("u", 4)
    a.alloc("d", 8)
    a.alloc("f", 6)  # pages 45..50 of the region [5, 92): the high gap (41 pages) is the larger
    before = a.schedulable_available_size("d")
    a.close_gate()
    pages = a.reserve("f", 10)
    assert pages == list(range(51, 61))  # it extended toward d
    a.cancel("f", pages)
    a.open_gate()
    assert a.schedulable_available_size("d") == before - 10  # ten pages (tokens: page_size 1) of d's promise are gone
    assert a.flush_targets("d") == ["f"]
    a.close_gate()  # held or not: a float's flush only absorbs
    a.urgent_flush("d")
    a.open_gate()
    assert a.schedulable_available_size("d") == before
    a.verify()


def test_finding_the_unheld_credit_is_not_what_an_absorb_only_flush_delivers():
    """``hold.ladder.{up,down}.n2.credit_unsound``, refuted: d's holes lie
    behind a live frontier page; the unheld view credits them to u, an
    absorb-only flush of d delivers none, so under a hold the view drops
    the credit (and the whole flush, once released, delivers it)."""
    a = Arena(640, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")], lazy=True)
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.free("d", [3, 4])  # pages 34, 35: behind ids 1 and 2 on pages 32, 33
    s = a.state()
    credited = chain.schedulable(s, 0)
    assert credited == pages_of(a, "u", a.schedulable_available_size("u")) == chain.available(s, 0) + 2
    held = copy.deepcopy(a)
    held.close_gate()
    assert pages_of(held, "u", held.schedulable_available_size("u")) == chain.available(s, 0)
    held.urgent_flush("u")
    t = held.state()
    assert A.rel_flush_end(s, t, 1) is True and chain.available(t, 0) == credited - 2  # nothing absorbed
    a.urgent_flush("u")
    assert a.available_pages("u") == credited


def test_the_refutations_carry_counterexamples_of_the_findings():
    rows = {
        r["name"]: r for r in cli.run_fresh(["hold.ladder.down.n2.credit_unsound", "hold.round_trip.float.ends.n3"])
    }
    credit = rows["hold.ladder.down.n2.credit_unsound"]
    assert credit["result"] == "counterexample" and credit["ok"]
    assert credit["counterexample"]["s_holes0"] >= 1  # the up END's holes, credited to down
    ends = rows["hold.round_trip.float.ends.n3"]
    assert ends["result"] == "counterexample" and ends["ok"] and ends["counterexample"]["n"] >= 1


# ------------------------------------------------------------ the registry


def test_the_hold_obligations_are_registered():
    names = {n for n, ob in REG.items() if ob.group == "hold"}
    findings = {
        "hold.round_trip.float.ends.n3",
        "hold.ladder.up.n2.credit_unsound",
        "hold.ladder.down.n2.credit_unsound",
    }
    for e in ("up", "down"):
        assert {f"hold.round_trip.{e}.n{n}" for n in (2, 3, 4)} <= names
        assert {f"hold.round_trip.{e}.held.n{n}" for n in (2, 3)} <= names
        assert {f"hold.ladder.{e}.n{n}.sound" for n in (3, 4)} <= names
    assert {"hold.round_trip.float.n3", "hold.round_trip.float.n4", "hold.round_trip.float.flushed.n3"} <= names
    assert findings <= names
    for name in names:
        ob = REG[name]
        assert ob.source == "spec" and ob.timeout_s <= 30
        assert (ob.kind, ob.expect) == (("finding", "counterexample") if name in findings else ("property", "proved"))
