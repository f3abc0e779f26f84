"""Tests of ``kvarena.verification``: the differential machines, fuzz campaigns, vectors, planted bugs,
the self-checks and ``kvarena verify``.
"""
