"""kvarena: one byte buffer for every kind of per-request KV state.

The three parts, one API between them (their folders are ``spec/``,
``impl/`` and ``proofs/`` at the top of the repository):

- ``kvarena.spec``: the executable specification, the reference;
- ``kvarena.impl``: the torch implementation, tested against the spec;
- ``kvarena.proofs``: z3 obligations and CrossHair runs about the spec.

The tooling, one folder per job: ``kvarena.verification`` (what ``kvarena
verify`` runs), ``kvarena.sim`` (the simulator and the benchmarks),
``kvarena.anchor`` (conformance with SGLang's own allocator), and
``kvarena.cli``, the ``kvarena`` command, which is the top: nothing imports it.

May import: every package above (the CLI dispatches to them).
"""

__version__ = "0.1.0"
