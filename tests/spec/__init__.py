"""Tests of ``kvarena.spec`` alone: every behaviour and ``ValueError``, the state machine, the formulas against
brute-force oracles, the run-time contract checker.
"""
