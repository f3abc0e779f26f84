"""Shared helpers for the spec tests (import them: ``from conftest import ...``)."""

import contextlib
import json

from hypothesis import HealthCheck, settings

# CI runs on a loaded 2-core machine: a slow example is not a failure.  Every
# property still fails on a wrong answer; only wall-clock limits are lifted.
settings.register_profile("kvarena", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvarena")


def live_ids(a, name):
    """Virtual ids currently bound in ``name`` (the sink, id 0, excluded)."""
    return [v for v, p in enumerate(a.v2p(name)) if v > 0 and p >= 0]


def check_content(a):
    """The content model: every live id's bytes sit where ``v2p`` says."""
    for name in a.chain:
        content, v2p = a.content(name), a.v2p(name)
        for v in live_ids(a, name):
            assert content.get(v2p[v]) == v, f"{name}: id {v} at page {v2p[v]} holds {content.get(v2p[v])}"


def check_all(a):
    a.verify()
    check_content(a)
    json.dumps(a.snapshot())  # JSON-able


@contextlib.contextmanager
def unchanged(a):
    """Assert the block leaves ``a`` exactly as it found it."""
    before = a.snapshot()
    yield
    assert a.snapshot() == before
    a.verify()
