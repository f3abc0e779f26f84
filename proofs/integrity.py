"""Integrity of the page tables, on the spec's own code.

``spec.bands`` writes a band's tables only through ``bind_pages``,
``unbind_ids`` and ``move_pages``, which read and write ``v2p``, ``p2v``
and ``content`` by index.  Here they run on z3 arrays (``Table``), so the
obligations are about those three functions:

- ``integrity.{bind,unbind,move}.kK``: with ``K`` ids (or move pairs), each
  a symbolic number, and tables that are *well formed* (``well_formed``:
  on live pages and ids, ``v2p`` and ``p2v`` are inverse and every live
  page holds its id's bytes), the operation leaves them well formed, does
  what it says to the ids it names, and changes no other id's page or
  liveness.  For a move, every live id's bytes are at its new page: the
  content map is preserved.  Page and id numbers are unbounded; the batch
  size ``K`` is bounded (1 to 3; three pairs already chain a destination
  that is another pair's source, as a leapfrog does).
- ``integrity.writes_disjoint.nN``: a band only ever writes pages inside
  its own span (``Band.check``: no live page outside it), and the order
  invariant then keeps those bytes off every other opaque band, whose
  tables and span the operation leaves alone (``frame``).  So an operation
  on pool P changes no other pool's data.

The preconditions are what the arena guarantees before each call: ids
validated by ``Arena._ids``, pages free by the transitions' placement, a
move's ``bands.move_ok`` asserted by ``Band.move``.
"""

import z3

from kvarena.spec.bands import bind_pages, move_pages, unbind_ids

from . import abstract as A
from .core import Built, Fresh, add

BATCHES = (1, 2, 3)
BOUND = 6  # the bounded twins: page and id numbers in [1, BOUND]


class Table:
    """A page table (or the content map) as a z3 array, read and written by
    index as the spec reads and writes its lists and dict."""

    def __init__(self, name):
        self.arr = z3.Array(name, z3.IntSort(), z3.IntSort())

    def __getitem__(self, k):
        return z3.Select(self.arr, k)

    def __setitem__(self, k, v):
        self.arr = z3.Store(self.arr, k, v)


def _tables(tag):
    return Table(f"{tag}v2p"), Table(f"{tag}p2v"), Table(f"{tag}content")


def _every(name, bound, body):
    """``body(x)`` for every number ``x >= 1``, or for ``1 <= x <= bound``
    (quantifier-free, so a refutation's model is one z3 can find)."""
    if bound:
        return z3.And(*[body(z3.IntVal(x)) for x in range(1, bound + 1)])
    x = z3.Int(name)
    return z3.ForAll([x], z3.Implies(x >= 1, body(x)))


def well_formed(v2p, p2v, content, bound=None):
    """On live pages and ids (numbers >= 1; 0 is the sink): ``p2v`` and
    ``v2p`` are inverse, and a live page holds its id's bytes."""
    return z3.And(
        _every("wf_p", bound, lambda p: z3.Implies(p2v[p] >= 1, z3.And(v2p[p2v[p]] == p, content[p] == p2v[p]))),
        _every("wf_v", bound, lambda v: z3.Implies(v2p[v] >= 1, p2v[v2p[v]] == v)),
    )


def _distinct(xs):
    return z3.Distinct(*xs) if len(xs) > 1 else z3.BoolVal(True)


def _others_unchanged(before, after, named, bound=None):
    """Every id not in ``named`` keeps its page (and so its liveness)."""
    return _every(
        "other_v",
        bound,
        lambda v: z3.Implies(z3.And(*[v != x for x in named]), z3.Select(after, v) == z3.Select(before, v)),
    )


def _within(xs, bound):
    """Every number named is >= 1 (and, bounded, at most ``bound``)."""
    return [z3.And(x >= 1, x <= bound) if bound else x >= 1 for x in xs]


def _table_bound(tables, bound):
    """Bounded: every table entry in range points in range (or is free)."""
    if not bound:
        return []
    return [
        _every("", bound, lambda x, tb=tb: z3.Or(tb[x] < 0, z3.And(tb[x] >= 1, tb[x] <= bound))) for tb in tables[:2]
    ]


def _setup(k, bound, *lists):
    """Well-formed symbolic tables and ``k`` distinct numbers per name in
    ``lists`` (ids or pages, each >= 1): ``(tables, old v2p, old p2v,
    numbers, hypotheses)``."""
    f = Fresh()
    tables = _tables("")
    v2p, p2v, content = tables
    nums = [[f.int(f"{name}{j}") for j in range(k)] for name in lists]
    hyps = [well_formed(v2p, p2v, content, bound)] + [_distinct(xs) for xs in nums]
    hyps += _within([x for xs in nums for x in xs], bound) + _table_bound(tables, bound)
    return tables, v2p.arr, p2v.arr, nums, hyps


