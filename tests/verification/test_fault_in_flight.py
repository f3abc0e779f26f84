"""Issue 52: a fault with a forward in flight, replayed step by step.

``test_cli_fuzz`` once found the composites machine disagreeing with
itself on SWA bytes: a ``TriPool`` (eager, page size 1, a lent buffer, the
planner) launched a forward that writes request 3's one token (SWA id 16,
page 42), then freed request 3 on the implementation with its 25th
operation failing.  The free of an eager END waits for the forward before
its compaction, so the forward's late write landed on page 42 inside the
call; then the fault undid the free and bound id 16 at page 42 again, with
the forward's bytes on it.  The implementation was right (the spec's
content model says the same once it settles: the forward wrote id 16).
The machine was wrong: its ``Flight`` decided whether a late write became
the id's expected bytes by the implementation's table at the moment the
write landed, when the free had unbound id 16, and so went on expecting
the bytes from before the forward.  It now decides by the id's life
(``Flight._same_life``).

The steps are the failing example's, each rule with the draws Hypothesis
printed for it, run by ``Script`` with no Hypothesis engine and no blob.
They fail on the old rule (planted back here), pass on both kernel
choices, and catch the implementation bug the old rule would have hidden:
an undo that puts back a freed page's bytes from before the forward.
"""

import pytest

from kvarena.impl import arena as arena_mod
from kvarena.spec.contracts import checking
from kvarena.verification import differential_composites, fuzz, inflight, vectors
from tests.support import mutant_module

# (rule, its draws in order), as the failing example printed them.
STEPS = [
    ("relieve", [0, True, 6, 1, True]),
    ("relieve", [4, False, 1, False]),
    (
        "overlap",
        [2, 1, 1, False, [0, 1, 2], False, False, [], [], True, [2, 1, 3], True, False, False, 3, None, True, 1],
    ),
    ("faulted", [33, True, 3]),
    ("decode", [[0, 3], True, False]),
    ("relieve", [4, True, 6, 2, False]),
    ("faulted", [28, True, 0]),
    ("decode", [[3, 1, 2, 0], False, True]),
    (
        "overlap",
        [True, [0, 1, 2], True, True, [16], [-1, 0], False, True, False, True, True, "none", 2, None, False, 2],
    ),
    ("faulted", [25, True, 3]),  # the free of request 3, faulted after its wait on the forward
]
BOOT = {"setup": ("tri", 250, 4, 5, 35, 1, False, 2), "policy": "planner", "lent": True}


class Script:
    """A rule's ``data``: hands out one rule's recorded draws in order."""

    def __init__(self, draws):
        self.draws = list(draws)

    def draw(self, strategy, label=None):
        assert self.draws, "the rule drew more than the example recorded"
        return self.draws.pop(0)


def replay(monkeypatch, kernels=None, k=None):
    """Run the steps on a fresh composites machine; ``kernels`` fixes every
    call's kernel choice (else the machine's own draws), ``k`` the
    operation the last free fails at (else the example's 25th)."""
    m = differential_composites.machine_for("cpu")()
    m.events = []
    monkeypatch.setattr(differential_composites, "event", m.events.append)
    with checking():
        m.boot(**BOOT)
        if kernels is not None:
            m.kernels = lambda: kernels
        m.agree()
        for i, (rule, draws) in enumerate(STEPS):
            data = Script([k, *draws[1:]] if k is not None and i == len(STEPS) - 1 else draws)
            getattr(m, rule)(data)
            assert not data.draws, f"{rule}: the rule drew less than the example recorded"
            m.agree()
    return m


@pytest.mark.parametrize("kernels", [None, "torch", "triton"])
def test_the_steps_agree(monkeypatch, kernels):
    m = replay(monkeypatch, kernels)
    # the state the failure needed: the forward still in flight, request 3 live, its id's bytes the forward's
    assert m.S.arena.in_flight and m.I.arena.in_flight
    assert m.reqs[3]["tokens"] == [16] and m.expected["swa"][16] > 15


def old_rule(self, pool, v, life):
    """The rule before the fix: an id is written only if the implementation's table binds it now."""
    return self.lives.get(pool, {}).get(v) == life and v in self.expected.get(pool, {}) and self._v2p(pool)[v] > 0


def test_the_old_rule_fails_on_the_steps(monkeypatch):
    monkeypatch.setattr(inflight.Flight, "_same_life", old_rule)
    with pytest.raises(AssertionError, match="swa"):
        replay(monkeypatch, "torch")


# Planted: a free keeps its pages' bytes when it frees them, not when they are overwritten
# (``Journal.keep_rows``), so an undo after the wait puts back what a page held before the
# forward wrote it: the bug the old rule hid, since it expected those very bytes.
KEEPS_AT_FREE = (
    "journal.freed = True\n        b.v2p.index_fill_(0, ids, -1)",
    "journal.freed = True\n"
    "        rows = self._page_rows(name)\n"
    "        journal.on_undo(rows.index_copy_, 0, pages, rows.index_select(0, pages))\n"
    "        b.v2p.index_fill_(0, ids, -1)",
)


