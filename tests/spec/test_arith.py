"""``spec/arith.py`` against independent oracles: brute force over small
integers (no formula is shared with the code under test), and the shim's z3
interpretation checked by evaluating the terms it builds.

These are the mutation-score tests of docs/results/suite-strength.md "Mutation score": each one pins
a corner that the scenario tests never reach (the two-END closed form, the
boot packing check, the golden gap's clamp, the shim on z3 terms)."""

import itertools
import random

import pytest
import z3

from kvarena.impl import capacity
from kvarena.spec import arith

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

# ------------------------------------------------------------ the oracles


def _bind_pages(pages, gap, epp, holes, room):
    """Bind ``pages`` pages on one END, one page at a time: a hole while any
    is left, else one page of extension out of ``gap`` bytes and ``room`` ids.
    Returns the bytes left, or None when some page finds neither."""
    for _ in range(pages):
        if holes:
            holes -= 1
        elif room and gap >= epp:
            room, gap = room - 1, gap - epp
        else:
            return None
    return gap


def _both_bind(pages, gap, ea, ha, ra, eb, hb, rb):
    """A coupled bind: END a first, then END b in the bytes a left."""
    left = _bind_pages(pages, gap, ea, ha, ra)
    return left is not None and _bind_pages(pages, left, eb, hb, rb) is not None


def _largest_joint(gap, ea, ha, ra, eb, hb, rb):
    p = 0
    while _both_bind(p + 1, gap, ea, ha, ra, eb, hb, rb):
        p += 1
    return p


_SMALL = list(itertools.product(range(10), (1, 2, 3), range(3), range(4), (1, 2, 3), range(3), range(4)))


def _sample(k, seed):
    return random.Random(seed).sample(_SMALL, k)


# ------------------------------------------------- two ENDs, one gap


@pytest.mark.parametrize("fn", [arith.two_end_joint_pages, capacity.two_end_joint_pages], ids=["spec", "impl"])
def test_two_end_joint_pages_is_the_largest_coupled_bind(fn):
    for args in _SMALL:
        got = fn(*args)
        assert type(got) is int, (args, got)
        assert got == _largest_joint(*args), args


def test_two_end_fits_is_both_gates():
    for gap, ea, ha, ra, eb, hb, rb in _SMALL:
        for p in range(ha + ra + 3):
            assert arith.two_end_fits(p, gap, ea, ha, ra, eb, hb, rb) is _both_bind(p, gap, ea, ha, ra, eb, hb, rb), (
                p,
                gap,
                ea,
                ha,
                ra,
                eb,
                hb,
                rb,
            )


def test_two_end_joint_pages_corners():
    # a runs out of holes first and the gap ends inside its solo stretch; then b first
    assert arith.two_end_joint_pages(5, 2, 0, 9, 3, 4, 9) == 2
    assert arith.two_end_joint_pages(5, 3, 4, 9, 2, 0, 9) == 2
    # the gap exactly covers the solo stretch: both extend after it
    assert arith.two_end_joint_pages(6, 2, 0, 9, 5, 3, 9) == 3
    # room caps, each side alone
    assert arith.two_end_joint_pages(100, 1, 1, 2, 1, 0, 9) == 3
    assert arith.two_end_joint_pages(100, 1, 0, 9, 1, 2, 1) == 3


_BAD = [
    (-1, 1, 0, 0, 1, 0, 0),
    (0, 0, 0, 0, 1, 0, 0),
    (0, 1, 0, 0, 0, 0, 0),
    (0, 1, -1, 0, 1, 0, 0),
    (0, 1, 0, -1, 1, 0, 0),
    (0, 1, 0, 0, 1, -1, 0),
    (0, 1, 0, 0, 1, 0, -1),
    (0, -1, 0, 0, 1, 0, 0),
    (0, 1, 0, 0, -1, 0, 0),
]


@pytest.mark.parametrize("fn", [arith.two_end_joint_pages, capacity.two_end_joint_pages], ids=["spec", "impl"])
@pytest.mark.parametrize("args", _BAD)
def test_two_end_joint_pages_rejects_each_bad_argument_alone(fn, args):
    with pytest.raises(ValueError, match=r"^two_end_joint_pages: sizes must be >= 0 and epps > 0$"):
        fn(*args)


# --------------------------------------------------------- first_pages


def _pack(grids):
    """Paint one page of each pool in chain order: the up END's first page,
    each float's lowest page clear of everything painted, the down END's top."""
    painted = 0  # bytes [0, painted) are taken
    out = []
    for i, (epp, n, m) in enumerate(grids):
        if i == 0:
            page = m
            fits = m < n
        elif i < len(grids) - 1:
            page = next(p for p in itertools.count(m) if p * epp >= painted)
            fits = page < n
        else:
            page = n - 1
            fits = m <= page and not any(page * epp <= b for b in range(painted))
            out.append((page, fits))
            break
        out.append((page, fits))
        painted = (page + 1) * epp
    return out


_GRID = list(itertools.product((1, 2, 3), range(4), range(3)))


def test_first_pages_two_pools_exhaustive():
    for up, down in itertools.product(_GRID, repeat=2):
        assert arith.first_pages([up, down]) == _pack([up, down]), (up, down)


