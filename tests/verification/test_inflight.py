"""The differential machines' in-flight forwards (``kvarena.verification.inflight``).

The byte oracle on hand-made overlapped steps, over a spec arena and its
implementation twin: a forward's late write must land at its id's page, and
a page it reads must keep its bytes until it is done.  Each is shown to fail
on a planted bug of the implementation (a non-urgent walk that ignores
pins, an allocation that hands out a pending page) with no spec comparison
involved; then both machines, with the same bugs planted in the spec or the
implementation, must fail.
"""

from collections import Counter
from pathlib import Path

import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import SubPool
from kvarena.verification import differential, differential_composites, fuzz
from kvarena.verification.differential import pattern
from kvarena.verification.faults import FaultAt, InjectedFault, unfaulted
from kvarena.verification.inflight import Flight, walk
from tests.support import mutant_module

POOLS = [SubPool("U", 4, 1, "up"), SubPool("D", 4, 1, "down")]
TOTAL = 4 * 40

# The planted bugs, one source edit each (``tests.support.mutant_module``):
# (module, old, new, class, method).
WALK_IGNORES_PINS = {
    "spec": ("kvarena.spec.moves", "stop, skip = set(pinned), set(guarded)", "stop, skip = set(), set(guarded)"),
    "impl": (
        "kvarena.impl.arena",
        "pinned = src[b.guard.index_select(0, src) >= 0]",
        "pinned = src[:0]",
        "Arena",
        "_walk",
    ),
}
HANDS_OUT_PENDING = {
    "spec": (
        "kvarena.spec.arena",
        "taken = [h for h in b.holes if not b.is_guarded(h)][:k]",
        "taken = ([h for h in b.holes if b.is_guarded(h)] + [h for h in b.holes if not b.is_guarded(h)])[:k]",
        "Arena",
        "_hand_out",  # what alloc (and reserve) hand out
    ),
    "impl": (
        "kvarena.impl.arena",
        "if self.in_flight and b.g_hi > 0 and self._skips_guards(b, n):",
        "if self.in_flight and b.g_hi < 0 and self._skips_guards(b, n):",
        "Arena",
        "_take",  # what alloc (and reserve) hand out, either kernels
    ),
}


def plant(monkeypatch, edit):
    """Apply one planted edit for the test's duration."""
    import importlib

    module, old, new, *where = edit
    real = importlib.import_module(module)
    mutant = mutant_module(real, old, new)
    if where:  # a method of a class
        cls, attr = where
        monkeypatch.setattr(getattr(real, cls), attr, getattr(getattr(mutant, cls), attr))
    else:  # the module's function of the same name
        monkeypatch.setattr(real, "guarded_flush_plan", mutant.guarded_flush_plan)


class Twins:
    """A spec arena and its implementation with a ``Flight``, driven by hand."""

    def __init__(self):
        self.S = spec.Arena(TOTAL, POOLS, lazy={"U"})
        self.I = impl.Arena(TOTAL, POOLS, lazy={"U"})
        self.expected = {"U": {}, "D": {}}
        self.gen = 0
        self.events = Counter()
        events = {"urgent": "urgent", "reused": "reused"}
        self.flight = Flight(self.S, self.I, self.expected, {"U": 0, "D": 1}, pattern, self.next_gen, self.note, events)

    def note(self, event):
        self.events[event] += 1

    def next_gen(self):
        self.gen += 1
        return self.gen

    def alloc(self, name, n):
        ids = self.S.alloc(name, n)
        got = self.I.alloc(name, n)
        self.flight.born(name, ids)
        self.flight.handed_out(name, self.I.translate(name, got).tolist())
        gen = self.next_gen()
        self.expected[name].update(dict.fromkeys(ids, gen))
        self.I.write_pages(name, got, pattern(self.S.chain.index(name), ids, [gen] * n, 4))
        return ids

    def free(self, name, ids):
        self.S.free(name, ids)
        self.I.free(name, ids)
        for v in ids:
            del self.expected[name][v]

    def launch(self, writes):
        self.S.launch(writes)
        self.I.launch(writes)
        self.flight.launch({n: sorted(self.expected[n]) if ids is None else ids for n, ids in writes.items()})

    def bytes_follow(self):
        """Every live id's bytes where the implementation's tables say."""
        for i, (name, live) in enumerate(self.expected.items()):
            ids = sorted(live)
            want = pattern(i, ids, [live[v] for v in ids], 4)
            if not torch.equal(self.I.read_pages(name, ids), want):
                return False
        return True


def stopped_walk(t):
    """A forward writes U's frontier page while the scheduler frees an inner
    page and compacts between steps: the walk must stop at the pin."""
    t.alloc("U", 6)
    t.launch({"U": [6]})
    t.free("U", [2])
    assert walk(t.S, "U", None) == (0, True)
    return t.I.flush("U", urgent=False)


