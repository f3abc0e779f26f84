"""The composites' joint views (issue 8): soundness, exactness, the golden identity.

A composite binds ``P`` new pages as one coupled step (``spec.composites._bind``):
``alloc(full, P)``, then ``alloc(swa, P, ids=...)`` on the state full left.
On the abstract arena that is ``rel_alloc_end`` for full, then swa's own
relation (``rel_alloc_end`` for an up END, the float's gate for a float) on
the post-state.  The obligations here tie the joint views' formulas to that
sequence, calling the spec's own ``arith.two_end_joint_pages`` and the
abstract arena's ``available`` (the spec's ``end_available`` /
``float_region`` / ``float_available``):

- ``composite.hybrid.joint_sound``: ``HybridSWA`` (swa up END . full down
  END), symbolic sizes, every invariant: for ``1 <= P <=
  two_end_joint_pages(...)`` both relations are enabled and the final state
  keeps every invariant (one query per gate and per invariant; the
  invariant queries assume the gates, which the gate queries prove);
- ``composite.hybrid.joint_tight``: ``P = joint + 1`` fails one of the two
  gates, so ``available_size() + page_size`` does not fit without relief;
- ``composite.mamba.joint_tight``: ``MambaHybrid``'s joint view is full's
  ``available`` on the 2-pool chain; ``available + 1`` fails the gate.
  (Its soundness *is* ``inv.alloc_down.{order,conservation,grid}.n2``: the
  coupled bind touches full only, and ``rel_alloc_end`` is enabled exactly
  when ``1 <= n <= available``.  Not repeated here.)
- ``golden.tripool_empty_float``: ``TriPool`` (state up END . swa float .
  full down END) with swa transparent: the coupled-bind predicate (full's
  gate, then the parked float's gate on its grid-aware region once full's
  frontier moved -- ``impl.TriPool.feasible``) is ``P <=
  two_end_joint_pages`` of the two-END layout (swa an up END at the state
  END's high frontier, no holes) whenever that frontier is on swa's grid;
- ``golden.tripool_empty_float.within_one_page``: on any grid the TriPool
  view is the two-END one or one page less;
- ``golden.tripool_empty_float.exact_off_grid`` (refuted, a finding): off
  swa's grid the two differ;
- ``relief.surplus_only.nN`` (N = 2, 3 pools): the composite ladder's
  stopping rule (``_compact_ends``).  A flush of a lazy END that leaves it
  at most ``d`` holes, ``d`` its own demand, leaves the END extending for
  that demand exactly as far as the packed END does, with the same verdict
  on its grid room: the planner's inputs (``chain.planner_inputs``) of
  the two states agree at that END.  So the ladder compacts an END only
  while its holes exceed its demand; past that, every page its frontier
  gives back is one its own extension takes again.
"""

import z3

from kvarena.spec import arith
from kvarena.spec import transitions as T
from kvarena.spec.chain import planner_inputs

from . import abstract as A
from .capacity import cdiv_galois, fdiv_galois
from .core import Built, Fresh, add

# HybridSWA / MambaHybrid: chain (up END, down END); TriPool: (state, swa, full)
UP, DOWN = 0, 1
STATE3, SWA3, FULL3 = 0, 1, 2


def extend_end(s, i, n):
    """``s`` with END ``i`` given ``n`` pages by the spec's transition
    (holes first, then extension), with no gate."""
    return s.with_band(i, T.alloc_end(s, i, n))


end_room = A.end_room  # the END's extension room on its own grid (the spec's)


def hybrid_joint(s):
    """``arith.two_end_joint_pages`` on a 2-pool state (swa up END, full down
    END): a = full, which binds first; b = swa; the gap is the chain walk's."""
    fu, sw = s.pools[DOWN], s.pools[UP]
    return arith.two_end_joint_pages(
        A.gap(s, DOWN), fu.epp, s.bands[DOWN].holes, end_room(s, DOWN), sw.epp, s.bands[UP].holes, end_room(s, UP)
    )


def hybrid_gates(s, n, m=None):
    """The coupled bind of ``n`` pages on a 2-pool state: full's gate, then
    swa's gate on the state full's bind left: the spec composites' own
    ``transitions.coupled_fits``.  ``m`` (default ``n``): swa binds only
    ``m`` of the new ids, the uneven demand."""
    return T.coupled_fits(s, DOWN, UP, n, n if m is None else m)


