"""The conformance adapter and campaign against the anchor (sglang 0.5.23).

``tests/anchor/conftest.py`` installs sglang (``--no-deps``) when it is
missing; where that fails, these tests fail with the command to run, they do
not skip.
"""

import json
import random
import subprocess
import sys

import pytest

from kvarena.anchor import classify
from kvarena.anchor.adapter import AnchorArena, Unsupported, anchor_domain
from kvarena.anchor.campaign import boot, run, step
from kvarena.anchor.fake_cache import FakeKVCache
from kvarena.anchor.loader import ANCHOR_VERSION, anchor_modules
from kvarena.anchor.observe import observe_anchor, observe_spec
from kvarena.anchor.walk import config_from_json, random_config
from kvarena.spec import SubPool
from tests.support import ROOT

THREE = {
    "total_bytes": 1280,
    "lazy": ["down"],
    "borrow": None,
    "pools": [
        {"name": "up", "entry_bytes": 32, "page_size": 1, "grow": "up", "kind": "kv"},
        {"name": "mid", "entry_bytes": 32, "page_size": 1, "grow": "float", "kind": "kv"},
        {"name": "down", "entry_bytes": 32, "page_size": 1, "grow": "down", "kind": "kv"},
    ],
}


def test_the_anchor_imports_without_torchvision():
    A = anchor_modules()
    assert A.version == ANCHOR_VERSION
    assert "torchvision" not in sys.modules  # the stand-in served sglang only
    from transformers.utils import is_torchvision_available

    assert not is_torchvision_available()


@pytest.mark.parametrize("seed", range(12))
def test_both_sides_boot_to_the_same_layout(seed):
    config = random_config(random.Random(seed))
    spec, anchor = boot(config)
    for name in spec.chain:
        g, a = spec.geometry(name), anchor.alloc_of[name]
        assert (g.num_pages, g.min_page, g.epp) == (a.num_pages, a.min_page_index, a.entry_bytes_per_page)
    assert observe_spec(spec) == observe_anchor(anchor)


def test_outside_the_anchors_domain_is_unsupported():
    mixed = [SubPool("a", 32, 4, "up"), SubPool("b", 96, 2, "down")]
    assert "sink" in anchor_domain(mixed, None, 1024)
    odd = [SubPool("a", 32, 1, "up"), SubPool("b", 64, 1, "down")]
    assert "even" in anchor_domain(odd, None, 1025)
    with pytest.raises(Unsupported):
        AnchorArena(1025, odd)


def test_adapter_maps_the_anchors_calls():
    spec, anchor = boot(config_from_json(THREE))
    for op, args in [("alloc", {"name": "down", "n": 10}), ("alloc", {"name": "mid", "n": 5})]:
        assert step(spec, anchor, op, args) == (None, None)
    # lazy holes below the float: the anchor credits them to its schedulable view
    classes, detail = step(spec, anchor, "free", {"name": "down", "ids": [3, 1], "segment": True})
    assert classes == ["float-schedulable-credit"] and detail["fields"] == ["mid.schedulable_available_size"]
    assert anchor.pages("down") == {v: p for v, p in enumerate(spec.v2p("down")) if v and p >= 0}
    assert anchor.translate("down", [2, 1, -1]) == spec.translate("down", [2, 1, -1]) == [31, 0, 0]
    assert anchor.holes("down") == [30, 32] and anchor.free_ids("down")[-2:] == [3, 1]
    assert anchor.flush("down") == spec.flush("down") == 1  # urgent: survivor 33 into hole 32... packed
    assert anchor.frontiers("down") == spec.frontiers("down")
    assert anchor.misplaced("down") == [] and anchor.violations() == []


def test_the_fake_cache_follows_moves_and_catches_a_lost_one(monkeypatch):
    c = FakeKVCache(8, 2)
    c.write([3, 4], [5, 6])
    c.move_physical_pages(__import__("torch").tensor([1]), __import__("torch").tensor([6]), 2)
    assert c.misplaced([3, 4], [5, 1]) == [] and c.misplaced([4], [6]) == []
    assert c.pages_moved == 1
    # planted: a cache that forgets to copy; an eager compaction then loses data
    monkeypatch.setattr(
        FakeKVCache,
        "move_physical_pages",
        lambda self, dst, src, ps: setattr(self, "pages_moved", self.pages_moved + 1),
    )
    spec, anchor = boot(config_from_json(dict(THREE, lazy=[])))
    step(spec, anchor, "alloc", {"name": "down", "n": 4})
    classes, detail = step(spec, anchor, "free", {"name": "down", "ids": [3], "segment": True})  # a survivor moves
    assert classes == [] and "down.misplaced" in detail["fields"]


def test_a_short_campaign_has_no_unclassified_difference():
    report = run(steps=900, seed=11, shrink_cases=False)
    d = report["differences"]
    assert report["steps"] == 900 and d["unclassified"] == 0, report["unclassified_cases"]
    every_call = "alloc free flush make_room compact_holes open_short_side relieve translate"
    assert set(report["operations"]) == set(every_call.split())
    assert d["total"] == sum(c["count"] for c in d["by_class"].values())
    for name, c in d["by_class"].items():
        assert c["kind"] == classify.CLASSES[name][0]
        assert sum(c["by_operation"].values()) == c["count"]
    assert {"hole-reuse-order", "free-order", "float-schedulable-credit"} <= set(d["by_class"])


def test_a_planted_spec_deviation_is_unclassified(monkeypatch):
    """A float that parks at the low end of its region instead of mid-region:
    no class explains it, so the campaign fails."""
    from kvarena.spec import arith

    monkeypatch.setattr(arith, "park_start", lambda lo, hi, n: lo)
    report = run(steps=400, seed=11, shrink_cases=False)
    assert report["differences"]["unclassified"] > 0


