"""In-flight forwards (docs/design.md §12, issue 40 item 1), on both packages:
``launch``/``settle``, the pins and pending pages each operation must
respect, when each one settles, and the spec and the implementation
agreeing page for page after random schedules with a forward in flight.

Pages are hand-placed where a rule decides which page goes where; each
test names the rule it pins down.  The byte-level effects (a late write
landing at its launch-time slot, a pending page's bytes surviving) are in
``tests/impl/test_inflight.py``."""

import collections
import copy
import random

import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import SubPool
from tests.support import ints, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

PACKAGES = [pytest.param(spec, id="spec"), pytest.param(impl, id="impl")]
EPP = 8
POOLS = [SubPool("u", EPP, 1, "up"), SubPool("f", EPP, 1, "float"), SubPool("d", EPP, 1, "down")]


def arena(pkg, lazy=True, policy="anchor"):
    """64 pages of ``EPP`` bytes in each grid: the up END ``u``, the float
    ``f`` and the down END ``d``."""
    return pkg.Arena(EPP * 64, POOLS, lazy=lazy, policy=policy)


def page_of(a, name, v):
    return ints(a.translate(name, [v]))[0]


def id_at(a, name, page):
    return next(v for v in live_ids(a, name) if page_of(a, name, v) == page)


def guarded(a, name):
    return set(ints(a.pinned(name))) | set(ints(a.pending(name)))


def hole_order(a, name):
    """The holes, oldest first (``holes()`` sorts them; the snapshot keeps the order)."""
    return a.snapshot()["pools"][name]["holes"]


def views(a):
    return {n: (a.available_pages(n), a.schedulable_available_size(n), a.gap_bytes(n)) for n in a.chain}


def walked(pkg):
    """The up END ``u`` with pages 1..10 bound and pages 2, 3, 4 freed:
    survivors 8, 9 and 10 lie beyond the packed edge (8), holes 2, 3 and 4
    inside it."""
    a = arena(pkg)
    a.alloc("u", 10)
    assert [page_of(a, "u", v) for v in live_ids(a, "u")] == list(range(1, 11))
    a.free("u", [id_at(a, "u", p) for p in (2, 3, 4)])
    return a


# ---------------------------------------------------------- launch, settle


@pytest.mark.parametrize("pkg", PACKAGES)
def test_launch_pins_the_pages_its_ids_hold_and_settle_lifts_them(pkg):
    a = arena(pkg)
    ids = ints(a.alloc("u", 6))
    a.alloc("d", 3)
    before = views(a)
    assert not a.in_flight and not a.snapshot()["in_flight"]
    a.launch({"u": [ids[1], -1, ids[4], 0, ids[1]]})  # -1 and the sink are padding; a repeat pins once
    pages = sorted(page_of(a, "u", v) for v in (ids[1], ids[4]))
    assert a.in_flight and a.snapshot()["in_flight"]
    assert ints(a.pinned("u")) == pages and ints(a.pending("u")) == [] and ints(a.pinned("d")) == []
    assert a.snapshot()["pools"]["u"]["pinned"] == [[p, id_at(a, "u", p)] for p in pages]
    assert views(a) == before  # a launch changes no count
    a.verify()
    a.settle()
    assert not a.in_flight and ints(a.pinned("u")) == [] and views(a) == before
    with unchanged(a):
        a.settle()  # nothing in flight: nothing to do


@pytest.mark.parametrize("pkg", PACKAGES)
def test_launch_none_pins_every_live_page_and_a_second_launch_adds_pins(pkg):
    a = arena(pkg)
    f = ints(a.alloc("f", 5))
    a.free("f", f[1:2])  # a hole: not pinned
    u = ints(a.alloc("u", 3))
    a.launch({"f": None, "u": u[:1]})
    assert ints(a.pinned("f")) == sorted(page_of(a, "f", v) for v in live_ids(a, "f"))
    a.launch({"u": u[2:]})  # still in flight: its pins join the first's
    assert ints(a.pinned("u")) == sorted(page_of(a, "u", v) for v in (u[0], u[2]))
    a.verify()
    a.settle()
    assert all(ints(a.pinned(n)) == [] for n in a.chain)


