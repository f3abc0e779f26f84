"""The conformance vectors (``kvarena.verification.vectors``): the shipped set in
``tests/vectors/`` is valid, current, covers what the issue names, and
replays on the implementation; the replayer and the registry can fail."""

import copy
import json

import jsonschema
import pytest
import torch

from kvarena import cli, impl
from kvarena.verification import vector_cases, vectors

VECTORS = vectors.default_dir()


@pytest.fixture(scope="module")
def shipped():
    return vectors.load_cases(VECTORS)


def test_shipped_set_matches_the_schema(shipped):
    schema = vectors.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for case in shipped:
        validator.validate(case)
    assert len(shipped) >= 100


def test_schema_rejects_a_malformed_case(shipped):
    bad = copy.deepcopy(shipped[0])
    bad["ops"][0].pop("returns", None)
    bad["ops"][0].pop("raises", None)  # a step that says nothing
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, vectors.schema())


@pytest.mark.mutation
def test_shipped_set_is_what_the_spec_writes_now(shipped):
    """The set is regenerated from the spec; a spec change that alters a result
    shows here first (then run ``kvarena vectors generate tests/vectors``)."""
    fresh = {c["name"]: c for c in vector_cases.generate()}
    assert sorted(fresh) == [c["name"] for c in shipped], "regenerate: kvarena vectors generate tests/vectors"
    stale = [c["name"] for c in shipped if fresh[c["name"]] != c]
    assert not stale, f"stale vectors (kvarena vectors generate tests/vectors): {stale[:5]}"
    index = json.loads((VECTORS / "index.json").read_text())
    assert index["cases"] == len(shipped) and index["coverage"] == vectors.coverage(shipped)


def test_shipped_set_covers_every_call_policy_and_anchor_bug(shipped):
    seen = set(vectors.coverage(shipped))
    missing = vector_cases.required_tags() - seen
    assert not missing, sorted(missing)
    assert {"policy:anchor", "policy:planner"} <= seen  # both policies, now that the planner is in
    assert any("raises" in s for c in shipped for s in c["ops"])


@pytest.mark.mutation
def test_shipped_set_replays_on_the_implementation(shipped, device):  # conftest: cpu, cuda
    results = [vectors.replay_case(c, vectors.get_target("impl", device=device)) for c in shipped]
    bad = [(r.name, r.detail) for r in results if not r.ok]
    assert not bad, bad[:5]
    assert all(r.compared > 0 for r in results)


def test_spec_replays_its_own_vectors(shipped):
    assert all(vectors.replay_case(c, "spec").ok for c in shipped[:40])


# ------------------------------------------------------- the replayer can fail


def test_a_wrong_return_value_fails(shipped):
    case = copy.deepcopy(next(c for c in shipped if c["name"].startswith("arena/alloc-ends-exact-fit/")))
    step = next(s for s in case["ops"] if s["call"] == "alloc" and s.get("returns"))
    step["returns"] = step["returns"][::-1]
    r = vectors.replay_case(case, "impl")
    assert r.status == "fail" and "alloc" in r.detail


def test_a_wrong_post_state_fails(shipped):
    case = copy.deepcopy(shipped[0])
    pool = next(iter(case["post"]["pools"].values()))
    pool["frontiers"] = [pool["frontiers"][0] + 1, pool["frontiers"][1]]
    r = vectors.replay_case(case, "impl")
    assert r.status == "fail" and "frontiers" in r.detail


def test_an_expected_error_that_does_not_happen_fails(shipped):
    case = copy.deepcopy(next(c for c in shipped if "bad-input" in c["tags"]))
    step = next(s for s in case["ops"] if "raises" in s)
    del step["raises"]
    step["returns"] = None
    assert vectors.replay_case(case, "impl").status == "fail"


def test_planted_move_bug_fails_the_implementation(shipped, monkeypatch):
    """Anchor bug 4 planted in the implementation: a move that copies the
    destination onto the source leaves data behind; the vectors see it."""

    def swapped(self, b, dst, src, *rest):
        return real(self, b, src, dst, *rest)

    real = impl.arena.Arena._move
    monkeypatch.setattr(impl.arena.Arena, "_move", swapped)
    results = [vectors.replay_case(c, "impl") for c in shipped if "anchor-bug:4" in c["tags"]]
    assert any(r.status == "fail" for r in results)


class Blind:
    """An adapter that runs every call but observes nothing."""

    def __init__(self, device="cpu"):
        self.inner = vectors.get_target("impl", device)

    def boot(self, allocator, config):
        self.inner.boot(allocator, config)

    def call(self, call, args):
        return self.inner.call(call, args)

    def observe(self):
        return {}


def test_a_target_that_observes_nothing_fails(shipped):
    r = vectors.replay_case(shipped[0], Blind())
    assert r.status == "fail" and "not observed" in r.detail


