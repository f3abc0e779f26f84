"""tests/sglang/ builds SGLang's own unified-memory stacks (sglang 0.5.23).

sglang goes in with ``--no-deps`` on first use, as in ``tests/anchor/``, and
here before collection: the test modules import kvarena's drop-in, which
subclasses SGLang's classes.  Where it cannot be installed the tests fail
with the command to run.  Each test starts with SGLang's factories restored
and the runtime context (CPU, one rank) published.
"""

import pytest

from kvarena.anchor import loader

loader.ensure_installed(allow_install=True, out=lambda line: print(f"\n{line}", flush=True))


@pytest.fixture(autouse=True)
def sglang_context():
    from kvarena import sglang as ks
    from kvarena.sglang import stacks

    stacks.runtime_context()
    ks.uninstall()
    yield
    ks.uninstall()
