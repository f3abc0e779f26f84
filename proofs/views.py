"""The views a scheduler reads, sound and tight (issue 26).

``schedulable_pages`` of an END is what it promises once its growth-side
neighbour has flushed: a scheduler admits work on it and then runs the
ladder, whose first rung is that flush.  The statement a scheduler relies
on, for chains of 2, 3 and 4 pools with every size symbolic:

- **sound**: after the other END flushes whole (if it is lazy; an eager END
  keeps no holes), the END's ``available_pages`` is at least its
  ``schedulable_pages`` before the flush: the view credits nothing a flush
  cannot deliver (the anchor's ``float-own-ladder`` over-promised);
- **tight**: and at most that: the view credits all the flush delivers
  (an under-promise is a false OOM).

Both run the spec's own code: ``chain.schedulable`` and ``chain.available``
on a state, ``transitions.flush_end`` for the flush.  A float between the
ENDs with a live page keeps its holes, and the END's view credits none of
them; a transparent one lets the walk through.
"""

from kvarena.spec import chain
from kvarena.spec import transitions as T
from kvarena.spec.arith import ite, max_

from . import abstract as A
from .core import Built, Fresh, add

SIZES = (2, 3, 4)


def flushed_whole(s, t, j):
    """``t`` is ``s`` with END ``j`` flushed without a cap when it is lazy
    (its frontier on its packed edge), unchanged when it is eager."""
    a = s.bands[j]
    edge = a.lo + a.live if s.pools[j].grow == "up" else a.hi - a.live
    flushed = A.and_(T.flush_end_ok(s, j, edge), A.becomes(s, t, j, T.flush_end(s, j, edge)))
    return ite(s.pools[j].lazy, flushed, A.becomes(s, t, j, s.bands[j]))


def _schedulable(i, n, sound):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        t = A.symbolic_state(f, "t_", like=s)
        j = n - 1 - i  # the other END, where an END's growth ends
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), flushed_whole(s, t, j)]
        promised, after = chain.schedulable(s, i), chain.available(t, i)
        goal = promised <= after if sound else after <= promised
        return Built(hyps, goal, hints=A.layout_hint(s))

    return build


for _n in SIZES:
    for _i, _e in ((0, "up"), (_n - 1, "down")):
        add(
            f"views.schedulable.{_e}.n{_n}.sound",
            "views",
            f"{_n} pools, {_e} END: once the other END flushes whole, available_pages >= the schedulable_pages "
            "promised before (the view credits nothing a flush cannot deliver)",
            _schedulable(_i, _n, True),
            timeout_s=30.0,
        )
        add(
            f"views.schedulable.{_e}.n{_n}.tight",
            "views",
            f"{_n} pools, {_e} END: once the other END flushes whole, available_pages <= the schedulable_pages "
            "promised before (the view credits all the flush delivers)",
            _schedulable(_i, _n, False),
            timeout_s=30.0,
        )


# --------------------------------------------------- the composites' joint view
#
# A composite's joint view (``available_size``) is the largest ``P`` whose
# coupled bind passes ``transitions.coupled_fits``, found by a binary search
# over ``[0, available(full)]`` (``spec.composites._joint_pages``; the
# implementation's TriPool searches its twin gate the same way).  A binary
# search finds the largest passing ``P`` exactly when the predicate is
# down-closed; so the view is sound (``alloc_extend`` of ``available_size()``
# tokens binds without relief) and tight (one page more does not) iff
# these hold.  The uneven demand's search (``_kept_pages``: keep ``K`` of
# ``P_f`` full pages, swa binding ``max(0, P_s - (P_f - K))``) needs the same.

COMPOSITES = {"hybrid": (2, 1, 0), "tripool": (3, 2, 1)}  # pools, full's index, swa's index


def _joint_down_closed(n, full, swa, uneven):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        P = f.int("P")
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), P >= 0]
        if uneven:
            pf, ps_n = f.int("Pf"), f.int("Ps")
            hyps += [P + 1 <= pf, ps_n >= 0, ps_n <= pf]

            def fits(k):
                return T.coupled_fits(s, full, swa, k, max_(0, ps_n - (pf - k)))

        else:

            def fits(k):
                return T.coupled_fits(s, full, swa, k, k)

        hyps.append(fits(P + 1))
        if s.pools[swa].grow == "float":  # one query per float shape and per full bind (holes only, or extending)
            opaque, holes_only = A.opaque(s, swa), P + 1 <= s.bands[full].holes
            cases = [[o, h] for o in (opaque, A.not_(opaque)) for h in (holes_only, A.not_(holes_only))]
            return Built(hyps, None, cases=cases, case_goals=[fits(P)] * 4, hints=A.layout_hint(s))
        return Built(hyps, fits(P), hints=A.layout_hint(s))

    return build


for _c, (_n, _full, _swa) in COMPOSITES.items():
    add(
        f"views.joint.{_c}.down_closed",
        "views",
        f"{_c} ({_n} pools): the coupled bind of P+1 pages passing its gates (transitions.coupled_fits) => so "
        "does P: the joint view's binary search finds the largest P, so available_size() binds without relief "
        "and one page more does not",
        _joint_down_closed(_n, _full, _swa, False),
        timeout_s=30.0,
    )
    add(
        f"views.joint.{_c}.uneven_down_closed",
        "views",
        f"{_c} ({_n} pools), uneven demand (Pf full pages, swa the last Ps): keeping K+1 <= Pf of them passing "
        "the gates (swa binding max(0, Ps - (Pf - K - 1))) => so does keeping K: the shortfall's search "
        "(_kept_pages) finds the largest K",
        _joint_down_closed(_n, _full, _swa, True),
        timeout_s=30.0,
    )
