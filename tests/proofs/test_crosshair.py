"""CrossHair runs: smoke tests within a small budget, each able to fail."""

import inspect
import textwrap

import pytest

from kvarena.proofs import crosshair_runs as C
from kvarena.spec import arith, policy


def test_check_policy_contracts_hold():
    rs = C.check_module("kvarena.spec.policy", per_condition_s=1.0, wall_s=120)
    assert [r["name"] for r in rs] == ["crosshair.check.kvarena.spec.policy.short_side_decision"]
    assert all(r["ok"] and r["result"] in ("confirmed", "no_counterexample") for r in rs), rs


def test_check_reports_every_contracted_arith_function():
    rs = C.check_module("kvarena.spec.arith", per_condition_s=1.0, wall_s=120)
    names = {r["name"].rsplit(".", 1)[1] for r in rs}
    assert {
        "fdiv",
        "cdiv",
        "float_region",
        "end_available",
        "float_available",
        "park_start",
        "make_room_need",
        "num_pages",
        "min_page",
        "two_end_joint_pages",
        "two_end_fits",
        "two_end_gates",
        "two_end_uneven_fits",
    } <= names
    assert all(r["ok"] for r in rs), [r for r in rs if not r["ok"]]


def test_finding_annotations_keep_crosshair_on_ints():
    """Finding: without int/bool annotations CrossHair fed str arguments to the
    spec formulas and reported TypeErrors as counterexamples; the annotations
    (added to spec/arith.py and spec/policy.py) keep the search on ints."""
    for fn in (
        arith.fdiv,
        arith.cdiv,
        arith.float_region,
        arith.end_available,
        arith.float_available,
        arith.park_start,
        arith.make_room_need,
        arith.make_room_feasible,
        policy.short_side_decision,
        arith.two_end_joint_pages,
        arith.two_end_fits,
        arith.two_end_gates,
        arith.two_end_uneven_fits,
    ):
        params = inspect.signature(fn).parameters.values()
        assert all(p.annotation in (int, bool) for p in params), fn.__name__


