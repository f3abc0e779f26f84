"""The serving simulator and the benchmarks.

- ``presets``: model geometries and the engine's sizing formulas;
- ``traces``: request traces (synthetic and JSONL);
- ``backends``: the unified arena and the static splits behind one interface;
- ``padded``: vLLM v1's padded block pool, behind the same interface;
- ``engine``: the scheduler that drives a backend step by step;
- ``timing``: the scheduler's clock, a roofline on a named accelerator;
- ``stats``: figures over seeds, with their 95% intervals;
- ``simulate``: ``kvarena simulate``, the setups side by side;
- ``policies``: ``kvarena policies``, the anchor policy against the planner;
- ``bench``: ``kvarena bench``, costs measured as ratios in one run;
- ``plot``: the figures.

May import: ``kvarena.spec``, ``kvarena.impl``, ``kvarena.sglang`` and ``kvarena.anchor`` (bench: SGLang's own stack).
"""
