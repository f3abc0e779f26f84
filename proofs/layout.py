"""Layout obligations: the sink, min_page, grids, float regions, pool order.

``layout_terms`` is ``arith.layout_grids``, the function
``spec.geometry.make_layout`` calls for the sink and every grid, and
``_valid`` its acceptance test: ``arith.first_pages`` on the grids in chain
order, the very function make_layout calls; ``tests/test_proofs_fidelity`` checks both
against ``make_layout`` on concrete configurations.  The pools of a
symbolic configuration are given in chain order (pool 0 the up END, the
last the down END, floats between).

Entry sizes and ``total_bytes`` are symbolic; each page size is a symbolic
member of {1, 2, 4, 8, 16, 32, 64} (so every size in the set, for every pool
independently, is covered by one obligation).
"""

import z3

from kvarena.spec import arith

from . import abstract as A
from .core import Built, Fresh, add

PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64)


layout_terms = arith.layout_grids  # (sink, [(epp, num_pages, min_page)]): the code make_layout runs


def _config(f, n):
    total = f.int("total")
    entries = [f.int(f"entry{i}") for i in range(n)]
    pss = [f.int(f"page_size{i}") for i in range(n)]
    hyps = [total > 0]
    for e, p in zip(entries, pss):
        hyps += [e >= 1, z3.Or(*[p == v for v in PAGE_SIZES])]
    return total, entries, pss, hyps


def _valid(total, sink, geo):
    """make_layout's acceptance conditions, with ``geo`` in chain order (up
    END first, down END last): a page above the sink for everyone, and every
    ``fits`` of ``arith.first_pages`` -- the function make_layout calls."""
    cs = [g[1] > g[2] for g in geo]
    cs += [fits for _, fits in arith.first_pages([tuple(g) for g in geo])]
    return cs


def _hint(total, entries, pss):
    return [total == 4096] + [e == 3 + 2 * i for i, e in enumerate(entries)] + [p == 4 for p in pss]


def _build(n, goal_fn, valid=True):
    """``goal_fn`` returns a list of goals, each its own z3 query: a fact per
    pool (or per permutation) is small and quick, where their conjunction
    over four pools of nonlinear grid arithmetic can time out under load."""

    def build():
        f = Fresh()
        total, entries, pss, hyps = _config(f, n)
        sink, geo = layout_terms(total, entries, pss)
        if valid:
            hyps += _valid(total, sink, geo)
        goals = goal_fn(f, total, entries, pss, sink, geo)
        return Built(hyps, None, cases=[[]] * len(goals), case_goals=goals, hints=_hint(total, entries, pss))

    return build


def _sink_covers(f, total, entries, pss, sink, geo):
    # page 0 of every grid is [0, epp) and lies in the sink [0, sink); the first
    # usable page lies wholly above it
    return [z3.And(e <= sink, m >= 1, m * e >= sink) for e, _, m in geo]


def _min_page_least(f, total, entries, pss, sink, geo):
    # no lower page lies wholly above the sink, and the sink is one of the epps
    return [(m - 1) * e < sink for e, _, m in geo] + [z3.Or(*[sink == e for e, _, _ in geo])]


def _grid_fits(f, total, entries, pss, sink, geo):
    # the grid ends inside the buffer and is the largest such grid
    return [z3.And(np_ * e <= total, (np_ + 1) * e > total, np_ >= 0) for e, np_, _ in geo]


def _num_pages_by_epp(f, total, entries, pss, sink, geo):
    # (total // entry) // page_size == total // epp: the abstract state's num_pages
    return [np_ == arith.fdiv(total, e) for e, np_, _ in geo]


def _order_goals(total, entries, pss, sink, geo):
    """One goal per swap of two neighbouring pools: the swapped layout has
    the same sink and grids.  The swaps generate every permutation, and
    "same layout" composes, so this covers every pool order (the n4 lemma
    took 24 queries and 15 s as one per permutation; 3 queries now)."""
    goals = []
    n = len(entries)
    for k in range(n - 1):
        perm = list(range(n))
        perm[k], perm[k + 1] = perm[k + 1], perm[k]
        s2, g2 = layout_terms(total, [entries[i] for i in perm], [pss[i] for i in perm])
        cs = [s2 == sink]
        for k, i in enumerate(perm):
            cs += [g2[k][0] == geo[i][0], g2[k][1] == geo[i][1], g2[k][2] == geo[i][2]]
        goals.append(z3.And(*cs))
    return goals


def _order_independent(f, total, entries, pss, sink, geo):
    return _order_goals(total, entries, pss, sink, geo)