def test_first_pages_with_floats():
    rng = random.Random(7)
    for _ in range(3000):
        grids = [rng.choice(_GRID) for _ in range(rng.choice((3, 4)))]
        assert arith.first_pages(grids) == _pack(grids), grids


def test_first_pages_corners():
    # the up END's min_page equal to its grid: no page
    assert arith.first_pages([(2, 3, 3), (1, 10, 0)])[0] == (3, False)
    # the down END's only page is its min_page
    assert arith.first_pages([(1, 5, 0), (4, 3, 2)])[-1] == (2, True)
    # the down END's grid ends below its min_page
    assert arith.first_pages([(1, 5, 0), (4, 2, 2)])[-1] == (1, False)
    # the chain's first grid is read from the first entry
    assert arith.first_pages([(3, 4, 1), (1, 20, 0)]) == [(1, True), (19, True)]


# ---------------------------------------------------------- golden_gap


def test_golden_gap_counts_the_bytes_between_the_frontiers():
    for wm_up, e_up, wm_down, e_down in itertools.product(range(5), (1, 2, 3), range(-1, 5), (1, 2, 3)):
        lo, hi = wm_up * e_up, (wm_down + 1) * e_down
        want = sum(1 for b in range(20) if lo <= b < hi)
        assert arith.golden_gap(wm_up, e_up, wm_down, e_down) == want


# ------------------------------------------------- the shim on z3 terms


def _value(term, **env):
    subs = [
        (
            z3.Int(k) if isinstance(v, int) and not isinstance(v, bool) else z3.Bool(k),
            z3.IntVal(v) if isinstance(v, int) and not isinstance(v, bool) else z3.BoolVal(v),
        )
        for k, v in env.items()
    ]
    v = z3.simplify(z3.substitute(term, *subs)) if subs else z3.simplify(term)
    return v.as_long() if z3.is_int_value(v) else z3.is_true(v)


def test_ite_builds_an_if():
    x = z3.Int("x")
    t = arith.ite(x > 0, x + 10, x - 10)
    assert z3.is_expr(t)
    assert _value(t, x=3) == 13 and _value(t, x=0) == -10


@pytest.mark.parametrize("op, py", [(arith.and_, all), (arith.or_, any)], ids=["and_", "or_"])
def test_and_or_on_z3_terms(op, py):
    names = ["p", "q", "r"]
    ps = [z3.Bool(n) for n in names]
    for k in (1, 2, 3):
        for extra in ((), (True,), (False,)):
            t = op(*ps[:k], *extra)
            for vals in itertools.product((False, True), repeat=k):
                want = py(list(vals) + list(extra))
                got = _value(t, **dict(zip(names, vals))) if z3.is_expr(t) else t
                assert got is want, (op.__name__, k, extra, vals)


def test_not_on_a_z3_term():
    p = z3.Bool("p")
    t = arith.not_(p)
    assert _value(t, p=True) is False and _value(t, p=False) is True


def test_fdiv_cdiv_on_z3_terms_floor_and_ceil():
    x, y = z3.Int("x"), z3.Int("y")
    for a in range(-7, 8):
        for b in (1, 2, 3):
            assert _value(arith.fdiv(x, b), x=a) == a // b
            assert _value(arith.fdiv(a, y), y=b) == a // b
            assert _value(arith.fdiv(x, y), x=a, y=b) == a // b
            assert _value(arith.cdiv(x, b), x=a) == -((-a) // b)


def test_two_end_joint_pages_on_z3_terms_reads_the_same():
    names = ["gap", "ea", "ha", "ra", "eb", "hb", "rb"]
    t = arith.two_end_joint_pages(*[z3.Int(n) for n in names])
    fits = arith.two_end_fits(z3.Int("p"), *[z3.Int(n) for n in names])
    for args in _sample(60, 3):
        env = dict(zip(names, args))
        want = _largest_joint(*args)
        assert _value(t, **env) == want, args
        assert _value(fits, p=want, **env) is True and _value(fits, p=want + 1, **env) is False, args


def test_two_end_joint_pages_with_one_z3_argument():
    # a proof may fix some sizes: the concrete-argument guard must not read a term
    names = ["gap", "ea", "ha", "ra", "eb", "hb", "rb"]
    for i, name in enumerate(names):
        for args in _sample(8, i):
            call = list(args)
            call[i] = z3.Int(name)
            assert _value(arith.two_end_joint_pages(*call), **{name: args[i]}) == _largest_joint(*args), (name, args)


def test_first_pages_on_z3_terms_reads_the_same():
    names = [f"{k}{i}" for i in range(3) for k in ("e", "n", "m")]
    terms = arith.first_pages([tuple(z3.Int(names[3 * i + j]) for j in range(3)) for i in range(3)])
    rng = random.Random(5)
    for _ in range(40):
        grids = [rng.choice(_GRID) for _ in range(3)]
        env = dict(zip(names, [v for g in grids for v in g]))
        assert [(_value(p, **env), _value(f, **env)) for p, f in terms] == _pack(grids), grids