BAD_LAUNCHES = [
    (lambda u: {"x": [u]}, "pool 'x': unknown pool"),
    (lambda u: {"u": [1.5]}, "pool 'u': launch: ids must be ints"),
    (lambda u: {"u": [True]}, "pool 'u': launch: ids must be ints"),
    (lambda u: {"u": 5}, "pool 'u': launch: ids must be ints"),
    (lambda u: {"u": [u, -2]}, r"pool 'u': launch: id -2 out of range \[-1, 64\)"),
    (lambda u: {"u": [64]}, r"pool 'u': launch: id 64 out of range \[-1, 64\)"),
    (lambda u: {"u": [u, 9]}, "pool 'u': launch: id 9 is not allocated"),
    (lambda u: {"u": [u], "d": [u]}, "pool 'd': launch: id 1 is not allocated"),  # and u's id is not pinned
]


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize(("writes", "words"), BAD_LAUNCHES)
def test_a_bad_launch_is_a_value_error_naming_the_pool_and_changes_nothing(pkg, writes, words):
    a = arena(pkg)
    u = ints(a.alloc("u", 3))[0]
    assert u == 1 and live_ids(a, "d") == []
    with unchanged(a), pytest.raises(ValueError, match=words):
        a.launch(writes(u))
    assert not a.in_flight


# ------------------------------------------------------ the non-urgent walk


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_pinned_survivor_stops_the_non_urgent_walk_and_what_it_vacates_waits(pkg):
    """Up END: the walk from the frontier moves 10 into 2 (the deepest
    hole), then stops at the pinned 9; 10 is pending, a hole at the back of
    the list; the frontier stays over it.  After settle it is a plain hole,
    and the urgent flush packs the band."""
    a = walked(pkg)
    moved_id, kept_id = id_at(a, "u", 10), id_at(a, "u", 9)
    a.launch({"u": [kept_id]})
    assert a.flush("u", urgent=False) == 1
    assert a.in_flight  # a non-urgent flush never waits
    assert page_of(a, "u", moved_id) == 2 and page_of(a, "u", kept_id) == 9
    assert ints(a.pending("u")) == [10] and a.snapshot()["pools"]["u"]["pending"] == [[10, moved_id]]
    assert hole_order(a, "u") == [3, 4, 10] and a.frontiers("u") == (EPP, 11 * EPP)
    a.verify()
    a.settle()
    assert ints(a.pending("u")) == [] and hole_order(a, "u") == [3, 4, 10]
    assert a.flush("u") == 2 and ints(a.holes("u")) == [] and a.frontiers("u") == (EPP, 8 * EPP)
    a.verify()


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_walk_of_a_down_end_stops_at_its_first_pinned_survivor(pkg):
    """Down END, the mirror: pages 54..63, holes 60, 61, 62; survivors 54,
    55, 56 beyond the edge (57); 55 pinned: 54 moves into 62 (the deepest
    hole) and waits, pending."""
    a = arena(pkg)
    a.alloc("d", 10)
    assert sorted(page_of(a, "d", v) for v in live_ids(a, "d")) == list(range(54, 64))
    a.free("d", [id_at(a, "d", p) for p in (60, 61, 62)])
    moved_id = id_at(a, "d", 54)
    a.launch({"d": [id_at(a, "d", 55)]})
    assert a.flush("d", urgent=False) == 1
    assert page_of(a, "d", moved_id) == 62 and ints(a.pending("d")) == [54]
    assert hole_order(a, "d") == [60, 61, 54] and a.frontiers("d") == (54 * EPP, 64 * EPP)
    a.verify()


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_walk_fills_no_guarded_hole_and_without_pins_is_the_urgent_flush(pkg):
    """A freed pinned page (3) stays a hole the walk skips: 10 goes to 2,
    the only unguarded hole inside; with nothing pinned in the band the
    walk moves as the urgent flush does."""
    a = arena(pkg)
    a.alloc("u", 10)
    a.launch({"u": [id_at(a, "u", 3)]})
    a.free("u", [id_at(a, "u", p) for p in (2, 3)])
    assert ints(a.pinned("u")) == [3] and a.snapshot()["pools"]["u"]["pinned"] == [[3, 0]]  # freed: FREED
    moved_id = id_at(a, "u", 10)
    assert a.flush("u", urgent=False) == 1
    assert page_of(a, "u", moved_id) == 2 and sorted(hole_order(a, "u")) == [3, 10]
    a.verify()
    free, still = walked(pkg), walked(pkg)
    free.launch({"d": []})  # in flight, nothing of u pinned
    assert free.flush("u", urgent=False) == still.flush("u") == 3
    placed = [[page_of(x, "u", v) for v in live_ids(x, "u")] for x in (free, still)]
    assert placed[0] == placed[1]
    assert ints(free.pending("u")) == [8, 9, 10] and free.frontiers("u") == (EPP, 11 * EPP)


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_non_urgent_flush_leaves_a_float_with_a_guarded_hole_alone(pkg):
    a = arena(pkg)
    f = ints(a.alloc("f", 4))
    a.launch({"f": f[-1:]})
    a.free("f", f[-1:])  # the boundary page, pinned: a guarded hole at the edge
    with unchanged(a):
        assert a.flush("f", urgent=False) == 0
    assert a.flush("f") == 0 and not a.in_flight  # the urgent one settles, then refits
    assert ints(a.holes("f")) == []


