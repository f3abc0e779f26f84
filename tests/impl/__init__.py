"""Tests of ``kvarena.impl`` alone: bytes through every relocation, the memo, host syncs, devices, and what
only the torch composites have (page copies, the trusted path).
"""
