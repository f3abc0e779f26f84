"""The verification product: everything ``kvarena verify`` runs, bar the proofs.

- ``selfcheck``: the spec's contract-checked scenarios and seeded random walks;
- ``differential``, ``differential_composites``: the Hypothesis machines that
  drive the implementation and the spec side by side (arena, composites);
- ``inflight``: the in-flight forwards those machines launch, their bytes
  simulated on the implementation (docs/design.md §12);
- ``fuzz``, ``fuzz_targets``: those machines as a campaign over processes;
- ``soak``: one long life of a composite, implementation beside spec, with
  memory sampled (``kvarena fuzz --soak``);
- ``faults``: fault injection (the k-th torch operation of a call raises),
  for the fault sweeps and the machines' ``faulted`` rules;
- ``vectors``, ``vector_cases``: the conformance vectors, written by the spec
  and replayed on any target;
- ``planted``: named planted bugs and the suites that catch them;
- ``verify``: all of the above and the proofs, every check to completion (``kvarena verify``);
- ``command_line``: what the commands above share: options, the ``--device``
  check, the console they print on.

May import: ``kvarena.spec``, ``kvarena.impl``, ``kvarena.proofs``.
"""
