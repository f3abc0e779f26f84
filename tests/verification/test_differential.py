"""Differential fuzzing: the torch implementation against the executable spec.

The machine itself lives in ``kvarena.verification.differential`` so that ``kvarena
verify`` runs it too.  Profiles: the default is sized for CI;
``KVARENA_PROFILE=long`` runs thousands of examples.
"""

import os

import pytest

from kvarena.verification.differential import CASES, REQUIRED, run_differential, run_machine

# The CI profile runs seeded (the same examples every run; ``kvarena verify``
# and ``kvarena fuzz`` draw fresh ones); the long profile draws its own.
SEEDED = {"derandomize": True, "database": None} if os.environ.get("KVARENA_PROFILE", "ci") == "ci" else {}


def test_differential(device):  # conftest: cpu, and cuda where present
    """The machine agrees with the spec on every step, and the run reaches
    every interesting case at least once."""
    CASES.clear()
    run_machine(device, **SEEDED)
    print("differential cases:", dict(CASES))
    missing = [c for c in REQUIRED if CASES[c] == 0]
    assert not missing, f"cases never reached: {missing}; counts {dict(CASES)}"


@pytest.mark.mutation
def test_verify_fuzz_part_reports_rows():
    """The rows ``kvarena verify`` prints: one per device, passing here."""
    rows = run_differential(examples=15, steps=20)
    assert rows[0]["name"] == "differential impl vs spec on cpu"
    assert all(set(r) == {"name", "ok", "detail", "seconds"} for r in rows)
    # 15 short runs need not reach every case; a disagreement would show here
    assert all(r["ok"] or "never reached" in r["detail"] for r in rows), rows