# --------------------------------------------------------------- hand-outs


def guarded_state(pkg):
    """In flight, with the float's and the up END's hole lists holding
    unguarded, freed-pinned and pending holes in a mixed order."""
    a = arena(pkg)
    u = ints(a.alloc("u", 12))
    f = ints(a.alloc("f", 10))
    a.launch({"u": [u[1], u[5], u[9]], "f": [f[2], f[7]]})
    a.free("u", [u[0], u[1], u[3]])  # holes 1, 2 (pinned), 4
    a.free("f", [f[2], f[4], f[7], f[8]])
    assert a.flush("u", urgent=False) == 2  # 11 and 12 move into 1 and 4 and wait; the walk stops at 10
    a.free("u", [u[6]])
    a.verify()
    return a


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("name", ["u", "f"])
def test_an_alloc_takes_the_unguarded_holes_oldest_first_and_settles_exactly_when_alloc_settles_says(pkg, name):
    """For every n the gate allows: ``transitions.alloc_settles`` (a guarded
    hole, and more pages than the unguarded holes) decides whether it
    settles; without a settle the pages are the unguarded holes in hole
    order and no guarded one is handed out."""
    base = guarded_state(pkg)
    order, guards = hole_order(base, name), guarded(base, name)
    assert guards & set(order) and set(order) - guards  # both kinds of hole
    unguarded = [h for h in order if h not in guards]
    for n in range(base.available_pages(name) + 1):
        a = copy.deepcopy(base)
        g = len(guards & set(order))
        settles = g > 0 and n > len(order) - g
        pages = [page_of(a, name, v) for v in ints(a.alloc(name, n))]
        assert a.in_flight == (not settles), n
        if settles:
            assert pages[: len(order)] == order[:n]
        else:
            assert pages == unguarded[:n] and not set(pages) & guards
            assert hole_order(a, name) == [h for h in order if h not in pages]  # the rest keep their order
        a.verify()


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_borrowed_bind_passes_over_the_borrowers_guarded_holes(pkg):
    """A borrower's alloc (the coupled bind's second half) follows the same rule."""
    a = pkg.Arena(EPP * 64, POOLS, lazy=True, borrow={"f": "d"})
    d = ints(a.alloc("d", 10))
    a.alloc("f", 6, ids=d[:6])
    a.launch({"f": d[1:2]})
    a.free("f", d[:3])
    assert guarded(a, "f") & set(hole_order(a, "f"))
    got = a.alloc("f", 2, ids=d[6:8])
    assert a.in_flight and not {page_of(a, "f", v) for v in ints(got)} & guarded(a, "f")
    a.alloc("f", 2, ids=d[8:10])  # past the unguarded holes: settles first
    assert not a.in_flight
    a.verify()


