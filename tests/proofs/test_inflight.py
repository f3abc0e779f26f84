"""In-flight forwards in the proofs (docs/design.md §12; ``proofs/inflight.py``,
``proofs/inflight_plans.py``): the encodings against the spec's own runs, the
non-urgent walk's claims, the planted races ``kvarena prove`` must refute,
and the finding.
"""

import copy
import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvarena.proofs import cli
from kvarena.proofs import inflight as I
from kvarena.proofs import inflight_plans as W
from kvarena.spec import AccountingError, Arena, SubPool, chain
from kvarena.spec import forward as fw
from kvarena.spec import transitions as T
from kvarena.verification import planted
from tests.support import live_ids

REG = cli.registry()
POOLS = ("u", "f", "d")
RUNS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pools():
    return [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")]


def arena():
    """An up END, a float and a down END of 16-byte pages, both ENDs lazy,
    ten pages in each END and four in the float, with holes deep in the
    ENDs (so that a flush has survivors to move)."""
    a = Arena(1600, pools(), lazy={"u", "d"})
    for name, n in (("u", 10), ("f", 4), ("d", 10)):
        a.alloc(name, n)
    a.free("u", [2, 3, 5])
    a.free("d", [7, 8, 10])
    return a


def lazy_down():
    """tests/spec/test_forward.py's arena: the down END holds ids 1..8, with holes at ids 3 and 4."""
    a = Arena(1600, pools(), lazy={"d"})
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.free("d", [3, 4])
    return a


def step(a, data, before_alloc=None, before_flush=None):
    """One random call of the forward's life: alloc, free, launch, settle, or
    a flush (urgent or not).  ``before_alloc(a, name, n)`` and
    ``before_flush(a, name, max_moves)`` run first and return a check to
    run after it."""
    if a.in_flight:  # mostly calls that may leave it in flight: an urgent flush or a settle ends it
        ops = ["alloc"] * 3 + ["free"] * 3 + ["walk"] * 4 + ["launch", "flush", "settle"]
    else:
        ops = ["alloc", "free", "free", "walk", "launch", "launch"]
    op = data.draw(st.sampled_from(ops))
    name = data.draw(st.sampled_from(POOLS))
    live = live_ids(a, name)
    after = None
    if op == "alloc":
        n = data.draw(st.integers(1, 4))
        after = before_alloc and before_alloc(a, name, n)
        ids = a.alloc(name, n)
        if ids is None:
            after = None
    elif op == "free" and live:
        a.free(name, data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True)))
    elif op == "launch":
        few = st.lists(st.sampled_from(live), max_size=3, unique=True) if live else st.just([])
        ids = data.draw(few | st.none()) if data.draw(st.integers(0, 4)) == 0 else data.draw(few)
        a.launch({name: ids})
    elif op == "settle":
        a.settle()
    elif op in ("flush", "walk"):
        urgent = op == "flush"
        cap = data.draw(st.none() | st.integers(0, 3))
        if not urgent and a.is_lazy(name):
            after = before_flush and before_flush(a, name, cap)
        a.flush(name, max_moves=cap, urgent=urgent)
    a.verify()
    if after:
        after()


class Values:
    """A band's table as the encodings read it, by index (a z3 numeral or an
    int), answering plain ints: the encoding evaluated on the real values."""

    def __init__(self, items, default=-1):
        self.values, self.default = dict(items), default

    def __getitem__(self, k):
        return self.values.get(k.as_long() if z3.is_int_value(k) else k, self.default)


def tables(a, name):
    """The band's ``p2v``, content, pins and pending marks (``Values``), and its top page."""
    b = a.bands[name]
    content = Values(b.content.items(), default=-(10**6))  # a page never written holds nobody's bytes
    return Values(enumerate(b.p2v)), content, Values(enumerate(b.pinned)), Values(enumerate(b.pending)), len(b.p2v) - 1


def guards_ok(a, name):
    p2v, content, pinned, pending, bound = tables(a, name)
    return z3.is_true(z3.simplify(I.guards_ok(p2v, content, pinned, pending, bound)))


# ----------------------------------------------------- the encodings, on runs


@RUNS
@given(st.data())
def test_the_guard_invariant_holds_on_every_state_the_spec_reaches(data):
    """``inflight.guards_ok`` (the obligations' hypothesis and goal) holds on
    the real tables of every state random runs with forwards in flight reach."""
    a = arena()
    for _ in range(data.draw(st.integers(1, 30))):  # checked where the run stops (z3 terms are slow to build)
        step(a, data)
    for name in POOLS:
        assert guards_ok(a, name), (name, a.snapshot())


