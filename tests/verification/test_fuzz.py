"""``kvarena fuzz`` (``kvarena.verification.fuzz``): the single-machine campaign, its
shared example database, and a failure saved as a replayable vector."""

import json

import pytest

from kvarena import cli, impl
from kvarena.verification import fuzz, planted, vectors


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
    s = fuzz.campaign(120, workers=2, db=db, examples=25, out_dir=tmp_path / "found", shrink=False)
    assert s["workers"] == 2 and len(s["failures"]) == 2, s
    assert any(p.is_file() for p in db.rglob("*")), "the shared database holds the failing examples"
    for f in s["failures"]:
        assert f["reproduces"] is True, f
        assert "def test_fuzz_repro_" in f["pytest"] and "state = " in f["hypothesis"]  # unshrunk here
    (case,) = vectors.load_cases(s["failures"][0]["vector"])
    assert vectors.replay_case(case, "impl").ok  # here, without the bug, the same case passes

    real = impl.arena.Arena._FRESH["available_pages"]
    monkeypatch.setitem(
        impl.arena.Arena._FRESH, "available_pages", lambda self, b: real(self, b) - (b.n_holes if b.is_end else 0)
    )
    machine = s["failures"][0]["machine"]
    again = fuzz.run_round(machine, examples=1, database=fuzz.open_database(db), shrink=False)
    assert again["failure"] is not None and again["examples"] <= 3


def test_saved_vector_pins_the_bug_and_nothing_else(tmp_path, monkeypatch):
    """The failure is shrunk, saved, reproduces, and passes once fixed."""
    plant_gap_bug(monkeypatch)
    r = fuzz.run_round("core", examples=50)
    assert r["failure"] is not None
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
    assert rc == 0 and "0 failure(s)" in text
    assert json.loads(out.read_text())["examples"] > 0
