"""kvarena.proofs: z3 obligations and CrossHair runs over ``kvarena.spec``.

- ``abstract``    the abstract arena (frontiers and counts), over the spec's shim;
- ``core``        obligations, the registry, the z3 runner;
- ``obligations`` the registry with every group loaded;
- ``layout``, ``golden``, ``invariants``, ``capacity``, ``policy``, ``composites``: the obligations;
- ``crosshair_runs``  ``crosshair check`` / ``diffbehavior`` runs;
- ``cli``         ``kvarena prove``.
"""
