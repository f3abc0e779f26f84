"""Host transfers on the implementation (docs/design.md §13): the move gate,
reservations, and what every moving call does while moves are held.

Each case runs the same calls on the spec and on the implementation (the
spec is the reference: page for page, and error for error), on small
hand-built arenas: two ENDs, and two ENDs around a float, with page sizes
1, 4 and 16.  Then the implementation's own concerns: the memo sees the
gate with no other write, a fault undoes every new call, and the bytes a
load put on its reserved pages survive the relief that runs once the gate
opens.
"""

import copy

import pytest
import torch

from kvarena import impl, spec
from kvarena.impl import AccountingError, SubPool
from kvarena.verification.faults import count_ops, fault_at

PAGE_SIZES = (1, 4, 16)
ENTRY = 2  # bytes per token: a page of 16 tokens is 32 bytes


def pools(ps, with_float):
    up, down = SubPool("up", ENTRY, ps, "up"), SubPool("down", ENTRY, ps, "down")
    return [up, SubPool("f", ENTRY, ps, "float"), down] if with_float else [up, down]


def twins(ps=1, with_float=True, lazy=True, pages=24, **kw):
    """A spec arena and an implementation arena of the same layout."""
    layout = pools(ps, with_float)
    total = ENTRY * ps * pages
    return spec.Arena(total, layout, lazy=lazy, **kw), impl.Arena(total, layout, lazy=lazy, **kw)


def both(arenas, call):
    """``call(arena)`` on both twins; the results, as host lists, must agree."""
    got = [call(a) for a in arenas]
    host = [g.tolist() if isinstance(g, torch.Tensor) else g for g in got]
    assert host[0] == host[1], host
    ref, arena = arenas
    assert ref.snapshot() == arena.snapshot()
    ref.verify()
    arena.verify()
    return host[0]


def scattered(arenas, with_float=True):
    """Live pages with holes between them in every pool (lazy frees)."""
    for name in ("up", "down") + (("f",) if with_float else ()):
        ids = both(arenas, lambda a, name=name: a.alloc(name, 6))
        both(arenas, lambda a, name=name, ids=ids: a.free(name, ids[1:5:2]))


def refused(arenas, name, call):
    """``call`` is a ``ValueError`` naming ``name``, in the same words in
    both twins, and changes nothing."""
    before = [a.snapshot() for a in arenas]
    words = []
    for a in arenas:
        with pytest.raises(ValueError, match=f"pool {name!r}") as err:
            call(a)
        words.append(str(err.value))
    assert words[0] == words[1]
    assert [a.snapshot() for a in arenas] == before


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("with_float", [False, True])
def test_reserve_takes_the_pages_alloc_would_and_counts_them(ps, with_float):
    arenas = twins(ps, with_float)
    scattered(arenas, with_float)
    ref, arena = arenas
    for name in ("up", "down") + (("f",) if with_float else ()):
        probe = copy.deepcopy(arena)
        would = probe.translate(name, probe.alloc(name, 3)).tolist()  # holes first, then the frontier
        live, avail = arena.live_pages(name), arena.available_pages(name)
        pages = both(arenas, lambda a, name=name: a.reserve(name, 3))
        assert pages == would
        assert arena.live_pages(name) == live + 3 and arena.available_pages(name) == avail - 3
        assert both(arenas, lambda a, name=name: a.reserved(name))[-3:] == pages
        assert arena.moves_held() and ref.moves_held()
    assert isinstance(arena.reserve("up", 1), torch.Tensor)


