"""The spec composites' own contracts (docs/design.md §6): the behaviour both
packages share is in ``tests/api/test_composites.py``, which runs every test
on the spec plain and under ``spec.contracts.checking()``; this checks that
the checking really covers the composites' methods."""

import pytest

from kvarena.spec import TriPool, composites, contracts

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def test_contract_wrapping_is_live():
    """Plain, the composites' methods are bare; under ``checking()`` their
    contracts are evaluated: a planted wrong answer from ``available_size``
    is caught there.  Outside the block the bare methods are back."""
    c = TriPool(16 * 8 * 40, 8, 8, 16 * 8, 16)
    assert not hasattr(type(c).available_size, "__wrapped_contract__")
    with contracts.checking():
        assert hasattr(type(c).available_size, "__wrapped_contract__")
        orig = composites._Composite._joint_pages
        composites._Composite._joint_pages = lambda self, arena: orig(self, arena) + 1
        try:
            with pytest.raises(contracts.ContractError, match="available_size"):
                c.available_size()
        finally:
            composites._Composite._joint_pages = orig
    assert not hasattr(type(c).available_size, "__wrapped_contract__")
