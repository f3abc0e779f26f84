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
from kvarena.spec.arith import ite

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