def pending_then_alloc(t):
    """A forward writes U's deepest page; a non-urgent flush moves the
    frontier page into a freed hole (its source stays pending); the next
    batch then needs that page."""
    t.alloc("U", 6)
    t.launch({"U": [1]})
    t.free("U", [2])
    assert walk(t.S, "U", None) == (1, False)
    assert t.S.flush("U", urgent=False) == t.I.flush("U", urgent=False) == 1
    assert t.S.pending("U") == t.I.pending("U").tolist() == [6]
    t.alloc("U", 1)


def test_a_late_write_lands_at_its_pinned_page():
    t = Twins()
    assert stopped_walk(t) == 0 and t.S.flush("U", urgent=False) == 0
    t.flight.settle()
    assert t.bytes_follow() and t.events == Counter()
    assert t.flight.forwards == []


def test_a_walk_that_ignores_pins_loses_the_late_write(monkeypatch):
    """The implementation moves the pinned page: the late write lands at the
    page it left, so its id reads stale bytes."""
    plant(monkeypatch, WALK_IGNORES_PINS["impl"])
    t = Twins()
    assert stopped_walk(t) == 1  # it moved the page the forward writes
    t.S.settle()
    t.I.settle()
    assert not t.bytes_follow()


def test_a_pending_page_is_reused_only_after_settle():
    t = Twins()
    pending_then_alloc(t)  # the alloc settles first, then hands the pending page out
    assert t.events == Counter(urgent=1, reused=1)
    assert not t.S.in_flight and not t.I.in_flight and t.bytes_follow()


def test_an_alloc_that_hands_out_a_pending_page_corrupts_a_read(monkeypatch):
    """The implementation binds the pending page without waiting: the bytes
    the forward still reads there are overwritten before it is done."""
    plant(monkeypatch, HANDS_OUT_PENDING["impl"])
    t = Twins()
    pending_then_alloc(t)
    assert t.I.in_flight  # it did not wait
    with pytest.raises(AssertionError, match=r"pool 'U': pages \[6\] that a forward reads were overwritten"):
        t.flight.settle()


def test_a_freed_pinned_page_takes_the_late_write_and_no_id_loses_bytes():
    """An id the forward writes is freed while it runs (its request ended):
    the late write still lands on its page, which no allocation may take
    before settle."""
    t = Twins()
    t.alloc("U", 3)
    t.launch({"U": None})
    t.free("U", [3])
    t.alloc("U", 2)  # the freed page is pinned: the alloc settles before it takes it
    assert t.events["urgent"] == 1 and t.bytes_follow()


# ----------------------------------------------------- machines catch plants

# seeded examples: 60 of the composites since their fault_in_flight rule (issue 52) took a share of the draws
MACHINES = [(differential, 40), (differential_composites, 60)]


@pytest.mark.parametrize("side", ["spec", "impl"])
@pytest.mark.parametrize("bug", ["walk ignores pins", "alloc hands out a pending page"])
@pytest.mark.parametrize("machine,examples", MACHINES, ids=["core", "composites"])
def test_the_machines_catch_each_planted_bug(monkeypatch, machine, examples, bug, side):
    edits = WALK_IGNORES_PINS if bug == "walk ignores pins" else HANDS_OUT_PENDING
    plant(monkeypatch, edits[side])
    with pytest.raises(AssertionError):
        machine.run_machine("cpu", derandomize=True, database=None, max_examples=examples)


def test_a_harness_works_unfaulted_inside_a_faulted_call():
    """The simulated forward completes inside the implementation's call
    (its ``settle``): its own torch operations are neither counted nor
    failed by the fault injected into that call."""
    x = torch.arange(4)
    with FaultAt(1) as mode:
        x.add(1)  # operation 0
        with unfaulted():
            x.mul(2).sum()  # uncounted
        with pytest.raises(InjectedFault, match=r"operation 1 \(aten.add"):
            x.add(2)
    assert mode.fired and mode.ops == 2
    with FaultAt(1), pytest.raises(InjectedFault, match=r"operation 1 \(aten.mul"):
        x.add(1)
        x.mul(2)  # counted: it fails


def test_a_failure_in_flight_is_saved_as_a_vector_that_reproduces(monkeypatch, tmp_path):
    """A traced round records ``launch`` and ``settle``; the vector replays
    them, observes the pinned and pending pages while the forward is in
    flight, and fails on the implementation with the bug planted."""
    plant(monkeypatch, WALK_IGNORES_PINS["impl"])
    r = fuzz.run_round("core", None, "cpu", examples=40, shrink=False, derandomize=True)
    f = fuzz.save_failure(r["failure"], "core", tmp_path)
    assert f["reproduces"] is True, f
    text = Path(f["vector"]).read_text()
    assert '"call": "launch"' in text and '"pinned"' in text
