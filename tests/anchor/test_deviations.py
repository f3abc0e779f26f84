"""Two composite differences pinned on their minimal cases (``kvarena
conform``; docs/results/conformance.md): the one the campaign first
filed as a kvarena deviation, now a documented design difference, and
relief-steps (at the end of this file).

tripool-ladder-finds-more: a coupled allocation that kvarena's TriPool
(policy "anchor") refuses in one call while the anchor's three-pool
composite makes it.  sglang's ``ensure_capacity`` has rungs beyond the
seed's demand-vector policy (END-only flushes under a reclaim certificate,
then a high-side ``make_room`` target computed for the coupled demand);
kvarena's "anchor" policy is the seed's, one ladder run, which slides the
float too little (docs/findings.md, policy finding 6: a second ``relieve`` then succeeds).  The
planner (``policy="planner"``) is kvarena's fix: it makes the call at once.
"""

import pytest

from kvarena.anchor.composites import replay_composite
from kvarena.spec import TriPool

CONFIG = {
    "total_bytes": 137356,
    "full_entry_bytes": 128,
    "swa_entry_bytes": 192,
    "state_bytes": 5972,
    "page_size": 8,
    "lazy": False,
}
CALLS = [
    ["alloc", {"n": 16}],
    ["free", {"request": 0}],
    ["alloc", {"n": 200}],
    ["free", {"request": 0}],
    ["alloc", {"n": 8}],
    ["alloc", {"n": 336}],
]


def _before_last(policy):
    c = TriPool(policy=policy, **CONFIG)
    c.free(c.alloc_extend([0], [16], [-1]))
    c.free(c.alloc_extend([0], [200], [-1]))
    c.alloc_extend([0], [8], [-1])
    return c


def test_the_anchor_makes_the_allocation():
    classes, detail, _, anchor = replay_composite({"kind": "TriPool", "config": CONFIG, "calls": CALLS})
    assert "tripool-ladder-finds-more" in classes
    assert len(detail["anchor"]) == 336 and anchor.violations() == []


def test_the_planner_makes_it_and_a_second_anchor_ladder_run_does():
    assert _before_last("planner").alloc_extend([0], [336], [-1]) is not None
    c = _before_last("anchor")
    assert c.alloc_extend([0], [336], [-1]) is None  # one ladder run: refused
    assert c.relieve(336) and c.alloc_extend([0], [336], [-1]) is not None


@pytest.mark.parametrize("pkg", ["spec", "impl"])
def test_tripool_policies_on_the_minimal_case(pkg):
    """Spec and implementation alike: the anchor policy refuses in one call
    (nothing changes in the tables), the planner allocates."""
    import kvarena.impl
    import kvarena.spec

    cls = (kvarena.spec if pkg == "spec" else kvarena.impl).TriPool
    results = {}
    for policy in ("anchor", "planner"):
        c = cls(policy=policy, **CONFIG)
        c.free(c.alloc_extend([0], [16], [-1]))
        c.free(c.alloc_extend([0], [200], [-1]))
        c.alloc_extend([0], [8], [-1])
        results[policy] = c.alloc_extend([0], [336], [-1])
        c.verify()
    assert results["anchor"] is None
    assert results["planner"] is not None and len(results["planner"]) == 336


# relief-steps: kvarena's composite ladder compacts its ENDs in doubling
# steps and stops at the fit; the anchor flushes its members whole.  The
# minimal case from ``run_composites(steps=400, seed=3)``, shrunk.
STEPS_CONFIG = {"full_entry_bytes": 256, "page_size": 8, "lazy": True, "swa_entry_bytes": 192, "total_bytes": 24576}
STEPS_CALLS = [
    ["alloc", {"n": 48}],
    ["free_swa", {"request": 0, "pages": 5}],
    ["alloc", {"n": 8}],
    ["alloc", {"n": 8}],
    ["free", {"request": 0}],
    ["alloc", {"n": 8}],
    ["alloc", {"n": 8}],
]


def test_relief_steps_leave_holes_that_a_whole_flush_takes():
    from kvarena.anchor.classify import same_up_to_placement
    from kvarena.anchor.composites import flushed_whole
    from kvarena.anchor.composites import replay_composite as replay
    from kvarena.anchor.observe import observe_anchor, observe_spec

    case = {"kind": "HybridSWA", "config": STEPS_CONFIG, "calls": STEPS_CALLS}
    classes, _, before, _ = replay(dict(case, calls=STEPS_CALLS[:-1]))
    assert classes is None or "relief-steps" not in classes
    classes, detail, _, anchor = replay(case)
    assert "relief-steps" in classes and detail["spec"] == detail["anchor"]
    # the walk adopted the anchor's state; the spec's own, from the prefix, checks the rule
    before.alloc_extend([0], [8], [-1])
    assert not same_up_to_placement(observe_spec(before.arena), observe_anchor(anchor))  # holes left
    assert same_up_to_placement(observe_spec(flushed_whole(before.arena)), observe_anchor(anchor))