# ------------------------------------------------------------------- frees


@pytest.mark.parametrize("pkg", PACKAGES)
def test_an_eager_free_settles_and_a_lazy_one_keeps_the_freed_pin(pkg):
    eager = arena(pkg, lazy=False)
    u = ints(eager.alloc("u", 4))
    eager.launch({"u": u[:1]})
    eager.free("u", u[3:])  # even an unpinned page: the compaction moves
    assert not eager.in_flight and ints(eager.pinned("u")) == []
    lazy = arena(pkg)
    u = ints(lazy.alloc("u", 4))
    page = page_of(lazy, "u", u[1])
    lazy.launch({"u": u[1:2]})
    lazy.free("u", u[1:2])
    assert lazy.in_flight and ints(lazy.pinned("u")) == [page] and page in ints(lazy.holes("u"))
    lazy.verify()


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize(
    ("pin", "settles"),
    [("a hole", True), ("the last page", True), ("another pool", False)],
)
def test_a_float_that_parks_settles_only_if_a_hole_or_a_freed_page_is_guarded(pkg, pin, settles):
    a = arena(pkg)
    f = ints(a.alloc("f", 3))
    u = ints(a.alloc("u", 1))
    a.launch({"f": f[:1]} if pin == "a hole" else {"f": f[2:]} if pin == "the last page" else {"u": u})
    a.free("f", f[:2])
    assert a.in_flight
    a.free("f", f[2:])  # the float parks: it drops its holes
    assert a.in_flight == (not settles)
    assert a.frontiers("f") == (64 * EPP, 64 * EPP) and ints(a.holes("f")) == []
    a.verify()


# ------------------------------------------------------- the urgent path


@pytest.mark.parametrize("pkg", PACKAGES)
def test_an_urgent_flush_settles_when_it_moves_or_the_band_holds_a_guarded_hole(pkg):
    a = walked(pkg)
    a.launch({"u": [id_at(a, "u", 9)]})
    with unchanged(a):
        assert a.flush("u", max_moves=0) == 0  # no move, no guarded hole: still in flight
    assert a.in_flight
    assert a.flush("u", max_moves=1) == 1 and not a.in_flight  # a move settles first
    b = walked(pkg)
    b.launch({"u": [id_at(b, "u", 5)]})
    b.free("u", [id_at(b, "u", 5)])  # a guarded hole
    assert b.flush("u", max_moves=0) == 0 and not b.in_flight


@pytest.mark.parametrize("pkg", PACKAGES)
def test_make_room_and_compact_holes_settle_when_they_move(pkg):
    a = arena(pkg)
    f = ints(a.alloc("f", 6))
    a.launch({"f": f[:1]})
    low = a.frontiers("f")[0] - a.below("f")
    with unchanged(a):
        assert a.make_room("f", "low", low) == 0  # the side has it: nothing moves, no settle
    assert a.make_room("f", "low", low + 2 * EPP) > 0 and not a.in_flight
    b = arena(pkg)
    f = ints(b.alloc("f", 6))
    b.free("f", f[1:2])
    b.launch({"f": f[:1]})
    assert b.compact_holes("f", "low") > 0 and not b.in_flight


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_planner_repack_settles_and_a_relief_that_moves_nothing_does_not(pkg):
    a = arena(pkg, policy="planner")
    a.alloc("u", 20)
    f = ints(a.alloc("f", 10))
    a.alloc("d", 20)
    a.launch({"f": f[:1]})
    assert a.relieve("d", a.available_pages("d")) and a.in_flight  # it fits at once
    need = a.available_pages("d") + 3
    assert a.relieve("d", need) and not a.in_flight  # the float moves: settled first
    a.verify()


