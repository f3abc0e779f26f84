"""The proof cache (``kvarena.proofs.cache``): a rerun takes each verdict
from it, only for the very formula, z3 and budget it was found for; a
planted spec bug is refuted through a warm cache; a corrupt or foreign
entry is ignored with a warning; a Redis server shares it."""

import json
import os
import subprocess
import sys

import z3

from kvarena.proofs import cache, cli, core
from kvarena.verification import planted

# Two of kvarena planted's proof plants, in two files, each refuting its own obligation
# (cheap ones: each runs in well under a second).
PLANTS = [planted.by_name("float-free-loses-a-hole"), planted.by_name("schedulable-credits-nothing")]
NAMES = [n for m in PLANTS for n in m.proof_only]


def entries(folder):
    return sorted(p for p in folder.rglob("*.json"))


def test_a_rerun_takes_every_verdict_from_the_cache(tmp_path):
    first = cli.run_fresh(NAMES, jobs=2, cache=str(tmp_path))
    assert [r["cache"] for r in first] == ["new"] * len(NAMES) and all(r["ok"] for r in first)
    assert len(entries(tmp_path)) == len(NAMES)
    again = cli.run_fresh(NAMES, jobs=2, cache=str(tmp_path))
    assert [r["cache"] for r in again] == ["hit"] * len(NAMES)
    for a, b in zip(first, again):  # the same verdict, and the time it first took
        assert (a["result"], a["vacuity"], a["tautology"], a["units"]) == (
            b["result"],
            b["vacuity"],
            b["tautology"],
            b["units"],
        )
        assert b["ok"] and b["proved_s"] == a["time_s"]
    fresh = cli.run_fresh(NAMES, jobs=2)  # no cache: nothing is read or written
    assert all("cache" not in r for r in fresh)


def test_the_key_is_the_formula_the_z3_version_and_the_budget(monkeypatch):
    """One formula printed twice has one key; one more hypothesis, another
    limit, tautology budget, name or z3 version each give another.  (Built
    again in this process, the same obligation prints other let-names:
    z3 names them after term ids, which is why the key is computed in a
    process that built nothing else, ``test_a_rerun...`` above.)"""
    ob = cli.registry()[NAMES[0]]
    built = ob.build()
    queries = core.proof_queries(built)

    def key(ob=ob, built=built, queries=queries, **kw):
        return core.cache_key(ob, built, queries, **kw)

    assert key() == key()
    tighter = core.Built(**{**built.__dict__, "hyps": [*built.hyps, z3.Int("extra") >= 0]})
    assert key(built=tighter, queries=core.proof_queries(tighter)) != key()
    assert key(ob=core.Obligation(**{**ob.__dict__, "timeout_s": ob.timeout_s + 1})) != key()
    assert key(ob=core.Obligation(**{**ob.__dict__, "name": ob.name + "x"})) != key()
    assert key(tautology_s=core.TAUTOLOGY_S + 1) != key()
    before = key()
    monkeypatch.setattr(z3, "get_full_version", lambda: "Z3 0.0.0.0")
    assert key() != before


def test_a_verdict_does_not_depend_on_asking_the_cache(tmp_path):
    """The key is computed (the obligation built and printed) in a child
    process, so the solver process proves exactly as with no cache: the
    same units spent.  (Computed in the proving process, the printing moved
    capacity.end_up.sound.n4 from 3.3 to 1.6 million units.)"""
    names = ["capacity.end_up.sound.n4", "capacity.end_down.tight.n2", *NAMES]
    plain = cli.run_fresh(names, jobs=2)
    cached = cli.run_fresh(names, jobs=2, cache=str(tmp_path))
    assert [r["cache"] for r in cached] == ["new"] * len(names)
    assert [(r["result"], r["units"]) for r in plain] == [(r["result"], r["units"]) for r in cached]


