"""kvarena: one byte buffer for every kind of per-request KV state.

``kvarena.spec`` is the executable specification, ``kvarena.impl`` the
torch implementation, ``kvarena.proofs`` the z3 and CrossHair obligations.
"""

__version__ = "0.1.0"
