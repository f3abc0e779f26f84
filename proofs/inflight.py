"""In-flight forwards (docs/design.md §12), on the spec's own code.

Until a launched forward settles it writes its *pinned* pages late (at the
pages they held at launch) and reads the pages a move vacated (*pending*).
``spec.forward`` keeps both as page-indexed tables beside a band's ``v2p``,
``p2v`` and ``content``, and its writers (``pin``, ``release``, ``vacate``)
and predicates (``move_clear``, ``bind_clear``, ``guarded``) read and write
them by index only, so here they run on z3 arrays (``integrity.Table``),
together with the spec's table writers (``bands.move_pages``,
``bind_pages``, ``unbind_ids``).

Page level (``K`` pairs, pages or ids, each a symbolic number; unbounded
numbers, and a ``.bounded`` twin in [1, 6] so that a refutation is a model
z3 can find, as ``integrity`` does).  ``guards_ok`` is what ``Band.check``
requires of the guards: a pending page is a hole that still holds the bytes
of its pending id; a page pinned with an id is still bound to it; a page
pinned ``FREED`` is a hole.  The goals are stated on the tables, not on the
guard predicates, so a weakened predicate is refuted:

- ``inflight.move.kK``: from well-formed tables and guards, a move that
  ``forward.move_clear`` allows, into free pages (the only move the arena
  makes while a forward is in flight: the non-urgent flush's, into holes),
  with its sources vacated first (``forward.vacate``, as ``Arena.flush``
  does): every page pinned with an id still holds it (the late write lands
  on that id's page), no live id sits on a page pinned ``FREED``, every page
  the forward reads (pending, the new ones included) holds the bytes it held
  before, and the guards stay well formed.
- ``inflight.move.chained``, refuted (a finding): the same with ``move_ok``'s
  destinations, which may be another pair's source; ``move_clear`` reads the
  guards before ``vacate`` marks the sources, so it clears a chained move
  that overwrites a page the same move leaves pending.
- ``inflight.bind.kK`` / ``inflight.bind.unguarded.kK``: binding free pages
  that ``forward.bind_clear`` clears (the arena's assertion), or that
  ``forward.guarded`` calls unguarded (the alloc's choice of holes), keeps
  every write landing and every read intact, and the guards well formed.
- ``inflight.pin.kK``: ``forward.pin`` pins each launched id's page with its
  id, changes no other pin, and leaves the guards well formed (the base
  case); ``inflight.release.kK``: unbinding live ids (``unbind_ids``) and
  ``forward.release`` keep every pin a pin (the late write still lands) and
  add none, with the guards well formed.

Count level (chains of 2 to 4 pools, every size symbolic, every invariant),
with ``g`` of a pool's holes guarded, ``0 <= g <= holes`` (the counts do not
record which: the arena counts ``b.guarded_holes()``):

- ``inflight.alloc.*``: ``transitions.alloc_settles`` is exact against the
  transition ``alloc``: an alloc that does not settle reuses at most the
  ``holes - g`` unguarded holes, and one that settles would otherwise have
  reused a guarded one.  The view and the gate do not read ``g``: an alloc
  of up to ``available`` pages succeeds either way.
- ``inflight.schedulable.*``: ``n <= schedulable_pages`` before the ladder's
  flush of the other END (urgent: it settles first when it moves or holds
  a guarded hole, then flushes whole) => the alloc of ``n`` passes the gate
  afterwards and, whatever ``g`` is left, settles exactly when it must.
- ``inflight.joint.*``: a coupled bind that passes ``transitions.coupled_fits``
  with ``g_f`` and ``g_s`` guarded holes: each of its two allocs settles
  exactly when it must, swa's seeing no guard once full's has settled.
- ``inflight.partial_flush.*``: a flush stopped anywhere its guard allows
  (the non-urgent walk, stopped by a pin or a guarded hole) takes back no
  page a view promised: every pool's ``available_pages``, and every END's
  ``schedulable_pages``, is at least what it was.

``settle`` changes no count (``chain.Chain`` has no guard: it writes only
the guard tables), so every view, transition and planner input reads the
same chain after it; that is a fact of construction, not a z3 goal (it would
be ``x == x``), and ``tests/proofs/test_inflight.py`` checks it on runs.
"""

