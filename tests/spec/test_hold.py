"""Move holds for host transfers (docs/design.md §13): the gate, reservations,
and what every moving operation does while moves are held, on small
hand-built arenas, with the spec's contracts checked on every call.  Two
planted bugs (a held flush that moves; a view that keeps its credit under a
hold) must fail the checks."""

import copy

import pytest

from kvarena.spec import AccountingError, Arena, SubPool, chain, contracts, moves
from kvarena.spec import arena as arena_mod
from tests.support import check_all, live_ids, unchanged

U, F, D = SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")


@pytest.fixture(autouse=True)
def contracts_checked():
    """Every spec contract checked on every call, the new ``post:`` lines included."""
    with contracts.checking():
        yield


def duo():
    """Two lazy ENDs of 16-byte pages (40 pages, min_page 1): u holds ids 1, 2
    on pages 1, 2; d holds ids 1..8 on pages 32..39 (id 1 at the frontier)
    with holes at ids 3 and 4 (pages 34, 35) behind live pages."""
    a = Arena(640, [U, D], lazy=True)
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.free("d", [3, 4])
    assert a.v2p("d")[1:9] == [32, 33, -1, -1, 36, 37, 38, 39] and a.holes("d") == [34, 35]
    return a


def tri():
    """u, a float f and d of 16-byte pages (100 pages each), every END lazy:
    u ids 1..4 on pages 1..4; d ids 1..8 on pages 92..99 with holes at ids 3,
    4 (pages 94, 95); f ids 1..6 on pages 45..50 with a hole at id 2 (page 46)."""
    a = Arena(1600, [U, F, D], lazy=True)
    a.alloc("u", 4)
    a.alloc("d", 8)
    a.alloc("f", 6)
    a.free("d", [3, 4])
    a.free("f", [2])
    assert a.v2p("f")[1:7] == [45, -1, 47, 48, 49, 50] and a.holes("f") == [46]
    assert a.v2p("d")[1:9] == [92, 93, -1, -1, 96, 97, 98, 99] and a.holes("d") == [94, 95]
    return a


def views(a):
    return {
        n: (a.available_pages(n), a.available_size(n), a.schedulable_available_size(n), a.conserved_available_size(n))
        for n in a.chain
    }


def free_ids(a, name):
    return a.snapshot()["pools"][name]["free_ids"]


def stayed(before, after):
    """Every id bound in both placements (``Arena._placement``) is on the same page."""
    return all(after[n][v] == p for n, m in before.items() for v, p in m.items() if v > 0 and v in after[n])


# ------------------------------------------------------------------ the gate


def test_the_gate_holds_moves_and_changes_no_count():
    a = duo()
    s = a.state()
    assert not a.gate_closed and not a.moves_held()
    assert a.schedulable_available_size("u") > a.available_size("u")  # d's holes credited
    a.close_gate()
    assert a.gate_closed and a.moves_held() and a.state() == s
    assert a.snapshot()["closed_gates"] == ["host"]
    for n in a.chain:  # only the view that credits a move changes
        assert a.schedulable_available_size(n) == a.available_size(n)
    a.close_gate()  # closing twice is closing
    assert a.gate_closed
    a.open_gate()
    assert not a.gate_closed and not a.moves_held() and a.state() == s
    assert a.schedulable_available_size("u") > a.available_size("u")
    a.open_gate()  # opening an open gate changes nothing
    check_all(a)


def test_two_sources_hold_one_gate():
    """HiCache and PD close the one gate each for itself: it opens when both have."""
    a = duo()
    s = a.state()
    a.close_gate("host")
    a.close_gate("disagg")
    assert a.snapshot()["closed_gates"] == ["disagg", "host"]
    a.open_gate("host")
    assert a.gate_closed and a.moves_held() and a.closed_gates == {"disagg"}
    assert a.flush("d", max_moves=None) == 0 and a.state() == s  # still held: the flush moves nothing
    a.open_gate("disagg")
    assert not a.moves_held()
    assert a.flush("d", max_moves=None) > 0  # the hold is over: the flush compacts
    check_all(a)