def caught(monkeypatch, kernels):
    """The operations of the last free whose fault the machine catches ("swa" bytes)."""
    out = []
    for k in range(FREE_OPS):
        try:
            replay(monkeypatch, kernels, k)
        except AssertionError as e:
            assert str(e) == "swa", e
            out.append(k)
    return out


# The last free makes fewer operations than this on either kernel choice: past them no fault comes out.
FREE_OPS = 64


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_a_fault_at_any_operation_of_the_free_agrees(monkeypatch, kernels):
    assert caught(monkeypatch, kernels) == []
    # the sweep covers the whole free: its last operation faults, and one past it does not
    assert replay(monkeypatch, kernels, 0).events[-1] == "composite fault undone"
    assert "composite fault undone" not in replay(monkeypatch, kernels, FREE_OPS).events[-3:]


def test_the_steps_catch_an_undo_that_loses_the_forwards_write(monkeypatch):
    """With the plant, a fault after the wait loses the forward's write (the
    plant adds operations, so every ``k`` is tried)."""
    mutant = mutant_module(arena_mod, *KEEPS_AT_FREE)
    monkeypatch.setattr(arena_mod.Arena, "free", mutant.Arena.free)
    assert caught(monkeypatch, "torch")


# What ``kvarena fuzz`` shrank the planted bug's failure to (``fuzz.shrink_trace``): 7 calls, the
# last a faulted free.  The fault's operation is the planted implementation's; here every one is tried.
PRE = (
    "TriPool",
    {
        "total_bytes": 250,
        "full_entry_bytes": 4,
        "swa_entry_bytes": 5,
        "state_bytes": 35,
        "page_size": 1,
        "lazy": [],
        "policy": "planner",
    },
)
CALLS = [
    {"call": "alloc_extend", "args": {"prefix_lens": [0], "seq_lens": [2], "last_loc": [-1]}},
    {"call": "alloc_extend", "args": {"prefix_lens": [0], "seq_lens": [1], "last_loc": [-1]}},
    {"call": "alloc_extend", "args": {"prefix_lens": [0], "seq_lens": [1], "last_loc": [-1]}},
    {"call": "alloc_decode", "args": {"seq_lens": [3, 2, 2], "last_loc": [10, 11, 12]}},
    {"call": "alloc_decode", "args": {"seq_lens": [4, 3, 3], "last_loc": [13, 14, 15], "seq_lens_cpu": [4, 3, 3]}},
    {"call": "launch", "args": {"token_ids": [16, -1, 0], "state_slots": None}},
]


def vector(k, kernels="torch"):
    """The shrunk case with its free faulted at operation ``k``."""
    free = {"call": "free", "args": {"token_ids": [16]}, "fault": {"at": k, "kernels": kernels}}
    return fuzz.steps_to_case(PRE, CALLS + [free], "fuzz/issue-52", lent=True)


def replays(target="impl"):
    """Each operation of the free: how its vector replays (status, detail), until the fault no longer comes out."""
    out = []
    for k in range(FREE_OPS):
        res = vectors.replay_case(vector(k), vectors.get_target(target))
        if res.fault_missed:
            break
        out.append((res.status, res.detail))
    return out


def test_the_vector_replays_at_every_operation_of_the_free():
    got = replays()
    assert len(got) > 10 and all(status == "pass" for status, _ in got), got
    case = vector(0)
    assert case["pre"]["lent"] is True and case["ops"][-1]["raises"] == "Fault"
    assert vectors.replay_case(case, "spec").ok


def test_the_vector_catches_the_planted_bug(monkeypatch):
    monkeypatch.setattr(arena_mod.Arena, "free", mutant_module(arena_mod, *KEEPS_AT_FREE).Arena.free)
    failed = [detail for status, detail in replays() if status == "fail"]
    assert failed and all("live data is not at its translated page" in d for d in failed), failed


def test_a_fault_that_does_not_come_out_is_no_reproduction():
    res = vectors.replay_case(vector(10_000), vectors.get_target("impl"))
    assert res.status == "fail" and res.fault_missed and "did not come out" in res.detail
    assert fuzz.outcome(PRE, CALLS + [vector(10_000)["ops"][-1]], lent=True)[0] is None


def test_a_faulted_call_the_spec_refuses_is_no_vector():
    bad = {"call": "free", "args": {"token_ids": [99]}, "fault": {"at": 0, "kernels": "torch"}}
    with pytest.raises(fuzz.FaultRefused):
        fuzz.steps_to_case(PRE, CALLS + [bad], "fuzz/bad")
    assert fuzz.outcome(PRE, CALLS + [bad]) == (None, None)
