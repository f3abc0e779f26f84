"""Tests of ``kvarena.proofs``: every obligation proved or refuted as registered, non-vacuous and faithful to
the spec's code; the planted proof bugs; the CrossHair runs.
"""
