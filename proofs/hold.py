"""Move holds for host transfers (docs/design.md §13), on the spec's own code.

While a host transfer is in flight (the gate is closed) or a band holds a
reserved page, no live page may change its physical page
(``Arena.moves_held``).  The rule is arithmetic in two places, and the
obligations here are about those two:

**A view that counts a reservation.**  ``Arena.reserve(name, n)`` takes
``n`` pages as ``alloc`` does (``transitions.alloc``: the same counts, live
but owned by no id) and ``cancel`` gives them back as holes
(``transitions.free``).  A round trip (reserve ``n``, then cancel the same
``n``, every END lazy: a hold needs lazy ENDs) must take back no promise:

- ``hold.round_trip.{up,down}.nN`` (proved, N = 2, 3, 4): an END's round trip leaves
  its own ``available_pages`` and both ENDs' ``schedulable_pages`` at least
  what they were (the cancelled extension is a lazy END's holes, which the
  other END's view credits);
- ``hold.round_trip.float.nN`` (proved, N = 3, 4): a float's round trip leaves the
  float's ``available_pages`` at least what it was;
- ``hold.round_trip.float.ends.n3`` (refuted, a finding): a float's round
  trip can lower an END's ``schedulable_pages``: the float extended toward
  its larger gap, and the cancelled pages are *float* holes, which no END's
  view credits (docs/design.md §5);
- ``hold.round_trip.float.flushed.n3`` (proved): the END's first rung, the
  float's flush (a float's flush only absorbs boundary holes, so a hold
  allows it), takes the drop back: the cancelled extension lies beyond the
  float's live pages, so the refit span lies inside the span before the
  reserve (the page-level fact the relation assumes, checked on the spec's
  runs in ``tests/proofs/test_hold.py``);
- ``hold.round_trip.{up,down}.held.nN`` (proved, N = 2, 3): under a hold, an END's
  round trip lowers the other END's *held* view (its ``available_pages``:
  the held view credits no hole), and the other END's held ladder step (an
  absorb-only flush of its flush target) takes it back: the cancelled
  extension lies beyond every live page of the reserving END, so an
  absorb-only flush brings its frontier back at least to where it was.

**A gate that blocks a move.**  While held, ``flush`` only absorbs
(``max_moves=0``): a lazy END's frontier comes in over the holes at its
frontier and stops at the first live, guarded or reserved page; a float
refits to its live pages as always.  In counts that is
``abstract.rel_flush_end`` with *any* frontier ``transitions.flush_end_ok``
allows (which one depends on where the holes lie) and
``abstract.rel_flush_float``.  So an END's ``schedulable_available_size``
drops its credit under a hold (it is ``chain.available``):

- ``hold.ladder.{up,down}.nN.sound`` (proved, N = 3, 4): under a hold, the
  held view is at most what the held ladder's END step delivers: the urgent
  flush of the END's flush target (``Arena.flush_targets``: the first
  opaque band on its growth side, a float when one is opaque, which
  refits, else the other END, which absorbs only).  With two pools the
  target is the other END, and this is the ``available_pages`` goal of
  ``inflight.partial_flush.*.n2`` for that END's flush (any frontier the
  guard allows), not restated;
- ``hold.ladder.{up,down}.n2.credit_unsound`` (refuted, a finding): the
  unheld view, ``chain.schedulable``, is *not* sound against an absorb-only
  flush of the other END: a live page at that END's frontier keeps every
  hole behind it, and only a move would deliver the credit.  This is why
  the view must drop it under a hold (``views.schedulable.*.sound`` proves
  it sound against the whole flush, which moves).

Every state, view and transition is the spec's (``chain``,
``transitions``), run on z3 terms; ``tests/proofs/test_hold.py`` ties each
relation to the spec arena's ``reserve``, ``cancel`` and held ``flush``.
"""

from kvarena.spec import chain
from kvarena.spec import transitions as T

from . import abstract as A
from .core import Built, Fresh, add

SIZES = (2, 3, 4)
TIMEOUT_S = 30.0


def ends(n):
    """``((index, "up"), (index, "down"))`` of an ``n``-pool chain."""
    return ((0, "up"), (n - 1, "down"))


def lazy_ends(s):
    """Every END lazy: ``close_gate`` and ``reserve`` refuse an eager END (``Arena._require_lazy``)."""
    return A.and_(s.pools[0].lazy, s.pools[-1].lazy)


def reserved(s, u, i, n):
    """``u`` is ``s`` after ``reserve(pool i, n)``: the pages ``alloc`` would
    take (``Arena._hand_out``), ``1 <= n <= available_pages``."""
    return A.and_(T.alloc_ok(s, i, n), A.becomes(s, u, i, T.alloc(s, i, n)))


def cancelled(u, t, i, k):
    """``t`` is ``u`` after ``cancel`` of ``k`` reserved pages of pool ``i``:
    ``transitions.free`` (holes; a float left with no live page parks)."""
    return A.and_(T.free_ok(u, i, k), A.becomes(u, t, i, T.free(u, i, k)))


