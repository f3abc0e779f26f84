"""``spec/geometry.py`` on its own: the boot layout against brute force (grids
counted page by page, the packing check by painting bytes), and every
configuration error naming both the pool and the rule it broke.  Fast unit
tests for the mutation selection (docs/results/suite-strength.md "Mutation score")."""

import itertools
import re

import pytest

from kvarena.spec import geometry
from kvarena.spec.geometry import AccountingError, SubPool, borrowing, check_policy, lazy_ends, make_layout

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def _grid(total, epp, sink):
    n = max(k for k in range(total + 1) if k * epp <= total)
    m = min(k for k in range(sink + 1) if k * epp >= sink)
    return n, m


def _every_pool_gets_a_page(total, epps):
    """Paint one page of each pool from byte 0 up the chain (the down END
    takes its top page) and report whether all of them fit."""
    sink = max(epps)
    grids = [_grid(total, e, sink) for e in epps]
    if any(n <= m for n, m in grids):
        return False
    painted = (grids[0][1] + 1) * epps[0]
    for e, (n, m) in zip(epps[1:-1], grids[1:-1]):
        page = next(p for p in itertools.count(m) if p * e >= painted)
        if page >= n:
            return False
        painted = (page + 1) * e
    n, m = grids[-1]
    return (n - 1) * epps[-1] >= painted


def test_layout_against_brute_force():
    shapes = [(8, 16), (16, 8), (8, 24, 16), (24, 8, 40), (12, 40, 8, 20)]
    for epps in shapes:
        for total in range(1, 200, 3):
            pools = [
                SubPool(f"p{i}", e, 1, "up" if i == 0 else "down" if i == len(epps) - 1 else "float")
                for i, e in enumerate(epps)
            ]
            if not _every_pool_gets_a_page(total, epps):
                with pytest.raises(ValueError, match=r"^pool '"):
                    make_layout(total, pools)
                continue
            lay = make_layout(total, pools)
            assert lay.sink_bytes == max(epps) and lay.chain == tuple(p.name for p in pools)
            assert lay.total_bytes == total and lay.pools == {p.name: p for p in pools}
            for p in pools:
                g = lay.geometry[p.name]
                assert (g.epp, g.num_pages, g.min_page) == (p.epp, *_grid(total, p.epp, max(epps))), (total, epps)


def _pools(*spec):
    return [SubPool(*s) for s in spec]


U, F, D = ("u", 8, 1, "up"), ("f", 8, 1, "float"), ("d", 8, 1, "down")
LAYOUT = make_layout(4096, _pools(U, F, D))