import copy

import z3

from kvarena.spec import chain, forward
from kvarena.spec import transitions as T
from kvarena.spec.bands import bind_pages, move_pages, unbind_ids

from . import abstract as A
from .core import Built, Fresh, add
from .integrity import BOUND, Table, _distinct, _every, _table_bound, _within, well_formed
from .views import flushed_whole

BATCHES = (1, 2, 3)


class At:
    """A table as it was: reads of a z3 array value, by index."""

    def __init__(self, arr):
        self.arr = arr

    def __getitem__(self, k):
        return z3.Select(self.arr, k)


def frozen(table):
    """``table`` as it is now, unchanged by later writes to it."""
    return At(table.arr) if isinstance(table, Table) else copy.copy(table)


def guards_ok(p2v, content, pinned, pending, bound=None):
    """``Band.check``'s rules for the guards, on pages >= 1: a pending page
    is a hole still holding its pending id's bytes; a page pinned with an id
    (>= 1) is bound to it; a page pinned ``FREED`` is a hole."""

    def page(p):
        return z3.And(
            z3.Implies(pending[p] >= 0, z3.And(p2v[p] < 0, content[p] == pending[p])),
            z3.Implies(pinned[p] >= 1, p2v[p] == pinned[p]),
            z3.Implies(pinned[p] == forward.FREED, p2v[p] < 0),
        )

    return _every("g_p", bound, page)


def writes_land(p2v, pinned, bound=None):
    """Every pinned page: still bound to its launch id (the late write lands
    on that id's page), or, pinned ``FREED``, bound to no id (the late write
    clobbers nobody's bytes)."""
    return _every(
        "w_p",
        bound,
        lambda p: z3.And(
            z3.Implies(pinned[p] >= 1, p2v[p] == pinned[p]),
            z3.Implies(pinned[p] == forward.FREED, p2v[p] < 0),
        ),
    )


def reads_intact(content, before, pending, bound=None):
    """Every page the forward reads (pending) holds the bytes it held before."""
    return _every("r_p", bound, lambda p: z3.Implies(pending[p] >= 0, content[p] == before[p]))


def _guard_bound(pinned, pending, bound):
    """Bounded: a pin is an id in range or ``FREED``; a pending mark an id in range."""
    if not bound:
        return []
    return [
        _every("", bound, lambda x: z3.Or(pinned[x] < 0, z3.And(pinned[x] >= 0, pinned[x] <= bound))),
        _every("", bound, lambda x: z3.Or(pending[x] < 0, z3.And(pending[x] >= 1, pending[x] <= bound))),
    ]


class Cells:
    """A bounded table: ``bound`` int cells, read and written by index (an
    index outside ``[1, bound]`` reads one spare cell and writes nothing),
    so that a counterexample's model is plain numbers, not arrays."""

    def __init__(self, name, bound):
        self.cells = [z3.Int(f"{name}{j}") for j in range(1, bound + 1)]
        self.spare = z3.Int(f"{name}_other")

    def __getitem__(self, k):
        r = self.spare
        for j, c in enumerate(self.cells, 1):
            r = z3.If(k == j, c, r)
        return r

    def __setitem__(self, k, v):
        self.cells = [z3.If(k == j, v, c) for j, c in enumerate(self.cells, 1)]


def _with_guards(k, bound, *lists, cells=False):
    """Well-formed tables (``integrity.well_formed``) and guards (``guards_ok``),
    and ``k`` distinct numbers >= 1 for each name in ``lists``: ``(tables,
    guards, numbers, hypotheses)``.  ``cells``: the tables are ``Cells``."""
    f = Fresh()
    make = (lambda name: Cells(name, bound)) if cells else Table
    v2p, p2v, content, pinned, pending = (make(n) for n in ("v2p", "p2v", "content", "pinned", "pending"))
    nums = [[f.int(f"{name}{j}") for j in range(k)] for name in lists]
    hyps = [well_formed(v2p, p2v, content, bound), guards_ok(p2v, content, pinned, pending, bound)]
    hyps += [_distinct(xs) for xs in nums] + _within([x for xs in nums for x in xs], bound)
    hyps += _table_bound((v2p, p2v), bound) + _guard_bound(pinned, pending, bound)
    return (v2p, p2v, content), (pinned, pending), nums, hyps


