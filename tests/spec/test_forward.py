"""The spec's in-flight forward (docs/design.md §12): its guards, its plan, and what verify catches."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvarena.spec import AccountingError, Arena, SubPool, contracts
from kvarena.spec import forward as fw
from kvarena.spec.moves import flush_plan, guarded_flush_plan


def lazy_down():
    """An up END, a float and a lazy down END of 16-byte pages; the down END
    holds ids 1..8 with holes at ids 3 and 4, the up END two pages."""
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")], lazy={"d"})
    a.alloc("u", 2)
    a.alloc("d", 8)
    a.free("d", [3, 4])
    return a


def page(a, name, v):
    return a.v2p(name)[v]


# ---------------------------------------------------------------- the rules


def test_launch_pins_the_pages_written_and_settle_lifts_everything():
    a = lazy_down()
    before = {n: a.available_pages(n) for n in a.chain}
    a.launch({"d": [7, 8, -1, 0], "u": None})
    assert a.in_flight
    assert a.pinned("d") == sorted([page(a, "d", 7), page(a, "d", 8)])
    assert a.pinned("u") == sorted(a.v2p("u")[v] for v in (1, 2))
    a.verify()
    a.settle()
    assert not a.in_flight and not a.pinned("d") and not a.pinned("u")
    assert {n: a.available_pages(n) for n in a.chain} == before
    a.verify()


@pytest.mark.parametrize(
    "writes,msg",
    [
        ({"x": [1]}, "unknown pool"),
        ({"d": [3]}, "id 3 is not allocated"),
        ({"d": [999]}, "out of range"),
        ({"d": ["a"]}, "must be ints"),
        ({"d": [1], "u": [-2]}, "out of range"),  # the second pool is bad: nothing pinned in the first
    ],
)
def test_launch_refuses_bad_ids_and_changes_nothing(writes, msg):
    a = lazy_down()
    before = a.snapshot()
    with pytest.raises(ValueError, match=msg):
        a.launch(writes)
    assert a.snapshot() == before and not a.in_flight


def test_non_urgent_walk_stops_at_a_pinned_survivor_and_leaves_its_sources_pending():
    a = lazy_down()  # d: ids 1..8 on its top pages, ascending; ids 3, 4 freed: two holes
    first = page(a, "d", 1)  # the frontier's page
    a.launch({"d": [2]})  # id 2's page lies between the frontier and the holes
    moved = a.flush("d", urgent=False)
    assert moved == 1  # id 1 (nearest the frontier) moves; id 2 is pinned and stops the walk
    assert a.pending("d") == [first]
    assert first in a.holes("d") and a.frontiers("d")[0] == first * 16  # a pending page is not absorbed
    a.verify()
    a.settle()
    assert a.flush("d") == 1 and not a.holes("d")  # after settle the ordinary flush finishes the job
    a.verify()


def test_a_pending_page_waits_and_an_alloc_that_needs_it_settles_first():
    a = lazy_down()
    a.launch({"d": [5]})
    a.flush("d", urgent=False)
    pending = a.pending("d")
    assert pending
    unguarded = [h for h in a.holes("d") if h not in pending]
    got = a.alloc("d", len(unguarded))  # fits in the unguarded holes: no settle
    assert a.in_flight and sorted(a.v2p("d")[v] for v in got) == sorted(unguarded)
    a.alloc("d", 1)  # only the pending page is left: settle, then hand it out
    assert not a.in_flight
    a.verify()


def test_an_urgent_flush_settles_before_it_moves_and_a_no_op_does_not():
    a = lazy_down()
    a.launch({"d": [8]})
    a.flush("u")  # an eager END: nothing to do, nothing settled
    assert a.in_flight
    assert a.flush("d") > 0 and not a.in_flight


def test_an_eager_free_settles_first():
    a = lazy_down()
    a.launch({"d": [1]})
    a.free("u", [1])  # the eager up END compacts on free
    assert not a.in_flight
    a.verify()


def test_a_freed_pinned_page_stays_a_hole_until_settle():
    a = lazy_down()
    p = page(a, "d", 8)
    a.launch({"d": [8]})
    a.free("d", [8])
    assert a.pinned("d") == [p] and p in a.holes("d")
    a.flush("d", max_moves=0, urgent=False)  # absorbs what it may; never the pinned hole
    assert p in a.holes("d")
    a.verify()


def test_with_nothing_in_flight_the_non_urgent_flush_is_the_flush():
    a, b = lazy_down(), lazy_down()
    assert a.flush("d", max_moves=1, urgent=False) == b.flush("d", max_moves=1)
    assert a.snapshot() == b.snapshot()


def test_contracts_hold_through_a_forward():
    with contracts.checking():
        a = lazy_down()
        a.launch({"d": [2, 6]})
        a.flush("d", urgent=False)
        a.alloc("d", 1)
        a.free("d", [6])
        a.alloc("d", 3)
        a.settle()
        a.verify()


# ------------------------------------------------------------- verify catches


def _hand_out(a, p):
    """Bind the pending page ``p`` as an alloc would, counts and all."""
    b = a.bands["d"]
    b.bind(b.take_ids(1, None), [p])
    b.live += 1
    b.holes.remove(p)


PLANTS = [
    ("pending page untouched", _hand_out),
    ("pending page untouched", lambda a, p: a.bands["d"].content.__setitem__(p, 99)),
    ("pinned page kept", lambda a, p: _move_pinned(a)),
]


def _move_pinned(a):
    """Move the pinned page into an unguarded hole, tables and holes kept consistent."""
    b = a.bands["d"]
    (src,) = a.pinned("d")
    dst = next(h for h in b.holes if not b.is_guarded(h))
    b.move([dst], [src])
    b.holes[b.holes.index(dst)] = src


@pytest.mark.parametrize("rule,plant", PLANTS, ids=["bind-over-pending", "write-pending", "pinned-moved"])
def test_verify_catches_a_race(rule, plant):
    a = lazy_down()
    a.launch({"d": [2]})
    a.flush("d", urgent=False)
    (p,) = a.pending("d")
    plant(a, p)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert (e.value.pool, e.value.rule) == ("d", rule)


def test_verify_catches_guards_without_a_forward():
    a = lazy_down()
    a.bands["d"].pending[a.holes("d")[0]] = 3
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert e.value.rule in ("guards without a forward", "pending page untouched")


# ----------------------------------------------------------------- the plan


@st.composite
def bands(draw):
    n = draw(st.integers(2, 14))
    grow = draw(st.sampled_from(["up", "down"]))
    state = draw(st.lists(st.sampled_from("lhx"), min_size=n, max_size=n))  # live, hole, beyond the span
    pages = list(range(1, n + 1))
    live = [p for p, c in zip(pages, state) if c == "l"]
    holes = [p for p, c in zip(pages, state) if c == "h"]
    edge = (1 + len(live)) if grow == "up" else (n + 1 - len(live))
    holes = [h for h in holes if (h < edge if grow == "up" else h >= edge)] + [
        h for h in holes if (h >= edge if grow == "up" else h < edge)
    ]
    pinned = draw(st.lists(st.sampled_from(live), unique=True)) if live else []
    guarded = draw(st.lists(st.sampled_from(holes), unique=True)) if holes else []
    cap = draw(st.none() | st.integers(0, n))
    return grow, live, holes, edge, cap, pinned, guarded


@settings(max_examples=300, deadline=None)
@given(bands())
def test_the_guarded_plan_skips_pins_and_guards_and_is_the_flush_without_them(case):
    grow, live, holes, edge, cap, pinned, guarded = case
    up = grow == "up"
    outside = sorted(p for p in live if (p >= edge if up else p < edge))
    inside = sorted(h for h in holes if (h < edge if up else h >= edge))
    if len(outside) != len(inside):
        return  # not a band flush_plan accepts: one misplaced hole per out-of-place survivor
    dst, src = guarded_flush_plan(grow, live, holes, edge, cap, pinned, guarded)
    assert not set(src) & set(pinned) and not set(dst) & set(guarded)
    assert len(dst) == len(src) and dst == sorted(dst) and src == sorted(src)
    # from the frontier inward, up to the first pin; into the unguarded holes furthest from the frontier
    walk = list(itertools.takewhile(lambda p: p not in pinned, outside[::-1] if up else outside))
    free = [h for h in inside if h not in guarded]
    k = min(len(walk), len(free), len(walk) if cap is None else cap)
    assert src == sorted(walk[:k])
    assert dst == sorted((free if up else free[::-1])[:k])
    if not pinned and not guarded:
        assert (dst, src) == flush_plan(grow, live, holes, edge, cap)


def test_the_guard_functions_run_on_lists():
    pinned, pending = [-1] * 8, [-1] * 8
    v2p = [0, 5, 6, -1]
    fw.pin(v2p, pinned, [1, 2])
    assert pinned[5] == 1 and pinned[6] == 2
    fw.release(pinned, [6, 7])
    assert pinned[6] == fw.FREED and pinned[7] == -1
    fw.vacate(pending, {3: 9}, [3])
    assert pending[3] == 9
    assert not fw.move_clear(pinned, pending, [2], [5])  # reads a pinned page
    assert not fw.move_clear(pinned, pending, [3], [4])  # writes a pending page
    assert fw.move_clear(pinned, pending, [2], [4])
    assert not fw.bind_clear(pinned, pending, [6]) and fw.bind_clear(pinned, pending, [1, 2])