def test_an_unknown_gate_source_changes_nothing():
    a = duo()
    with unchanged(a):
        for call in (a.close_gate, a.open_gate):
            with pytest.raises(ValueError, match="gate source 'pd': expected one of"):
                call("pd")


@pytest.mark.parametrize("lazy,eager", [(False, "u"), ({"u"}, "d"), ({"d"}, "u")])
def test_a_hold_refuses_an_eager_end_naming_it_and_changes_nothing(lazy, eager):
    a = Arena(1600, [U, F, D], lazy=lazy)
    a.alloc("u", 2)
    a.alloc("d", 2)
    with unchanged(a):
        with pytest.raises(ValueError, match=f"pool '{eager}': close_gate holds moves, but this END is eager"):
            a.close_gate()
        for name in a.chain:
            with pytest.raises(ValueError, match=f"pool '{eager}': reserve\\('{name}'\\) holds moves.*eager"):
                a.reserve(name, 1)
    assert not a.moves_held()


# ------------------------------------------------------------ reservations


@pytest.mark.parametrize("name,n", [("u", 3), ("d", 1), ("d", 4), ("f", 1), ("f", 3)])
def test_reserve_takes_the_pages_alloc_would_and_counts_them_in_every_view(name, n):
    a = tri()
    b = copy.deepcopy(a)
    ids_before = live_ids(a, name)
    got = b.alloc(name, n)
    pages = a.reserve(name, n)
    assert pages == b.translate(name, got)  # holes first, oldest first, then the frontier
    assert a.reserved(name) == pages and a.moves_held() and not a.gate_closed
    assert a.snapshot()["pools"][name]["reserved"] == pages
    assert a.state() == b.state()  # the counts alloc leaves: live, holes, span
    assert a.holes(name) == b.holes(name) and not set(pages) & set(a.holes(name))
    for m in a.chain:  # live in every view
        assert a.live_pages(m) == b.live_pages(m)
        assert a.available_pages(m) == b.available_pages(m)
        assert a.conserved_available_size(m) == b.conserved_available_size(m)
        assert a.schedulable_available_size(m) == a.available_size(m)  # held: no credit
    assert all(a.p2v(name)[p] < 0 for p in pages)  # owned by no id
    assert live_ids(a, name) == ids_before and free_ids(a, name) == free_ids(tri(), name)
    check_all(a)


def test_reserve_zero_and_short():
    a = tri()
    with unchanged(a):
        assert a.reserve("d", 0) == []
        assert a.reserve("d", a.available_pages("d") + 1) is None
    assert not a.moves_held()
    n, b = a.available_pages("f"), copy.deepcopy(a)
    b.alloc("f", n)
    assert len(a.reserve("f", n)) == n and a.state() == b.state()  # every page the gate prices
    check_all(a)


@pytest.mark.parametrize(
    "name,n,msg",
    [
        ("x", 1, "pool 'x': unknown pool"),
        ("d", -1, "pool 'd': n must be >= 0"),
        ("d", 1.0, "pool 'd': n must be an int"),
        ("d", True, "pool 'd': n must be an int"),
        ("f", "2", "pool 'f': n must be an int"),
    ],
)
def test_reserve_refuses_bad_arguments_naming_the_pool(name, n, msg):
    a = tri()
    with unchanged(a), pytest.raises(ValueError, match=msg):
        a.reserve(name, n)


