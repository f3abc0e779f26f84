"""``kvarena fuzz --soak`` (``kvarena.verification.soak``): a short soak
agrees and samples memory; a planted implementation bug stops it."""

import json

import pytest

from kvarena import cli, impl
from kvarena.verification import soak


def test_a_short_soak_agrees_and_samples_memory():
    s = soak.soak(600, check_every=100, samples=3, seed=1)
    for policy in ("anchor", "planner"):
        r = s[policy]
        assert [x["op"] for x in r["samples"]] == [200, 400, 600]
        assert all(x["rss_bytes"] > 0 and x["tensors"] > 0 for x in r["samples"])
        # the scheduler reached every kind of operation, and relief
        assert {"admitted", "extended", "decoded", "window freed", "finished", "relieved"} <= set(r["events"]), r
    assert soak.soak(600, check_every=100, samples=3, seed=1)["anchor"]["events"] == s["anchor"]["events"]  # seeded


def test_a_planted_bug_stops_the_soak(monkeypatch):
    """The implementation frees one SWA page too few per window slide: the
    soak's next check sees it."""
    original = impl.TriPool.free_swa

    def short(self, token_ids, start_pos, *args, **kwargs):
        return original(
            self, token_ids[: -soak.PS] if len(token_ids) > soak.PS else token_ids, start_pos, *args, **kwargs
        )

    monkeypatch.setattr(impl.TriPool, "free_swa", short)
    with pytest.raises(soak.Mismatch):
        soak.soak(2000, check_every=50, samples=1, policies=("anchor",))


def test_the_command(tmp_path, capsys):
    out = tmp_path / "soak.json"
    assert cli.main(["fuzz", "--soak", "200", "--check-every", "50", "--samples", "2", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["ops_per_policy"] == 200 and {"anchor", "planner"} <= set(s)
    assert [x["op"] for x in s["anchor"]["samples"]] == [100, 200]
    assert "no disagreement" in capsys.readouterr().out