def hybrid_uneven(s, n, m):
    """``arith.two_end_uneven_fits`` on a 2-pool state: full binds ``n``
    pages, then swa ``m`` of them; the closed form ``impl.HybridSWA`` asks."""
    fu, sw = s.pools[DOWN], s.pools[UP]
    return arith.two_end_uneven_fits(
        n,
        m,
        A.gap(s, DOWN),
        fu.epp,
        s.bands[DOWN].holes,
        end_room(s, DOWN),
        sw.epp,
        s.bands[UP].holes,
        end_room(s, UP),
    )


def tripool_fits(s, n, m=None):
    """The coupled bind of ``n`` pages on a 3-pool state (state, swa float,
    full): full's gate, then the float's gate on its region between the
    state END's high frontier and full's *new* low frontier: the spec
    composites' own ``transitions.coupled_fits`` (``impl.TriPool._gates``
    is its twin).  ``m`` (default ``n``): swa binds only ``m`` of the new
    ids, the uneven demand (``impl.TriPool._uneven_fits``)."""
    return T.coupled_fits(s, FULL3, SWA3, n, n if m is None else m)


def tripool_two_end(s):
    """The two-END closed form for a TriPool whose swa float is transparent:
    swa an up END whose high frontier is the state END's high frontier, no
    holes, its ids its room; the gap is full's (the float is invisible to
    the walk: ``golden.transparent_invisible``)."""
    fu = s.pools[FULL3]
    return arith.two_end_joint_pages(
        A.gap(s, FULL3), fu.epp, s.bands[FULL3].holes, end_room(s, FULL3), s.pools[SWA3].epp, 0, A.index_room(s, SWA3)
    )


def tripool_two_end_uneven(s, n, m):
    """``tripool_two_end``'s layout asked the uneven question: full ``n``
    pages, then swa ``m`` (``arith.two_end_uneven_fits``)."""
    fu = s.pools[FULL3]
    return arith.two_end_uneven_fits(
        n,
        m,
        A.gap(s, FULL3),
        fu.epp,
        s.bands[FULL3].holes,
        end_room(s, FULL3),
        s.pools[SWA3].epp,
        0,
        A.index_room(s, SWA3),
    )


def _state(n):
    f = Fresh()
    s = A.symbolic_state(f, "s_", n=n)
    return f, s, [A.layout_ok(s, first_pages=False), A.inv_all(s)]


# ------------------------------------------------------------- HybridSWA


def _hybrid_sound():
    f, s, hyps = _state(2)
    P = f.int("P")
    hyps += [P >= 1, P <= hybrid_joint(s)]
    u = extend_end(extend_end(s, DOWN, P), UP, P)  # what the composite's _bind leaves
    fits = hybrid_gates(s, P)  # proved by the first query; assumed by the invariant ones
    cases = [[]] + [[fits]] * 3
    goals = [fits, A.inv_grid(u), A.inv_cons(u), A.inv_order(u)]
    return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s, epps=(4, 6)))


def _hybrid_tight():
    f, s, hyps = _state(2)
    P = f.int("P")
    hyps += [P == hybrid_joint(s) + 1]
    return Built(hyps, z3.Not(hybrid_gates(s, P)), hints=A.layout_hint(s, epps=(4, 6)))


add(
    "composite.hybrid.joint_sound",
    "composite",
    "HybridSWA (swa up END . full down END): 1 <= P <= two_end_joint_pages(gap, full, swa) => the coupled "
    "bind passes both gates (transitions.coupled_fits: full's, then swa's on the state full's alloc leaves), "
    "and every invariant holds after both allocs",
    _hybrid_sound,
    timeout_s=40.0,
)  # about 6 s idle (5 queries, the slowest under 4 s); 20 s seen under load
add(
    "composite.hybrid.joint_tight",
    "composite",
    "HybridSWA: P = two_end_joint_pages + 1 fails full's gate or swa's gate after full's bind "
    "(available_size() + page_size does not fit without relief)",
    _hybrid_tight,
    timeout_s=30.0,
)


