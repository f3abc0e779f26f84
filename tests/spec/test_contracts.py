"""``spec/contracts.py``, the run-time contract checker, on small functions
of its own: what it parses, when it raises and what the message says,
``__old__``, the outermost-only rule, and that ``checking()`` wraps and then
restores exactly what it touched.  Fast unit tests for the mutation selection
(docs/results/suite-strength.md "Mutation score")."""

import pytest

from kvarena.spec import arith, composites, contracts
from kvarena.spec.arena import Arena, SubPool
from kvarena.spec.contracts import ContractError, checked, checking, conditions, unchecked

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def test_conditions_reads_only_non_empty_pre_post_inv_lines():
    doc = """Title.

    pre: x > 0
      post:   __return__ == x + 1
    inv: True
    pre:
    note: x
    raises: ValueError
    post: xs[1:] == {1: 2}[x]
    """
    assert conditions(doc) == {
        "pre": ["x > 0"],
        "post": ["__return__ == x + 1", "xs[1:] == {1: 2}[x]"],
        "inv": ["True"],
    }
    assert conditions(None) == {"pre": [], "post": [], "inv": []}


def _inc(x, y=1):
    """pre: x >= 0
    post: __return__ == x + y
    """
    return x + y


def _wrong(x, _hidden=0):
    """post: __return__ > x"""
    return x


def _grows(box):
    """post: len(box) == len(__old__.box) + 1"""
    box.append(0)
    return None


def test_checked_passes_and_fails_with_a_message_naming_the_rule():
    f = checked(_inc)
    assert f(2) == 3 and f(2, y=5) == 7 and f.__wrapped_contract__ is _inc and f.__name__ == "_inc"
    with pytest.raises(ContractError) as e:
        f(-1)
    assert str(e.value) == "_inc: pre failed: x >= 0  with {'x': -1, 'y': 1}"
    with pytest.raises(ContractError) as e:
        checked(_wrong)(4)
    assert str(e.value) == "_wrong: post failed: __return__ > x  with {'x': 4}"  # no _names
    assert issubclass(ContractError, AssertionError)


def test_old_is_a_copy_taken_before_the_call():
    box = [1]
    assert checked(_grows)(box) is None and box == [1, 0]


def test_a_function_without_contracts_is_returned_as_is():
    def plain(x):
        """Nothing to check."""
        return x

    assert checked(plain) is plain
    assert checked(plain, ["x == 1"])(1) == 1
    with pytest.raises(ContractError, match="inv failed: x == 1"):
        checked(plain, ["x == 1"])(2)


def test_outermost_checks_only_the_outer_call():
    calls = []

    def inner(x):
        """pre: x > 0"""
        calls.append(x)
        return x

    outer_fn = checked(inner, outermost=True)

    def outer(x):
        """post: __return__ == x"""
        outer_fn(-5)  # nested: not checked
        return x

    assert checked(outer, outermost=True)(3) == 3 and calls == [-5]
    with pytest.raises(ContractError):
        outer_fn(-1)  # outermost: checked
    with unchecked():
        assert outer_fn(-2) == -2
    with pytest.raises(ContractError):
        outer_fn(-3)  # unchecked() has ended
    assert contracts._depth == [0]


def test_checking_wraps_and_restores():
    before_fn = arith.min_page
    before_alloc, before_extend = Arena.alloc, composites._Composite.alloc_extend
    with checking():
        assert arith.min_page.__wrapped_contract__ is before_fn
        with pytest.raises(ContractError, match="min_page: pre failed"):
            arith.min_page(-1, 8)
        assert Arena.alloc is not before_alloc
        assert composites._Composite.alloc_extend is not before_extend
        # a public method inherited from a class with no invariant is checked
        # on the composite that inherits it; verify and private methods are not
        assert "free_swa" in vars(composites.HybridSWA)
        assert "verify" not in vars(composites.HybridSWA) and "_bind" not in vars(composites.HybridSWA)
        assert not hasattr(composites._Composite._bind, "__wrapped_contract__")
        # a function imported into another spec module is wrapped once
        assert composites.arith.cdiv is arith.cdiv
    assert arith.min_page is before_fn and Arena.alloc is before_alloc
    assert composites._Composite.alloc_extend is before_extend
    assert "free_swa" not in vars(composites.HybridSWA)
    assert composites.HybridSWA.free_swa is composites._WithSWA.free_swa


def test_checking_restores_after_an_exception():
    before = arith.cdiv
    with pytest.raises(RuntimeError), checking():
        raise RuntimeError
    assert arith.cdiv is before and "free_state" not in vars(composites.TriPool)


class _Box:
    def put(self, x):
        """pre: x > 0"""
        return x


def test_a_failing_method_names_its_arguments_but_not_self():
    with pytest.raises(ContractError) as e:
        checked(_Box.put)(_Box(), -1)
    assert str(e.value) == "_Box.put: pre failed: x > 0  with {'x': -1}"


def test_a_one_shot_iterator_is_read_once_for_the_call_and_its_conditions():
    """``free``'s postconditions read ``ids`` again: an iterator (valid
    input, ``Iterable[int]``) used to be empty by then, so a correct free
    failed its own contract after changing the state."""
    a = Arena(4096, [SubPool("U", 64, 1, "up"), SubPool("D", 64, 1, "down")])
    ids = a.alloc("U", 3)
    with checking():
        assert a.translate("U", iter(ids)) == [1, 2, 3]
        a.free("U", iter(ids))
    assert a.live_pages("U") == 0

    def total(xs):
        """post: __return__ == sum(xs)"""
        return sum(xs)

    assert checked(total)(iter([1, 2, 3])) == 6  # the function and its condition each see all three


def test_old_is_a_copy_the_call_cannot_reach():
    """``__old__`` deep-copies the arena; ``Band.__deepcopy__`` copies its int
    tables flat (for speed).  A copy must equal the original, share no table
    with it, and stay as it was when the original changes: a postcondition
    comparing ``__old__`` would otherwise compare the state with itself.
    (Planted: a ``__deepcopy__`` that shares ``pinned`` fails here.)"""
    import copy

    pools = [
        SubPool("mamba", 4096, 1, "up", "state"),
        SubPool("swa", 256, 16, "float"),
        SubPool("full", 512, 16, "down"),
    ]
    a = Arena(1 << 18, pools, lazy=True)
    ids = a.alloc("full", 5)
    assert ids and a.alloc("swa", 3) and a.alloc("mamba", 2)
    a.free("full", ids[:2])
    a.launch({"full": ids[2:4]})
    old = copy.deepcopy(a)
    before = old._whole()
    assert before == a._whole() and old.snapshot() == a.snapshot()
    for name in a.chain:
        mine, theirs = a.bands[name], old.bands[name]
        for table in mine._INT_TABLES:
            assert getattr(mine, table) is not getattr(theirs, table), (name, table)
    a.free("full", ids[2:])
    a.settle()
    assert a._whole() != before and old._whole() == before