def test_bind_reserved_gives_the_pages_to_ids_and_the_loads_bytes_are_theirs():
    a = tri()
    live = a.live_pages("d")
    pages = a.reserve("d", 4)
    assert pages == [94, 95, 90, 91]  # the two holes, then two frontier pages
    free = free_ids(a, "d")
    ids = [free[-1], free[0]]  # any free ids, in any order
    a.bind_reserved("d", ids, pages[:2])
    assert a.translate("d", ids) == pages[:2]
    assert [a.content("d")[p] for p in pages[:2]] == ids  # the bytes the load wrote are the ids'
    assert a.reserved("d") == pages[2:] and a.moves_held()
    assert a.live_pages("d") == live + 4 and not set(ids) & set(free_ids(a, "d"))
    more = free_ids(a, "d")[:2]
    a.bind_reserved("d", iter(more), iter(pages[2:]))  # one-shot iterators are fine
    assert a.translate("d", more) == pages[2:] and a.reserved("d") == []
    assert not a.moves_held() and a.live_pages("d") == live + 4
    check_all(a)
    assert a.alloc("d", 1) not in ([v] for v in ids + more)  # the FIFO no longer hands them out
    # the bytes follow their ids once moves run again
    a.free("d", [1, 2])
    assert a.flush("d") > 0
    check_all(a)
    assert [a.content("d")[a.v2p("d")[v]] for v in ids + more] == ids + more


@pytest.mark.parametrize(
    "ids,pages,msg",
    [
        ([9], [93], "pool 'd': bind_reserved: pages \\[93\\] are not reserved"),
        ([9, 10], [90, 90], "pool 'd': bind_reserved: repeated page"),
        ([9], ["90"], "pool 'd': bind_reserved: pages must be ints"),
        ([1], [90], "pool 'd': id 1 is already allocated"),
        ([0], [90], "pool 'd': id 0 is the sink"),
        ([9, 9], [90, 91], "pool 'd': repeated id"),
        ([999], [90], "pool 'd': id 999 out of range"),
        ([9], [90, 91], "pool 'd': bind_reserved: 1 ids for 2 pages"),
    ],
)
def test_bind_reserved_refuses_and_changes_nothing(ids, pages, msg):
    a = tri()
    a.reserve("d", 4)
    with unchanged(a), pytest.raises(ValueError, match=msg):
        a.bind_reserved("d", ids, pages)
    with unchanged(a), pytest.raises(ValueError, match="pool 'x': unknown pool"):
        a.bind_reserved("x", [9], [90])
    with unchanged(a), pytest.raises(ValueError, match="pool 'u': bind_reserved: pages \\[90\\] are not reserved"):
        a.bind_reserved("u", [9], [90])  # reserved, but in another pool


def test_cancel_gives_the_pages_back_as_holes_and_a_round_trip_takes_back_no_promise():
    a = tri()
    before = views(a)
    ids = {n: dict(enumerate(a.v2p(n))) for n in a.chain}
    pages = a.reserve("d", 4)
    a.cancel("d", pages[1:3])
    assert a.reserved("d") == [pages[0], pages[3]] and a.moves_held()
    assert sorted(pages[1:3]) == a.holes("d") and a.live_pages("d") == 8
    a.cancel("d", (pages[3], pages[0]))
    assert a.reserved("d") == [] and not a.moves_held()
    assert a.holes("d") == sorted(pages) and a.live_pages("d") == 6
    assert {n: dict(enumerate(a.v2p(n))) for n in a.chain} == ids  # no id moved
    after = views(a)
    assert after["d"][0] == before["d"][0]  # the reserving END's available: the same
    for n in ("u", "d"):  # both ENDs' schedulable views: at least what they were
        assert after[n][2] >= before[n][2]
    a.cancel("d", [])  # nothing
    check_all(a)


@pytest.mark.parametrize(
    "pages,msg",
    [
        ([93], "pool 'd': cancel: pages \\[93\\] are not reserved"),
        ([90, 90], "pool 'd': cancel: repeated page"),
        ([True], "pool 'd': cancel: pages must be ints"),
        ([90, 42], "pool 'd': cancel: pages \\[42\\] are not reserved"),
    ],
)
def test_cancel_refuses_and_changes_nothing(pages, msg):
    a = tri()
    a.reserve("d", 4)
    with unchanged(a), pytest.raises(ValueError, match=msg):
        a.cancel("d", pages)
    with unchanged(a), pytest.raises(ValueError, match="pool 'x': unknown pool"):
        a.cancel("x", [90])