def _hand_out(a, p):
    b = a.bands["d"]
    b.bind(b.take_ids(1, None), [p])


def _move_pinned(a, _p):
    b = a.bands["d"]
    (src,) = a.pinned("d")
    dst = next(h for h in b.holes if not b.is_guarded(h))
    b.move([dst], [src])


@pytest.mark.parametrize(
    "race",
    [_hand_out, lambda a, p: a.bands["d"].content.__setitem__(p, 99), _move_pinned],
    ids=["pending-handed-out", "pending-overwritten", "pinned-moved"],
)
def test_the_guard_invariant_fails_where_verify_does(race):
    """Each race Band.check reports also breaks ``guards_ok``: the encoding
    is no weaker than the rules it stands for, on these tables."""
    a = lazy_down()
    a.launch({"d": [2]})
    a.flush("d", urgent=False)
    (p,) = a.pending("d")
    assert guards_ok(a, "d")
    race(a, p)
    with pytest.raises(AccountingError):
        a.verify()
    assert not guards_ok(a, "d")


@RUNS
@given(st.data())
def test_alloc_settles_is_the_arenas_decision_and_its_reuse(data):
    """The count-level encoding of an alloc in flight: ``g`` is the arena's
    ``len(guarded_holes())``, the alloc settles exactly when
    ``transitions.alloc_settles`` says, and one that does not reuses at most
    ``holes - g`` holes (``inflight.alloc.*``'s goal, on the real run)."""

    def before_alloc(a, name, n):
        b = a.bands[name]
        if not a.in_flight or n > a.available_pages(name):
            return None
        s, i = a.state(), a.chain.index(name)
        g, holes = len(b.guarded_holes()), len(b.holes)
        settles = T.alloc_settles(s, i, n, g)

        def check():
            assert a.in_flight is not settles
            reused = holes - len(a.bands[name].holes)
            assert reused == holes - T.alloc(s, i, n).holes
            assert reused > holes - g if settles else reused <= holes - g

        return check

    a = arena()
    for _ in range(data.draw(st.integers(5, 30))):
        step(a, data, before_alloc=before_alloc)


def _strip(snapshot):
    """A snapshot without the forward: what the ladder reads and writes."""
    out = {k: v for k, v in snapshot.items() if k != "in_flight"}
    out["pools"] = {
        n: {k: v for k, v in p.items() if k not in ("pinned", "pending")} for n, p in snapshot["pools"].items()
    }
    return out


@RUNS
@given(st.data())
def test_settle_changes_nothing_a_view_or_the_planner_reads(data):
    """``settle`` changes no count, page table or hole: the chain every view,
    transition and planner input reads is the same after it (a fact of
    construction, not a z3 goal: it would be ``x == x``)."""
    a = arena()
    for _ in range(data.draw(st.integers(5, 25))):
        step(a, data)
    a.launch(dict.fromkeys(POOLS))
    demand = [data.draw(st.integers(0, 50)) for _ in POOLS]
    s, snap = a.state(), _strip(a.snapshot())
    views = [(a.available_pages(n), a.schedulable_available_size(n)) for n in POOLS]
    a.settle()
    assert a.state() == s and _strip(a.snapshot()) == snap
    assert [(a.available_pages(n), a.schedulable_available_size(n)) for n in POOLS] == views
    assert chain.planner_inputs(a.state(), demand) == chain.planner_inputs(s, demand)


