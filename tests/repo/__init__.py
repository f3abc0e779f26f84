"""Tests of the repository as a whole: ruff and mypy, who may import whom, the CLI registry and the README's
own code.
"""