# HybridSWA, uneven demand (docs/design.md §11): full binds Pf pages, swa the last Ps <= Pf of those ids.


def _hybrid_uneven_sound():
    f, s, hyps = _state(2)
    Pf, Ps = f.int("Pf"), f.int("Ps")
    hyps += [Pf >= 1, Ps >= 0, Ps <= Pf, hybrid_uneven(s, Pf, Ps)]
    t = extend_end(s, DOWN, Pf)
    u = extend_end(t, UP, Ps)
    full_rel, swa_rel = A.rel_alloc_end(s, t, DOWN, Pf), A.rel_alloc_end(t, u, UP, Ps)
    # Ps == 0: swa binds nothing (alloc(swa, 0) returns at once), so only full's relation is asked
    cases = [[], [Ps >= 1, full_rel]] + [[Ps >= 1, full_rel, swa_rel]] * 3
    goals = [full_rel, swa_rel, A.inv_grid(u), A.inv_cons(u), A.inv_order(u)]
    # the uneven case is reached where the coupled bind of Pf pages would not fit
    witness = [Ps >= 1, Ps < Pf, z3.Not(hybrid_gates(s, Pf))]
    return Built(hyps, None, cases=cases, case_goals=goals, witnesses=[witness], hints=A.layout_hint(s, epps=(4, 6)))


def _hybrid_uneven_tight():
    f, s, hyps = _state(2)
    Pf, Ps = f.int("Pf"), f.int("Ps")
    hyps += [Ps >= 0, Ps <= Pf, z3.Not(hybrid_uneven(s, Pf, Ps))]
    # swa's holes cover part of its demand: the case a gate blind to them gets wrong
    witness = [s.bands[UP].holes >= 1, Ps >= 1, hybrid_gates(s, Pf, Ps - 1)]
    return Built(hyps, z3.Not(hybrid_gates(s, Pf, Ps)), witnesses=[witness], hints=A.layout_hint(s, epps=(4, 6)))


add(
    "composite.hybrid.uneven_sound",
    "composite",
    "HybridSWA, uneven demand: 1 <= Pf, 0 <= Ps <= Pf, two_end_uneven_fits(Pf, Ps, ...) => full's "
    "rel_alloc_end(Pf), then swa's rel_alloc_end(Ps) on the state it leaves (Ps >= 1), are enabled, and every "
    "invariant holds after both",
    _hybrid_uneven_sound,
    timeout_s=40.0,
)
add(
    "composite.hybrid.uneven_tight",
    "composite",
    "HybridSWA, uneven demand: 0 <= Ps <= Pf and not two_end_uneven_fits(Pf, Ps, ...) => full's gate for Pf "
    "or swa's gate for Ps after full's bind fails (fits(tokens, swa_tokens=...) is exact)",
    _hybrid_uneven_tight,
    timeout_s=30.0,
)


# ----------------------------------------------------------- MambaHybrid


def _mamba_tight():
    f, s, hyps = _state(2)
    P = f.int("P")
    hyps += [P == A.available(s, DOWN) + 1]
    t = extend_end(s, DOWN, P)
    # the gate refuses it (P > available, by construction); placing it anyway breaks an invariant
    return Built(hyps, z3.Not(A.inv_all(t)), hints=A.layout_hint(s, epps=(1, 6)))


add(
    "composite.mamba.joint_tight",
    "composite",
    "MambaHybrid (state up END . full down END): P = available_pages(full) + 1, which the gate refuses, "
    "cannot be placed: placing it anyway breaks an invariant (soundness is inv.alloc_down.*.n2)",
    _mamba_tight,
    timeout_s=30.0,
)


# -------------------------------------------------------------- TriPool


