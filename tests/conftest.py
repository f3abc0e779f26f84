"""Test-run settings shared by every folder: the Hypothesis profile and the
``one_thread``, ``redis_url`` and ``proof_cache`` fixtures.  Helpers live in ``tests/support.py``."""

import pytest
from hypothesis import HealthCheck, settings

from kvarena.impl.kernels import interpret_without_cuda

# Triton's kernels run on CPU tensors under its interpreter, which Triton reads
# when it is first imported: before any test imports it (docs/design.md §14).
# A machine with CUDA compiles them.
interpret_without_cuda()

# CI runs on a loaded 2-core machine: a slow example is not a failure.  Every
# property still fails on a wrong answer; only wall-clock limits are lifted.
settings.register_profile("kvarena", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvarena")


@pytest.fixture(autouse=True, scope="session")
def proof_cache(tmp_path_factory):
    """The commands' default proof cache (``kvarena.proofs.cache``) in a
    folder of the test run's own, not the checkout's ``.kvarena-cache``."""
    from kvarena.proofs import cache

    mp = pytest.MonkeyPatch()
    mp.setenv(cache.ENV, str(tmp_path_factory.mktemp("proof-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors: one torch thread, as the commands use; restored after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def redis_url(tmp_path):
    """A Redis server of its own on the loopback address, the binary the
    ``[test]`` extra installs (``fuzz.redis_server``: no system package),
    stopped after the test; its URL and a client."""
    import redis

    from kvarena.verification import fuzz

    with fuzz.redis_server(tmp_path) as url:
        client = redis.Redis.from_url(url)
        try:
            yield url, client
        finally:
            client.close()