def test_reserve_short_or_zero_changes_nothing():
    arenas = twins(4)
    before = arenas[1].snapshot()
    assert both(arenas, lambda a: a.reserve("up", a.available_pages("up") + 1)) is None
    assert both(arenas, lambda a: a.reserve("down", 0)) == []
    assert arenas[1].snapshot() == before and not arenas[1].moves_held()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_bind_reserved_gives_the_pages_to_the_ids(ps):
    arenas = twins(ps)
    scattered(arenas)
    ref, arena = arenas
    pages = both(arenas, lambda a: a.reserve("up", 3))
    ids = list(ref.bands["up"].free_ids[-3:])  # any free ids, in any order
    live = arena.live_pages("up")
    both(arenas, lambda a: a.bind_reserved("up", ids[::-1], pages))
    assert arena.translate("up", ids[::-1]).tolist() == pages
    assert arena.live_pages("up") == live and not arena.moves_held()
    assert not set(ids) & set(arena.free_ids("up").tolist())
    # a tensor of each, and nothing at all, as well
    pages = both(arenas, lambda a: a.reserve("down", 2))
    ids = list(ref.bands["down"].free_ids[:2])
    ref.bind_reserved("down", ids, pages)
    arena.bind_reserved("down", torch.tensor(ids), torch.tensor(pages))
    both(arenas, lambda a: a.bind_reserved("down", [], []))


def test_a_borrower_binds_its_lenders_ids():
    ref, arena = arenas = twins(4, borrow={"f": "up"})
    lent = both(arenas, lambda a: a.alloc("up", 4))
    pages = both(arenas, lambda a: a.reserve("f", 2))
    refused(arenas, "f", lambda a: a.bind_reserved("f", [ref.bands["up"].free_ids[0]], pages[:1]))  # not lent
    both(arenas, lambda a: a.bind_reserved("f", lent[2:], pages))
    assert arena.translate("f", lent[2:]).tolist() == pages


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_cancel_gives_the_pages_back_as_holes(ps):
    arenas = twins(ps)
    scattered(arenas)
    arena = arenas[1]
    holes = both(arenas, lambda a: a.holes("up"))
    pages = both(arenas, lambda a: a.reserve("up", 4))
    both(arenas, lambda a: a.cancel("up", pages[2:]))
    assert both(arenas, lambda a: a.reserved("up")) == pages[:2]
    both(arenas, lambda a: a.cancel("up", torch.tensor(pages[:2])))
    assert not arena.moves_held() and sorted(arena.holes("up").tolist()) == sorted(set(holes) | set(pages))


def test_cancelling_a_floats_last_pages_parks_it():
    arenas = twins(4)
    pages = both(arenas, lambda a: a.reserve("f", 3))
    assert arenas[1].frontiers("f")[0] < arenas[1].frontiers("f")[1]
    both(arenas, lambda a: a.cancel("f", pages))
    g = arenas[1].geometry("f")
    assert arenas[1].frontiers("f") == (g.num_pages * g.epp,) * 2 and arenas[1].counts("f").holes == 0


def test_bad_input_names_the_pool_and_changes_nothing():
    arenas = twins(4)
    scattered(arenas)
    ref = arenas[0]
    pages = both(arenas, lambda a: a.reserve("up", 2))
    free_ids = list(ref.bands["up"].free_ids)
    live = [v for v, p in enumerate(ref.bands["up"].v2p) if v > 0 and p >= 0]
    not_reserved = next(p for p in range(1, 30) if p not in pages)
    for name, call in [
        ("up", lambda a: a.reserve("up", -1)),
        ("up", lambda a: a.reserve("up", "2")),
        ("up", lambda a: a.reserve("up", True)),
        ("nowhere", lambda a: a.reserve("nowhere", 1)),
        ("up", lambda a: a.cancel("up", [not_reserved])),
        ("up", lambda a: a.cancel("up", [pages[0], pages[0]])),
        ("up", lambda a: a.cancel("up", ["x"])),
        ("up", lambda a: a.cancel("up", [1.0])),
        ("down", lambda a: a.cancel("down", pages)),  # reserved in another pool
        ("up", lambda a: a.bind_reserved("up", free_ids[:1], [not_reserved])),
        ("up", lambda a: a.bind_reserved("up", free_ids[:2], [pages[0], pages[0]])),
        ("up", lambda a: a.bind_reserved("up", free_ids[:1], pages)),  # not one id per page
        ("up", lambda a: a.bind_reserved("up", live[:1], pages[:1])),  # already allocated
        ("up", lambda a: a.bind_reserved("up", [0], pages[:1])),  # the sink
        ("up", lambda a: a.bind_reserved("up", [free_ids[0]] * 2, pages)),  # repeated id
        ("up", lambda a: a.bind_reserved("up", [10**6], pages[:1])),  # out of range
    ]:
        refused(arenas, name, call)


