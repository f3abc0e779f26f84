"""The z3 obligations: every one proved (or, for a refutation, refuted) within
its limit and non-vacuous; the mutation checks; the findings' regression tests.
"""

import json

import pytest
import z3

from kvarena.proofs import abstract as A
from kvarena.proofs import cli
from kvarena.proofs.core import UNITS_PER_S, Built, Obligation, run_obligation
from kvarena.spec import Arena, SubPool, arith
from tests.support import ROOT, Patch, SourcePatch, mutant_module, refuted

REG = cli.registry()
ARITH, POLICY, ABSTRACT = "kvarena.spec.arith", "kvarena.proofs.policy", "kvarena.proofs.abstract"
GROUPS = {
    "layout",
    "golden",
    "invariants",
    "capacity",
    "policy",
    "composite",
    "planner",
    "integrity",
    "views",
    "inflight",
    "hold",
    "disagg",
}


@pytest.fixture(scope="module")
def results():
    """One batched run of every obligation (2 processes), shared by the tests."""
    return {r["name"]: r for r in cli.run_z3(jobs=2)}


def test_registry_covers_the_issue():
    assert len(REG) >= 40
    assert {ob.group for ob in REG.values()} == GROUPS
    for op in (
        "alloc_up",
        "alloc_down",
        "alloc_float_holes",
        "alloc_float_parked",
        "alloc_float_extend_low",
        "alloc_float_extend_high",
        "free_eager",
        "free_lazy",
        "free_float",
        "flush",
        "make_room_boundary",
        "make_room_leapfrog",
        "compact_holes",
    ):
        for inv in ("order", "conservation", "grid"):
            assert f"inv.{op}.{inv}" in REG
    for n in (2, 3, 4):
        assert f"layout.every_pool_allocates.n{n}" in REG
    for sfx in ("", ".n3", ".n2"):
        assert f"inv.conservation.single_drift_detected{sfx}" in REG
    assert REG["inv.conservation.bytes_localize_drift"].expect == "counterexample"
    for name in (
        "composite.hybrid.joint_sound",
        "composite.hybrid.joint_tight",
        "composite.mamba.joint_tight",
        "golden.tripool_empty_float",
        "golden.tripool_empty_float.within_one_page",
    ):
        assert REG[name].expect == "proved", name
    assert REG["golden.tripool_empty_float.exact_off_grid"].expect == "counterexample"
    for n in (3, 4):  # the planner: every pool of chains of 3 and 4 (docs/design.md §4b)
        for j in range(n):
            for what in ("complete", "sound.meets", "stays"):
                assert REG[f"planner.{what}.n{n}.pool{j}"].expect == "proved"
        assert REG[f"planner.sound.inv.n{n}"].expect == "proved"
    assert "planner.order_safe" in REG
    for n in (2, 3, 4):  # issue 10: the base case, the dead terms, the tables
        for name in (
            f"inv.init.n{n}",
            f"dead.golden_clamp.n{n}",
            f"dead.end_room_cap.n{n}",
            f"integrity.writes_disjoint.n{n}",
        ):
            assert REG[name].expect == "proved" and REG[name].kind == "property" and REG[name].source == "spec"
    for op in ("bind", "unbind", "move"):
        for k in (1, 2, 3):
            assert f"integrity.{op}.k{k}" in REG and f"integrity.{op}.k{k}.bounded" in REG
    for n in (2, 3, 4):  # issue 26: an END's schedulable view, sound and tight, on the spec's code
        for end in ("up", "down"):
            for what in ("sound", "tight"):
                ob = REG[f"views.schedulable.{end}.n{n}.{what}"]
                assert ob.expect == "proved" and ob.kind == "property" and ob.source == "spec"
    for name in ("capacity.float.raw_bytes_overpromise", "capacity.end_down.floor_check_overlaps"):
        assert REG[name].kind == "demo" and REG[name].expect == "counterexample"
    for ob in REG.values():
        assert ob.statement and ob.timeout_s > 0 and ob.expect in ("proved", "counterexample")
        assert ob.tautology in ("none", "conjuncts", "any")
        assert (ob.tautology == "any") == (ob.kind == "lemma"), ob.name  # a goal valid alone is a lemma
        assert (ob.expect == "counterexample") == (ob.kind in ("finding", "demo")), ob.name
        if ob.group == "invariants":  # every transition obligation is about the spec's own transitions
            assert ob.source == "spec", ob.name
        if ob.group == "invariants" and ob.name.split(".")[1] not in ("conservation", "init"):
            assert ob.tautology == "none", ob.name  # every conjunct of an invariant must be able to fail


