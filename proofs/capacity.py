"""Capacity soundness and exactness.

- ``n <= available_pages`` implies the allocation succeeds with no
  relocation (only the pool's own band changes, by holes and extension) and
  every invariant holds afterwards;
- the bound is exact: ``available + 1`` pages cannot be placed without
  overlapping a neighbour, leaving the grid or running out of ids -- for
  ENDs and floats, with every neighbour frontier symbolic and therefore
  possibly off this pool's grid (anchor bugs 1 and 5);
- two refutations document the anchor's bug class: pricing a float's region
  in raw bytes, and the down END checking its extension on a floored page
  index, both over-promise.
"""

import z3

from kvarena.spec import arith
from kvarena.spec import transitions as T

from . import abstract as A
from .core import Built, Fresh, add

SIZES = (2, 3, 4)  # pools in the chain: every END obligation for each, the floats' for 3 and 4


def floats(n):
    return range(1, n - 1)


def _base(n=4):
    f = Fresh()
    s = A.symbolic_state(f, "s_", n=n)
    t = A.symbolic_state(f, "t_", like=s)
    return f, s, t, [A.layout_ok(s, first_pages=False), A.inv_all(s)]


def _end_sound(i, n_pools):
    def build():
        f, s, t, hyps = _base(n_pools)
        n = f.int("n")
        return Built(hyps + [A.rel_alloc_end(s, t, i, n)], A.inv_all(t), hints=A.layout_hint(s))

    return build


def _extended_end(s, t, i, n):
    """t is s with END i given n more pages by the spec's transition (holes
    first, then extension), with no gate."""
    return A.becomes(s, t, i, T.alloc_end(s, i, n))


def _end_tight(i, n_pools):
    def build():
        f, s, t, hyps = _base(n_pools)
        n = f.int("n")
        hyps += [n == A.available(s, i) + 1, _extended_end(s, t, i, n)]
        return Built(hyps, z3.Not(A.inv_all(t)), hints=A.layout_hint(s))

    return build


for _n in SIZES:
    for _i, _e in ((0, "up"), (_n - 1, "down")):
        add(
            f"capacity.end_{_e}.sound.n{_n}",
            "capacity",
            f"{_n} pools, {_e} END: 1 <= n <= available_pages => alloc succeeds by holes + extension only, "
            "invariants hold",
            _end_sound(_i, _n),
            timeout_s=30.0,
        )
        add(
            f"capacity.end_{_e}.tight.n{_n}",
            "capacity",
            f"{_n} pools, {_e} END: n = available_pages + 1 cannot be placed (the placement breaks an invariant)",
            _end_tight(_i, _n),
            timeout_s=30.0,
        )


def _float_gate(n_pools):
    f, s, _t, hyps = _base(n_pools)
    n = f.int("n")
    cases = []
    goals = []
    for i in floats(n_pools):
        a = s.bands[i]
        # the spec's choice of side, and the room it needs there
        lo, hi = A.region(s, i)
        m = n - a.holes
        fits = z3.If(T.float_extends_high(s, i), m <= hi - a.hi, m <= a.lo - lo)
        cases.append([n >= 1, n <= A.available(s, i), A.opaque(s, i)])
        goals.append(z3.Or(n <= a.holes, fits))
    return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))


def _float_sound(n_pools):
    f, s, t, hyps = _base(n_pools)
    n = f.int("n")
    rels = [
        A.rel_alloc_float_holes,
        A.rel_alloc_float_extend_low,
        A.rel_alloc_float_extend_high,
        A.rel_alloc_float_parked,
    ]
    cases = [[r(s, t, i, n)] for i in floats(n_pools) for r in rels]
    # bytes, not pages: the placed span lies inside the neighbours' frontiers
    goal = [A.inv_all(t)]
    for i in floats(n_pools):
        goal.append(
            z3.Implies(t.bands[i].live > 0, z3.And(A.low_f(t, i) >= A.below(s, i), A.high_f(t, i) <= A.above(s, i)))
        )
    return Built(hyps, z3.And(*goal), cases=cases, hints=A.layout_hint(s))


def cdiv_galois(x, b, e):
    """x*e >= b  <=>  x >= cdiv(b, e), for e > 0."""
    return z3.Implies(e > 0, (x * e >= b) == (x >= arith.cdiv(b, e)))


def fdiv_galois(x, a, e):
    """x*e <= a  <=>  x <= fdiv(a, e), for e > 0."""
    return z3.Implies(e > 0, (x * e <= a) == (x <= arith.fdiv(a, e)))


def _lemma(fn):
    def build():
        f = Fresh()
        x, b, e = f.int("x"), f.int("b"), f.int("e")
        return Built([e > 0], fn(x, b, e), hints=[e == 3, b == 7])

    return build


