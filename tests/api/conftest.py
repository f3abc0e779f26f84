"""The package a behaviour test of ``tests/api`` runs on."""

import pytest

from kvarena import impl, spec
from kvarena.spec import contracts


@pytest.fixture(params=["spec", "spec-contracts", "impl"])
def pkg(request):
    """The package under test; ``spec-contracts`` checks every spec contract
    while the test runs."""
    if request.param == "spec-contracts":
        with contracts.checking():
            yield spec
    else:
        yield spec if request.param == "spec" else impl
