"""kvarena.proofs: z3 obligations and CrossHair runs over ``kvarena.spec``.

- ``abstract``    the abstract arena (frontiers and counts), over the spec's shim;
- ``core``        obligations, the registry, the z3 runner;
- ``cache``       the proof cache: verdicts keyed by each obligation's SMT-LIB text;
- ``obligations`` the registry with every group loaded;
- ``layout``, ``golden``, ``invariants``, ``capacity``, ``policy``, ``composites``, ``integrity``,
  ``views``, ``planner``, ``inflight``: the obligations;
- ``crosshair_runs``  ``crosshair check`` / ``diffbehavior`` runs;
- ``inflight_plans``  the non-urgent flush's walk, a CrossHair harness (list code z3 does not run);
- ``cli``         ``kvarena prove``.

Every obligation runs the spec's own code on z3 terms; nothing here models
the spec a second time.

May import: ``kvarena.spec``.
"""