def test_cancel_of_a_floats_last_pages_parks_it():
    a = tri()
    a.free("f", [1, 3, 4, 5, 6])
    assert a.frontiers("f") == (1600, 1600)  # parked
    pages = a.reserve("f", 3)  # a parked float places a span mid-region
    assert a.live_pages("f") == 3 and a.frontiers("f")[0] < 1600 and a.moves_held()
    a.cancel("f", pages[:1])
    assert a.holes("f") == pages[:1]
    a.cancel("f", pages[1:])
    assert a.frontiers("f") == (1600, 1600) and a.holes("f") == [] and a.live_pages("f") == 0
    check_all(a)
    # bound ids and a reservation: freeing the ids does not park it, cancelling the last page does
    got = a.alloc("f", 2)
    pages = a.reserve("f", 1)
    a.free("f", got)
    assert a.frontiers("f")[0] < 1600 and a.live_pages("f") == 1
    a.cancel("f", pages)
    assert a.frontiers("f") == (1600, 1600) and not a.moves_held()
    check_all(a)


def test_a_copy_keeps_its_own_reservations():
    a = tri()
    pages = a.reserve("d", 2)
    old = copy.deepcopy(a)
    a.cancel("d", pages)
    assert old.reserved("d") == pages and a.reserved("d") == [] and old.moves_held()
    old.verify()


# -------------------------------------------------------- held behaviours


def held_flush_absorbs_only(a):
    """``duo()`` held: a flush absorbs the holes at the frontier and moves no page."""
    assert a.moves_held()
    a.free("d", [1])  # page 32, the frontier, becomes a hole: absorbable
    placement = a._placement()
    assert a.flush("d") == 0
    assert a.frontiers("d")[0] == 33 * 16 and a.holes("d") == [34, 35]  # absorbed 32, kept 34, 35
    assert a._placement() == placement
    assert a.flush("d", max_moves=5) == 0 and a.flush("d", urgent=False) == 0
    assert a._placement() == placement and a.holes("d") == [34, 35]
    check_all(a)


def test_a_held_flush_absorbs_but_does_not_move():
    a = duo()
    a.close_gate()
    held_flush_absorbs_only(a)
    a.open_gate()
    assert a.flush("d") == 1 and a.holes("d") == []  # id 2 (page 33) moves into the deepest hole
    check_all(a)


def test_a_reservation_holds_the_flush_too_and_stops_its_absorption():
    a = duo()
    pages = a.reserve("u", 1)  # no gate: the reservation holds every move
    held_flush_absorbs_only(a)
    a.cancel("u", pages)
    assert a.flush("d") == 1  # released
    b = Arena(640, [U, D], lazy=True)
    b.alloc("d", 8)
    (p,) = b.reserve("d", 1)  # the new frontier page
    b.free("d", [1, 2])
    assert p == 31 and b.flush("d") == 0 and b.frontiers("d")[0] == 31 * 16  # the reserved page stops it
    b.cancel("d", [p])
    b.close_gate()
    assert b.flush("d") == 0 and b.frontiers("d")[0] == 34 * 16 and b.holes("d") == []  # 31..33 absorbed
    check_all(b)


def test_make_room_compact_plan_and_relieve_refuse_to_move_while_held():
    a = tri()
    a.close_gate()
    with unchanged(a):
        assert a.make_room("f", "low", 700) == 0  # clearing 4 edge pages moves live ones
        assert a.compact_holes("f", "low") == 0  # id 1 would move into the hole
        assert a.plan_floats({"u": 60}) == 0  # the plan slides f
        assert a.open_short_side("f", {"u": 60}) == 0
        assert a.relieve("u", 60) is False  # nothing the held ladder may do fits
    a.open_gate()
    b = copy.deepcopy(a)
    assert a.make_room("f", "low", 700) > 0 and a.band_bytes("f", "low") >= 700
    assert b.compact_holes("f", "low") == 1 and b.holes("f") == []
    c, d = copy.deepcopy(tri()), copy.deepcopy(tri())
    assert c.plan_floats({"u": 60}) > 0 and c.available_pages("u") >= 60
    assert d.relieve("u", 60) is True
    for x in (a, b, c, d):
        check_all(x)