def _op_goal(tables, old_v2p, changed, bound, facts):
    """A table operation's goal: the tables stay well formed, ``facts()`` hold, and every id
    not in ``changed`` keeps its page (``facts`` is a thunk so that its terms are built
    after ``well_formed``'s, in the order z3 is given them)."""
    v2p, p2v, content = tables
    return z3.And(well_formed(v2p, p2v, content, bound), *facts(), _others_unchanged(old_v2p, v2p.arr, changed, bound))


def _bind(k, bound):
    def build():
        tables, old_v2p, _, (ids, pages), hyps = _setup(k, bound, "id", "page")
        v2p, p2v, content = tables
        hyps += [v2p[x] < 0 for x in ids] + [p2v[p] < 0 for p in pages]
        bind_pages(v2p, p2v, content, ids, pages)
        return Built(hyps, _op_goal(tables, old_v2p, ids, bound, lambda: [v2p[x] == p for x, p in zip(ids, pages)]))

    return build


def _unbind(k, bound):
    def build():
        tables, old_v2p, _, (ids,), hyps = _setup(k, bound, "id")
        v2p, p2v, _content = tables
        hyps += [v2p[x] >= 1 for x in ids]
        before = [v2p[x] for x in ids]
        pages = unbind_ids(v2p, p2v, ids)

        def facts():
            return [v2p[x] < 0 for x in ids] + [p == b for p, b in zip(pages, before)] + [p2v[p] < 0 for p in pages]

        return Built(hyps, _op_goal(tables, old_v2p, ids, bound, facts))

    return build


def _move(k, bound):
    def build():
        (v2p, p2v, content), old_v2p, old_p2v, (src, dst), hyps = _setup(k, bound, "src", "dst")
        # bands.move_ok: distinct live sources, distinct destinations, each free or a source
        hyps += [p2v[s] >= 1 for s in src] + [z3.Or(p2v[d] < 0, *[d == s for s in src]) for d in dst]
        moved_ids = [p2v[s] for s in src]
        move_pages(v2p, p2v, content, dst, src)
        goal = z3.And(
            well_formed(v2p, p2v, content, bound),  # inverse, and every live page holds its id's bytes
            *[z3.Select(v2p.arr, z3.Select(old_p2v, s)) == d for s, d in zip(src, dst)],  # each moved id is at its dst
            _others_unchanged(old_v2p, v2p.arr, moved_ids, bound),
            _every("live_v", bound, lambda v: (z3.Select(v2p.arr, v) >= 1) == (z3.Select(old_v2p, v) >= 1)),
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
            f"integrity.bind{_sfx}",
            "integrity",
            f"bands.bind_pages, {_k} id(s) to {_k} free page(s), {_num}: the tables stay inverse with each live "
            "page holding its id's bytes, each id is at its page, no other id changes",
            _bind(_k, _b),
            timeout_s=30.0,
        )
        add(
            f"integrity.unbind{_sfx}",
            "integrity",
            f"bands.unbind_ids, {_k} live id(s), {_num}: the tables stay inverse, the ids are unbound, their "
            "pages are returned and free, no other id changes",
            _unbind(_k, _b),
            timeout_s=30.0,
        )
        add(
            f"integrity.move{_sfx}",
            "integrity",
            f"bands.move_pages, {_k} pair(s) satisfying move_ok, {_num}: the tables stay inverse, every live "
            "id's bytes are at its new page, each moved id is at its destination, no other id moves, no id is "
            "born or lost",
            _move(_k, _b),
            timeout_s=40.0,
        )


def _disjoint(n):
    def build():
        f = Fresh()
        s = A.symbolic_state(f, "s_", n=n)
        d = f.int("page")
        cases, goals = [], []
        for i in range(n):
            b, p = s.bands[i], s.pools[i]
            for j in range(n):
                if j == i:
                    continue
                cases.append([A.opaque(s, i), A.opaque(s, j), b.lo <= d, d < b.hi])
                goals.append(z3.Or((d + 1) * p.epp <= A.low_f(s, j), A.high_f(s, j) <= d * p.epp))
        return Built(
            [A.layout_ok(s, first_pages=False), A.inv_order(s), A.inv_grid(s)],
            None,
            cases=cases,
            case_goals=goals,
            hints=A.layout_hint(s),
            lemmas="floor",
        )

    return build


for _n in (2, 3, 4):
    add(
        f"integrity.writes_disjoint.n{_n}",
        "integrity",
        f"{_n} pools: with the order and grid invariants, the bytes of any page inside an opaque band's span lie "
        "outside every other opaque band: a write by pool P (inside its span) touches no other pool's data",
        _disjoint(_n),
        timeout_s=30.0,
    )