def within(s, t, i):
    """Band ``i`` of ``t`` lies inside band ``i`` of ``s``, on the side(s)
    it can grow: an END's frontier is back at least where it was, a float's
    span is inside the old one (an opaque float; a parked one stays parked)."""
    a, b = s.bands[i], t.bands[i]
    grow = s.pools[i].grow
    if grow == "up":
        return b.hi <= a.hi
    if grow == "down":
        return b.lo >= a.lo
    return A.implies(A.opaque(s, i), A.and_(a.lo <= b.lo, b.hi <= a.hi))


def held_step(s, t, i, bound=None):
    """The held ladder's END step for END ``i``, as cases: ``urgent_flush(i)``
    flushes its flush target, the first opaque band on its growth side
    (``Arena.flush_targets``).  A float target refits to its live pages
    (``abstract.rel_flush_float``); the other END absorbs only, to any
    frontier its guard allows (``abstract.rel_flush_end``: which frontier
    depends on where the holes lie, and a held flush moves nothing).

    ``bound``: a state whose band the target's flush stays inside
    (``within``): the page-level fact of a cancelled reservation.
    """
    up = s.pools[i].grow == "up"
    cases, passed = [], []
    for k in range(i + 1, s.n) if up else range(i - 1, -1, -1):
        extra = [] if bound is None else [within(bound, t, k)]
        if s.pools[k].grow == "float":
            cases.append(passed + [A.opaque(s, k), A.rel_flush_float(s, t, k)] + extra)
            passed = passed + [A.parked(s, k)]  # transparent: the walk goes on
        else:
            cases.append(passed + [A.rel_flush_end(s, t, k)] + extra)
    return cases


def _setup(n, tags=("s_",)):
    f = Fresh()
    s = A.symbolic_state(f, tags[0], n=n)
    rest = [A.symbolic_state(f, tag, like=s) for tag in tags[1:]]
    hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), lazy_ends(s)]
    return f, s, rest, hyps


def _float_variants(s, i, n):
    """The reserve's variants on a float (``transitions.alloc_float``), one
    case each: parked, within its holes, extending high, extending low."""
    opaque, holes = A.opaque(s, i), s.bands[i].holes
    high = T.float_extends_high(s, i)
    return [
        [A.parked(s, i)],
        [opaque, n <= holes],
        [opaque, n > holes, high],
        [opaque, n > holes, A.not_(high)],
    ]


# ------------------------------------------------------- a view that counts a reservation


def _round_trip(i, n_pools):
    def build():
        f, s, (u, t), hyps = _setup(n_pools, ("s_", "u_", "t_"))
        n = f.int("n")
        hyps += [reserved(s, u, i, n), cancelled(u, t, i, n)]
        goals = [chain.available(t, i) >= chain.available(s, i)]
        goals += [chain.schedulable(t, e) >= chain.schedulable(s, e) for e, _ in ends(n_pools)]
        # one query per view: each is easy, their conjunction harder
        return Built(hyps, None, cases=[[] for _ in goals], case_goals=goals, hints=A.layout_hint(s))

    return build


def _float_round_trip(n_pools, goal_of):
    def build():
        f, s, (u, t), hyps = _setup(n_pools, ("s_", "u_", "t_"))
        n = f.int("n")
        hyps += [reserved(s, u, 1, n), cancelled(u, t, 1, n)]
        cases = _float_variants(s, 1, n)
        goal = goal_of(s, t)
        return Built(hyps, None, cases=cases, case_goals=[goal] * len(cases), hints=A.layout_hint(s))

    return build


def ends_schedulable_kept(s, t):
    """Both ENDs' ``schedulable_pages`` in ``t`` are at least what they were in ``s``."""
    return A.and_(*[chain.schedulable(t, e) >= chain.schedulable(s, e) for e, _ in ends(s.n)])


def _float_round_trip_flushed(n_pools):
    def build():
        f, s, (u, t, w), hyps = _setup(n_pools, ("s_", "u_", "t_", "w_"))
        n = f.int("n")
        hyps += [reserved(s, u, 1, n), cancelled(u, t, 1, n), A.rel_flush_float(t, w, 1), within(s, w, 1)]
        cases = _float_variants(s, 1, n)
        goal = ends_schedulable_kept(s, w)
        return Built(hyps, None, cases=cases, case_goals=[goal] * len(cases), hints=A.layout_hint(s))

    return build


def _held_round_trip(i, n_pools):
    def build():
        f, s, (u, t, w), hyps = _setup(n_pools, ("s_", "u_", "t_", "w_"))
        n = f.int("n")
        j = n_pools - 1 - i  # the other END, whose held view the round trip may lower
        hyps += [reserved(s, u, i, n), cancelled(u, t, i, n)]
        cases = held_step(t, w, j, bound=s)
        goal = chain.available(w, j) >= chain.available(s, j)
        witnesses = [[chain.available(t, j) < chain.available(s, j)]]  # the round trip does lower it
        return Built(
            hyps, None, cases=cases, case_goals=[goal] * len(cases), witnesses=witnesses, hints=A.layout_hint(s)
        )

    return build


