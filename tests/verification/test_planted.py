"""``kvarena planted`` (``kvarena.verification.planted``): the named mutations still apply
to today's sources, a cheap subset is caught, and a mutation that no suite
catches is reported as missed (so the command can fail).  The full run is
``kvarena planted`` (docs/results/suite-strength.md)."""

import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from kvarena.verification import planted


def test_at_least_fifteen_named_mutations_with_the_anchor_bugs():
    names = [m.name for m in planted.MUTATIONS]
    assert len(names) >= 15 and len(set(names)) == len(names)
    bugs = {int(b) for m in planted.MUTATIONS for b in re.findall(r"anchor bug (\d+)", m.what)}
    assert {1, 2, 4, 5, 6, 7, 8, 9, 10} <= bugs  # 3 is about tests; every vector and test here can fail
    assert {m.file.split("/")[0] for m in planted.MUTATIONS} == {"spec", "impl"}


@pytest.mark.parametrize("m", planted.MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_applies_to_todays_sources(tmp_path, m):
    """Each edit's text occurs exactly once, so a refactor that moves it is
    noticed here rather than as a silent 'missed' in the full run."""
    planted.mutated_copy(m, tmp_path)
    top, _, rest = m.file.partition("/")
    text = (tmp_path / planted.PACKAGES[top] / rest).read_text()
    assert all(new in text for _, new in m.edits)


def test_a_mutation_that_no_longer_matches_is_an_error(tmp_path):
    m = planted.Mutation("stale", "", "impl/arena.py", [("text that is not there", "x")])
    o = planted.run_mutation(m, suites=("vectors",))
    assert not o.caught and "occurs 0 times" in o.error


def test_cheap_subset_is_caught():
    """Two real mutations, vectors only: what CI runs of the full command."""
    for name in ("move-src-dst-swapped", "holes-not-credited"):
        o = planted.run_mutation(planted.by_name(name), suites=("vectors",))
        assert o.caught and o.caught_by == ["vectors"], (name, o)


def test_a_mutation_no_suite_catches_is_reported_missed(monkeypatch):
    """A planted no-op (it edits a comment) must come back as missed, and the
    command must then fail."""
    noop = planted.Mutation(
        "noop",
        "changes a comment only",
        "impl/capacity.py",
        [("# -(-a // b): exact ceiling", "# -(-a // b): the exact ceiling")],
        unit=("tests/impl/test_memo.py",),
    )
    o = planted.run_mutation(noop, suites=("vectors", "unit"))
    assert not o.caught and o.missed_by == ["vectors", "unit"] and not o.error
    assert " passed" in o.details["unit"]["detail"]  # the unit suite really ran the tests
    monkeypatch.setattr(planted, "MUTATIONS", [noop])
    monkeypatch.setattr(planted, "run_all", lambda ms, first=True, progress=None: [o])
    monkeypatch.setattr(planted, "check_baseline", lambda: o)
    console = Console(record=True, width=200)
    args = SimpleNamespace(only=None, list=False, json=None)
    assert planted.main(args, console) == 1
    assert "1 missed (noop)" in console.export_text()


def test_a_suite_that_fails_unmutated_stops_the_run(tmp_path):
    """The baseline: with one vector made wrong, the vectors suite fails on
    the unmutated package, and the run refuses to report catches."""
    import shutil

    from kvarena.verification import vectors

    shutil.copytree(vectors.default_dir(), tmp_path / "v")
    case = vectors.load_cases(tmp_path / "v")[0]
    case["post"]["data_follows"] = not case["post"]["data_follows"]
    vectors.case_path(tmp_path / "v", case["name"]).write_text(vectors.dump(case))
    with pytest.raises(ValueError, match="fail without any mutation"):
        planted.check_baseline(suites=("vectors",), vectors_dir=tmp_path / "v")


# Host transfers (docs/design.md §13): each hold plant, applied in this process to the one
# member of the implementation's Arena it edits, is caught by the differential machine in a
# few examples.  The memo plant needs a gate flip while a neighbour's holes are credited,
# which the CI profile meets (100 examples in): tests/impl/test_hold.py meets it at once.
HOLD_SITES = {
    "hold-flush-moves": "flush",
    "hold-plan-moves": "plan_floats",
    "hold-reserve-uncounted": "reserve",
    "hold-schedulable-credits": "_FRESH",  # the views' table holds the function itself
}
# Caught by the unit tests, whose held flush of each END finds holes behind live pages at
# once; the seeded machine meets a held flush of the up END with such holes only now and then.
UNIT_ONLY = {"hold-gate-around-the-memo", "hold-ignored-on-the-up-end"}


def test_every_hold_plant_has_a_site_or_is_caught_by_the_unit_tests():
    assert set(HOLD_SITES) | UNIT_ONLY == {m.name for m in planted.HOLD_PLANTS}


@pytest.mark.parametrize("name", sorted(HOLD_SITES))
def test_the_differential_machine_catches_each_hold_plant(monkeypatch, name):
    import kvarena.impl.arena as real
    from kvarena.verification import differential
    from tests.support import mutant_module

    ((old, new),) = planted.by_name(name).edits
    mutant = mutant_module(real, old, new)
    monkeypatch.setattr(real.Arena, HOLD_SITES[name], getattr(mutant.Arena, HOLD_SITES[name]))
    with pytest.raises(AssertionError):
        differential.run_machine("cpu", derandomize=True, database=None, max_examples=20)


@pytest.mark.parametrize("name", ["hold-flush-moves", "hold-reserve-uncounted", "hold-ignored-on-the-up-end"])
def test_the_unit_tests_catch_a_flush_that_ignores_the_hold_and_an_uncounted_reservation(name):
    o = planted.run_mutation(planted.by_name(name), suites=("unit",))
    assert o.caught and o.caught_by == ["unit"], o


@pytest.mark.parametrize("name", ["hold-flush-moves", "hold-reserve-uncounted", "hold-schedulable-credits"])
def test_the_shipped_vectors_catch_a_hold_plant(name):
    """The vectors record HiCache's holds (issue 52): the shipped set alone
    catches a held flush that moves, an uncounted reservation and a held
    view that keeps its credit."""
    o = planted.run_mutation(planted.by_name(name), suites=("vectors",))
    assert o.caught and o.caught_by == ["vectors"], o
