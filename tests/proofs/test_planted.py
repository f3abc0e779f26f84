"""Bugs planted in the code the arena runs fail `kvarena prove` (docs/design.md
§7, "proofs about the code that runs").

Each ``planted.PROOF_PLANTS`` mutation edits ``spec/chain.py``,
``spec/transitions.py`` or ``spec/bands.py`` -- the views, the transitions
and the page-table writes that ``spec.Arena`` calls on every operation --
or a closed form of ``spec/arith.py`` that a composite's gate is proved
equal to, in a scratch copy of the package, and runs ``kvarena prove --only`` on the
obligations named for it there.  Each must be refuted (a counterexample),
not merely time out; unmutated, the same obligations all hold.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvarena.verification import planted


@pytest.fixture(scope="module")
def outcomes():
    with ThreadPoolExecutor(max_workers=2) as ex:
        runs = list(
            ex.map(
                lambda m: planted.run_mutation(m, suites=("proofs",), first=False),
                [planted.PROOF_BASELINE] + planted.PROOF_PLANTS,
            )
        )
    return {o.name: o for o in runs}


def test_at_least_three_plants_in_the_arenas_own_code():
    arena_code = {"spec/chain.py", "spec/transitions.py", "spec/bands.py"}
    own = [m for m in planted.PROOF_PLANTS if m.file in arena_code]
    assert len(own) >= 3 and {m.file for m in planted.PROOF_PLANTS} <= arena_code | {"spec/arith.py"}
    names = {m.name for m in planted.PROOF_PLANTS}
    # the audit's three: a view dropping holes, a float free losing a hole, a flipped side choice
    assert {"view-drops-holes", "float-free-loses-a-hole", "float-extends-toward-smaller-gap"} <= names
    # the uneven joint gate (docs/design.md §11): a closed form blind to swa's holes
    assert "uneven-gate-ignores-swa-holes" in names


def test_unmutated_the_planted_obligations_hold(outcomes):
    o = outcomes["proof-baseline"]
    assert not o.error and o.missed_by == ["proofs"], o
    assert "exits 0" in o.details["proofs"]["detail"]


@pytest.mark.parametrize("m", planted.PROOF_PLANTS, ids=lambda m: m.name)
def test_kvarena_prove_refutes_each_planted_bug(outcomes, m):
    o = outcomes[m.name]
    assert not o.error, o.error
    assert o.caught_by == ["proofs"], o.details
    assert "counterexample" in o.details["proofs"]["detail"], o.details
