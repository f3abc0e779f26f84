"""``kvarena policies``: the anchor policy against the planner on the same traces."""

from kvarena import cli
from kvarena.sim import policies
from kvarena.spec import planner


def test_planner_never_evicts_with_room_present():
    totals = policies.compare(traces=4, steps=150, seed=1)
    a, p = totals["anchor"], totals["planner"]
    assert a["allocs"] == p["allocs"] > 0  # the same operations
    assert p["false_oom"] == 0
    assert p["shortfalls"] > 0 and a["shortfalls"] > 0  # the traces do run short
    for t in totals.values():
        assert t["moved_per_relief"] == round(t["pages_moved"] / max(1, t["shortfalls"]), 3)


def test_false_oom_is_counted(monkeypatch):
    """Plant a planner that never finds a placement: its false OOMs must show
    (the judge, ``_placeable``, keeps the real decision)."""
    real = planner.plan_chain
    judge = policies._placeable

    def never(up, floats, down):
        return real(up, floats, down)._replace(feasible=False, moves=[False] * len(floats))

    def honest_judge(a, name, n):
        with monkeypatch.context() as m:
            m.setattr(planner, "plan_chain", real)
            return judge(a, name, n)

    monkeypatch.setattr(planner, "plan_chain", never)
    monkeypatch.setattr(policies, "_placeable", honest_judge)
    assert policies.compare(traces=4, steps=150, seed=1)["planner"]["false_oom"] > 0


def test_cli_prints_the_table(capsys):
    assert cli.main(["policies", "--traces", "2", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "false OOM" in out and "planner" in out