@pytest.mark.parametrize("release", ["bind", "cancel"])
def test_a_reservation_holds_the_slides_until_it_is_bound_or_cancelled(release):
    a = tri()
    a.open_gate()
    pages = a.reserve("d", 2)
    with unchanged(a):
        assert a.make_room("f", "low", 700) == 0
        assert a.compact_holes("f", "high") == 0
        assert a.plan_floats({"u": 60}) == 0
        assert a.relieve("u", 60) is False
    if release == "bind":
        a.bind_reserved("d", free_ids(a, "d")[:2], pages)
    else:
        a.cancel("d", pages)
    assert not a.moves_held()
    assert a.make_room("f", "low", 700) > 0 and a.relieve("u", 60) is True
    check_all(a)


def test_a_held_slide_with_only_holes_to_clear_still_acts():
    a = tri()
    a.free("f", [1])  # pages 45, 46: holes at the low edge
    a.close_gate()
    placement = a._placement()
    assert a.make_room("f", "low", 640 + 32) == 0  # two edge pages, both holes: absorbed, nothing moved
    assert a.band_bytes("f", "low") >= 672 and a._placement() == placement
    check_all(a)


def held_view_is_the_available_one(a):
    """``duo()``: under a hold an END's schedulable view credits no hole, and
    the held ladder delivers what it promises."""
    credited = a.schedulable_available_size("u")
    a.close_gate()
    for n in a.chain:
        assert a.schedulable_available_size(n) == a.available_size(n)
    promised = a.schedulable_available_size("u") // a.pool("u").page_size
    assert promised < credited  # the credit is gone
    c = copy.deepcopy(a)
    assert c.relieve("u", promised) is True and c.alloc("u", promised) is not None
    c = copy.deepcopy(a)
    assert c.relieve("u", promised + 1) is False  # d's holes lie behind live pages: only a move frees them
    c.open_gate()
    assert c.relieve("u", credited) is True  # the move runs once released


def test_schedulable_under_a_hold_is_the_available_view_and_is_sound():
    held_view_is_the_available_one(duo())
    a = duo()
    pages = a.reserve("d", 1)  # a reservation drops the credit too
    assert a.schedulable_available_size("u") == a.available_size("u")
    a.bind_reserved("d", free_ids(a, "d")[:1], pages)
    assert a.schedulable_available_size("u") > a.available_size("u")


def test_alloc_and_free_while_held_move_nothing():
    a = tri()
    a.close_gate()
    placement = a._placement()
    got = a.alloc("d", 3)  # the holes, then the frontier
    assert sorted(a.translate("d", got)) == [91, 94, 95]
    a.free("d", got)
    a.free("f", [1, 3, 4, 5, 6])  # the float's last ids: it parks (dropping holes moves nothing)
    assert a.frontiers("f") == (1600, 1600)
    assert stayed(placement, a._placement()) and a.live_pages("d") == 6
    check_all(a)


# --------------------------------------------------- with a forward in flight


def test_a_hold_with_a_forward_in_flight():
    a = duo()
    a.launch({"d": [1, 7]})  # pins pages 32 (the frontier) and 38
    a.close_gate()
    placement = a._placement()
    assert a.flush("d", urgent=False) == 0 and a.pending("d") == []  # nothing vacated
    assert a.flush("d") == 0 and a.in_flight  # urgent, but nothing moves and no hole is guarded
    a.free("d", [7])  # page 38: a hole pinned FREED
    pages = a.reserve("d", 2)  # the two unguarded holes: no settle
    assert pages == [34, 35] and a.in_flight
    a.bind_reserved("d", [3], pages[:1])
    assert a.content("d")[34] == 3 and a.in_flight
    more = a.reserve("d", 2)  # the last hole is guarded: the reserve settles first
    assert not a.in_flight and more == [38, 31]
    assert stayed(placement, a._placement())
    a.launch({"d": None})
    a.cancel("d", more + pages[1:])
    assert a.in_flight and a.flush("d") == 0  # the gate is still closed
    a.settle()
    assert a.gate_closed and a.moves_held()
    check_all(a)