add(
    "capacity.lemma.cdiv_galois",
    "capacity",
    "for e > 0: x*e >= b <=> x >= cdiv(b, e) (used by tight_parked)",
    _lemma(cdiv_galois),
    timeout_s=20.0,
    tautology="any",
    kind="lemma",
)
add(
    "capacity.lemma.fdiv_galois",
    "capacity",
    "for e > 0: x*e <= a <=> x <= fdiv(a, e) (used by tight_parked)",
    _lemma(fdiv_galois),
    timeout_s=20.0,
    tautology="any",
    kind="lemma",
)


def _float_tight(parked, n_pools):
    def build():
        f, s, _t, hyps = _base(n_pools)
        n, x = f.int("n"), f.int("x")
        cases, goals = [], []
        for i in floats(n_pools):
            p, a = s.pools[i], s.bands[i]
            bl, ab = A.below(s, i), A.above(s, i)
            avail = A.available(s, i)
            room_ok = a.live + n <= p.num_pages - p.min_page
            m = n - a.holes

            def fits(lo_pg, hi_pg, p=p, bl=bl, ab=ab):
                return z3.And(lo_pg >= p.min_page, hi_pg <= p.num_pages, lo_pg * p.epp >= bl, hi_pg * p.epp <= ab)

            base = [n == avail + 1, room_ok]
            if parked:  # no start page x places n pages
                # lemmas capacity.lemma.cdiv_galois / fdiv_galois, instantiated at x and x+n
                lem = [cdiv_galois(x, bl, p.epp), fdiv_galois(x + n, ab, p.epp)]
                cases.append(base + [z3.Not(A.opaque(s, i))] + lem)
                goals.append(z3.Not(fits(x, x + n)))
            else:  # neither side can take the m pages the holes leave
                for side_fits in (fits(a.lo - m, a.hi), fits(a.lo, a.hi + m)):
                    cases.append(base + [A.opaque(s, i)])
                    goals.append(z3.Not(side_fits))
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))

    return build


for _n in SIZES[1:]:
    _of = f"{_n} pools, each float"
    add(
        f"capacity.float.gate_complete.n{_n}",
        "capacity",
        f"{_of}, opaque: 1 <= n <= available_pages => holes cover n or one side's extension fits "
        "(alloc's bound pages, transitions.alloc_float, always fit the gate)",
        lambda _n=_n: _float_gate(_n),
        timeout_s=30.0,
    )
    add(
        f"capacity.float.sound.n{_n}",
        "capacity",
        f"{_of} (holes / extend low / extend high / parked): n <= available_pages => the new span lies within "
        "the neighbours' byte frontiers (off-grid included) and all invariants hold",
        lambda _n=_n: _float_sound(_n),
        timeout_s=40.0,
    )
    add(
        f"capacity.float.tight_opaque.n{_n}",
        "capacity",
        f"{_of}, opaque: n = available_pages + 1 (ids permitting) cannot be placed: no one-sided extension "
        "keeps the span on the grid inside the neighbours' (off-grid) frontiers",
        _float_tight(False, _n),
        timeout_s=40.0,
    )
    add(
        f"capacity.float.tight_parked.n{_n}",
        "capacity",
        f"{_of}, parked: n = available_pages + 1 (ids permitting) cannot be placed: no start page keeps "
        "n pages on the grid inside the neighbours' (off-grid) frontiers",
        _float_tight(True, _n),
        timeout_s=40.0,
    )


def _raw_bytes():
    f, s, _t, hyps = _base()
    n, i = f.int("n"), 1
    p = s.pools[i]
    bl, ab = A.below(s, i), A.above(s, i)
    raw = arith.fdiv(ab - bl, p.epp)  # raw byte pricing of the region
    lo, hi = A.region(s, i)
    hyps += [z3.Not(A.opaque(s, i)), n == raw, n >= 1, n <= p.num_pages - p.min_page]
    # claim (false): the raw price always fits in the page-grid region
    return Built(hyps, n <= hi - lo, hints=A.layout_hint(s))


add(
    "capacity.float.raw_bytes_overpromise",
    "capacity",
    "REFUTED (bug-class demo, anchor bug 1; the spec rounds inward instead): pricing a parked float's region "
    "in raw bytes, (above-below)//epp, always fits its page-grid region",
    _raw_bytes,
    timeout_s=20.0,
    expect="counterexample",
    kind="demo",
    source="anchor",
)


def _down_floor():
    f, s, _t, hyps = _base()
    i = 3
    p, a = s.pools[i], s.bands[i]
    bl = A.below(s, i)
    m = f.int("m")
    # the anchor's check: extend down to page lo-m if lo-m >= below // epp
    hyps += [m >= 1, a.lo - m >= arith.fdiv(bl, p.epp), a.lo - m >= p.min_page]
    return Built(hyps, (a.lo - m) * p.epp >= bl, hints=A.layout_hint(s))


add(
    "capacity.end_down.floor_check_overlaps",
    "capacity",
    "REFUTED (bug-class demo, anchor bug 5; the spec prices the gap in bytes instead): a down END extension "
    "checked as lo-m >= below // epp never overlaps the band below",
    _down_floor,
    timeout_s=20.0,
    expect="counterexample",
    kind="demo",
    source="anchor",
)