@RUNS
@given(st.data())
def test_the_ladder_in_flight_reaches_what_it_reaches_settled(data):
    """An urgent step with a forward in flight (relieve, the planner, an
    urgent flush) leaves the tables, holes and counts it leaves on a copy
    settled first: it settles before it moves a page or drops a guarded
    hole, and otherwise does the same.  An alloc leaves the same counts and
    ids, but may bind other holes (``test_an_alloc_in_flight_binds_other_holes``)."""
    a = arena()
    for _ in range(data.draw(st.integers(5, 25))):
        step(a, data)
    a.launch({n: data.draw(st.none() | st.just([])) for n in POOLS})
    for _ in range(data.draw(st.integers(0, 4))):  # pending pages, and freed pinned ones
        name = data.draw(st.sampled_from(("u", "d")))
        if live_ids(a, name) and data.draw(st.booleans()):
            a.free(name, [data.draw(st.sampled_from(live_ids(a, name)))])
        a.flush(name, urgent=False)
    settled = copy.deepcopy(a)
    settled.settle()
    name = data.draw(st.sampled_from(POOLS))
    op = data.draw(st.sampled_from(["relieve", "plan", "flush", "alloc"]))
    if op == "relieve":
        need = data.draw(st.integers(1, 60))
        assert a.relieve(name, need) == settled.relieve(name, need)
    elif op == "plan":
        demand = {n: data.draw(st.integers(0, 40)) for n in POOLS}
        assert a.plan_floats(demand) == settled.plan_floats(demand)
    elif op == "flush":
        assert a.flush(name) == settled.flush(name)
    else:
        n = data.draw(st.integers(1, 4))
        assert a.alloc(name, n) == settled.alloc(name, n)
        assert a.state() == settled.state()
        return
    a.verify()
    assert _strip(a.snapshot()) == _strip(settled.snapshot())


def test_an_alloc_in_flight_binds_other_holes():
    """What "the same placements" means: the same counts (every view, the
    planner's inputs), not the same pages.  An alloc in flight that does not
    settle takes the oldest *unguarded* holes; settled, the oldest ones."""
    a = Arena(1600, pools(), lazy={"d"})
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.launch({"d": [3]})
    a.free("d", [3, 4])  # id 3's page: a hole pinned FREED, the oldest
    settled = copy.deepcopy(a)
    settled.settle()
    assert a.alloc("d", 1) == settled.alloc("d", 1) and a.in_flight
    assert a.state() == settled.state()
    assert a.holes("d") != settled.holes("d")
    a.verify()


# ------------------------------------------------- the non-urgent walk's claims


def _claims(w, cap):
    assert not set(w.src) & set(w.pinned) and not set(w.dst) & set(w.guarded)
    assert W.clear(w) and W.packs(w, cap) and W.stops_at_pins(w) and W.as_long_as_allowed(w, cap)


@RUNS
@given(st.data())
def test_the_walks_claims_hold_on_the_bands_the_arena_flushes(data):
    """The CrossHair harness's claims (``inflight_plans``), on every band the
    arena's non-urgent flush plans for in random runs (any span, holes in
    any order), with the plan the arena then applies."""

    def before_flush(a, name, cap):
        b = a.bands[name]
        live = b.occupied_pages()
        edge = b.geom.min_page + b.live if b.grow == "up" else b.geom.num_pages - b.live
        pinned = [p for p in live if b.pinned[p] >= 0]
        pending = [h for h in b.holes if b.pending[h] >= 0]
        freed = [h for h in b.holes if b.pinned[h] == fw.FREED]
        assert sorted(pending + freed) == sorted(b.guarded_holes())
        w = W.plan_for(b.grow == "up", live, list(b.holes), edge, pinned, pending, freed, -1 if cap is None else cap)
        _claims(w, -1 if cap is None else cap)
        moved = {p: b.p2v[p] for p in w.src}

        def check():  # the arena moved exactly these pages, each id to its destination
            assert all(a.bands[name].v2p[v] == d for (s, v), d in zip(sorted(moved.items()), w.dst))

        return check

    a = arena()
    for _ in range(data.draw(st.integers(5, 30))):
        step(a, data, before_flush=before_flush)


def test_the_walks_claims_hold_on_every_band_of_up_to_five_pages():
    """The harness's claims by enumeration: every band of at most 5 pages
    (each live, pinned, a hole, pending or pinned FREED), both directions,
    every cap up to 3 and none; CrossHair searches bands of up to 8."""
    n = 0
    for size in range(6):
        for kinds in itertools.product(range(W.FREED + 1), repeat=size):
            for up, cap in itertools.product((True, False), (-1, 0, 1, 2, 3)):
                W.non_urgent_walk(up, list(kinds), cap)
                n += 1
    assert n == 2 * 5 * sum(5**k for k in range(6))


def test_a_walk_past_a_pin_breaks_the_claims():
    w = W.walk(True, [W.HOLE, W.PINNED], -1)  # page 2, pinned, lies beyond the packed edge
    assert w.src == [] and w.dst == []
    moved = w._replace(dst=[1], src=[2])  # the plan a walk that did not stop would make
    assert not W.clear(moved) and not W.stops_at_pins(moved)


# ----------------------------------------------------------- the registry


