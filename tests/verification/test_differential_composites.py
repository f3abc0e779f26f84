"""Differential fuzzing of the composites: the spec and impl twins driven by
one scheduler (``kvarena.verification.differential_composites``).  ``KVARENA_PROFILE=long``
runs thousands of examples."""

import os

import pytest

from kvarena.verification.differential_composites import CASES, HOLDS, IN_FLIGHT, required, run_machine

# Seeded in the CI profile, as tests/verification/test_differential.py.
SEEDED = {"derandomize": True, "database": None} if os.environ.get("KVARENA_PROFILE", "ci") == "ci" else {}


def test_composites_differential(device):  # conftest: cpu, and cuda where present
    """The twins agree on every step, and the run reaches every event the
    issue names: window-slide frees, joint-view exhaustion, state starvation
    relieved without eviction, and each composite; and every in-flight rule
    (launches, a refused one, settles, ``flush_opportunistic`` moving pages
    while a forward runs); and HiCache's move gate closed, opened and
    refused, with relief run under it.  Each is reached by an explicit
    example (``EXAMPLES``), whatever Hypothesis draws (test_coverage_seeds.py)."""
    CASES.clear()
    run_machine(device, **SEEDED)
    print("composite cases:", dict(CASES))
    missing = [c for c in required(device) + IN_FLIGHT + HOLDS if CASES[c] == 0]
    assert not missing, f"cases never reached: {missing}; counts {dict(CASES)}"


@pytest.mark.mutation
def test_verify_fuzz_part_reports_rows():
    """The composite rows ``kvarena verify`` prints: one per device, passing
    here (a short derandomized run; a disagreement fails it)."""
    from kvarena.verification.differential_composites import run_differential

    rows = run_differential(examples=15, steps=20)
    assert rows[0]["name"] == "composites impl vs spec on cpu"
    assert all(set(r) == {"name", "ok", "detail", "seconds"} for r in rows)
    assert all(r["ok"] or "never reached" in r["detail"] for r in rows), rows
