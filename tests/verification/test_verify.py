"""``kvarena verify`` (``kvarena.verification.verify``): with no flags every
part runs to completion; under ``--budget`` each part stops at its share,
and what did not run is listed with exit status 3; a failure exits 1 with a
shrunk, replayable reproduction.  The proofs' own runs are
``tests/proofs/``; here the parts are run small or stood in for."""

import json
import time

import pytest
import torch
from rich.console import Console

from kvarena import cli, impl
from kvarena.impl import kernels
from kvarena.verification import command_line, differential, fuzz, verify


def run(args, monkeypatch):
    console = Console(record=True, width=220)
    monkeypatch.setattr(command_line, "console", lambda: console)
    rc = cli.main(args)
    return rc, console.export_text()


def parse(args):
    import argparse

    p = argparse.ArgumentParser()
    verify.add_arguments(p)
    return p.parse_args(args)


def test_no_flags_means_no_budget_every_walk_and_the_local_cache():
    a = parse([])
    assert a.budget is None and a.walks == verify.WALKS and a.steps == verify.STEPS
    assert a.cache is None and not a.no_cache and not (a.skip_proofs or a.skip_fuzz or a.skip_vectors)


def stand_ins(monkeypatch, *, fail=None, cut=None):
    """Every part stood in for by a passing row; ``fail``: the part whose
    row fails; ``cut``: the part that reports work not run.  Returns the
    deadlines each part was given."""
    given = {}

    def part(name):
        def fn(*args, **kwargs):
            given[name] = [a for a in args if isinstance(a, float) or a is None]
            row = {"part": name, "name": f"{name} stand-in", "ok": name != fail, "seconds": 0.0, "detail": "-"}
            cuts = [verify.cut(name, "some of it", "the budget")] if name == cut else []
            return [row], cuts

        return fn

    monkeypatch.setattr(verify, "selfcheck_rows", part("self-checks"))
    monkeypatch.setattr(verify, "crosshair_rows", part("crosshair"))
    monkeypatch.setattr(verify, "vector_rows", part("vectors"))
    z3 = part("z3")
    monkeypatch.setattr(verify, "z3_rows", lambda *a, **k: (z3(*a, **k)[0], ["obl.x"] if cut == "z3" else []))

    def machines(labels, device, seed, deadline, *rest):
        return [machine(label, deadline) for label in labels]

    def machine(label, deadline):
        given.setdefault("differential", []).append(deadline)
        row = {
            "part": "differential",
            "name": label,
            "ok": fail != "differential",
            "seconds": 0.0,
            "detail": "-",
            "examples": 60,
            "steps": 100,
            "required": 1,
            "reached": 1,
            "missing": [],
        }
        cuts = [verify.cut("differential", label, "the budget")] if cut == "differential" else []
        return row, verify.Counter(exhaustion=1), verify.Counter(examples=60, steps=100), None, cuts

    monkeypatch.setattr(verify, "differential_rows", machines)
    return given


@pytest.mark.parametrize(
    "fail, cut, rc",
    [
        (None, None, verify.EXIT_OK),
        (None, "z3", verify.EXIT_INCOMPLETE),
        (None, "differential", verify.EXIT_INCOMPLETE),
        ("crosshair", None, verify.EXIT_FAILED),
        ("vectors", "differential", verify.EXIT_FAILED),  # a failure outranks a cut
    ],
)
def test_the_exit_status_says_complete_failed_or_incomplete(tmp_path, monkeypatch, fail, cut, rc):
    stand_ins(monkeypatch, fail=fail, cut=cut)
    path = tmp_path / "v.json"
    got, out = run(["verify", "--cache", str(tmp_path / "c"), "--json", str(path)], monkeypatch)
    assert got == rc, out
    s = json.loads(path.read_text())["summary"]
    assert s["exit"] == rc and bool(s["not_run"]) == (cut is not None)
    if cut:
        assert "NOT RUN" in out and ("not run, listed above" in out)
    if cut and not fail:
        assert f"INCOMPLETE (exit {verify.EXIT_INCOMPLETE})" in out
    if rc == verify.EXIT_OK:
        assert "complete: every check ran and passed" in out and "NOT RUN" not in out


