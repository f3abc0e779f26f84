"""tests/anchor/ drives sglang 0.5.23's own allocator classes.

The ``[test]`` extra brings what their import path needs; sglang itself must
go in with ``--no-deps`` (its own requirements pull a CUDA torch), which an
extra cannot say.  So, as ``kvarena conform`` does, the first test here runs
that one pip command when sglang is missing.  Where it cannot be installed
the tests fail with the command to run; they never skip.
"""

import pytest

from kvarena.anchor import loader


@pytest.fixture(scope="session", autouse=True)
def anchor_installed() -> None:
    loader.ensure_installed(allow_install=True, out=lambda line: print(f"\n{line}", flush=True))