def tripool_lemmas(s, P):
    """Instances of the proved Galois lemmas (``capacity.lemma.fdiv_galois``,
    ``cdiv_galois``) at the points the TriPool/two-END comparison turns on:
    each floor or ceiling division of the two predicates, at ``P`` and
    ``P + 1``.  They only restate what each division means; z3 needs them
    to keep the nonlinear queries small."""
    fu, sw = s.pools[FULL3], s.pools[SWA3]
    e_f, e_s, h_f = fu.epp, sw.epp, s.bands[FULL3].holes
    G = A.gap(s, FULL3)
    sh = A.high_f(s, STATE3)
    c = arith.cdiv(sh, e_s)
    lem = [cdiv_galois(c, sh, e_s), cdiv_galois(c - 1, sh, e_s), cdiv_galois(c, s.sink, e_s)]
    for x in (P, P + 1):
        m_f = x - arith.min_(x, h_f)
        lo_r, _ = A.region(extend_end(s, FULL3, x), SWA3)
        above = A.above(extend_end(s, FULL3, x), SWA3)
        lem += [
            fdiv_galois(m_f, G, e_f),
            fdiv_galois(x, G, e_s),
            fdiv_galois(x - h_f, G - h_f * e_s, e_f + e_s),
            fdiv_galois(lo_r + x, above, e_s),
            fdiv_galois(lo_r + x, s.total, e_s),
        ]
    return lem


def _tripool(grid, claim):
    def build():
        f, s, hyps = _state(3)
        P, k = f.int("P"), f.int("k")
        hyps += [s.bands[SWA3].live == 0, P >= 1]
        if grid:  # the state END's high frontier is on swa's grid
            sh, e_s = A.high_f(s, STATE3), s.pools[SWA3].epp
            hyps += [sh == k * e_s, cdiv_galois(k, sh, e_s), cdiv_galois(k - 1, sh, e_s)]  # so cdiv(sh, e_s) == k
        J = tripool_two_end(s)
        fits = tripool_fits(s, P)
        hint = A.layout_hint(s, epps=(3, 8, 6))
        if claim == "exact":
            return Built(hyps, fits == (P <= J), hints=hint)
        hyps += tripool_lemmas(s, P)
        lower = J - 1 if claim == "within_one" else J
        h_f = s.bands[FULL3].holes
        cases, goals = [], []
        for side in (P <= h_f, P > h_f):  # full binds holes only / extends too
            cases += [[side, P <= lower], [side, fits]]
            goals += [fits, P <= J]
        return Built(hyps, None, cases=cases, case_goals=goals, hints=hint)

    return build


add(
    "golden.tripool_empty_float",
    "golden",
    "TriPool, swa float transparent, the state END's high frontier on swa's grid: full's gate then the "
    "parked float's gate after full's bind holds iff P <= two_end_joint_pages (swa an up END at that "
    "frontier, no holes)",
    _tripool(True, "equal"),
    timeout_s=30.0,
)
add(
    "golden.tripool_empty_float.within_one_page",
    "golden",
    "TriPool, swa float transparent, any grid: P <= two_end_joint_pages - 1 => the coupled bind fits, "
    "and a fitting P <= two_end_joint_pages (grid rounding costs at most one page)",
    _tripool(False, "within_one"),
    timeout_s=30.0,
)


def tripool_uneven_lemmas(s, Pf, Ps):
    """``tripool_lemmas`` for the uneven question: the Galois instances at
    full's ``Pf`` and at swa's ``Ps`` and ``Ps + 1`` in the region full's
    bind leaves."""
    fu, sw = s.pools[FULL3], s.pools[SWA3]
    e_f, e_s, h_f = fu.epp, sw.epp, s.bands[FULL3].holes
    G = A.gap(s, FULL3)
    sh = A.high_f(s, STATE3)
    c = arith.cdiv(sh, e_s)
    t = extend_end(s, FULL3, Pf)
    lo_r, _ = A.region(t, SWA3)
    above = A.above(t, SWA3)
    lem = [cdiv_galois(c, sh, e_s), cdiv_galois(c - 1, sh, e_s), cdiv_galois(c, s.sink, e_s)]
    lem += [fdiv_galois(Pf - arith.min_(Pf, h_f), G, e_f)]
    for y in (Ps, Ps + 1):
        lem += [fdiv_galois(lo_r + y, above, e_s), fdiv_galois(lo_r + y, s.total, e_s)]
    return lem