def test_without_a_budget_no_part_has_a_deadline(tmp_path, monkeypatch):
    given = stand_ins(monkeypatch)
    assert run(["verify", "--cache", str(tmp_path)], monkeypatch)[0] == verify.EXIT_OK
    assert all(d is None for ds in given.values() for d in ds), given


def test_a_budget_gives_each_part_its_cumulative_share(tmp_path, monkeypatch):
    given = stand_ins(monkeypatch)
    t0 = time.perf_counter()
    assert run(["verify", "--budget", "100", "--cache", str(tmp_path)], monkeypatch)[0] == verify.EXIT_OK
    usable = 100 - min(5.0, 3.0)
    for part, share in verify.SHARES.items():
        (deadline, *_) = given[part]
        assert t0 + share * usable - 1 <= deadline <= t0 + share * usable + 1, part


@pytest.mark.parametrize("skip", ["--skip-proofs", "--skip-vectors", "--skip-fuzz"])
def test_a_skipped_part_is_listed_and_never_exits_0(tmp_path, monkeypatch, skip):
    stand_ins(monkeypatch)
    rc, out = run(["verify", skip, "--cache", str(tmp_path)], monkeypatch)
    assert rc == verify.EXIT_INCOMPLETE and f"({skip})" in out


def test_fewer_walks_than_the_default_are_a_cut():
    rows, cuts = verify.selfcheck_rows(walks=1, steps=20)
    assert all(r["ok"] for r in rows)
    assert {c["why"] for c in cuts} == {"--walks 1", "--steps 20"}
    rows, cuts = verify.selfcheck_rows(deadline=time.perf_counter())  # no time left for a walk
    assert rows and not any(r["name"].startswith("random walk") for r in rows)
    assert cuts == [verify.cut("self-checks", "20 of 20 random walks", "the budget")]


def test_z3_stops_at_its_deadline_and_names_what_it_did_not_run():
    rows, not_run = verify.z3_rows(deadline=time.perf_counter())
    assert rows == [] and len(not_run) > 100


def test_z3_counts_the_cache_apart(tmp_path):
    names = ["golden.up_gap.n2", "golden.up_gap.n3"]
    first, _ = verify.z3_rows(names=names, cache=str(tmp_path))
    again, _ = verify.z3_rows(names=names, cache=str(tmp_path))
    assert [r["cache"] for r in first] == ["new", "new"] and [r["cache"] for r in again] == ["hit", "hit"]
    s = verify._summary(first + again, verify.Counter(), verify.Counter(), [], [], None, 1.0, "cpu", "c", 0)
    assert (s["z3"]["proved_now"], s["z3"]["from_cache"], s["z3"]["proved"]) == (2, 2, 4)


def test_a_crosshair_run_the_deadline_stops_is_not_finished_and_listed(monkeypatch):
    """A run stopped at the deadline is "not finished" (listed, not failed);
    one with no time left is not started; a counterexample still fails."""
    from kvarena.proofs import crosshair_runs as ch

    def check(module, wall_s):
        return [{"name": f"crosshair.check.{module}", "result": "error", "ok": False, "time_s": wall_s,
                 "reason": f"crosshair run exceeded its {wall_s}s wall-clock cap"}]  # fmt: skip

    def diff(f1, f2, wall_s):
        return {"name": f"crosshair.diff.{f1}", "result": "counterexample", "ok": False, "time_s": 1.0,
                "reason": "Given (1,), returns 2 and 3"}  # fmt: skip

    monkeypatch.setattr(ch, "check_module", check)
    monkeypatch.setattr(ch, "diff_pair", diff)
    rows, not_run = verify.crosshair_rows(deadline=time.perf_counter() + 60)
    checks = [r for r in rows if r["name"].startswith("crosshair.check")]
    assert checks and all(r["result"] == "not finished" and r["ok"] for r in checks)
    assert not_run == [
        verify.cut("crosshair", f"{len(checks)} not finished: " + ", ".join(r["name"] for r in checks), "the budget")
    ]
    assert rows and all(not r["ok"] for r in rows if r["name"].startswith("crosshair.diff"))
    rows, _ = verify.crosshair_rows(deadline=None)  # no budget: the run's own cap hit is an error, a failure
    assert all(not r["ok"] for r in rows)
    rows, not_run = verify.crosshair_rows(deadline=time.perf_counter())  # no time left: none started, all listed
    assert rows == [] and not_run[0]["what"].startswith(f"{len(ch.CHECK_MODULES) + len(ch.DIFF_PAIRS)} not started: ")