class NoComposites(Blind):
    def boot(self, allocator, config):
        if allocator != "arena":
            raise vectors.Unsupported("arena only")
        super().boot(allocator, config)

    def observe(self):
        return self.inner.observe()


def test_unsupported_is_reported_never_passed(shipped):
    case = next(c for c in shipped if c["pre"]["allocator"] == "TriPool")
    r = vectors.replay_case(case, NoComposites())
    assert r.status == "unsupported" and not r.ok


def test_partial_observation_is_counted(shipped):
    class PagesOnly(NoComposites):
        def observe(self):
            obs = self.inner.observe()
            return {"pools": {n: {"pages": p["pages"]} for n, p in obs["pools"].items()}}

    case = next(c for c in shipped if c["pre"]["allocator"] == "arena")
    r = vectors.replay_case(case, PagesOnly())
    assert r.ok and "pools.frontiers" in r.unobserved and "data_follows" in r.unobserved


# ------------------------------------------------------------- the registry


def test_register_a_target_by_name(shipped, monkeypatch):
    monkeypatch.setitem(vectors._TARGETS, "mine", lambda device="cpu": NoComposites(device))
    assert "mine" in vectors.target_names()
    case = next(c for c in shipped if c["pre"]["allocator"] == "arena")
    assert vectors.replay_case(case, "mine").ok


def test_module_factory_and_unknown_targets():
    t = vectors.get_target("kvarena.verification.vectors:SpecTarget")
    assert isinstance(t, vectors.SpecTarget)
    with pytest.raises(ValueError, match="unknown"):
        vectors.get_target("no-such-target")


def test_plugin_module_is_imported_on_demand(tmp_path, monkeypatch):
    """``--target NAME`` imports the module ``PLUGINS`` names, which registers
    NAME (how ``kvarena.anchor`` provides ``--target anchor``)."""
    (tmp_path / "kvarena_test_plugin.py").write_text(
        "from kvarena.verification.vectors import SpecTarget, register_target\n"
        "register_target('plugged', lambda device='cpu': SpecTarget(device))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(vectors.PLUGINS, "plugged", "kvarena_test_plugin")
    monkeypatch.delitem(vectors._TARGETS, "plugged", raising=False)
    try:
        assert isinstance(vectors.get_target("plugged"), vectors.SpecTarget)
    finally:
        vectors._TARGETS.pop("plugged", None)
    monkeypatch.setitem(vectors.PLUGINS, "absent", "kvarena_no_such_module")
    with pytest.raises(ValueError, match="not available"):
        vectors.get_target("absent")


# ------------------------------------------------------------------ the CLI


def test_cli_generate_and_replay(tmp_path, capsys):
    out = tmp_path / "v"
    assert cli.main(["vectors", "generate", str(out)]) == 0
    assert len(list(out.rglob("*.json"))) > 100
    for extra in sorted(out.rglob("*.json"))[6:]:  # replay a few here; the whole set is replayed above
        extra.unlink()
    assert cli.main(["vectors", "replay", str(out), "--target", "impl", "--json", str(tmp_path / "r.json")]) == 0
    text = capsys.readouterr().out
    assert "0 failed" in text
    rows = json.loads((tmp_path / "r.json").read_text())
    assert rows and all(r["status"] == "pass" for r in rows)
    victim = sorted(out.rglob("*.json"))[1]
    case = json.loads(victim.read_text())
    case["post"]["data_follows"] = not case["post"]["data_follows"]
    victim.write_text(json.dumps(case))
    assert cli.main(["vectors", "replay", str(out)]) == 1
    assert "1 failed" in capsys.readouterr().out


def test_a_bind_that_loses_the_loads_bytes_fails(shipped, monkeypatch):
    """The implementation target writes a load's bytes into the pages a
    ``reserve`` returns and expects them at the ids a ``bind_reserved``
    gives them: a bind that clears its pages (as a hand-out zeroes them) is
    caught by the shipped hold case."""
    real = impl.Arena.bind_reserved

    def clearing(self, name, ids, pages):
        real(self, name, ids, pages)
        self.page_view(name)[torch.as_tensor(pages, dtype=torch.int64)] = 0

    case = copy.deepcopy(next(c for c in shipped if c["name"] == "arena/hold-gate-and-loads/anchor"))
    # a refused bind of the same page first (the sink's id): it changes nothing, the load's bytes included
    at = next(i for i, s in enumerate(case["ops"]) if s["call"] == "bind_reserved")
    bad = copy.deepcopy(case["ops"][at])
    bad["args"]["ids"] = [0]
    bad.pop("returns", None)
    bad["raises"] = "ValueError"
    case["ops"].insert(at, bad)
    assert vectors.replay_case(case, "impl").ok and vectors.replay_case(case, "spec").ok
    monkeypatch.setattr(impl.Arena, "bind_reserved", clearing)
    r = vectors.replay_case(case, "impl")
    assert r.status == "fail" and "live data is not at its translated page" in r.detail, r