@pytest.mark.parametrize("name", list(REG))
def test_obligation(results, name):
    r = results[name]
    ob = REG[name]
    assert r["result"] == ob.expect, r
    assert r["vacuity"] == "sat", r  # the hypotheses are satisfiable: not a vacuous proof
    if ob.expect == "proved":  # the margin proofs/core.py promises: 4 times what the proof spends
        assert r["units"] * 4 <= r["limit_units"] == ob.timeout_s * UNITS_PER_S, r
    if ob.expect == "proved":  # the goal does not hold with no hypotheses, unless declared so
        allowed = {"none": {"none"}, "conjuncts": {"none", "conjuncts"}, "any": {"none", "conjuncts", "goal"}}
        assert r["tautology"] in allowed[ob.tautology] | {"unknown"}, r
    assert r["ok"]


def test_tautology_verdicts(results):
    """The invariants decide their tautology check (no conjunct holds alone);
    the by-construction obligations are the declared ones."""
    for name, r in results.items():
        if name.startswith("inv.") and not name.startswith("inv.init") and REG[name].expect == "proved":
            assert r["tautology"] == "none", r
    goal = {n for n, r in results.items() if r["tautology"] == "goal"}
    lemmas = {n for n, ob in REG.items() if ob.kind == "lemma"}
    assert goal <= lemmas  # a goal valid with no hypotheses is labelled a lemma ...
    assert all(results[n]["tautology"] in ("goal", "unknown") for n in lemmas)  # ... and a lemma is one
    assert "capacity.lemma.cdiv_galois" in goal


def test_refutations_carry_concrete_counterexamples(results):
    refuted = [r for r in results.values() if r["expect"] == "counterexample"]
    assert len(refuted) >= 3
    for r in refuted:
        assert r["counterexample"] and all(isinstance(v, (int, bool)) for v in r["counterexample"].values())


# ------------------------------------------------------------------ runner


def test_runner_reports_counterexample_unknown_and_vacuity():
    x = z3.Int("x")
    cex = run_obligation(Obligation("t.cex", "t", "x > 0 => x > 1 (false)", lambda: Built([x > 0], x > 1)))
    assert cex["result"] == "counterexample" and cex["counterexample"] == {"x": 1} and not cex["ok"]
    vac = run_obligation(Obligation("t.vac", "t", "vacuous", lambda: Built([x > 0, x < 0], x == 5)))
    assert vac["result"] == "proved" and vac["vacuity"] == "unsat" and not vac["ok"]
    a, b, c = z3.Ints("a b c")
    hard = lambda: Built([a > 0, b > 0, c > 0], a**3 + b**3 != c**3)  # noqa: E731
    unk = run_obligation(Obligation("t.unk", "t", "Fermat n=3", hard, timeout_s=0.5))
    assert unk["result"] == "unknown" and not unk["ok"] and unk["units"] >= unk["limit_units"] == UNITS_PER_S // 2