for _n in SIZES:
    for _i, _e in ends(_n):
        add(
            f"hold.round_trip.{_e}.n{_n}",
            "hold",
            f"{_n} pools, every END lazy, the {_e} END reserves n pages (transitions.alloc, 1 <= n <= "
            "available_pages) and cancels the same n (transitions.free: holes): its available_pages and both ENDs' "
            "schedulable_pages are at least what they were (a reservation's round trip takes back no promise)",
            _round_trip(_i, _n),
            timeout_s=TIMEOUT_S,
        )
for _n in (3, 4):
    add(
        f"hold.round_trip.float.n{_n}",
        "hold",
        f"{_n} pools, every END lazy, the float next to the up END reserves n pages (transitions.alloc: parked, "
        "within its holes, or extending either way) and cancels the same n (transitions.free: holes, or parked "
        "again): its available_pages is at least what it was",
        _float_round_trip(_n, lambda s, t: chain.available(t, 1) >= chain.available(s, 1)),
        timeout_s=TIMEOUT_S,
    )
add(
    "hold.round_trip.float.ends.n3",
    "hold",
    "REFUTED (finding): 3 pools, every END lazy, the float reserves n pages and cancels them: both ENDs' "
    "schedulable_pages are at least what they were.  A float that extended toward an END keeps the cancelled pages "
    "as its own holes, which no END's view credits: the END's view drops until the float's flush absorbs them",
    _float_round_trip(3, ends_schedulable_kept),
    timeout_s=TIMEOUT_S,
    expect="counterexample",
)
add(
    "hold.round_trip.float.flushed.n3",
    "hold",
    "3 pools, every END lazy, the float reserves n pages, cancels them, then flushes (an END's first rung: "
    "absorb only, allowed under a hold), the refit span inside its span before the reserve (the cancelled "
    "extension lies beyond its live pages): both ENDs' schedulable_pages are at least what they were",
    _float_round_trip_flushed(3),
    timeout_s=TIMEOUT_S,
)
for _n in (2, 3):
    for _i, _e in ends(_n):
        add(
            f"hold.round_trip.{_e}.held.n{_n}",
            "hold",
            f"{_n} pools, moves held, every END lazy: the {_e} END reserves n pages and cancels them (which can lower "
            "the other END's held view, its available_pages), then the other END's held ladder step flushes its "
            "flush target absorb-only, the reserving END's frontier coming back at least where it was (the cancelled "
            "extension lies beyond its live pages): the other END's available_pages is at least what it was",
            _held_round_trip(_i, _n),
            timeout_s=TIMEOUT_S,
        )


# ------------------------------------------------------------ a gate that blocks a move


def _ladder_sound(i, n_pools):
    def build():
        _, s, (t,), hyps = _setup(n_pools, ("s_", "t_"))
        cases = held_step(s, t, i)
        goal = chain.available(t, i) >= chain.available(s, i)  # the held view: no credit
        return Built(hyps, None, cases=cases, case_goals=[goal] * len(cases), hints=A.layout_hint(s))

    return build


def _credit_unsound(i, n_pools):
    def build():
        _, s, (t,), hyps = _setup(n_pools, ("s_", "t_"))
        j = n_pools - 1 - i
        hyps.append(A.rel_flush_end(s, t, j))  # absorb-only: any frontier its guard allows
        return Built(hyps, chain.schedulable(s, i) <= chain.available(t, i), hints=A.layout_hint(s))

    return build


for _n in (3, 4):
    for _i, _e in ends(_n):
        add(
            f"hold.ladder.{_e}.n{_n}.sound",
            "hold",
            f"{_n} pools, moves held, every END lazy: the {_e} END's held schedulable view (its available_pages: no "
            "credit) is at most its available_pages after the held ladder's END step, the urgent flush of its flush "
            "target (the first opaque band on its growth side: a float refits, the other END absorbs only, to any "
            "frontier its guard allows)",
            _ladder_sound(_i, _n),
            timeout_s=TIMEOUT_S,
        )
for _i, _e in ends(2):
    add(
        f"hold.ladder.{_e}.n2.credit_unsound",
        "hold",
        f"REFUTED (finding): 2 pools, every END lazy: the {_e} END's unheld schedulable_pages (the other END's holes "
        "credited) is at most its available_pages after an absorb-only flush of the other END (any frontier its "
        "guard allows).  A live page at that END's frontier keeps the holes behind it, and only a move delivers the "
        "credit: under a hold the view must drop it",
        _credit_unsound(_i, 2),
        timeout_s=TIMEOUT_S,
        expect="counterexample",
    )
