"""The one difference the conformance campaign first filed as a kvarena
deviation (``kvarena conform``; README "Conformance with the anchor"), now a
documented design difference, pinned on its minimal case.

tripool-ladder-finds-more: a coupled allocation that kvarena's TriPool
(policy "anchor") refuses in one call while the anchor's three-pool
composite makes it.  sglang's ``ensure_capacity`` has rungs beyond the
seed's demand-vector policy (END-only flushes under a reclaim certificate,
then a high-side ``make_room`` target computed for the coupled demand);
kvarena's "anchor" policy is the seed's, one ladder run, which slides the
float too little (finding 6: a second ``relieve`` then succeeds).  The
planner (``policy="planner"``) is kvarena's fix: it makes the call at once.
"""

import pytest

from kvarena.anchor.composites import replay_composite
from kvarena.spec import TriPool

CONFIG = {"total_bytes": 137356, "full_entry_bytes": 128, "swa_entry_bytes": 192, "state_bytes": 5972,
          "page_size": 8, "lazy": False}
CALLS = [["alloc", {"n": 16}], ["free", {"request": 0}], ["alloc", {"n": 200}], ["free", {"request": 0}],
         ["alloc", {"n": 8}], ["alloc", {"n": 336}]]


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
