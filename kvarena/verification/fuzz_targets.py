"""The differential machines as Hypothesis tests, for HypoFuzz.

Beyond one machine, ``kvarena fuzz`` hands over to HypoFuzz, an existing
coverage-guided engine: every worker runs

    KVARENA_FUZZ_DB=/shared/kvarena-db hypothesis fuzz --no-dashboard -- kvarena/verification/fuzz_targets.py

(``pip install -e ".[fuzz]"``), and all of them share the Hypothesis example
database named by ``KVARENA_FUZZ_DB``: a directory on shared storage or
``redis://host:port/0``.  A failure one worker finds is stored there, and
``kvarena fuzz --db`` with the same database (or any later worker)
replays it first, shrinks it, and saves it as a vector.  Nothing here runs
in the test suite; ``kvarena/`` is not a test folder and this file is only
collected when named.

The spec's contracts are checked for the life of the fuzzing process, as in
``kvarena fuzz``.
"""

import os

from hypothesis import HealthCheck, settings

from kvarena.spec.contracts import checking
from kvarena.verification import differential, differential_composites, fuzz

_db = os.environ.get("KVARENA_FUZZ_DB")
settings.register_profile(
    "kvarena-fuzz", deadline=None, database=fuzz.open_database(_db) if _db else None, print_blob=True
)
settings.load_profile("kvarena-fuzz")
checking().__enter__()  # a fuzzing process checks the contracts until it exits


# HypoFuzz refuses a test that suppresses the nested-given check, so name
# only the checks a long stateful machine trips.
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.large_base_example]


def _target(module):
    opts = {**module.PROFILES["long"], **differential.COMMON, "suppress_health_check": HEALTH}
    return fuzz.hypofuzz_target(module, settings(**opts))


# TestCase classes, not test functions: HypoFuzz keys those by the machine
# class, as Hypothesis and ``kvarena fuzz`` do (``fuzz.hypofuzz_target``).
TestDifferentialArena = _target(differential)
TestDifferentialComposites = _target(differential_composites)