FACTS = {
    "sink_covers_page0": (_sink_covers, "every pool's page 0 lies in the sink and its min_page lies above it"),
    "min_page_least": (_min_page_least, "min_page is the least page wholly above the sink; sink = max epp"),
    "grid_fits": (_grid_fits, "every grid fits within the buffer and is maximal"),
    "num_pages_by_epp": (_num_pages_by_epp, "(total // entry) // page_size == total // epp"),
    "order_independent": (_order_independent, "a layout given in any pool order has the same sink and per-pool grids"),
}

for _n in (2, 3, 4):
    for _fact, (_fn, _st) in FACTS.items():
        add(
            f"layout.{_fact}.n{_n}",
            "layout",
            f"{_n} pools, symbolic total/entry sizes, page sizes in {{1..64}}: {_st}",
            _build(_n, _fn, valid=_fact != "num_pages_by_epp"),
            timeout_s=60.0 if _fact == "order_independent" else 30.0,
            # the same sink and grids in any order holds by construction of
            # layout_terms (max is commutative; each grid is its own pool's)
            tautology="any" if _fact == "order_independent" else "conjuncts",
            kind="lemma" if _fact == "order_independent" else "property",
        )


# ------------------------------------------------- every pool allocates


def _galois_cdiv(x, b, e):
    """x*e >= b  <=>  x >= cdiv(b, e), for e > 0 (proved: capacity.lemma.cdiv_galois)."""
    return z3.Implies(e > 0, (x * e >= b) == (x >= arith.cdiv(b, e)))


def _galois_fdiv(x, a, e):
    """x*e <= a  <=>  x <= fdiv(a, e), for e > 0 (proved: capacity.lemma.fdiv_galois)."""
    return z3.Implies(e > 0, (x * e <= a) == (x <= arith.fdiv(a, e)))


def _allocates_build(n):
    """``layout_ok`` -- which holds every ``fits`` of ``arith.first_pages``
    -- implies ``available(boot, i) >= 1`` for every pool ``i``: one query
    per pool, each with the lemma instances that chain the packed first
    pages (``page_k * epp_k >= high_{k-1}``) and price the boot region."""

    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        boot = A.boot_state(s)
        grids = A.grids(s)
        firsts = arith.first_pages(grids)
        lem = []
        high = (grids[0][2] + 1) * grids[0][0]  # the up END's first page's high frontier
        for (e, _, _m), (page, _) in list(zip(grids, firsts))[1:-1]:
            lem.append(_galois_cdiv(page, high, e))
            high = (page + 1) * e
        cases, goals = [], []
        for i in range(n):
            p = boot.pools[i]
            if p.grow == "float":
                extra = [
                    _galois_cdiv(firsts[i][0], A.below(boot, i), p.epp),
                    _galois_fdiv(firsts[i][0] + 1, A.above(boot, i), p.epp),
                ]
            else:
                extra = [_galois_fdiv(1, A.gap(boot, i), p.epp)]
            cases.append(lem + extra)
            goals.append(A.available(boot, i) >= 1)
        return Built([A.layout_ok(s)], None, cases=cases, case_goals=goals, hints=A.layout_hint(s))

    return build


for _n in (2, 3, 4):
    add(
        f"layout.every_pool_allocates.n{_n}",
        "layout",
        f"{_n} pools, symbolic layout numbers: a valid layout (make_layout's conditions, every "
        "arith.first_pages fits) gives every pool available_pages >= 1 in the boot state (up END empty "
        "at min_page, floats parked, down END empty at num_pages); one query per pool",
        _allocates_build(_n),
        timeout_s=30.0,
    )


# ---------------------------------------------------------- float regions


def _regions(s):
    goal = []
    for i in range(1, s.n - 1):
        p, b = s.pools[i], s.bands[i]
        lo, hi = A.region(s, i)
        bl, ab = A.below(s, i), A.above(s, i)
        goal += [
            lo >= p.min_page,
            hi <= p.num_pages,  # on the grid, above the sink
            lo * p.epp >= bl,
            hi * p.epp <= ab,  # inside the neighbours' frontiers
            # maximal: one more page on either side leaves the grid or overlaps
            z3.Or(lo - 1 < p.min_page, (lo - 1) * p.epp < bl),
            z3.Or(hi + 1 > p.num_pages, (hi + 1) * p.epp > ab),
            # an opaque float's own span lies in its region
            z3.Implies(b.live > 0, z3.And(lo <= b.lo, b.hi <= hi)),
        ]
    return goal


for _n in (3, 4):
    add(
        f"layout.float_region.n{_n}",
        "layout",
        f"{_n} pools, symbolic state: each float's region is page-aligned on its grid, lies inside its "
        "opaque neighbours' (possibly off-grid) frontiers, is maximal, and holds its span",
        A.on_every_state(_n, _regions),
        timeout_s=30.0,
    )