def _move(k, bound, chained=False):
    def build():
        (v2p, p2v, content), (pinned, pending), (src, dst), hyps = _with_guards(k, bound, "src", "dst", cells=chained)
        hyps += [p2v[s] >= 1 for s in src]  # move_ok: live sources ...
        if chained:  # ... and destinations each free or another pair's source
            hyps += [z3.Or(p2v[d] < 0, *[d == s for s in src]) for d in dst]
        else:  # the non-urgent flush's destinations are holes
            hyps += [p2v[d] < 0 for d in dst]
        hyps.append(forward.move_clear(pinned, pending, dst, src))
        before = frozen(content)
        forward.vacate(pending, content, src)  # as Arena.flush: before the move
        move_pages(v2p, p2v, content, dst, src)
        if chained:  # the finding is about the bytes: a read the move corrupts
            return Built(hyps, reads_intact(content, before, pending, bound))
        goal = z3.And(
            writes_land(p2v, pinned, bound),
            reads_intact(content, before, pending, bound),
            guards_ok(p2v, content, pinned, pending, bound),
        )
        return Built(hyps, goal)

    return build


def _bind(k, bound, unguarded):
    def build():
        (v2p, p2v, content), (pinned, pending), (ids, pages), hyps = _with_guards(k, bound, "id", "page")
        hyps += [v2p[x] < 0 for x in ids] + [p2v[p] < 0 for p in pages]
        if unguarded:  # the alloc's choice: holes that forward.guarded calls unguarded
            hyps += [A.not_(forward.guarded(pinned, pending, p)) for p in pages]
        else:  # the alloc's assertion
            hyps.append(forward.bind_clear(pinned, pending, pages))
        before = frozen(content)
        bind_pages(v2p, p2v, content, ids, pages)
        goal = z3.And(
            writes_land(p2v, pinned, bound),
            reads_intact(content, before, pending, bound),
            guards_ok(p2v, content, pinned, pending, bound),
        )
        return Built(hyps, goal)

    return build


def _pin(k, bound):
    def build():
        (v2p, p2v, content), (pinned, pending), (ids,), hyps = _with_guards(k, bound, "id")
        hyps += [v2p[x] >= 1 for x in ids]  # launch: allocated ids
        before = frozen(pinned)
        pages = [v2p[x] for x in ids]
        forward.pin(v2p, pinned, ids)
        goal = z3.And(
            *[pinned[p] == x for p, x in zip(pages, ids)],
            _every("o_p", bound, lambda p: z3.Implies(z3.And(*[p != q for q in pages]), pinned[p] == before[p])),
            guards_ok(p2v, content, pinned, pending, bound),
        )
        return Built(hyps, goal)

    return build


def _release(k, bound):
    def build():
        (v2p, p2v, content), (pinned, pending), (ids,), hyps = _with_guards(k, bound, "id")
        hyps += [v2p[x] >= 1 for x in ids]  # free: live ids
        before = frozen(pinned)
        pages = unbind_ids(v2p, p2v, ids)
        forward.release(pinned, pages)
        goal = z3.And(
            _every("s_p", bound, lambda p: (pinned[p] >= 0) == (before[p] >= 0)),
            guards_ok(p2v, content, pinned, pending, bound),
        )
        return Built(hyps, goal)

    return build