def test_a_verdict_does_not_depend_on_the_calling_process():
    """Each obligation runs in a clean process: the same units spent, to the
    unit, after this process has built every obligation's terms.  A pool
    forked from this process fails it (z3 numbers its terms per process, and
    the search follows the numbering)."""
    names = "integrity.bind.k1,integrity.move.k1,integrity.unbind.k1,capacity.lemma.cdiv_galois"
    first = {r["name"]: r["units"] for r in cli.run_z3(names, jobs=2)}
    for ob in REG.values():
        ob.build()
    again = {r["name"]: r["units"] for r in cli.run_z3(names, jobs=2)}
    assert first == again and len(first) == 7  # the three k1 obligations, their bounded twins, the lemma


def test_a_mutants_verdict_does_not_depend_on_the_calling_process():
    """A mutant runs in a clean process too (``cli.run_fresh``): the same
    units spent after this process has run other refutations.  Run in this
    process, the second search spends a different count (a mutation test
    once ran out of budget in a long-lived worker this way)."""
    names = ["layout.float_region.n3", "inv.alloc_float_parked.order.n3"]
    patch = Patch(ARITH, "cdiv", arith.fdiv)
    first = [(r["result"], r["units"]) for r in cli.run_fresh(names, patch)]
    for n in names + ["capacity.end_up.sound.n2"]:
        run_obligation(REG[n])  # wear this process's z3 context
    again = [(r["result"], r["units"]) for r in cli.run_fresh(names, patch)]
    assert first == again and [r for r, _ in first] == ["counterexample"] * 2
    err = run_obligation(Obligation("t.err", "t", "broken encoding", lambda: 1 / 0))
    assert err["result"] == "error" and not err["ok"]


def test_cli_only_and_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = cli.main(["--only", "golden.up_gap.", "--no-crosshair", "--json", str(out), "--jobs", "1"])
    assert rc == 0
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["results"]]
    assert names and all(n.startswith("golden.") for n in names) and data["ok"]
    text = capsys.readouterr().out
    assert "golden.up_gap.n2" in text and "kvarena prove:" in text
    assert cli.main(["--only", "no.such.obligation", "--no-crosshair"]) == 2


