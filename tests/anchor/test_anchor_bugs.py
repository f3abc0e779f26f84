"""Each anchor bug the conformance campaign found, kept as a minimal case
(``tests/anchor_cases/*.json``) and replayed on sglang 0.5.23's own
allocator: the test asserts the anchor's *current* behaviour, so it fails
the day the anchor changes it (and the case should then be revisited)."""

import json
import subprocess
import sys

import pytest

from kvarena.anchor.boot import BOOT_CLASSES, replay_boot
from kvarena.anchor.campaign import replay
from kvarena.anchor.classify import CLASSES
from tests.support import ROOT

ALL_CASES = sorted((ROOT / "tests" / "anchor_cases").glob("*.json"))
CASES = [p for p in ALL_CASES if not json.loads(p.read_text()).get("boot")]
BOOT_CASES = [p for p in ALL_CASES if json.loads(p.read_text()).get("boot")]


def test_every_anchor_bug_class_has_a_case():
    bugs = {c for c, (kind, _) in {**CLASSES, **BOOT_CLASSES}.items() if kind == "anchor-bug"}
    assert {json.loads(p.read_text())["class"] for p in ALL_CASES} == bugs


@pytest.mark.parametrize("path", BOOT_CASES, ids=lambda p: p.stem)
def test_boot_case_replays_as_recorded(path):
    """A layout the anchor accepts (or crashes on) and kvarena refuses,
    naming the pool: both sides still do exactly that."""
    case = json.loads(path.read_text())
    assert case["kind"] == BOOT_CLASSES[case["class"]][0] == "anchor-bug"
    classes, detail = replay_boot(case)
    assert classes == case["expect"]["classes"] == [case["class"]]
    assert detail == {k: v for k, v in case["expect"].items() if k != "classes"}
    assert detail["spec"].startswith("ValueError: pool ")


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_anchor_case_replays_as_recorded(path):
    case = json.loads(path.read_text())
    assert case["kind"] == CLASSES[case["class"]][0] == "anchor-bug"
    classes, detail, spec, anchor = replay(case)
    assert classes == case["expect"]["classes"]
    assert detail["anchor"] == case["expect"]["anchor"]  # what the anchor does today
    assert detail["spec"] == case["expect"]["spec"]  # what kvarena does
    assert detail["fields"] == case["expect"]["fields"]
    spec.verify()
    assert anchor.violations() == []  # the anchor's own check sees nothing wrong


def test_float_own_ladder_fails_what_its_schedulable_view_promised():
    """The user-visible form of the float ladder bug: the view says it fits,
    the alloc (which runs the anchor's own ladder) returns None."""
    case = json.loads((ROOT / "tests" / "anchor_cases" / "float-own-ladder-flush.json").read_text())
    *before, (_, args) = case["ops"]
    _, _, spec, anchor = replay(dict(case, ops=before))
    name, n = args["name"], args["n"]
    ps = anchor.page_size[name]
    assert anchor.available_size(name) < n * ps <= anchor.schedulable_available_size(name)
    assert anchor.alloc(name, n) is None
    assert spec.alloc(name, n) is None and spec.relieve(name, n) and spec.alloc(name, n) is not None


def test_replay_command_reports_each_case():
    proc = subprocess.run(
        [sys.executable, "-m", "kvarena.cli", "conform", "--no-install", "--replay", *map(str, ALL_CASES)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("as recorded") == len(ALL_CASES)