for _k in BATCHES:
    for _b in (None, BOUND):
        _sfx, _num = (
            (f".k{_k}", "unbounded page and id numbers")
            if _b is None
            else (f".k{_k}.bounded", f"pages and ids in [1, {_b}], so a refutation is a model z3 can find")
        )
        add(
            f"inflight.move{_sfx}",
            "inflight",
            f"forward.vacate then bands.move_pages, {_k} pair(s) into free pages that forward.move_clear allows, "
            f"well-formed tables and guards, {_num}: every page pinned with an id still holds it, none pinned "
            "FREED holds one, every pending page (the sources now too) keeps its bytes, the guards stay well formed",
            _move(_k, _b),
            timeout_s=40.0,
        )
        add(
            f"inflight.bind{_sfx}",
            "inflight",
            f"bands.bind_pages, {_k} id(s) to {_k} free page(s) that forward.bind_clear allows, well-formed tables "
            f"and guards, {_num}: every pinned page keeps its id (or none, FREED), every pending page keeps its "
            "bytes, the guards stay well formed",
            _bind(_k, _b, False),
            timeout_s=30.0,
        )
        add(
            f"inflight.bind.unguarded{_sfx}",
            "inflight",
            f"bands.bind_pages, {_k} id(s) to {_k} free page(s) that forward.guarded calls unguarded (the alloc's "
            f"choice of holes), {_num}: every pinned page keeps its id (or none), every pending page keeps its "
            "bytes, the guards stay well formed",
            _bind(_k, _b, True),
            timeout_s=30.0,
        )
        add(
            f"inflight.pin{_sfx}",
            "inflight",
            f"forward.pin, {_k} live id(s), well-formed tables and guards, {_num}: each id's page is pinned with "
            "the id, no other pin changes, the guards stay well formed",
            _pin(_k, _b),
            timeout_s=30.0,
        )
        add(
            f"inflight.release{_sfx}",
            "inflight",
            f"bands.unbind_ids then forward.release, {_k} live id(s), well-formed tables and guards, {_num}: "
            "every pin stays a pin (the late write still lands there) and none is added, the guards stay well "
            "formed (a freed pinned page is FREED, a hole)",
            _release(_k, _b),
            timeout_s=30.0,
        )

add(
    "inflight.move.chained",
    "inflight",
    "REFUTED (finding): forward.move_clear alone keeps an in-flight forward's reads intact: with move_ok's "
    "destinations (free or another pair's source), 2 pairs, pages and ids in [1, 6], a cleared chained move "
    "writes a page the same move leaves pending",
    _move(2, BOUND, chained=True),
    timeout_s=30.0,
    expect="counterexample",
)


# ------------------------------------------------------------ count level


def settles_exactly(s, t, i, n, g):
    """The alloc of ``n`` pages of pool ``i`` that leaves ``t`` from ``s``,
    with ``g`` of the pool's holes guarded: when it does not settle
    (``transitions.alloc_settles``) it reuses no more than the unguarded
    holes; when it settles, it would have reused a guarded one."""
    holes = s.bands[i].holes
    reused = holes - t.bands[i].holes
    settles = T.alloc_settles(s, i, n, g)
    return z3.And(z3.Implies(A.not_(settles), reused <= holes - g), z3.Implies(settles, reused > holes - g))


def _witnesses(s, i, n, g):
    """Both verdicts reachable: an alloc that settles, and one that does not while a hole is guarded."""
    settles = T.alloc_settles(s, i, n, g)
    return [[settles], [A.not_(settles), g >= 1]]


def _alloc(i, n_pools):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n_pools)
        t = A.symbolic_state(f, "t_", like=s)
        n, g = f.int("n"), f.int("g")
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), T.alloc_ok(s, i, n)]
        hyps += [g >= 0, g <= s.bands[i].holes, A.becomes(s, t, i, T.alloc(s, i, n))]
        return Built(hyps, settles_exactly(s, t, i, n, g), witnesses=_witnesses(s, i, n, g), hints=A.layout_hint(s))

    return build


_POOLS = {2: ((0, "up"), (1, "down")), 3: ((0, "up"), (1, "float"), (2, "down"))}
for _n, _pools in _POOLS.items():
    for _i, _kind in _pools:
        add(
            f"inflight.alloc.{_kind}.n{_n}",
            "inflight",
            f"{_n} pools, the {_kind} pool, every invariant, 1 <= n <= available_pages, g of its holes guarded "
            "(0 <= g <= holes): transitions.alloc_settles is exact against transitions.alloc: an alloc that does "
            "not settle reuses at most holes - g holes (no guarded one), one that settles would reuse more",
            _alloc(_i, _n),
            timeout_s=30.0,
        )


