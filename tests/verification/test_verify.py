"""``kvarena verify`` (``kvarena.verification.verify``): the budget is shared out and
kept, the summary says what ran, and a failure comes with a shrunk,
replayable reproduction.  The proofs' own runs are ``tests/test_proofs*.py``;
here they are budgeted, not re-proved."""

import json

from rich.console import Console

from kvarena import cli, impl
from kvarena.verification import command_line, fuzz, verify


def run(args, monkeypatch=None):
    console = Console(record=True, width=220)
    monkeypatch.setattr(command_line, "console", lambda: console)
    rc = cli.main(args)
    return rc, console.export_text()


def test_plan_shares_the_budget():
    p = verify.plan(180)
    assert p.walks == 20 and p.z3_s == 90 and p.crosshair_s == 27 and p.differential_examples == 60
    small = verify.plan(30)
    assert small.walks == 5 and small.z3_s == 15 and small.differential_examples == 10
    assert verify.plan(180, skip_proofs=True).z3_s == 0
    assert any("--skip-fuzz" in n for n in verify.plan(180, skip_fuzz=True).notes)


def test_crosshair_budget_scales_down_and_never_above_prove():
    cap, per, per_diff = verify.crosshair_budget(27, tasks=10, jobs=2)
    assert cap == 5.4 and per == 0.25 and per_diff == 0.5
    cap, per, per_diff = verify.crosshair_budget(10_000, tasks=10, jobs=2)
    assert (per, per_diff) == (2.0, 4.0)  # kvarena prove's budgets are the ceiling


def test_crosshair_pairs_only_when_the_share_holds_them():
    tasks, skipped = verify.crosshair_tasks(27, 2, ["a", "b"], [("x", "y")] * 8)
    assert [t[0] for t in tasks] == ["check", "check"] and len(skipped) == 8
    tasks, skipped = verify.crosshair_tasks(75, 2, ["a", "b"], [("x", "y")] * 8)
    assert len(tasks) == 10 and not skipped


def test_z3_stops_at_its_share():
    """A share too small for any obligation runs none and names them all."""
    rows, not_run = verify.z3_rows(0.0)
    assert len(rows) + len(not_run) > 100 and len(not_run) >= len(rows)


def test_a_crosshair_run_cut_off_by_its_cap_is_not_finished(monkeypatch):
    from kvarena.proofs import crosshair_runs as ch

    def capped(module, per_condition_s, wall_s):
        return [
            {
                "name": f"crosshair.check.{module}",
                "result": "error",
                "ok": False,
                "time_s": wall_s,
                "reason": f"crosshair run exceeded its {wall_s}s wall-clock cap",
            }
        ]

    def diff(f1, f2, per_condition_s, wall_s):
        return {
            "name": f"crosshair.diff.{f1}",
            "result": "counterexample",
            "ok": False,
            "time_s": 1.0,
            "reason": "Given (1,), returns 2 and 3",
        }

    monkeypatch.setattr(ch, "check_module", capped)
    monkeypatch.setattr(ch, "diff_pair", diff)
    rows, note = verify.crosshair_rows(200)  # a share that holds the diff pairs too
    checks = [r for r in rows if r["name"].startswith("crosshair.check")]
    assert checks and all(r["result"] == "not finished" and r["ok"] for r in checks)
    assert all(not r["ok"] for r in rows if r["name"].startswith("crosshair.diff"))  # a finding still fails
    assert "per condition" in note


def test_budgeted_run_prints_one_summary_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setattr(fuzz, "required_cases", lambda: ["exhaustion", "hybrid"])
    path = tmp_path / "v.json"
    rc, out = run(
        ["verify", "--budget", "12", "--skip-proofs", "--json", str(path), "--failures", str(tmp_path / "f")],
        monkeypatch,
    )
    assert rc == 0, out
    assert "kvarena verify: summary" in out and "coverage events seen" in out
    data = json.loads(path.read_text())
    s = data["summary"]
    assert s["budget_s"] == 12 and s["failures"] == []
    assert s["vectors"]["cases"] >= 100 and s["fuzz"]["differential_examples"] > 0
    assert s["coverage"]["exhaustion"] > 0
    assert {r["part"] for r in data["rows"]} >= {"self-checks", "vectors", "differential", "coverage"}


def test_an_unreached_coverage_event_fails_the_run(monkeypatch):
    monkeypatch.setattr(fuzz, "required_cases", lambda: ["exhaustion", "an event no machine has"])
    ran = {"part": "campaign", "name": "campaign on cpu", "ok": True, "seconds": 60.0, "detail": "(stand-in)"}
    monkeypatch.setattr(verify, "campaign_rows", lambda *a: ([ran], verify.Counter(), verify.Counter(), []))
    rc, out = run(
        ["verify", "--budget", "120", "--skip-proofs", "--skip-vectors", "--walks", "0", "--fuzz-examples", "2"],
        monkeypatch,
    )
    assert rc == 1 and "never reached" in out and "an event no machine has" in out


def test_coverage_is_judged_after_a_campaign_only():
    """Events missed when the budget left no campaign are reported, not failed;
    missed after a real campaign, they fail."""
    seen = verify.Counter(exhaustion=3)
    short = verify.coverage_row(seen, campaign_s=0, budget=180)
    assert short["ok"] and "not reached within this budget" in short["detail"]
    full = verify.coverage_row(seen, campaign_s=90, budget=180)
    assert not full["ok"] and "never reached" in full["detail"]


def test_a_failure_is_shrunk_saved_and_printed_as_a_reproduction(tmp_path, monkeypatch):
    real = impl.arena.Arena.gap_bytes
    monkeypatch.setattr(
        impl.arena.Arena, "gap_bytes", lambda self, name: real(self, name) + (1 if self.live_pages(name) >= 3 else 0)
    )
    path = tmp_path / "v.json"
    rc, out = run(
        [
            "verify",
            "--budget",
            "3",
            "--skip-proofs",
            "--skip-vectors",
            "--walks",
            "0",
            "--fuzz-examples",
            "10",
            "--json",
            str(path),
            "--failures",
            str(tmp_path / "f"),
        ],
        monkeypatch,
    )
    assert rc == 1 and "FAILURE" in out and "def test_fuzz_repro_" in out
    (f,) = [f for f in json.loads(path.read_text())["summary"]["failures"] if "vector" in f]
    assert f["machine"] == "core" and f["reproduces"] is True and "state = " in f["hypothesis"]


def test_cuda_without_a_device_is_refused_up_front(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for args in (
        ["verify", "--device", "cuda"],
        ["fuzz", "--device", "cuda"],
        ["vectors", "replay", "tests/vectors", "--device", "cuda"],
    ):
        rc, out = run(args, monkeypatch)
        assert rc == 2 and "no CUDA device" in out