def test_cli_list_shows_kind_and_source_and_only_takes_several_prefixes(tmp_path, capsys):
    assert cli.main(["--list"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(REG) and all(len(r) == 5 for r in rows)
    by_name = {r[0]: r for r in rows}
    for name, ob in REG.items():
        assert by_name[name][1:3] == [ob.kind, ob.source]
    assert all(by_name[n][2] == "spec" for n in REG if n.startswith("inv."))  # the transitions: the spec's own
    out = tmp_path / "p.json"
    assert (
        cli.main(["--only", "dead.golden_clamp.n2,inv.init.n2", "--no-crosshair", "--json", str(out), "--jobs", "1"])
        == 0
    )
    names = [r["name"] for r in json.loads(out.read_text())["results"]]
    assert names == ["inv.init.n2", "dead.golden_clamp.n2"]


def _no_gap(*args):
    return 0


def test_cli_exits_nonzero_on_failure(monkeypatch, capsys):
    # a wrong closed form, in the solver processes the command starts
    wrong = Patch(ARITH, "golden_gap", _no_gap)
    monkeypatch.setattr(cli, "run_z3", lambda only, jobs, cache: cli.run_fresh(cli.selected(only), wrong, jobs, cache))
    assert cli.main(["--only", "golden.up_gap.n2", "--no-crosshair", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "counterexample" in out and "1 failed" in out


def test_runner_reports_tautologies():
    """A goal valid with no hypotheses fails the obligation unless declared
    (``tautology="any"``); a conjunct valid alone fails only ``"none"``."""
    x, y = z3.Ints("x y")
    taut = Obligation("t.taut", "t", "x + y - y == x", lambda: Built([x > 0], x + y - y == x))
    r = run_obligation(taut)
    assert r["result"] == "proved" and r["vacuity"] == "sat" and r["tautology"] == "goal" and not r["ok"]
    ok = run_obligation(Obligation("t.lemma", "t", "lemma", taut.build, tautology="any"))
    assert ok["tautology"] == "goal" and ok["ok"]
    part = lambda: Built([x > 0], z3.And(x > -1, z3.Or(y <= y, x == x)))  # noqa: E731
    r = run_obligation(Obligation("t.conj", "t", "a conjunct holds alone", part))
    assert r["tautology"] == "conjuncts" and r["tautological_conjuncts"] and r["ok"]
    r = run_obligation(Obligation("t.conj0", "t", "no conjunct may hold alone", part, tautology="none"))
    assert r["tautology"] == "conjuncts" and not r["ok"]
    clean = run_obligation(Obligation("t.clean", "t", "needs its hypothesis", lambda: Built([x > 0], x > -1)))
    assert clean["tautology"] == "none" and clean["ok"]
    assert (
        run_obligation(Obligation("t.ref", "t", "refuted", lambda: Built([x > 0], x > 1), expect="counterexample"))[
            "tautology"
        ]
        == "n/a"
    )


def _telescoping(s):
    """The conservation sum before this issue: gap + (high - low) per opaque band."""
    from kvarena.proofs import abstract as A

    prev = covered = s.sink
    for i in range(s.n):
        o = A.opaque(s, i)
        covered = arith.ite(o, covered + (A.low_f(s, i) - prev) + (A.high_f(s, i) - A.low_f(s, i)), covered)
        prev = arith.ite(o, A.high_f(s, i), prev)
    return covered + (s.total - prev)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_conservation_goal_is_not_a_tautology(n):
    """docs/design.md §7: conservation must be able to fail.  With no
    hypotheses at all z3 finds a state that breaks verify()'s byte equation
    (and the whole invariant); the old telescoping sum held for every state."""
    from kvarena.proofs import abstract as A
    from kvarena.proofs.core import Budget, Fresh, _check, tautology_check

    s = A.symbolic_state(Fresh(), "t_", n=n)
    r, model, _ = _check([z3.Not(A.cons_bytes(s))], Budget(2))
    assert r == z3.sat and model is not None  # a counterexample state
    assert _check([z3.Not(A.inv_cons(s))], Budget(2))[0] == z3.sat
    assert tautology_check([A.inv_cons(s)]) == ("none", [])
    # teeth: the old sum is valid alone, and the check says so
    assert _check([z3.Not(_telescoping(s) == s.total)], Budget(2))[0] == z3.unsat
    assert tautology_check([z3.And(A.inv_cons(s), _telescoping(s) == s.total)])[0] == "conjuncts"


# ---------------------------------------------------------------- mutation
#
# Each mutant runs in fresh solver processes (``cli.run_fresh``), the patch
# applied there: a refutation's cost depends on the terms a process built
# before, and a worker of a parallel run searched mutants past their budget
# where a fresh process refutes them in seconds (docs/proofs.md, "Budgets
# are deterministic").  The mutants are module-level functions, which those
# processes import by name.


def test_mutation_ceil_to_floor_in_float_region(results):
    """The float region's low edge rounded down (anchor bug 1) breaks the proofs."""
    assert results["layout.float_region.n3"]["result"] == "proved"
    # 3 pools: with conservation's clamped byte equation among the hypotheses the
    # 4-pool counterexample takes z3 10+ s under load (the 3-pool one about 2 s)
    names = ["layout.float_region.n3", "inv.alloc_float_parked.order.n3"]
    assert refuted(names, Patch(ARITH, "cdiv", arith.fdiv)) == names
    assert arith.cdiv is not arith.fdiv  # the mutation stayed in those processes


def _end_available_ceil(gap, epp, room, holes):
    return arith.min_(arith.cdiv(gap, epp), room) + holes


def test_mutation_end_available_ceil(results):
    """Pricing an END's gap with ceil over-promises a page: capacity soundness fails."""
    assert refuted(["capacity.end_up.sound.n2"], Patch(ARITH, "end_available", _end_available_ceil)) == [
        "capacity.end_up.sound.n2"
    ]
    assert results["capacity.end_up.sound.n2"]["result"] == "proved"


def _min_page_floor(sink, epp):
    return arith.fdiv(sink, epp)


def test_mutation_ge_to_gt_in_min_page():
    """min_page one page too low (>= sink turned into > sink - epp): the sink is not covered."""
    assert refuted(["layout.sink_covers_page0.n2"], Patch(ARITH, "min_page", _min_page_floor)) == [
        "layout.sink_covers_page0.n2"
    ]


def _decision_without_both_short_guard(sides_low, sides_high, band_low, band_high, float_bytes, slack):
    from kvarena.spec import policy as spec_policy

    act, low, target = spec_policy.short_side_decision(sides_low, sides_high, band_low, band_high, float_bytes, slack)
    return arith.ite(sides_low > band_low, True, act), low, target


def test_mutation_policy_both_short_guard():
    """Dropping the both-sides-short guard from the decision breaks no_move_both_short."""
    names = ["policy.no_move_both_short", "policy.pure.no_move_both_short"]
    assert refuted(names, Patch(POLICY, "short_side_decision", _decision_without_both_short_guard)) == names


_REAL_ALLOC_END = A.rel_alloc_end  # taken at import, before any patch, in every process


def _alloc_up_one_page_too_far(s, t, i, n):
    # the mutant's post-state: the up END's watermark lands one page too far
    b = t.bands[i]
    shifted = t.with_band(i, A.BandState(b.lo, b.hi - 1, b.live, b.holes))
    return _REAL_ALLOC_END(s, shifted, i, n) if s.pools[i].grow == "up" else _REAL_ALLOC_END(s, t, i, n)


def test_mutation_frontier_off_by_one():
    """An alloc_up transition that extends one page too far is caught."""
    assert refuted(["inv.alloc_up.conservation.n2"], Patch(ABSTRACT, "rel_alloc_end", _alloc_up_one_page_too_far)) == [
        "inv.alloc_up.conservation.n2"
    ]


# ---------------------------------------------------------------- findings


def _ids_at(a, name, pages):
    v2p = a.v2p(name)
    return [v for v, p in enumerate(v2p) if v > 0 and p in set(pages)]


def test_finding_far_side_made_short():
    """policy.far_side_kept is refuted: a far END whose demand fit before the
    move no longer fits after it (the leapfrog packs the float against it)."""
    e = SubPool
    a = Arena(400, [e("up", 4, 1, "up"), e("f", 4, 1, "float"), e("down", 4, 1, "down")])
    a.alloc("up", 10)
    a.alloc("f", 2)
    a.alloc("down", 40)
    demand = {"up": 40, "down": 10}
    assert a.available_pages("up") >= demand["up"]  # the far (low) side is not short
    assert a.available_pages("down") < demand["down"]  # the high side is short
    moved = a.open_short_side("f", demand)
    a.verify()
    assert moved > 0
    assert a.available_pages("down") >= demand["down"]  # the short side got its room ...
    assert a.available_pages("up") < demand["up"]  # ... and the far side became short


def test_finding_float_short_holes_assumed_to_survive():
    """policy.float_short_fits_after is refuted: the float-only target counts
    the float's holes, but the move discards them; pages move in vain."""
    e = SubPool
    a = Arena(100, [e("up", 5, 1, "up"), e("f", 5, 1, "float"), e("down", 5, 1, "down")])
    a.alloc("up", 8)
    a.alloc("down", 6)
    a.alloc("f", 4)
    assert a.frontiers("f") == (45, 65)
    a.free("f", _ids_at(a, "f", [9, 11, 12]))
    assert a.live_pages("f") == 1 and len(a.holes("f")) == 3
    assert a.available_pages("f") < 6
    moved = a.open_short_side("f", {"f": 6})
    a.verify()
    assert moved == 1
    assert a.holes("f") == []  # the holes the target counted on are gone
    assert a.available_pages("f") < 6  # and the demand still does not fit


def test_finding_far_float_moves_in_vain():
    """policy.short_side_fits_after.n4_far_float is refuted: with an opaque
    float between, opening the far float's low side cannot help the up END."""
    e = SubPool
    a = Arena(400, [e("up", 4, 1, "up"), e("f1", 4, 1, "float"), e("f2", 4, 1, "float"), e("down", 4, 1, "down")])
    a.alloc("up", 10)
    a.alloc("down", 10)
    a.alloc("f1", 75)
    a.free("f1", [v for v in _ids_at(a, "f1", range(100)) if a.v2p("f1")[v] not in (16, 17)])
    a.flush("f1")
    assert a.frontiers("f1") == (64, 72)
    a.alloc("f2", 1)
    before = a.available_pages("up")
    assert before < 36
    moved = a.open_short_side("f2", {"up": 36})
    a.verify()
    assert moved == 1
    assert a.available_pages("up") == before  # nothing gained for the END that asked


def test_finding_conservation_does_not_localize_drift():
    """inv.conservation.bytes_localize_drift is refuted: verify()'s byte
    equation catches one drifted band (single_drift_detected, proved) but
    not two drifts that cancel in bytes.  Replayed on the real spec."""
    from kvarena.spec import AccountingError

    e = SubPool
    a = Arena(400, [e("u", 4, 1, "up"), e("d", 4, 1, "down")])
    a.alloc("u", 5)
    a.alloc("d", 5)
    a.verify()
    opaque = list(a.chain)
    a.bands["u"].hi += 1  # one page too many in u's span ...
    with pytest.raises(AccountingError, match="conservation"):
        a._conservation(opaque)  # a single drift is caught
    a.bands["d"].lo += 1  # ... and one too few in d's: the bytes cancel
    a._conservation(opaque)  # not caught by the byte equation
    spans = [a.bands[n].hi - a.bands[n].lo - a.bands[n].live - len(a.bands[n].holes) for n in opaque]
    assert spans == [1, -1]
    with pytest.raises(AccountingError, match="outside span"):
        a.verify()  # here another per-band rule of verify() catches it; not proved in general


def test_anchor_bug_raw_bytes_overpromise_example():
    """capacity.float.raw_bytes_overpromise, concretely: off-grid frontiers."""
    below, above, epp = 5, 11, 3
    lo, hi = arith.float_region(below, above, epp, 1, 100)
    assert (above - below) // epp == 2 and hi - lo == 1
    assert lo * epp >= below and hi * epp <= above


# ------------------------------------------------- source-level mutations


def test_source_mutation_gt_to_ge_in_policy():
    """``float_bytes > max_(...)`` turned into ``>=`` in spec/policy.py: the policy
    then acts when nothing is short and asks make_room for what the band has."""
    patch = SourcePatch(
        "kvarena.spec.policy",
        "float_short = float_bytes > max_(",
        "float_short = float_bytes >= max_(",
        POLICY,
        "short_side_decision",
    )
    assert refuted(["policy.pure.target_beyond_band"], patch) == ["policy.pure.target_beyond_band"]


def test_source_mutation_floor_to_ceil_in_end_available():
    """``fdiv(gap, epp)`` turned into ``cdiv(gap, epp)`` in spec/arith.py."""
    patch = SourcePatch(
        ARITH,
        "return min_(fdiv(gap, epp), index_room) + holes",
        "return min_(cdiv(gap, epp), index_room) + holes",
        ARITH,
        "end_available",
    )
    assert refuted(["capacity.end_down.sound.n2"], patch) == ["capacity.end_down.sound.n2"]


FIRST_PAGES_FLOOR = ("page = max_(cdiv(high, epp), m)", "page = max_(fdiv(high, epp), m)")


def test_source_mutation_first_pages_raw_bytes(results):
    """``cdiv(high, epp)`` turned into ``fdiv`` in ``arith.first_pages``: a
    float's first page may then overlap the page below it, the layout check
    accepts a float that can never allocate, and every_pool_allocates fails."""
    assert results["layout.every_pool_allocates.n3"]["result"] == "proved"
    assert refuted(
        ["layout.every_pool_allocates.n3"], SourcePatch(ARITH, *FIRST_PAGES_FLOOR, ARITH, "first_pages")
    ) == ["layout.every_pool_allocates.n3"]
    # the design's example (docs/design.md §3), concretely: the mutant accepts F, whose region is empty
    m = mutant_module(arith, *FIRST_PAGES_FLOOR)
    grids = [(10, 8, 4), (33, 2, 1), (10, 8, 4)]
    assert all(f for _, f in m.first_pages(grids)) and not all(f for _, f in arith.first_pages(grids))


def _first_pages_unpacked(grids):
    return [(0, True) for _ in grids]


def test_mutation_first_pages_dropped():
    """Without the packing (only a page above the sink for everyone) a pool
    may never allocate: the obligation needs the first_pages hypotheses."""
    names = ["layout.every_pool_allocates.n2", "layout.every_pool_allocates.n3"]
    assert refuted(names, Patch(ARITH, "first_pages", _first_pages_unpacked)) == names


def test_source_mutation_region_ceil_to_floor():
    """``cdiv(below, epp)`` turned into ``fdiv`` in float_region (anchor bug 1)."""
    patch = SourcePatch(
        ARITH, "lo = max_(cdiv(below, epp), lowest)", "lo = max_(fdiv(below, epp), lowest)", ARITH, "float_region"
    )
    assert refuted(["capacity.float.sound.n3"], patch) == ["capacity.float.sound.n3"]


def test_readme_proof_table_matches_the_registry():
    """docs/guides/verifying.md's table of obligations by kind and source is the registry's."""
    import collections
    import re

    text = (ROOT / "docs" / "guides" / "verifying.md").read_text()
    row = re.search(
        r"\| \*\*all (\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|",
        text,
    )
    assert row, "docs/guides/verifying.md's proof table has no totals row"
    assert all(ob.source == "spec" for ob in REG.values() if ob.kind != "demo"), "a goal not on the spec's code"
    c = collections.Counter(ob.kind for ob in REG.values())
    want = [len(REG), c["property"], c["lemma"], c["finding"], c["demo"]]
    assert [int(x) for x in row.groups()] == want
    assert f"z3: {len(REG)} named obligations" in text


def test_finding_cost_guard_bounds_spared_holes_by_the_cleared_pages():
    """z3's counterexample to the first ``policy.cost_bound`` over
    ``transitions.make_room_moved``: with the guard ``spared <= holes`` only,
    a boundary make_room could "spare" more holes than the ``need`` pages it
    clears and move a negative number of pages.  The guard now bounds
    ``spared`` by ``min(holes, need)``; this is that state."""
    from kvarena.proofs import policy as P
    from kvarena.spec import chain as C
    from kvarena.spec import transitions as T

    s = C.Chain(
        480,
        10,
        (C.Shape("up", 4, 120, 3, True), C.Shape("float", 6, 80, 2, False), C.Shape("down", 10, 48, 1, False)),
        (C.Counts(3, 7, 3, 1), C.Counts(9, 16, 3, 4), C.Counts(12, 48, 36, 0)),
    )
    skip, act, low, target, _ = P.decision(s, 1, [7, 5, 2])
    assert not skip and act and not T.make_room_leaps(s, 1, low, target)
    _, _, need = C.make_room_terms(s, 1, low, target)
    assert need == 2 < s.bands[1].holes == 4
    assert T.make_room_moved(s, 1, low, target, 3) == -1  # 3 spared holes among 2 cleared pages: impossible
    assert not T.make_room_moved_ok(s, 1, low, target, 3)
    assert T.make_room_moved_ok(s, 1, low, target, 2) and T.make_room_moved(s, 1, low, target, 2) == 0
