"""The test suite, one folder per unit (README "Quick start" has the table).

Shared helpers are in ``tests/support.py``; run settings in ``tests/conftest.py``.
"""
