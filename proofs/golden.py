"""The golden identity, and transparent floats are invisible to every walk."""

import itertools

import z3

from kvarena.spec import arith

from . import abstract as A
from .core import Built, Fresh, add


def _golden(s):
    up, down = s.pools[0], s.pools[-1]
    wm_up = s.bands[0].hi
    wm_down = s.bands[-1].lo - 1
    return arith.golden_gap(wm_up, up.epp, wm_down, down.epp)


def _transparent(s):
    return [s.bands[i].live == 0 for i in range(1, s.n - 1)]


def _golden_build(n, end):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        i = 0 if end == "up" else n - 1
        return Built(
            [A.layout_ok(s, first_pages=False), A.inv_all(s)] + _transparent(s),
            A.gap(s, i) == _golden(s),
            hints=A.layout_hint(s),
        )

    return build


for _n in (2, 3, 4):
    for _end in ("up", "down"):
        _fl = "" if _n == 2 else f" with {_n - 2} transparent float(s) between"
        add(
            f"golden.{_end}_gap.n{_n}",
            "golden",
            f"the {_end} END's chain-walk gap equals golden_gap(wm_up, epp_up, wm_down, epp_down){_fl}",
            _golden_build(_n, _end),
            timeout_s=20.0,
            # two ENDs: the walk's gap *is* the closed form (no hypothesis is used);
            # the identity has content once transparent floats stand between
            tautology="any" if _n == 2 else "conjuncts",
            kind="lemma" if _n == 2 else "property",
        )


def _drop(s, keep):
    return A.AState(s.total, s.sink, [s.pools[i] for i in keep], [s.bands[i] for i in keep])


def _invisible(s):
    """For each set of transparent floats: every walk of every remaining pool
    equals the walk in the chain with those floats removed."""
    n = s.n
    floats = list(range(1, n - 1))
    goal = []
    for r in range(1, len(floats) + 1):
        for gone in itertools.combinations(floats, r):
            keep = [i for i in range(n) if i not in gone]
            d = _drop(s, keep)
            eqs = []
            for k, i in enumerate(keep):
                eqs += [A.above(s, i) == A.above(d, k), A.below(s, i) == A.below(d, k)]
                if s.pools[i].grow != "float":
                    eqs.append(A.gap(s, i) == A.gap(d, k))
                    eqs.append(A.available(s, i) == A.available(d, k))
                else:
                    lo, hi = A.region(s, i)
                    lo2, hi2 = A.region(d, k)
                    eqs += [lo == lo2, hi == hi2]
            goal.append(z3.Implies(z3.And(*[s.bands[g].live == 0 for g in gone]), z3.And(*eqs)))
    return goal


for _n in (3, 4):
    add(
        f"golden.transparent_invisible.n{_n}",
        "golden",
        f"{_n} pools: removing any set of transparent floats changes no above/below walk, END gap, "
        "END available_pages or float region",
        A.on_every_state(_n, _invisible),
        timeout_s=30.0,
        # by construction of the walk (``abstract.above``/``below`` skip a band
        # whose opaque() is false); fidelity ties the walk to the spec's
        tautology="any",
        kind="lemma",
    )