def _tripool_uneven(grid):
    """The golden comparison for the uneven demand: full ``Pf``, swa ``Ps
    <= Pf``; on swa's grid the TriPool gates are the two-END closed form,
    off it they lose at most one swa page."""

    def build():
        f, s, hyps = _state(3)
        Pf, Ps, k = f.int("Pf"), f.int("Ps"), f.int("k")
        hyps += [s.bands[SWA3].live == 0, Pf >= 1, Ps >= 0, Ps <= Pf]
        if grid:
            sh, e_s = A.high_f(s, STATE3), s.pools[SWA3].epp
            hyps += [sh == k * e_s, cdiv_galois(k, sh, e_s), cdiv_galois(k - 1, sh, e_s)]
        hyps += tripool_uneven_lemmas(s, Pf, Ps)
        fits = tripool_fits(s, Pf, Ps)
        two = tripool_two_end_uneven(s, Pf, Ps)
        promise = two if grid else tripool_two_end_uneven(s, Pf, Ps + 1)
        h_f = s.bands[FULL3].holes
        cases, goals = [], []
        for side in (Pf <= h_f, Pf > h_f):  # full binds holes only / extends too
            cases += [[side, promise], [side, fits]]
            goals += [fits, two]
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s, epps=(3, 8, 6)))

    return build


add(
    "golden.tripool_empty_float.uneven",
    "golden",
    "TriPool, swa float transparent, the state END's high frontier on swa's grid, uneven demand 0 <= Ps <= Pf: "
    "full's gate for Pf then the parked float's gate for Ps after full's bind holds iff two_end_uneven_fits "
    "(swa an up END at that frontier, no holes)",
    _tripool_uneven(True),
    timeout_s=30.0,
)
add(
    "golden.tripool_empty_float.uneven_within_one_page",
    "golden",
    "TriPool, swa float transparent, any grid, uneven demand 0 <= Ps <= Pf: two_end_uneven_fits(Pf, Ps + 1) => "
    "the uneven bind (Pf, Ps) fits, and a fitting one satisfies two_end_uneven_fits(Pf, Ps)",
    _tripool_uneven(False),
    timeout_s=30.0,
)
add(
    "golden.tripool_empty_float.exact_off_grid",
    "golden",
    "REFUTED (finding): TriPool with a transparent float fits P iff P <= two_end_joint_pages, whatever "
    "the state END's frontier",
    _tripool(False, "exact"),
    timeout_s=20.0,
    expect="counterexample",
)


# ------------------------------------------------------- the relief ladder


def _end_reach(s, i, d):
    """How far END ``i`` of ``s`` extends for the demand vector ``d``, and
    whether its grid has the room: from the spec's ``planner_inputs``."""
    up, _, down = planner_inputs(s, d)
    if i == 0:
        return up.frontier + up.ext * up.epp, up.ext <= up.room
    return down.frontier - down.ext * down.epp, down.ext <= down.room


def _surplus_only(n, slack=0):
    """``slack`` > 0 lets the ladder stop that many holes past the demand:
    a planted bug, which the tests refute."""

    def build():
        f, s, hyps = _state(n)
        d = [f.int(f"demand{j}") for j in range(n)]
        hyps += [dj >= 0 for dj in d]
        cases, goals = [], []
        for i in (0, n - 1):
            a = s.bands[i]
            edge = f.int(f"edge{i}")
            packed = a.lo + a.live if s.pools[i].grow == "up" else a.hi - a.live
            t = s.with_band(i, T.flush_end(s, i, edge))  # where the ladder stopped
            p = s.with_band(i, T.flush_end(s, i, packed))  # a whole flush
            (reach_t, room_t), (reach_p, room_p) = _end_reach(t, i, d), _end_reach(p, i, d)
            cases.append([s.pools[i].lazy, T.flush_end_ok(s, i, edge), t.bands[i].holes <= d[i] + slack])
            goals.append(z3.And(reach_t == reach_p, room_t == room_p))
        return Built(hyps, None, cases=cases, case_goals=goals, hints=A.layout_hint(s))

    return build


for _n in (2, 3):
    add(
        f"relief.surplus_only.n{_n}",
        "composite",
        f"{_n} pools, either END, lazy: a flush that leaves the END at most d holes (d its own demand) "
        "leaves it extending for d as far as a whole flush does, with the same grid-room verdict "
        "(planner_inputs agree at that END): compacting past the surplus gains nothing",
        _surplus_only(_n),
        timeout_s=20.0,
    )