# -------------------------------------------- spec and implementation agree


def schedule(seed, pkgs, seen, borrow=False):
    """A random schedule with forwards launched and settled, run on each
    package's arena in step; the two snapshots must stay equal.  ``seen``
    counts what the steps reached."""
    rng = random.Random(seed)
    lazy, policy = rng.random() < 0.75, rng.choice(["anchor", "planner"])
    kw = {"borrow": {"f": "d"}} if borrow else {}
    arenas = [p.Arena(EPP * 48, POOLS, lazy=lazy, policy=policy, **kw) for p in pkgs]
    first = arenas[0]
    for _ in range(70):
        name = rng.choice(first.chain)
        live = live_ids(first, name)
        op = rng.choice(["alloc"] * 3 + ["free"] * 2 + ["walk", "flush", "launch", "launch", "settle", "slide"])
        if op == "alloc":
            if borrow and name == "f":
                spare = [v for v in live_ids(first, "d") if v not in live]
                ids = rng.sample(spare, rng.randint(0, min(3, len(spare))))
                args, kwargs = ("f", len(ids)), {"ids": ids}
            else:
                args, kwargs = (name, rng.randint(0, 4)), {}
            call = "alloc"
        elif op == "free":
            if not live or (borrow and name == "d" and set(live) & set(live_ids(first, "f"))):
                continue
            args, kwargs, call = (name, rng.sample(live, rng.randint(1, min(4, len(live))))), {}, "free"
        elif op in ("walk", "flush"):
            args, kwargs, call = (name, rng.choice([None, 0, 1, 2])), {"urgent": op == "flush"}, "flush"
        elif op == "launch":
            writes = {name: rng.sample(live, rng.randint(0, len(live))) + [-1, 0]}
            if rng.random() < 0.3:
                writes[rng.choice(first.chain)] = None
            args, kwargs, call = (writes,), {}, "launch"
        elif op == "settle":
            args, kwargs, call = (), {}, "settle"
        else:
            args, kwargs, call = (name, rng.randint(1, 12)), {}, "relieve"
        outs, flying = [], first.in_flight
        for a in arenas:
            out = getattr(a, call)(*args, **kwargs)
            outs.append(ints(out) if isinstance(out, (list, torch.Tensor)) else out)
            a.verify()
        assert outs[0] == outs[1], (seed, call, args, kwargs, outs)
        snap = arenas[0].snapshot()
        assert snap == arenas[1].snapshot(), (seed, call, args, kwargs)
        seen[f"{call} settled"] += flying and not snap["in_flight"]
        seen["pending"] += any(p["pending"] for p in snap["pools"].values())
        seen["freed pin"] += any(v == 0 for p in snap["pools"].values() for _, v in p["pinned"])


@pytest.mark.parametrize("borrow", [False, True])
def test_random_schedules_with_forwards_in_flight_agree_page_for_page(borrow):
    seen = collections.Counter()
    for seed in range(25):
        schedule(seed, [spec, impl], seen, borrow)
    for event in ("pending", "freed pin", "alloc settled", "free settled", "flush settled", "relieve settled"):
        assert seen[event], (event, seen)  # the schedules reach each kind


# --------------------------------------------------------------- composites