def _schedulable(i, n_pools):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n_pools)
        t = A.symbolic_state(f, "t_", like=s)
        u = A.symbolic_state(f, "u_", like=s)
        j = n_pools - 1 - i  # the other END, the ladder's first rung
        n, g = f.int("n"), f.int("g")
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), flushed_whole(s, t, j)]
        hyps += [n >= 1, n <= chain.schedulable(s, i), g >= 0, g <= t.bands[i].holes]
        hyps.append(A.becomes(t, u, i, T.alloc(t, i, n)))
        goal = z3.And(T.alloc_ok(t, i, n), settles_exactly(t, u, i, n, g))
        return Built(hyps, goal, witnesses=_witnesses(t, i, n, g), hints=A.layout_hint(s))

    return build


for _n in (2, 3, 4):
    for _i, _e in ((0, "up"), (_n - 1, "down")):
        add(
            f"inflight.schedulable.{_e}.n{_n}",
            "inflight",
            f"{_n} pools, {_e} END, every invariant: 1 <= n <= schedulable_pages, then the ladder's flush of the "
            "other END (whole: urgent, it settles first), g of the END's holes guarded: the alloc of n passes the "
            "gate and settles exactly when it would otherwise reuse a guarded hole",
            _schedulable(_i, _n),
            timeout_s=30.0,
        )


COMPOSITES = {"hybrid": (2, 1, 0), "tripool": (3, 2, 1)}  # pools, full's index, swa's index


def _joint(n_pools, full, swa):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n_pools)
        u = A.symbolic_state(f, "u_", like=s)
        w = A.symbolic_state(f, "w_", like=s)
        P, gf, gs = f.int("P"), f.int("g_full"), f.int("g_swa")
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), P >= 1, T.coupled_fits(s, full, swa, P, P)]
        hyps += [gf >= 0, gf <= s.bands[full].holes, gs >= 0, gs <= s.bands[swa].holes]
        hyps += [A.becomes(s, u, full, T.alloc(s, full, P)), A.becomes(u, w, swa, T.alloc(u, swa, P))]
        gs_left = z3.If(T.alloc_settles(s, full, P, gf), 0, gs)  # full's settle lifts swa's guards too
        goal = z3.And(settles_exactly(s, u, full, P, gf), settles_exactly(u, w, swa, P, gs_left))
        witnesses = [[T.alloc_settles(s, full, P, gf)], [A.not_(T.alloc_settles(s, full, P, gf)), gs >= 1]]
        return Built(hyps, goal, witnesses=witnesses, hints=A.layout_hint(s))

    return build


for _c, (_n, _full, _swa) in COMPOSITES.items():
    add(
        f"inflight.joint.{_c}",
        "inflight",
        f"{_c} ({_n} pools), every invariant: a coupled bind of P pages passing transitions.coupled_fits, with "
        "g_full and g_swa guarded holes: full's alloc settles exactly when it must, and swa's, on the state "
        "full's leaves (no guard left if full's settled), too",
        _joint(_n, _full, _swa),
        timeout_s=30.0,
    )


def _partial_flush(j, n_pools):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n_pools)
        t = A.symbolic_state(f, "t_", like=s)
        hyps = [A.layout_ok(s, first_pages=False), A.inv_all(s), s.pools[j].lazy, A.rel_flush_end(s, t, j)]
        goals = [chain.available(t, k) >= chain.available(s, k) for k in range(n_pools)]
        goals += [chain.schedulable(t, k) >= chain.schedulable(s, k) for k in (0, n_pools - 1)]
        # one query per view: z3 finds each easy and their conjunction hard
        return Built(hyps, None, cases=[[] for _ in goals], case_goals=goals, hints=A.layout_hint(s))

    return build


for _n in (2, 3):
    for _j, _e in ((0, "up"), (_n - 1, "down")):
        add(
            f"inflight.partial_flush.{_e}.n{_n}",
            "inflight",
            f"{_n} pools, the lazy {_e} END flushed to any frontier its guard allows (the non-urgent walk stops "
            "at a pin or a guarded hole), every invariant: every pool's available_pages and both ENDs' "
            "schedulable_pages are at least what they were (no promise is taken back)",
            _partial_flush(_j, _n),
            timeout_s=30.0,
        )