def test_cancelling_a_floats_last_page_settles_a_guarded_hole():
    a = tri()
    a.free("f", [3, 4, 5, 6])  # f: id 1 on page 45, holes 46..50
    pages = a.reserve("f", 1)
    a.launch({"f": [1]})
    a.free("f", [1])  # a hole pinned FREED; the reservation keeps the float opaque
    assert a.frontiers("f")[0] < 1600 and a.in_flight
    a.cancel("f", pages)  # the float parks, dropping a guarded hole: settle first
    assert a.frontiers("f") == (1600, 1600) and not a.in_flight
    check_all(a)


# ----------------------------------------------------------- verify catches


def test_verify_catches_a_broken_reservation():
    a = tri()
    a.reserve("d", 1)
    b = a.bands["d"]
    b.reserved.append(b.reserved[0])  # repeated ...
    b.live += 1  # ... with a count that agrees
    with contracts.unchecked(), pytest.raises(AccountingError, match="reserved pages"):
        a.verify()
    a = tri()
    a.bands["d"].reserved.append(a.holes("d")[0])  # a hole reserved, the count unchanged
    with contracts.unchecked(), pytest.raises(AccountingError, match="live count"):
        a.verify()
    a = Arena(1600, [U, F, D], lazy={"d"})
    a.closed_gates = frozenset({"host"})  # closed behind close_gate's back, with an eager END
    with contracts.unchecked(), pytest.raises(AccountingError, match="hold needs lazy ENDs"):
        a.verify()


# ---------------------------------------------------------------- plants


class _MovesUnderHold:
    """``spec.moves`` with a flush plan that ignores ``max_moves=0``: a held
    flush that moves (planted)."""

    def __getattr__(self, name):
        return getattr(moves, name)

    @staticmethod
    def flush_plan(grow, live, holes, edge, max_moves):
        return moves.flush_plan(grow, live, holes, edge, None if max_moves == 0 else max_moves)


def _keeps_its_credit(self, name):
    """``schedulable_available_size`` that credits the neighbour's holes under a hold too (planted)."""
    s, i = self._at(name)
    pages = chain.schedulable(s, i) if chain.is_end(s, i) else chain.available(s, i)
    return pages * self.pool(name).page_size


def test_plant_a_held_flush_that_moves_is_caught(monkeypatch):
    monkeypatch.setattr(arena_mod, "moves", _MovesUnderHold())
    a = duo()
    a.close_gate()
    with contracts.unchecked(), pytest.raises(AssertionError):  # the test's own checks
        held_flush_absorbs_only(copy.deepcopy(a))
    with pytest.raises(contracts.ContractError, match="_placement"):  # and flush's contract
        a.flush("d")


def test_plant_a_view_that_keeps_its_credit_under_a_hold_is_caught(monkeypatch):
    with contracts.unchecked():
        monkeypatch.setattr(Arena, "schedulable_available_size", _keeps_its_credit)
        with pytest.raises(AssertionError):
            held_view_is_the_available_one(duo())
        a = duo()
        a.close_gate()
        promised = a.schedulable_available_size("u") // a.pool("u").page_size
        assert a.relieve("u", promised) is False  # what the planted view over-promises


def test_the_new_methods_carry_contracts_and_are_checked_here():
    """The arena's contracts are checked at run time (``spec.contracts``; CrossHair
    cannot build a symbolic ``Arena``, ``proofs/crosshair_runs.py``): the new
    methods state theirs and this module's autouse ``checking()`` wraps them."""
    for name in ("reserve", "bind_reserved", "cancel", "close_gate", "open_gate", "moves_held", "reserved"):
        method = getattr(Arena, name)
        assert method.__wrapped_contract__ is vars(arena_mod.Arena)[name].__wrapped_contract__
        if name not in ("moves_held", "reserved"):  # the two reads: the class invariant only
            assert contracts.conditions(method.__wrapped_contract__.__doc__)["post"], name