def test_an_eager_end_refuses_every_hold():
    arenas = twins(4, lazy={"up"})
    for call in (lambda a: a.close_gate(), lambda a: a.reserve("f", 1), lambda a: a.reserve("up", 1)):
        refused(arenas, "down", call)  # the eager END is named, whichever pool asked
    both(arenas, lambda a: a.open_gate())  # nothing to open: a no-op


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("hold", ["gate", "load"])
def test_while_held_nothing_moves(ps, hold):
    """Every moving call, held, moves no page; only the absorbing parts of
    a flush run (frontier holes, a float's boundary holes)."""
    arenas = twins(ps, pages=40)
    scattered(arenas)
    ref, arena = arenas
    b = ref.bands["down"]
    edge = [v for v, p in enumerate(b.v2p) if p == b.lo]
    both(arenas, lambda a: a.free("down", edge))  # a frontier hole: what a held flush still absorbs
    if hold == "gate":
        both(arenas, lambda a: a.close_gate())
    else:
        both(arenas, lambda a: a.reserve("f", 1))
    placed = {n: arena.v2p(n).tolist() for n in arena.chain}
    assert both(arenas, lambda a: a.flush("up")) == 0
    assert both(arenas, lambda a: a.flush("down", urgent=False)) == 0
    assert arena.counts("down").holes  # holes inside the band stay: nothing moved into them
    assert both(arenas, lambda a: a.flush("f")) == 0
    assert both(arenas, lambda a: a.compact_holes("f", "low")) == 0
    assert both(arenas, lambda a: a.make_room("f", "low", a.gap_bytes("f") + 1)) == 0
    assert both(arenas, lambda a: a.plan_floats({"up": a.available_pages("up") + 2})) == 0
    both(arenas, lambda a: a.relieve("up", a.available_pages("up") + 2))
    both(arenas, lambda a: a.relieve("down", a.available_pages("down") + 2))
    assert {n: arena.v2p(n).tolist() for n in arena.chain} == placed


def test_held_relief_then_relief_after_the_gate_opens():
    """Held, the ladder finds nothing to move; opened, it moves as it
    always did (both twins, page for page)."""
    for policy in spec.POLICIES:
        arenas = twins(4, pages=40, policy=policy)
        scattered(arenas)
        arena = arenas[1]
        need = arena.available_pages("up") + 2
        both(arenas, lambda a: a.close_gate())
        before = arena.snapshot()
        assert both(arenas, lambda a, need=need: a.relieve("up", need)) is False
        assert {n: p["v2p"] for n, p in arena.snapshot()["pools"].items()} == {
            n: p["v2p"] for n, p in before["pools"].items()
        }
        both(arenas, lambda a: a.open_gate())
        assert both(arenas, lambda a, need=need: a.relieve("up", need)) is True


def test_the_schedulable_view_credits_no_hole_while_held():
    arenas = twins(4, with_float=False)
    scattered(arenas, with_float=False)
    arena = arenas[1]
    assert arena.schedulable_available_size("up") > arena.available_size("up")  # down's holes credited
    for hold, release in [
        (lambda a: a.close_gate(), lambda a: a.open_gate()),
        (lambda a: a.reserve("up", 1), lambda a: a.cancel("up", a.reserved("up"))),
    ]:
        both(arenas, hold)
        assert both(arenas, lambda a: a.schedulable_available_size("up")) == arena.available_size("up")
        both(arenas, release)
        assert both(arenas, lambda a: a.schedulable_available_size("up")) > arena.available_size("up")