def composite(pkg, kind, lazy=True, ps=2):
    total = 8 * ps * 48
    if kind == "hybrid":
        return pkg.HybridSWA(total, 8, 8, ps, lazy=lazy)
    if kind == "mamba":
        return pkg.MambaHybrid(total, 8, 8 * ps, ps, lazy=lazy)
    return pkg.TriPool(total, 8, 8, 8 * ps, ps, lazy=lazy)


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_a_composite_launch_pins_full_swa_where_live_and_the_state_slots(pkg, kind):
    c = composite(pkg, kind)
    toks = ints(c.alloc_extend([0, 0], [5, 4], [-1, -1]))
    has_state = kind != "hybrid"
    slots = ints(c.alloc_state(3)) if has_state else []
    if kind != "mamba":
        c.free_swa(toks[:2], 0)  # the first page leaves the window: not live in swa
    c.launch([toks[0], toks[4], -1, 1], slots[1:2] if has_state else None)  # -1 and page 0: padding
    a = c.arena
    pages = [toks[0] // 2, toks[4] // 2]
    assert ints(a.pinned("full")) == sorted(page_of(a, "full", v) for v in pages)
    if kind != "mamba":
        assert ints(a.pinned("swa")) == [page_of(a, "swa", pages[1])]
    if has_state:
        assert ints(a.pinned("state")) == [page_of(a, "state", slots[1])]
        c.launch([], None)  # every live slot
        assert ints(a.pinned("state")) == sorted(page_of(a, "state", s) for s in slots)
    c.verify()
    c.settle()
    assert not a.in_flight and all(ints(a.pinned(n)) == [] for n in a.chain)


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (lambda t: ([t[0], -2], None), "launch: token -2 names no token"),
        (lambda t: ([t[0], 10**6], None), "launch: token 1000000 is out of range"),
        (lambda t: ([t[0], t[-1] + 6], None), "is not allocated"),
        (lambda t: ([t[0], "a"], None), r"launch: token_ids\[1\] must be an int"),
        (lambda t: ([t[0]], [7]), "pool 'state': launch: id 7 is not allocated"),
    ],
)
def test_a_bad_composite_launch_is_a_value_error_and_changes_nothing(pkg, args, words):
    c = composite(pkg, "tri")
    toks = ints(c.alloc_extend([0], [5], [-1]))
    c.alloc_state(1)
    with unchanged(c.arena), pytest.raises(ValueError, match=words):
        c.launch(*args(toks))


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("kind", ["hybrid", "tri"])
def test_flush_opportunistic_walks_each_lazy_end_without_waiting(pkg, kind):
    c = composite(pkg, kind)
    reqs = [ints(c.alloc_extend([0], [6], [-1])) for _ in range(4)]
    c.free(reqs[0] + reqs[2])  # holes under survivors in full
    c.launch(reqs[3][-1:])  # the newest request's last page: pinned
    moved = c.flush_opportunistic()
    assert c.arena.in_flight and moved == 2  # request 1 moves under request 3's pinned page
    assert len(ints(c.arena.pending("full"))) == 2
    c.verify()
    assert c.flush_opportunistic(max_moves=0) == 0
    eager = composite(pkg, kind, lazy=False)
    eager.alloc_extend([0], [6], [-1])
    assert eager.flush_opportunistic() == 0


def test_composite_schedules_with_forwards_in_flight_agree_page_for_page():
    for seed in range(12):
        rng = random.Random(seed)
        kind, lazy = rng.choice(["hybrid", "mamba", "tri"]), rng.random() < 0.7
        cs = [composite(p, kind, lazy) for p in (spec, impl)]
        reqs = []
        for _ in range(40):
            op = rng.choice(["extend", "extend", "free", "launch", "settle", "flush", "window"])
            if (op in ("free", "window") and not reqs) or (op == "window" and kind == "mamba"):
                continue
            i, n = rng.randrange(max(1, len(reqs))), rng.randint(1, 7)
            outs = []
            for c in cs:
                if op == "extend":
                    out = c.alloc_extend([0], [n], [-1])
                elif op == "free":
                    out = c.free(reqs[i])
                elif op == "launch":
                    out = c.launch([r[-1] for r in reqs], None)
                elif op == "settle":
                    out = c.settle()
                elif op == "flush":
                    out = c.flush_opportunistic()
                else:
                    out = c.free_swa(reqs[i][:2], 0)
                outs.append(None if out is None else out if isinstance(out, int) else ints(out))
                c.verify()
            assert outs[0] == outs[1], (seed, op)
            if op == "extend" and outs[0] is not None:
                reqs.append(outs[0])
            if op == "free":
                reqs.pop(i)
            assert cs[0].snapshot() == cs[1].snapshot(), (seed, op)
