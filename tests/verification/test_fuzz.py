"""``kvarena fuzz`` (``kvarena.verification.fuzz``): the single-machine campaign, its
shared example database, and a failure saved as a replayable vector."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvarena import cli, impl
from kvarena.verification import fuzz, planted, vectors
from tests.impl.test_kernels import needs_triton


def plant_gap_bug(monkeypatch):
    """The implementation reports one byte too many of gap once a pool holds
    three pages: every differential machine sees it within a few steps."""
    real = impl.arena.Arena.gap_bytes

    def wrong(self, name):
        g = real(self, name)
        return g + 1 if self.live_pages(name) >= 3 else g

    monkeypatch.setattr(impl.arena.Arena, "gap_bytes", wrong)


def test_one_worker_campaign_runs_every_machine(tmp_path):
    s = fuzz.campaign(1, workers=1, examples=4, out_dir=tmp_path)  # at least one round of each machine
    assert not s["failures"], s["failures"]
    assert s["rounds"] >= len(fuzz.targets()) and s["examples"] >= 4 * len(fuzz.targets())
    assert s["steps"] > s["examples"]
    assert {k.split("/")[0] for k in s["per_target"]} == set(fuzz.MACHINES)
    assert s["cases"]  # coverage events were counted


def test_two_workers_share_one_database_and_save_the_failure(tmp_path, monkeypatch):
    """Two processes fuzz an implementation with a planted bug (a package copy
    first on their sys.path: ``kvarena.verification.planted``'s holes-not-credited) into
    one directory database; each stops at its failure and saves it as a
    vector that reproduces there.  This process, unmutated, then replays the
    shared database and finds the failure at once when the same bug is
    planted here."""
    mutated = tmp_path / "mutated"
    planted.mutated_copy(planted.by_name("holes-not-credited"), mutated)
    monkeypatch.syspath_prepend(str(mutated))  # spawned children start from this sys.path; this
    # process has imported kvarena already and keeps the real one
    db = tmp_path / "db"
    # seeded: the draws that find the bug are the same every run; the deadline only guards a regression
    s = fuzz.campaign(600, workers=2, db=db, examples=25, out_dir=tmp_path / "found", shrink=False, seed=0)
    assert s["workers"] == 2 and len(s["failures"]) == 2, s
    assert any(p.is_file() for p in db.rglob("*")), "the shared database holds the failing examples"
    for f in s["failures"]:
        assert f["reproduces"] is True, f
        assert "def test_fuzz_repro_" in f["pytest"] and "state = " in f["hypothesis"]
        assert "shrink" not in f  # shrink=False: saved as recorded
    (case,) = vectors.load_cases(s["failures"][0]["vector"])
    assert vectors.replay_case(case, "impl").ok  # here, without the bug, the same case passes

    found_again_at_once(monkeypatch, s, db)


def found_again_at_once(monkeypatch, summary, db):
    """A third worker with the bug in this process finds the stored failure
    in its first examples, from the shared database ``db``."""
    plant_holes_not_credited(monkeypatch)
    machine = summary["failures"][0]["machine"]
    third = fuzz.run_round(machine, examples=1, database=fuzz.open_database(db), shrink=False)
    assert third["failure"] is not None and third["examples"] <= 3


def test_saved_vector_pins_the_bug_and_nothing_else(tmp_path, monkeypatch):
    """The failure is shrunk, saved, reproduces, and passes once fixed."""
    plant_gap_bug(monkeypatch)
    r = fuzz.run_round("core", examples=50, seed=0)  # seeded: an example of more than one call to shrink
    assert r["failure"] is not None
    assert "@reproduce_failure(" in r["failure"]["hypothesis"]  # the blob that replays it, printed
    shrink = r["failure"]["shrink"]
    assert shrink["complete"] and shrink["calls"][1] < shrink["calls"][0], shrink
    f = fuzz.save_failure(r["failure"], "core", tmp_path)
    assert f["reproduces"] is True and "gap_bytes" in f["replay"]
    (case,) = vectors.load_cases(f["vector"])
    assert case["name"].startswith("fuzz/core-") and all("state" in s for s in case["ops"])
    monkeypatch.undo()  # the bug fixed: the same vector passes
    assert vectors.replay_case(case, "impl").ok
    ns = {}
    exec(f["pytest"], ns)  # the printed reproduction is a runnable test
    ns[next(k for k in ns if k.startswith("test_fuzz_repro_"))]()


def test_recording_keeps_evict_rounds_nested():
    from kvarena import spec

    trace = fuzz.CallTrace()
    a = spec.Arena(4096, [spec.SubPool("u", 16, 1, "up"), spec.SubPool("d", 16, 1, "down")])
    rec = fuzz.Recording(a, trace, fuzz.ARENA_RECORDED)
    trace.config = fuzz.config_of(a)
    ids = rec.alloc("d", rec.available_pages("d"))

    def evict(k):
        rec.free("d", ids[:k])
        return k

    assert rec.relieve("u", 3, evict) is True
    assert [s["call"] for s in trace.steps] == ["alloc", "relieve"]
    rnd = trace.steps[1]["evict"][0]
    assert rnd["returns"] == 3 and rnd["ops"][0]["call"] == "free"
    case = fuzz.trace_to_case(trace, "fuzz/unit")
    assert vectors.replay_case(case, "impl").ok
    assert case["ops"][1]["shortfalls"] == [3]


def plant_holes_not_credited(monkeypatch):
    """``planted``'s holes-not-credited, in this process: an END's available
    pages forget its lazy holes."""
    real = impl.arena.Arena._FRESH["available_pages"]
    monkeypatch.setitem(
        impl.arena.Arena._FRESH, "available_pages", lambda self, b: real(self, b) - (b.n_holes if b.is_end else 0)
    )


def a_long_trace_with_two_relevant_calls():
    """A spec arena's recorded calls, 22 of them (15 top-level, 7 in a
    ``relieve``'s evict rounds), where planted holes-not-credited shows in
    one: the lazy free of four of the up END's pages inside the evictor's
    second round.  Around it the float and the down END allocate, free,
    flush, compact and plan, and each round frees down pages too."""
    a = up_float_down(lazy={"u"})
    trace = fuzz.CallTrace()
    rec = fuzz.Recording(a, trace, fuzz.ARENA_RECORDED)
    trace.config = fuzz.config_of(a)

    def live(name):
        return [v for v, p in enumerate(a.v2p(name)) if v > 0 and p >= 0]

    f_ids = rec.alloc("f", 50)
    rec.alloc("d", 90)
    rec.free("d", live("d")[:5])
    u_ids = rec.alloc("u", 100)
    rec.alloc("f", 2)
    rec.free("f", f_ids[:3])
    rec.flush("d")
    rec.free("u", [])
    rec.alloc("d", 4)
    rec.compact_holes("f", "high")
    rounds = []

    def evict(k):
        rounds.append(k)
        rec.free("d", live("d")[:2])
        if len(rounds) == 2:
            rec.free("u", u_ids[5:9])  # lazy: holes behind u's frontier, which the planted bug forgets
        rec.free("d", live("d")[:2])
        return 4

    assert rec.relieve("d", rec.available_pages("d") + 12, evict) and len(rounds) >= 2
    rec.alloc("f", 1)
    rec.free("d", live("d")[:2])
    rec.plan_floats({"d": 3})
    rec.alloc("d", 2)
    return trace


def test_shrink_cuts_a_planted_failure_to_the_calls_that_show_it(monkeypatch):
    """``fuzz.shrink_trace`` cuts 22 recorded calls to the 5 the planted bug
    needs (the allocations that make the relieve evict, the relieve, and
    the one free in its one round), none of which can go; the result
    reproduces, passes once the bug is gone, is the same every time, and a
    bound of 5 replays stops it after 5."""
    trace = a_long_trace_with_two_relevant_calls()
    whole = fuzz.trace_to_case(trace, "fuzz/unit-whole")
    assert vectors.replay_case(whole, "impl").ok  # without the bug every call agrees
    assert fuzz.calls_in(trace.steps) == 22 and len(trace.steps) == 15
    plant_holes_not_credited(monkeypatch)
    assert not vectors.replay_case(whole, "impl").ok

    small, info = fuzz.shrink_trace(trace)
    assert info["complete"] and info["calls"] == [22, 5] and info["replays"] <= fuzz.SHRINK_REPLAYS, info
    assert [s["call"] for s in small.steps] == ["alloc", "alloc", "alloc", "relieve"]
    (u_free,) = [o for r in trace.steps[10]["evict"] for o in r["ops"] if o["args"]["name"] == "u"]
    assert [r["ops"] for r in small.steps[-1]["evict"]] == [[u_free]]  # one round, its one free of u
    # none of the calls left can go: without any one of them the vector passes
    for i in range(len(small.steps)):
        assert fuzz.outcome(small.config, small.steps[:i] + small.steps[i + 1 :])[0] is None, i
    no_free = [*small.steps[:-1], {**small.steps[-1], "evict": [{**small.steps[-1]["evict"][0], "ops": []}]}]
    assert fuzz.outcome(small.config, no_free)[0] is None
    case = fuzz.trace_to_case(small, "fuzz/unit-small")
    r = vectors.replay_case(case, "impl")
    assert not r.ok and "available_pages" in r.detail, r
    again, again_info = fuzz.shrink_trace(trace)  # counted, not timed: the same cut every run
    assert again.steps == small.steps and again_info == info

    bounded, binfo = fuzz.shrink_trace(trace, max_replays=5)
    assert binfo["replays"] == 5 and not binfo["complete"], binfo
    assert fuzz.outcome(trace.config, bounded.steps)[0] == "impl"  # the smallest failing calls found by then
    assert fuzz.calls_in(bounded.steps) == binfo["calls"][1] < 22

    monkeypatch.undo()  # the bug fixed: the shrunk vector passes
    assert vectors.replay_case(case, "impl").ok


def test_shrink_leaves_a_trace_it_cannot_replay_as_a_failure_alone(tmp_path):
    """A trace whose vector passes (a failure only the machine's own checks
    see), one that does not rebuild the spec's state, and a bound of 0
    replays: each comes back as it was, with the reason."""
    trace = a_long_trace_with_two_relevant_calls()
    same, info = fuzz.shrink_trace(trace)  # no bug planted: the vector passes
    assert same is trace and "passes" in info["skipped"] and info["replays"] == 1, info
    same, info = fuzz.shrink_trace(trace, max_replays=0)
    assert same is trace and info["replays"] == 0 and info["skipped"], info

    missed = a_trace_that_misses_plan_floats()
    same, info = fuzz.shrink_trace(missed)
    assert same is missed and "rebuild" in info["skipped"], info
    assert fuzz.save_failure({"trace": same}, "core", tmp_path)["vector"] is None  # reported, not saved


def a_trace_that_misses_plan_floats():
    """A trace whose recording left out ``plan_floats``, a call that moved
    the float: it does not rebuild the spec's state."""
    trace = fuzz.CallTrace()
    a = up_float_down()
    rec = fuzz.Recording(a, trace, tuple(c for c in fuzz.ARENA_RECORDED if c != "plan_floats"))
    trace.config = fuzz.config_of(a)
    rec.alloc("f", 4)
    assert rec.plan_floats({"u": 200}) == 4
    return trace


def up_float_down(lazy=False):
    """A spec arena of an up END, one float and a down END, 255 pages each."""
    from kvarena import spec

    pools = [spec.SubPool("u", 16, 1, "up"), spec.SubPool("f", 16, 1, "float"), spec.SubPool("d", 16, 1, "down")]
    return spec.Arena(4096, pools, lazy=lazy)


def test_saved_vector_keeps_the_planners_moves(tmp_path, monkeypatch):
    """The planner's rung (``plan_floats``, a rule of the core machine) moves
    pages: left out of the trace, the replay refuses the big ``alloc`` that
    the moved float made room for, never punches the holes, and the saved
    vector of a real failure passes (the flaky two-worker test)."""
    trace = fuzz.CallTrace()
    a = up_float_down(lazy={"u"})
    rec = fuzz.Recording(a, trace, fuzz.ARENA_RECORDED)
    trace.config = fuzz.config_of(a)
    rec.alloc("f", 4)
    assert rec.available_pages("u") < 200 and rec.plan_floats({"u": 200}) == 4
    ids = rec.alloc("u", 200)  # fits only where the planner put the float
    rec.free("u", ids[10:20])  # lazy: holes behind the frontier
    assert rec.holes("u")
    case = fuzz.trace_to_case(trace, "fuzz/unit-plan")
    assert case["post"] == fuzz.observe_spec(a)  # the trace rebuilds the spec's own state
    plant_holes_not_credited(monkeypatch)
    f = fuzz.save_failure({"trace": trace}, "core", tmp_path)
    assert f["reproduces"] is True and "available_pages" in f["replay"], f


def test_a_trace_that_misses_a_call_is_not_saved(tmp_path):
    """A state change the trace did not record (a call missing from
    ``ARENA_RECORDED``) is reported, not saved as a vector of another run."""
    trace = a_trace_that_misses_plan_floats()
    f = fuzz.save_failure({"trace": trace}, "core", tmp_path)
    assert f["vector"] is None and f["reproduces"] is False and "do not rebuild" in f["pytest"], f
    assert not list(tmp_path.rglob("*.json"))


def test_each_example_starts_without_a_trace():
    """A failure before the machine boots saves no trace, not the previous example's."""
    sink = {"examples": 0, "checks": 0, "trace": fuzz.CallTrace()}
    fuzz.traced(fuzz.MACHINES["core"].machine_for("cpu"), sink)()
    assert sink["trace"] is None and sink["examples"] == 1


def test_recording_a_composite():
    from kvarena import spec

    trace = fuzz.CallTrace()
    c = spec.TriPool(8 * 16 * 24, 8, 8, 8 * 16, 16, lazy={"full"})
    rec = fuzz.Recording(c, trace, fuzz.COMPOSITE_RECORDED)
    trace.config = fuzz.config_of(c)
    slot = rec.alloc_state(1)
    toks = rec.alloc_extend([0], [40], [-1])
    rec.free_swa(toks[:16], 0)
    with pytest.raises(ValueError):
        rec.free_state([0])

    def evict(k):
        rec.free(toks)
        rec.free_state(slot)
        return len(toks)

    rec.relieve(rec.available_size() + 32, 1, evict)
    assert trace.config[0] == "TriPool" and trace.config[1]["lazy"] == ["full"]
    case = fuzz.trace_to_case(trace, "fuzz/unit-composite")
    assert [s["call"] for s in case["ops"]] == ["alloc_state", "alloc_extend", "free_swa", "free_state", "relieve"]
    assert case["ops"][3]["raises"] == "ValueError"
    r = vectors.replay_case(case, "impl")
    assert r.ok and r.compared > 20, r


def test_recording_an_uneven_relieve():
    """A ``relieve`` with ``swa_tokens`` (the uneven demand) records its
    keyword and the uneven shortfall, and replays on the implementation:
    9 free pages, (8, 4) keeps 6 full pages, so evict is asked for 2."""
    from kvarena import spec

    trace = fuzz.CallTrace()
    c = spec.HybridSWA(8 * 40, 8, 8, 1)
    rec = fuzz.Recording(c, trace, fuzz.COMPOSITE_RECORDED)
    trace.config = fuzz.config_of(c)
    toks = rec.alloc_extend([0], [15], [-1])

    def evict(k):
        rec.free(toks)
        return len(toks)

    assert rec.relieve(8, 0, evict, swa_tokens=4)
    case = fuzz.trace_to_case(trace, "fuzz/unit-uneven")
    step = case["ops"][-1]
    assert step["args"] == {"tokens": 8, "state_slots": 0, "swa_tokens": 4} and step["shortfalls"] == [2]
    r = vectors.replay_case(case, "impl")
    assert r.ok and r.compared > 20, r


@pytest.mark.parametrize("db", [None, "dir"])
def test_open_database(tmp_path, db):
    got = fuzz.open_database(None if db is None else tmp_path)
    assert (got is None) == (db is None)


def test_cli_fuzz(tmp_path, capsys):
    out = tmp_path / "s.json"
    args = "fuzz --minutes 0.05 --workers 1 --examples 3"
    rc = cli.main([*args.split(), "--json", str(out), "--failures", str(tmp_path)])
    text = capsys.readouterr().out
    # a failure here is a real disagreement found at random: keep what reproduces it (Hypothesis's
    # @reproduce_failure blob is in its notes, and the saved vector, shrunk, is printed whole)
    found = json.loads(out.read_text())
    assert rc == 0 and "0 failure(s)" in text, reproduction(found)
    assert found["examples"] > 0


def reproduction(summary):
    """A campaign's failures as text: each one's report, then its vector file."""
    parts = [json.dumps(summary.get("failures"), indent=1)[:20000]]
    for f in summary.get("failures") or []:
        if f.get("vector"):
            parts.append(f"vector {f['vector']}:\n{Path(f['vector']).read_text()[:50000]}")
    return "\n".join(parts)


def test_cli_fuzz_shrinks_within_its_replay_bound(tmp_path, capsys, monkeypatch):
    """``--shrink-replays N`` bounds a failure's shrink, and the report says
    the bound ended it (one worker: the bug planted in this process).  Two
    replays never finish: the whole trace's and one candidate, and this
    bug's failures take two calls at least (an allocation, a free)."""
    plant_holes_not_credited(monkeypatch)
    out = tmp_path / "s.json"
    args = "fuzz --minutes 0.5 --workers 1 --examples 25 --shrink-replays 2"
    rc = cli.main([*args.split(), "--json", str(out), "--failures", str(tmp_path)])
    text = capsys.readouterr().out
    (f,) = json.loads(out.read_text())["failures"]
    assert rc == 1 and f["shrink"]["replays"] == 2 and not f["shrink"]["complete"], f
    assert "in 2 replays; the replay bound ended it (--shrink-replays to go on)" in " ".join(text.split()), text


def test_two_workers_share_a_redis_server_and_a_third_finds_the_failure_at_once(tmp_path, monkeypatch, redis_url):
    """Issue 24, item 4: the scale-out path against a real Redis server.  Two
    workers fuzz an implementation with a planted bug into it; both failures
    are stored there, shrunk, saved and replayed; a third worker, with the
    same bug, finds the failure from the shared database at once."""
    url, client = redis_url
    mutated = tmp_path / "mutated"
    planted.mutated_copy(planted.by_name("holes-not-credited"), mutated)
    monkeypatch.syspath_prepend(str(mutated))
    # seeded: the draws that find the bug are the same every run; the deadline only guards a regression
    s = fuzz.campaign(600, workers=2, db=url, examples=25, out_dir=tmp_path / "found", shrink=True, seed=0)
    assert s["rounds"] <= 16, s  # each worker finds it within a few rounds
    # no Hypothesis shrink phase (its attempts would count here by the hundred): a round runs at most its
    # examples and the failing one's final replay
    assert s["examples"] <= 26 * s["rounds"], s
    assert s["workers"] == 2 and len(s["failures"]) == 2, s
    assert {f["machine"] for f in s["failures"]} == set(fuzz.MACHINES), s  # worker i starts on machine i
    assert client.dbsize() > 0, "the server holds the failing examples"
    for f in s["failures"]:
        assert f["reproduces"] is True, f
        assert "def test_fuzz_repro_" in f["pytest"]
        (case,) = vectors.load_cases(f["vector"])
        # shrunk by fuzz.shrink_trace, counted in replays, not timed: to the end (no single call left
        # to remove), and small (2 calls each: an allocation and the free that leaves holes, seen on
        # Hypothesis 6.170); a drawn example runs up to 40 steps of one to three calls
        before, after = f["shrink"]["calls"]
        assert f["shrink"]["complete"] and after < before and after == fuzz.calls_in(case["ops"]), f
        assert len(case["ops"]) <= 8, f
        assert vectors.replay_case(case, "impl").ok  # here, without the bug, the saved case passes
    found_again_at_once(monkeypatch, s, url)


def test_a_failure_a_hypofuzz_target_stored_is_replayed_at_once(tmp_path, monkeypatch):
    """``fuzz_targets``' targets (the untraced machines as TestCase classes,
    what HypoFuzz runs) and ``kvarena fuzz``'s rounds (the machines traced)
    share one database key: a failure a HypoFuzz worker stored is the first
    example ``kvarena fuzz --db`` runs.  The target is built by HypoFuzz
    25.11's rule for a TestCase (``hypofuzz/collection.py``: the machine's
    test, keyed by its class).  (They did not share it twice over: the
    traced subclass had its own key, and HypoFuzz keys a plain test
    function by its pytest node id.)"""
    from hypothesis import settings
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    from kvarena.verification import differential

    plant_holes_not_credited(monkeypatch)
    db = fuzz.open_database(tmp_path / "db")
    opts = {**differential.PROFILES["ci"], **differential.COMMON, "database": db, "derandomize": False}
    case = fuzz.hypofuzz_target(differential, settings(**opts))
    machine = case.runTest._hypothesis_state_machine_class
    machine._hypothesis_internal_use_seed = 0  # what @seed(0) sets: the same draws every run
    target = get_state_machine_test(machine, settings=case.settings)  # what HypoFuzz runs
    key = function_digest(target.hypothesis.inner_test)  # HypoFuzz's database key for the target
    assert key == fuzz.database_key(machine)  # the key kvarena fuzz's traced machine reads
    with pytest.raises(AssertionError):
        target()  # the HypoFuzz target finds the planted bug and stores the failing example
    assert list(db.fetch(key))  # under the key HypoFuzz reads and writes
    again = fuzz.run_round("core", examples=1, database=db, shrink=False)
    assert again["failure"] is not None and again["examples"] <= 2  # the stored example, then its final replay


def test_every_hypofuzz_target_is_a_machine_test_case():
    """HypoFuzz keys a plain test function by its pytest node id, which no
    ``kvarena fuzz`` round reads; so every target ``fuzz_targets`` exposes
    must be a machine's TestCase (checked in a fresh process: importing the
    module loads its settings profile and turns the contracts on)."""
    code = (
        "import unittest\n"
        "from kvarena.verification import fuzz_targets as t\n"
        "names = [n for n in dir(t) if n.lower().startswith('test') and not n.startswith('TestCase')]\n"
        "assert names, 'no targets'\n"
        "for n in names:\n"
        "    c = getattr(t, n)\n"
        "    assert isinstance(c, type) and issubclass(c, unittest.TestCase), n\n"
        "    assert c.runTest._hypothesis_state_machine_class.__name__.endswith('_cpu'), n\n"
        "print(sorted(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['TestDifferentialArena', 'TestDifferentialComposites']"


def test_cli_fuzz_starts_a_redis_server_of_its_own(tmp_path, capsys):
    """``--db redis:local``: the campaign's workers share a Redis server it
    starts on the loopback address and stops at the end (the documented
    hour-long campaign's database)."""
    out = tmp_path / "s.json"
    args = "fuzz --minutes 0.02 --workers 1 --examples 2 --db redis:local"
    assert cli.main([*args.split(), "--json", str(out), "--failures", str(tmp_path)]) == 0
    db = json.loads(out.read_text())["database"]
    assert db.startswith("redis://127.0.0.1:"), db
    port = int(db.rsplit(":", 1)[1].split("/")[0])
    import socket

    with socket.socket() as s, pytest.raises(OSError):  # stopped with the campaign
        s.connect(("127.0.0.1", port))


@needs_triton
def test_a_triton_kernel_bug_shrinks_to_a_vector_that_runs_it(monkeypatch, tmp_path):
    """The traced machines note each call's kernels on its step
    (``fuzz.KernelNotes``), so a bug only a Triton kernel has (one of
    tests/impl/test_kernels.py's planted off-by-ones, the bind's ring read
    one past) shrinks to a vector that fails on the implementation: on the
    default kernels the same calls pass."""
    from tests.impl.test_kernels import PLANTS, planted

    old, new, _ = PLANTS["bind ring"]
    mod = planted(tmp_path, old, new)
    monkeypatch.setattr(impl.kernels, "_triton", lambda: mod)
    r = fuzz.run_round("composites", examples=20, seed=0)
    trace = r["failure"]["trace"]
    assert any(s.get("kernels") == "triton" for s in trace.steps), trace.steps
    assert fuzz.outcome(trace.config, trace.steps, lent=trace.lent)[0] == "impl"
    bare = [{k: v for k, v in s.items() if k != "kernels"} for s in trace.steps]
    assert fuzz.outcome(trace.config, bare, lent=trace.lent)[0] is None