def test_the_gate_ticks_the_memo_with_no_other_write():
    """Closing or opening the gate changes no count, only a view: the memo
    must see it by construction (the gate is a capacity field), and a
    write around its descriptor is a stale memo ``verify`` reports."""
    _, a = twins(4)
    ids = a.alloc("down", 6)
    a.free("down", ids[1:4])
    credited = a.schedulable_available_size("up")  # fills the memo
    misses = a._memo.misses
    a.close_gate()
    assert a.schedulable_available_size("up") == a.available_size("up") < credited
    assert a._memo.misses == misses + 2  # no other write, yet both views are read afresh
    a.verify()
    a.open_gate()
    assert a.schedulable_available_size("up") == credited
    a.schedulable_available_size("up")
    a.__dict__["closed_gates"] = frozenset({"host"})  # around the descriptor: no tick
    with pytest.raises(AccountingError, match="stale memo"):
        a.verify()


def test_each_gate_source_ticks_the_memo_and_the_gate_opens_when_both_have():
    """A second source (PD) closes the same gate: every change of the closed
    set is a tick, and the spec and the implementation agree on the set."""
    arenas = twins(4)
    s, a = arenas
    ids = a.alloc("down", 6)
    s.alloc("down", 6)
    both(arenas, lambda x: x.free("down", [int(i) for i in ids[1:4]]))
    credited = a.schedulable_available_size("up")
    both(arenas, lambda x: x.close_gate("disagg"))
    assert a.schedulable_available_size("up") == a.available_size("up") < credited
    both(arenas, lambda x: x.close_gate("host"))
    a.schedulable_available_size("up")  # fills the memo
    misses = a._memo.misses
    s.open_gate("disagg")
    a.open_gate("disagg")  # host still holds: the view is read afresh, unchanged
    assert a.schedulable_available_size("up") == a.available_size("up") and a._memo.misses == misses + 2
    assert s.snapshot()["closed_gates"] == a.snapshot()["closed_gates"] == ["host"]
    both(arenas, lambda x: x.open_gate("host"))
    assert a.schedulable_available_size("up") == s.schedulable_available_size("up") == credited
    for x in arenas:
        with pytest.raises(ValueError, match="gate source 'pd'"):
            x.close_gate("pd")
    a.verify()


def test_with_a_forward_in_flight_a_reservation_settles_as_alloc_does():
    """A reservation that needs a guarded hole settles first, as ``alloc``
    does; one that does not leaves the forward in flight; a float that
    parks on a cancel settles if it holds a guarded hole (docs/design.md §12)."""
    arenas = twins(4)
    ref, arena = arenas
    ids = both(arenas, lambda a: a.alloc("up", 6))
    both(arenas, lambda a: a.launch({"up": ids[:2]}))
    both(arenas, lambda a: a.free("up", ids[:4]))  # two guarded holes (pinned, freed), two free ones
    both(arenas, lambda a: a.reserve("up", 2))
    assert ref.in_flight and arena.in_flight
    both(arenas, lambda a: a.reserve("up", 1))  # only a guarded hole is left
    assert not ref.in_flight and not arena.in_flight
    f = both(arenas, lambda a: a.alloc("f", 2))
    pages = both(arenas, lambda a: a.reserve("f", 1))
    both(arenas, lambda a: a.launch({"f": f}))
    both(arenas, lambda a: a.free("f", f))  # guarded holes; the reservation keeps the float
    assert ref.in_flight and arena.in_flight
    both(arenas, lambda a: a.cancel("f", pages))  # it parks, dropping guarded holes: settle first
    assert not ref.in_flight and not arena.in_flight


