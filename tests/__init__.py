"""The test suite, one folder per unit (docs/guides/verifying.md "The test suite" has the table).

Shared helpers are in ``tests/support.py``; run settings in ``tests/conftest.py``.
"""