def small_rounds(monkeypatch, required):
    monkeypatch.setattr(verify, "ROUND_EXAMPLES", 3)
    monkeypatch.setattr(verify, "MIN_ROUNDS", 1)
    monkeypatch.setattr(verify, "MAX_EXAMPLES", 9)
    monkeypatch.setattr(differential, "REQUIRED", required)
    monkeypatch.setattr(differential, "kernel_events", lambda device: ())  # only ``required``


def test_a_machine_requires_a_call_on_each_kernel_choice_that_runs_here(monkeypatch, tmp_path):
    """verify's machine rows also wait for a call on each kernel choice
    (docs/design.md §14): on the CPU, Triton's under its interpreter."""
    monkeypatch.setattr(verify, "ROUND_EXAMPLES", 3)
    monkeypatch.setattr(verify, "MIN_ROUNDS", 1)
    monkeypatch.setattr(verify, "MAX_EXAMPLES", 9)
    monkeypatch.setattr(differential, "REQUIRED", ())
    row, seen, _, failure, _ = verify.machine_rows("core", out_dir=tmp_path)
    want = differential.kernel_events("cpu")
    assert "kernels torch" in want and row["required"] == len(want) and failure is None
    assert ("kernels triton" in want) == (kernels.unavailable(torch.device("cpu")) is None)
    assert row["ok"] and all(seen[e] > 0 for e in want), seen
    monkeypatch.setattr(differential, "kernel_events", lambda device: ("kernels nobody runs",))
    row, *_ = verify.machine_rows("core", out_dir=tmp_path)
    assert not row["ok"] and "kernels nobody runs" in row["detail"]


def test_a_machine_runs_seeded_rounds_until_its_required_events(monkeypatch, tmp_path):
    small_rounds(monkeypatch, ("exhaustion",))
    row, seen, stats, failure, cuts = verify.machine_rows("core", out_dir=tmp_path)
    assert row["ok"] and failure is None and not cuts and seen["exhaustion"] > 0
    assert row["reached"] == row["required"] == 1 and stats["examples"] <= 9


def test_an_event_never_reached_in_max_examples_fails_the_machine(monkeypatch, tmp_path):
    small_rounds(monkeypatch, ("exhaustion", "an event no machine has"))
    rc_row, _, stats, _, cuts = verify.machine_rows("core", out_dir=tmp_path)
    assert not rc_row["ok"] and "never reached in 9 examples" in rc_row["detail"] and not cuts
    assert stats["examples"] >= 9


def test_coverage_is_counted_in_examples_not_seconds(monkeypatch, tmp_path):
    """The same seeded rounds reach the same events, however slow each round is."""
    small_rounds(monkeypatch, ("exhaustion", "an event no machine has"))
    fast = verify.machine_rows("core", out_dir=tmp_path)
    real = fuzz.run_round

    def slow(*a, **k):
        time.sleep(0.5)  # a loaded machine
        return real(*a, **k)

    monkeypatch.setattr(fuzz, "run_round", slow)
    slowed = verify.machine_rows("core", out_dir=tmp_path)
    assert fast[1] == slowed[1] and fast[2] == slowed[2]


def test_a_machine_cut_by_the_budget_lists_the_events_it_did_not_reach(monkeypatch, tmp_path):
    small_rounds(monkeypatch, ("exhaustion",))
    row, _, stats, _, cuts = verify.machine_rows("core", deadline=time.perf_counter(), out_dir=tmp_path)
    assert row["ok"] and stats["examples"] == 0
    assert cuts == [verify.cut("differential", "core: required events not reached: exhaustion", "the budget")]


