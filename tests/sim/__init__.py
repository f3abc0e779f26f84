"""Tests of ``kvarena.sim``: the simulator, the bench and the policy comparison, on behaviour only (no
timings).
"""
