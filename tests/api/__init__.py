"""Behaviour the two packages share, written once and run on ``kvarena.spec`` and ``kvarena.impl`` alike
(parametrised over the package, or over its ``Arena``).
"""