def test_check_finds_a_broken_contract(tmp_path, monkeypatch):
    mod = tmp_path / "kv_broken_contract.py"
    mod.write_text(
        textwrap.dedent('''
        def floor_half(a: int) -> int:
            """
            pre: a >= 0
            post: __return__ * 2 == a
            """
            return a // 2
    ''')
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    rs = C.check_module("kv_broken_contract", per_condition_s=2.0, wall_s=60)
    assert len(rs) == 1 and rs[0]["result"] == "counterexample" and not rs[0]["ok"], rs


def test_diffbehavior_pair_agrees():
    if not C.impl_available():
        pytest.skip("kvarena.impl.capacity missing")
    r = C.diff_pair(
        "kvarena.spec.arith.float_region", "kvarena.impl.capacity.float_region", per_condition_s=2.0, wall_s=90
    )
    assert r["ok"] and r["result"] in ("confirmed", "no_counterexample"), r


def test_diffbehavior_two_end_joint_pages_agrees():
    """The HybridSWA closed form: spec (min of the convex cost's linear
    pieces) and impl (branch on the one-sided stretch) twins agree."""
    if not C.impl_available():
        pytest.skip("kvarena.impl.capacity missing")
    r = C.diff_pair(
        "kvarena.spec.arith.two_end_joint_pages",
        "kvarena.impl.capacity.two_end_joint_pages",
        per_condition_s=4.0,
        wall_s=90,
    )
    assert r["ok"] and r["result"] in ("confirmed", "no_counterexample"), r


def test_diffbehavior_two_end_uneven_fits_agrees():
    """The uneven HybridSWA gate: spec (``and_`` of the three bounds, z3-ready)
    and impl (plain ints) twins agree."""
    if not C.impl_available():
        pytest.skip("kvarena.impl.capacity missing")
    r = C.diff_pair(
        "kvarena.spec.arith.two_end_uneven_fits",
        "kvarena.impl.capacity.two_end_uneven_fits",
        per_condition_s=4.0,
        wall_s=90,
    )
    assert r["ok"] and r["result"] in ("confirmed", "no_counterexample"), r


def test_diffbehavior_finds_an_uneven_difference(tmp_path, monkeypatch):
    """A twin blind to swa's holes (the planted proof bug's twin) is caught."""
    mod = tmp_path / "kv_mutant_uneven.py"
    mod.write_text(
        textwrap.dedent("""
        def two_end_uneven_fits(pages_a: int, pages_b: int, gap: int, epp_a: int, holes_a: int, room_a: int,
                                epp_b: int, holes_b: int, room_b: int) -> bool:
            if gap < 0 or epp_a <= 0 or epp_b <= 0 or min(holes_a, room_a, holes_b, room_b) < 0:
                raise ValueError("sizes")
            m_a, m_b = max(0, pages_a - holes_a), max(0, pages_b)
            return m_a <= room_a and m_b <= room_b and m_a * epp_a + m_b * epp_b <= gap
    """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = C.diff_pair(
        "kvarena.spec.arith.two_end_uneven_fits",
        "kv_mutant_uneven.two_end_uneven_fits",
        per_condition_s=4.0,
        wall_s=90,
    )
    assert r["result"] == "counterexample" and not r["ok"], r


def test_diffbehavior_finds_a_two_end_difference(tmp_path, monkeypatch):
    """A twin that forgets b's holes in its room cap is caught."""
    mod = tmp_path / "kv_mutant_two_end.py"
    mod.write_text(
        textwrap.dedent("""
        from kvarena.impl.capacity import two_end_joint_pages as real

        def two_end_joint_pages(gap: int, epp_a: int, holes_a: int, room_a: int, epp_b: int, holes_b: int,
                                room_b: int) -> int:
            return min(real(gap, epp_a, holes_a, room_a, epp_b, holes_b, room_b), room_b)
    """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = C.diff_pair(
        "kvarena.spec.arith.two_end_joint_pages",
        "kv_mutant_two_end.two_end_joint_pages",
        per_condition_s=4.0,
        wall_s=90,
    )
    assert r["result"] == "counterexample" and not r["ok"], r


def test_diffbehavior_finds_a_difference(tmp_path, monkeypatch):
    """A floor where the spec has a ceiling (anchor bug 1) is caught."""
    mod = tmp_path / "kv_mutant_capacity.py"
    mod.write_text(
        textwrap.dedent("""
        def float_region(below: int, above: int, epp: int, lowest: int, num_pages: int):
            lo = max(below // epp, lowest)
            hi = min(above // epp, num_pages)
            return lo, hi
    """)
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = C.diff_pair(
        "kvarena.spec.arith.float_region", "kv_mutant_capacity.float_region", per_condition_s=3.0, wall_s=90
    )
    assert r["result"] == "counterexample" and not r["ok"], r


def test_diff_pairs_skip_only_when_impl_missing(monkeypatch):
    monkeypatch.setattr(C, "IMPL_MODULE", "kvarena.impl.no_such_module")
    r = C.diff_pair("kvarena.spec.arith.park_start", "kvarena.impl.no_such_module.park_start")
    assert r["result"] == "skipped" and "missing" in r["reason"]


def test_every_required_pair_is_listed():
    fns = {a.rsplit(".", 1)[1] for a, _ in C.DIFF_PAIRS}
    assert {
        "end_available",
        "float_available",
        "float_region",
        "park_start",
        "make_room_need",
        "make_room_feasible",
        "short_side_decision",
        "two_end_joint_pages",
        "two_end_uneven_fits",
        "swa_tail_pages",
    } == fns
    for a, b in C.DIFF_PAIRS:
        assert b.startswith(C.IMPL_MODULE + ".") and a.rsplit(".", 1)[1] == b.rsplit(".", 1)[1]


def test_the_contract_scan_parses_under_the_ast_lock():
    """``kvarena verify`` scans modules on two threads, and CPython 3.11's
    AST builder is not safe so (gh-106905: a clean-clone CI run failed with
    "AST constructor recursion depth mismatch").  The scan waits for
    ``AST_LOCK``: held here, it cannot finish; released, it does."""
    import threading

    done = []
    with C.AST_LOCK:
        t = threading.Thread(target=lambda: done.append(C._contracted_functions("kvarena.spec.arith")))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not done
    t.join(10)
    assert done and done[0][1]  # the contracted arith functions