# (call, pool named or None for an arena-wide error, words of the rule)
ERRORS = [
    (lambda: SubPool("", 8), "''", "non-empty string"),
    (lambda: SubPool(5, 8), "5", "non-empty string"),
    (lambda: SubPool("x", 0), "'x'", "entry_bytes must be a positive int, got 0"),
    (lambda: SubPool("x", 8, 1.5), "'x'", "page_size must be a positive int, got 1.5"),
    (lambda: SubPool("x", 8, 1, "sideways"), "'x'", "grow must be one of ('up', 'down', 'float'), got 'sideways'"),
    (lambda: SubPool("x", 8, 1, "up", "blob"), "'x'", "kind must be one of ('kv', 'state'), got 'blob'"),
    (lambda: SubPool("x", 8, 2, "up", "state"), "'x'", "a state pool has page_size 1, got 2"),
    (lambda: make_layout(0, _pools(U, D)), None, "total_bytes must be a positive int, got 0"),
    (lambda: make_layout(True, _pools(U, D)), None, "total_bytes must be a positive int, got True"),
    (lambda: make_layout(4096, [U, D]), None, "expected SubPool"),
    (lambda: make_layout(4096, _pools(U, D, ("u", 8, 1, "float"))), "'u'", "duplicate name"),
    (lambda: make_layout(4096, _pools(U, ("u2", 8, 1, "up"), D)), "'u2'", "a second 'up' pool"),
    (lambda: make_layout(4096, _pools(U, D, ("d2", 8, 1, "down"))), "'d2'", "a second 'down' pool"),
    (lambda: make_layout(4096, _pools(U, F)), None, "(pools 'u', 'f'): no 'down' pool"),
    (lambda: make_layout(4096, _pools(F, D)), None, "(pools 'f', 'd'): no 'up' pool"),
    (lambda: make_layout(4096, []), None, "(pools none): no 'up' pool"),
    (
        lambda: make_layout(100, _pools(("s", 1, 1, "up"), ("b", 64, 1, "down"))),
        "'b'",
        "no page above the 64-byte sink",
    ),
    (
        lambda: make_layout(86, _pools(("U", 10, 1, "up"), ("F", 33, 1, "float"), ("D", 10, 1, "down"))),
        "'F'",
        "never gets a page: with one page of every pool below it the buffer is used up to byte 50, "
        "and its 33-byte grid has no page above that within 86 bytes",
    ),
    (lambda: lazy_ends(LAYOUT, "u"), "'u'", "not a string"),
    (lambda: lazy_ends(LAYOUT, None), None, "lazy is a bool or a set of END-pool names, got None"),
    (lambda: lazy_ends(LAYOUT, 1), None, "got 1"),
    (lambda: lazy_ends(LAYOUT, {"zz"}), "'zz'", "unknown pool"),
    (lambda: lazy_ends(LAYOUT, [3]), "3", "unknown pool"),
    (lambda: lazy_ends(LAYOUT, {"f"}), "'f'", "only END pools can be lazy"),
    (lambda: borrowing(LAYOUT, [("f", "d")]), None, "borrow is a dict"),
    (lambda: borrowing(LAYOUT, {"f": "zz"}), "'zz'", "borrow names an unknown pool"),
    (lambda: borrowing(LAYOUT, {7: "d"}), "7", "borrow names an unknown pool"),
    (lambda: borrowing(LAYOUT, {"f": "f"}), "'f'", "cannot borrow its own ids"),
    (
        lambda: borrowing(LAYOUT, {"f": "d", "d": "u"}),
        "'d'",
        "lends ids to 'f' and borrows its own; a lender mints its ids",
    ),
    (lambda: check_policy("greedy"), None, "policy must be one of ('anchor', 'planner'), got 'greedy'"),
    (lambda: check_policy(None), None, "got None"),
]


@pytest.mark.parametrize("call,pool,rule", ERRORS, ids=[e[2] for e in ERRORS])
def test_every_configuration_error_names_the_pool_and_the_rule(call, pool, rule):
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(f"pool {pool}: " if pool else "arena"), msg
    assert rule in msg, msg


def test_borrowing_with_different_page_sizes():
    lay = make_layout(4096, _pools(U, ("f", 8, 2, "float"), D))
    with pytest.raises(ValueError, match=re.escape("pool 'f': borrows ids from 'd' but has page_size 2, not 1")):
        borrowing(lay, {"f": "d"})


def test_what_valid_options_come_back_as():
    assert lazy_ends(LAYOUT, True) == {"u", "d"} and lazy_ends(LAYOUT, False) == set()
    assert lazy_ends(LAYOUT, ["d"]) == {"d"} and lazy_ends(LAYOUT, frozenset()) == set()
    assert borrowing(LAYOUT, None) == {} and borrowing(LAYOUT, {"f": "d"}) == {"f": "d"}
    for p in geometry.POLICIES:
        assert check_policy(p) is None
    assert SubPool("s", 24, 1, "up", "state").epp == 24 and SubPool("k", 8, 4).epp == 32


def test_accounting_error_message():
    assert str(AccountingError("p", "live count")) == "pool 'p': live count"
    assert str(AccountingError("p", "live count", "3 != 4")) == "pool 'p': live count (3 != 4)"
    e = AccountingError("p", "rule")
    assert (e.pool, e.rule) == ("p", "rule") and isinstance(e, AssertionError)
