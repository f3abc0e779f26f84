"""Differential fuzzing: the torch implementation against the executable spec.

The machine itself lives in ``kvarena.verification.differential`` so that ``kvarena
verify`` runs it too.  Profiles: the default is sized for CI;
``KVARENA_PROFILE=long`` runs thousands of examples.
"""

import importlib
import os
import sys

import pytest

from kvarena.verification.differential import (
    CASES,
    HOLDS,
    IN_FLIGHT,
    REQUIRED,
    kernel_events,
    run_differential,
    run_machine,
)

# The CI profile runs seeded (the same examples every run; ``kvarena verify``
# and ``kvarena fuzz`` draw fresh ones); the long profile draws its own.
SEEDED = {"derandomize": True, "database": None} if os.environ.get("KVARENA_PROFILE", "ci") == "ci" else {}


def test_differential(device):  # conftest: cpu, and cuda where present
    """The machine agrees with the spec on every step, and the run reaches
    every interesting case at least once, and every in-flight rule (a
    launch, one while in flight, a refused one, a settle, a non-urgent flush
    that moves pages while a forward runs), and every host-transfer rule
    (the gate closed and opened, loads reserved, bound and cancelled, a
    hold refused, bad input, and flushes, relief, slides and plans, and a
    forward, while moves are held).  Each is reached by an explicit example
    (``EXAMPLES``), whatever Hypothesis draws (test_coverage_seeds.py)."""
    CASES.clear()
    run_machine(device, **SEEDED)
    print("differential cases:", dict(CASES))
    missing = [c for c in REQUIRED + IN_FLIGHT + HOLDS + kernel_events(device) if CASES[c] == 0]
    assert not missing, f"cases never reached: {missing}; counts {dict(CASES)}"


def test_a_pinned_run_draws_the_same_whatever_else_is_imported(tmp_path, monkeypatch):
    """Hypothesis draws some values from the literals of the local modules
    imported so far; a derandomized run must not (``same_draws``).  The
    required cases above were once reached or missed by what pytest-xdist
    had collected beside this file: the same seed, other examples."""

    def counts():
        CASES.clear()
        run_machine("cpu", derandomize=True, database=None, max_examples=6, stateful_step_count=20)
        return dict(CASES)

    before = counts()
    # a local module full of integer literals, as any module another test imports
    literals = ", ".join(map(str, range(2, 600, 3)))
    (tmp_path / "kvarena_literals_probe.py").write_text(f"X = [{literals}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("kvarena_literals_probe")
    try:
        assert counts() == before
    finally:
        del sys.modules["kvarena_literals_probe"]  # later unpinned draws in this worker must not see it


@pytest.mark.mutation
def test_verify_fuzz_part_reports_rows():
    """The rows ``kvarena verify`` prints: one per device, passing here."""
    rows = run_differential(examples=15, steps=20)
    assert rows[0]["name"] == "differential impl vs spec on cpu"
    assert all(set(r) == {"name", "ok", "detail", "seconds"} for r in rows)
    # 15 short runs need not reach every case; a disagreement would show here
    assert all(r["ok"] or "never reached" in r["detail"] for r in rows), rows