def test_the_inflight_obligations_are_registered():
    names = {n for n, ob in REG.items() if ob.group == "inflight"}
    for op in ("move", "bind", "bind.unguarded", "pin", "release"):
        for k in (1, 2, 3):
            assert {f"inflight.{op}.k{k}", f"inflight.{op}.k{k}.bounded"} <= names
    for kind, n in (("up", 2), ("down", 2), ("up", 3), ("float", 3), ("down", 3)):
        assert f"inflight.alloc.{kind}.n{n}" in names
    for n in (2, 3, 4):
        assert {f"inflight.schedulable.up.n{n}", f"inflight.schedulable.down.n{n}"} <= names
    assert {"inflight.joint.hybrid", "inflight.joint.tripool"} <= names
    assert {f"inflight.partial_flush.{e}.n{n}" for e in ("up", "down") for n in (2, 3)} <= names
    for name in names:
        ob = REG[name]
        assert ob.source == "spec" and ob.kind == ("finding" if name == "inflight.move.chained" else "property")


# -------------------------------------------------------------- the finding


def test_finding_move_clear_passes_a_chained_move():
    """``inflight.move.chained``, refuted: ``forward.move_clear`` reads the
    guards before ``vacate`` marks the move's sources, so it passes a move
    whose destination is another pair's source (``move_ok`` allows it), and
    that move overwrites a page the forward still reads.  The arena never
    makes one while a forward is in flight (the non-urgent flush moves into
    holes: ``inflight.move.kK`` assumes it, the walk's claims check it); the
    predicate alone does not say so."""
    (r,) = cli.run_fresh(["inflight.move.chained"])
    assert r["result"] == "counterexample" and r["ok"]
    cex = r["counterexample"]
    assert {cex["dst0"], cex["dst1"]} & {cex["src0"], cex["src1"]}  # a destination that is a source
    # the same race on the spec's own band
    a = Arena(1600, pools(), lazy={"d"})
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.free("d", [8])
    a.launch({"d": [1]})
    b = a.bands["d"]
    hole = a.holes("d")[0]
    x, y = (b.v2p[v] for v in (6, 7))
    dst, src = [hole, x], [x, y]  # x's id moves into the hole, y's id into x's page
    assert fw.move_clear(b.pinned, b.pending, dst, src)
    fw.vacate(b.pending, b.content, src)
    b.move(dst, src)
    assert b.content[x] == 7 != b.pending[x] == 6  # the forward reads id 6's bytes at x: gone
    b.holes = [y]  # the holes as the arena would leave them
    with pytest.raises(AccountingError, match="pending page untouched"):
        b.check()


# ------------------------------------------------------- the planted races


@pytest.fixture(scope="module")
def outcomes():
    baseline = planted.Mutation(
        "inflight-baseline",
        "no mutation: the in-flight plants' obligations and CrossHair run hold",
        "",
        [],
        proof_only=tuple(sorted({g for m in planted.INFLIGHT_PLANTS for g in m.proof_only})),
    )
    with ThreadPoolExecutor(max_workers=2) as ex:
        runs = list(
            ex.map(
                lambda m: planted.run_mutation(m, suites=("proofs",), first=False),
                [baseline] + planted.INFLIGHT_PLANTS,
            )
        )
    return {o.name: o for o in runs}


def test_the_three_races_of_the_issue_are_planted():
    names = {m.name for m in planted.INFLIGHT_PLANTS}
    # a move of a pinned page; a pending page handed out early; a gate counting pending pages free
    assert {"inflight-walk-moves-a-pin", "inflight-pending-handed-out", "inflight-alloc-takes-guarded-holes"} <= names
    assert all(m in planted.MUTATIONS for m in planted.INFLIGHT_PLANTS)
    assert set(planted.PROOF_BASELINE.proof_only) >= {g for m in planted.INFLIGHT_PLANTS for g in m.proof_only}


def test_unmutated_the_inflight_proofs_hold(outcomes):
    o = outcomes["inflight-baseline"]
    assert not o.error and o.missed_by == ["proofs"], o
    assert "exits 0" in o.details["proofs"]["detail"]


@pytest.mark.parametrize("m", planted.INFLIGHT_PLANTS, ids=lambda m: m.name)
def test_kvarena_prove_refutes_each_planted_race(outcomes, m):
    o = outcomes[m.name]
    assert not o.error, o.error
    assert o.caught_by == ["proofs"], o.details
    assert "counterexample" in o.details["proofs"]["detail"], o.details