def test_verify_rules_of_a_hold():
    _, a = twins(4)
    pages = a.reserve("up", 2)
    b = a.bands["up"]
    b.live = b.live - 1  # the counter forgets a reservation
    with pytest.raises(AccountingError, match=r"live count \(0 bound \+ 2 reserved, counter 1\)") as err:
        a.verify()
    assert err.value.pool == "up"
    b.live = b.live + 1
    b.reserved = torch.cat([b.reserved, pages[:1]])  # a page reserved twice
    b.live = b.live + 1
    with pytest.raises(AccountingError, match="reserved pages"):
        a.verify()
    _, e = twins(4, lazy={"up"})
    e.closed_gates = frozenset({"host"})  # around close_gate's check
    with pytest.raises(AccountingError, match="hold needs lazy ENDs"):
        e.verify()


def test_snapshots_name_the_same_keys():
    ref, arena = twins(4)
    ref.reserve("f", 1), arena.reserve("f", 1)
    ref.close_gate(), arena.close_gate()
    s, i = ref.snapshot(), arena.snapshot()
    assert s == i and s["closed_gates"] == ["host"] and s["pools"]["f"]["reserved"] == i["pools"]["f"]["reserved"]


def test_loaded_bytes_survive_the_relief_after_the_gate_opens():
    """A load lands on reserved pages by physical page while the gate is
    closed; the ids that own them then, and the relief that runs once the
    gate opens (which moves them), keep those bytes."""
    _, a = twins(16, pages=64, policy="planner")
    lo, f = a.alloc("up", 12), a.alloc("f", 8)
    a.free("up", lo[8:])  # the oldest holes: up's frontier pages
    a.free("up", lo[:4])  # and holes deep in up, below them
    a.free("f", f[:6])
    a.close_gate()
    pages = a.reserve("up", 4)  # the load-back's pages: up's oldest holes, at its frontier
    seed = torch.Generator().manual_seed(7)
    data = torch.randint(0, 256, (4, a.geometry("up").epp), dtype=torch.uint8, generator=seed)
    a.page_view("up")[pages] = data  # the H2D copy, by physical page
    need = a.available_pages("down") + 4
    assert not a.relieve("down", need)  # held: nothing moves
    assert torch.equal(a.page_view("up")[pages], data)
    ids = a.free_ids("up")[:4]
    a.bind_reserved("up", ids, pages)
    a.open_gate()
    before = a.translate("up", ids)
    moved = a.flush("up") + a.plan_floats({"down": need})
    assert moved and not torch.equal(a.translate("up", ids), before)  # the relief moved the loaded pages
    assert torch.equal(a.read_pages("up", ids), data)
    a.verify()


@pytest.mark.parametrize("op", ["close_gate", "open_gate", "reserve", "bind_reserved", "cancel"])
def test_every_new_call_is_all_or_nothing(op):
    """Each torch operation of each call fails in turn: the fault comes out
    and the arena is as the call found it (``impl/journal.py``)."""
    _, base = twins(4, pages=40)
    for name in ("up", "f"):
        base.free(name, base.alloc(name, 6)[1:4])
    if op == "open_gate":
        base.close_gate()
    if op in ("bind_reserved", "cancel"):
        base.reserve("up", 3)

    def call(a):
        if op == "reserve":
            return a.reserve("up", 5)
        if op == "bind_reserved":
            return a.bind_reserved("up", a.free_ids("up")[-2:], a.reserved("up")[1:])
        if op == "cancel":
            return a.cancel("up", a.reserved("up")[:2])
        return getattr(a, op)()

    before = base.snapshot()
    x = copy.deepcopy(base)
    _, n = count_ops(lambda: call(x))
    assert x.snapshot() != before
    for k in range(n):
        x = copy.deepcopy(base)
        raised, _ = fault_at(k, lambda x=x: call(x))
        assert raised and x.snapshot() == before, (op, k)
        x.verify()
    gate = copy.deepcopy(base)  # a scope that closes the gate and then fails opens it again
    with pytest.raises(RuntimeError), gate.atomic():
        gate.close_gate()
        raise RuntimeError
    assert gate.gate_closed == base.gate_closed