def test_a_planted_anchor_result_is_unclassified(monkeypatch):
    """An adapter that drops the last id of every alloc is caught."""
    real = AnchorArena.alloc
    monkeypatch.setattr(
        AnchorArena,
        "alloc",
        lambda self, name, n, ids=None: (lambda out: out if not out else out[:-1])(real(self, name, n, ids)),
    )
    report = run(steps=200, seed=11, shrink_cases=False)
    assert report["differences"]["unclassified"] > 0


def test_every_class_is_documented_in_the_results():

    from kvarena.anchor.boot import BOOT_CLASSES
    from kvarena.anchor.composites import COMPOSITE_CLASSES

    section = (ROOT / "docs" / "results" / "conformance.md").read_text()
    for name in list(classify.CLASSES) + list(COMPOSITE_CLASSES) + list(BOOT_CLASSES):
        assert f"`{name}`" in section, name


def test_the_anchor_replays_vectors():
    from kvarena.verification import vectors

    results = {r.name: r for r in vectors.replay_dir(vectors.default_dir(), target="anchor")}
    passed = [n for n, r in results.items() if r.status == "pass"]
    assert passed and all(n.startswith(("arena/", "anchor-bugs/")) for n in passed)
    assert all(r.status == "unsupported" for n, r in results.items() if n.startswith("composites/"))


def test_conform_command_writes_its_report(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvarena.cli",
            "conform",
            "--steps",
            "120",
            "--seed",
            "5",
            "--no-install",
            "--no-shrink",
            "--boot",
            "40",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["steps"] == 120 and report["differences"]["unclassified"] == 0
    assert report["boot"]["geometries"] == 40 and report["boot"]["differences"]["unclassified"] == 0
    assert "unclassified: 0" in proc.stdout and "kvarena conform, boot: 40 layouts" in proc.stdout


# ---------------------------------------------------------------- boot time


def test_a_boot_campaign_classifies_every_layout():
    """Layouts across the anchor's domain: every one agrees or shows a
    boot class, and a short campaign meets agreement both ways and each
    of the anchor's boot-time bugs."""
    from kvarena.anchor.boot import BOOT_CLASSES, OUTCOMES, run_boot

    report = run_boot(geometries=200, seed=0)
    assert report["differences"]["unclassified"] == 0, report["unclassified_cases"]
    assert set(report["outcomes"]) == set(OUTCOMES) and sum(report["outcomes"].values()) == 200
    assert set(report["cases"]) == set(BOOT_CLASSES) == set(report["differences"]["by_class"])
    sizes = {int(s.split("page size ")[1]) for s in report["shapes"]}
    assert {1, 256} <= sizes and {s.split(" pools")[0] for s in report["shapes"]} == {"2", "3"}


def test_boot_agreement_is_checked_on_the_observations(monkeypatch):
    """An anchor whose boot frontiers are off by a page: both build, the
    observations differ, and no class explains it."""
    from kvarena.anchor import boot

    real = boot.observe_anchor

    def shifted(aa):
        obs = real(aa)
        first = obs[aa.chain[0]]
        first["frontiers"] = [f + 1 for f in first["frontiers"]]
        return obs

    monkeypatch.setattr(boot, "observe_anchor", shifted)
    assert boot.run_boot(geometries=60, seed=0)["differences"]["unclassified"] > 0


def test_kvarena_refusing_what_the_anchor_serves_is_unclassified(monkeypatch):
    """kvarena refusing a layout on which the anchor gives every pool a page
    at once would be kvarena's bug: planted (a spec that refuses every
    layout), the campaign fails."""
    from kvarena.anchor import boot

    def refuse(config):
        raise ValueError("planted: refuses every layout")

    monkeypatch.setattr(boot, "build_spec", refuse)
    assert boot.run_boot(geometries=60, seed=0)["differences"]["unclassified"] > 0


# ------------------------------------------------------------ composite level


def test_composites_boot_to_the_same_arena_and_joint_view():
    from kvarena.anchor.composites import boot_composite, random_composite, spec_views

    rng = random.Random(3)
    kinds = set()
    for _ in range(9):
        kind, kw = random_composite(rng)
        spec, anchor = boot_composite(kind, kw)
        kinds.add(kind)
        assert observe_spec(spec.arena) == observe_anchor(anchor)
        assert spec_views(spec)["available_size"] == anchor.views()["available_size"]
    assert kinds == {"HybridSWA", "MambaHybrid", "TriPool"}


def test_a_short_composite_campaign_has_no_unclassified_difference():
    from kvarena.anchor.composites import COMPOSITE_CLASSES, run_composites

    report = run_composites(steps=400, seed=3)
    d = report["differences"]
    assert report["steps"] == 400 and d["unclassified"] == 0, report["unclassified_cases"]
    assert {k.split(".")[0] for k in report["operations"]} == {"HybridSWA", "MambaHybrid", "TriPool"}
    assert "component-views" in d["by_class"]
    for name in d["by_class"]:
        assert name in COMPOSITE_CLASSES or name in classify.CLASSES


def test_a_planted_composite_difference_is_unclassified(monkeypatch):
    """A composite adapter whose free_swa forgets its first token: caught."""
    from kvarena.anchor.composites import AnchorComposite, run_composites

    real = AnchorComposite.free_swa
    monkeypatch.setattr(AnchorComposite, "free_swa", lambda self, toks: real(self, toks[1:]))
    assert run_composites(steps=300, seed=3)["differences"]["unclassified"] > 0