def test_under_a_budget_only_whole_rounds_count_towards_the_rounds_verify_promises(monkeypatch, tmp_path):
    """A budget's probe round (``PROBE_EXAMPLES``, to time an example) and
    shortened rounds do not count: a budgeted run that completes ran every
    whole round an unbudgeted one runs, and more."""
    small_rounds(monkeypatch, ())  # no events to wait for: only the rounds decide when it stops
    policies = len(fuzz.policies_for(differential))
    row, _, stats, _, cuts = verify.machine_rows("core", deadline=time.perf_counter() + 600, out_dir=tmp_path)
    assert row["ok"] and not cuts
    assert stats["examples"] >= verify.PROBE_EXAMPLES + verify.MIN_ROUNDS * 3 * policies, stats


def test_a_budget_too_small_exits_3_and_lists_what_did_not_run(tmp_path, monkeypatch):
    path = tmp_path / "v.json"
    rc, out = run(
        ["verify", "--budget", "8", "--cache", str(tmp_path / "c"), "--json", str(path), "--failures", str(tmp_path)],
        monkeypatch,
    )
    assert rc == verify.EXIT_INCOMPLETE, out
    s = json.loads(path.read_text())["summary"]
    assert s["exit"] == 3 and s["failures"] == [] and any(n["why"] == "the budget" for n in s["not_run"])
    assert "NOT RUN" in out and "INCOMPLETE (exit 3)" in out


def test_a_failure_is_shrunk_saved_and_printed_as_a_reproduction(tmp_path, monkeypatch):
    monkeypatch.setattr(verify, "ROUND_EXAMPLES", 5)  # the bug shows within a few steps
    real = impl.arena.Arena.gap_bytes
    monkeypatch.setattr(
        impl.arena.Arena, "gap_bytes", lambda self, name: real(self, name) + (1 if self.live_pages(name) >= 3 else 0)
    )
    path = tmp_path / "v.json"
    args = ["verify", "--skip-proofs", "--skip-vectors", "--walks", "0", "--jobs", "1", "--json", str(path)]
    rc, out = run([*args, "--failures", str(tmp_path / "f")], monkeypatch)
    assert rc == verify.EXIT_FAILED and "FAILURE" in out and "def test_fuzz_repro_" in out
    (f,) = [f for f in json.loads(path.read_text())["summary"]["failures"] if "vector" in f]
    assert f["machine"] == "core" and f["reproduces"] is True and f["shrunk"] and "state = " in f["hypothesis"]
    assert f["shrink"]["complete"] and f["shrink"]["calls"][1] < f["shrink"]["calls"][0], f["shrink"]
    assert fuzz.shrink_line(f["shrink"]) in out  # the report says how far the shrink got


def test_a_cache_or_device_that_cannot_be_used_is_refused_up_front(monkeypatch):
    import torch

    rc, out = run(["verify", "--cache", "redis://127.0.0.1:1/0"], monkeypatch)
    assert rc == verify.EXIT_USAGE and "--cache redis://127.0.0.1:1/0" in out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for args in (
        ["verify", "--device", "cuda"],
        ["fuzz", "--device", "cuda"],
        ["vectors", "replay", "tests/vectors", "--device", "cuda"],
    ):
        rc, out = run(args, monkeypatch)
        assert rc == 2 and "no CUDA device" in out


def test_machines_side_by_side_report_in_order_and_keep_the_deadline(tmp_path):
    """With two jobs each machine runs in a process of its own; the
    deadline crosses as wall-clock time (past here: nothing runs, and each
    machine lists its required events as not reached)."""
    labels = list(fuzz.MACHINES)
    out = verify.differential_rows(labels, deadline=time.perf_counter(), out_dir=tmp_path, jobs=2)
    assert [r[0]["name"].split()[0] for r in out] == labels
    for (row, _, stats, failure, cuts), label in zip(out, labels):
        assert row["ok"] and failure is None and stats["examples"] == 0
        assert cuts and cuts[0]["what"].startswith(f"{label}: required events not reached")
