"""``static-best`` where memory never binds (issue 42, item 4): with no
split that memory binds and that serves the trace, no split is best, so
the report names none instead of printing an arbitrary split as the best."""

import pytest

from kvarena.sim import engine, presets, simulate, traces

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread, as the commands use


def test_no_split_is_named_best_where_memory_never_binds():
    s = presets.Sizes.of(presets.preset("gpt-oss-120b"), 40.0)  # a large buffer for a few short requests
    trace = traces.generate("short", 12, seed=0)
    cfg = engine.Config(record=False)
    best, _, _ = simulate.best_static(s, trace, cfg)
    default, _ = simulate._static(s, trace, cfg, 0.8, 0.5, "static-default")
    assert not simulate._bound(default) and default.rejected == 0  # memory binds no split here
    assert best.split["unbound"] is True and best.rejected == 0 and best.stuck == 0
    assert best.mean_concurrency_all == default.mean_concurrency_all  # one that serves it, as any does
    label = simulate._split_label(best.split)
    assert label.startswith("none: memory never binds") and "swa" not in label
    table = simulate.table(simulate.aggregate([{"seed": 0, "setups": {"static-best": best.numbers()}, "ratios": {}}]))
    assert "| static-best | none: memory never binds" in table


def test_a_split_memory_binds_is_still_named():
    s = presets.Sizes.of(presets.preset("nemotron-h-8b"), 5.0)
    best, _, _ = simulate.best_static(s, traces.generate("balanced", 120, seed=7), engine.Config(record=False))
    assert "unbound" not in best.split and "none" not in simulate._split_label(best.split)