def prove_in_copy(m, tmp_path, cache_dir):
    """``kvarena prove --only NAMES`` in a copy of the package with ``m``
    planted (``kvarena planted``'s copy), on the proof cache ``cache_dir``:
    the exit status and the rows by name."""
    dest = tmp_path / m.name
    planted.mutated_copy(m, dest)
    out = tmp_path / f"{m.name}.json"
    env = {**os.environ, "PYTHONPATH": str(dest) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["--only", ",".join(NAMES), "--no-crosshair", "--jobs", "1", "--cache", str(cache_dir), "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "kvarena.proofs.cli", *args], cwd=dest, env=env, capture_output=True, text=True
    )
    assert out.exists(), proc.stderr[-2000:]
    return proc.returncode, {r["name"]: r for r in json.loads(out.read_text())["results"]}


def test_a_planted_spec_bug_is_refuted_through_a_warm_cache(tmp_path):
    """Issue 42: warm the cache with the unmutated verdicts (every one then
    a hit), then plant each of two of ``kvarena planted``'s spec bugs in a
    copy of the package: its obligation is refuted, proved afresh, while
    the other plant's obligation, whose formula the bug does not touch,
    still comes from the cache, so the cache was read in that very run."""
    store = tmp_path / "cache"
    assert all(r["ok"] for r in cli.run_fresh(NAMES, jobs=2, cache=str(store)))
    assert [r["cache"] for r in cli.run_fresh(NAMES, jobs=2, cache=str(store))] == ["hit"] * len(NAMES)
    for m in PLANTS:
        rc, rows = prove_in_copy(m, tmp_path, store)
        assert rc == 1
        for name in NAMES:
            if name in m.proof_only:
                assert rows[name]["result"] == "counterexample" and not rows[name]["ok"], rows[name]
                assert rows[name]["cache"] == "new"  # never a stored verdict
            else:
                assert rows[name]["ok"] and rows[name]["cache"] == "hit", rows[name]
    # the refutations were not stored: the unmutated package still hits every entry
    assert [r["cache"] for r in cli.run_fresh(NAMES, jobs=2, cache=str(store))] == ["hit"] * len(NAMES)


def test_a_corrupt_or_foreign_entry_is_ignored_with_a_warning(tmp_path):
    name = NAMES[0]
    (row,) = cli.run_fresh([name], cache=str(tmp_path))
    (path,) = entries(tmp_path)
    good = path.read_bytes()

    def rerun():
        (r,) = cli.run_fresh([name], cache=str(tmp_path))
        return r

    path.write_bytes(b"{not json")  # a torn or garbled file
    r = rerun()
    assert r["cache"] == "new" and r["ok"] and "corrupt" in r["cache_warning"]
    assert json.loads(path.read_text())["row"]["result"] == "proved"  # proved afresh and rewritten
    assert rerun()["cache"] == "hit"

    entry = json.loads(good)
    entry["row"]["result"] = "counterexample"  # an edited verdict, its digest left as it was
    path.write_text(json.dumps(entry))
    r = rerun()
    assert r["cache"] == "new" and r["result"] == "proved" and "digest" in r["cache_warning"]

    entry["obligation"] = NAMES[1]  # another obligation's entry, sealed as such, under this key
    body = {k: entry[k] for k in ("format", "key", "obligation", "z3", "row")}
    entry["digest"] = cache.digest(json.dumps(body, sort_keys=True, default=str))
    path.write_text(json.dumps(entry))
    r = rerun()
    assert r["cache"] == "new" and r["result"] == "proved" and "foreign" in r["cache_warning"]

    entry["obligation"] = name  # well formed and this obligation's, but a verdict that does not pass
    body = {k: entry[k] for k in ("format", "key", "obligation", "z3", "row")}
    entry["digest"] = cache.digest(json.dumps(body, sort_keys=True, default=str))
    path.write_text(json.dumps(entry))
    r = rerun()
    assert r["cache"] == "new" and r["ok"] and "does not pass" in r["cache_warning"]
    assert rerun()["cache"] == "hit" and row["result"] == "proved"


def test_a_redis_server_shares_the_cache(redis_url):
    """``--cache redis://...``: what one run proved, the next (on another
    machine of a fleet, here another process) takes from the server."""
    url, client = redis_url
    assert [r["cache"] for r in cli.run_fresh(NAMES, jobs=2, cache=url)] == ["new"] * len(NAMES)
    assert len(client.keys(cache.REDIS_PREFIX + "*")) == len(NAMES)
    assert [r["cache"] for r in cli.run_fresh(NAMES, jobs=2, cache=url)] == ["hit"] * len(NAMES)


def test_prove_counts_the_cache_apart_and_no_cache_reads_none(tmp_path, capsys):
    args = ["--only", NAMES[0], "--no-crosshair", "--jobs", "1"]
    assert cli.main([*args, "--cache", str(tmp_path)]) == 0
    assert "1 checked now, 0 from the cache" in capsys.readouterr().out
    assert cli.main([*args, "--cache", str(tmp_path)]) == 0
    assert "0 checked now, 1 from the cache" in capsys.readouterr().out
    assert cli.main([*args, "--no-cache"]) == 0
    assert "no cache" in capsys.readouterr().out
    assert cli.main([*args, "--cache", "redis://127.0.0.1:1/0"]) == 2  # nothing listens there
    assert "--cache redis://127.0.0.1:1/0" in capsys.readouterr().err
