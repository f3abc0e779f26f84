"""Capacity views: the gate is exact, schedulable and conserved views, translate,
and Knuth's two-stack guarantee."""

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvarena.spec import Arena, SubPool
from tests.support import check_all, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

# ------------------------------------------------- an independent oracle


def _walk(snap, name):
    """(below, above) in bytes, from the snapshot alone: nearest opaque neighbours."""
    chain, pools = snap["chain"], snap["pools"]

    def opaque(n):
        return pools[n]["pool"]["grow"] != "float" or pools[n]["live"] > 0

    i = chain.index(name)
    below = next((pools[n]["frontiers"][1] for n in reversed(chain[:i]) if opaque(n)), 0)
    above = next((pools[n]["frontiers"][0] for n in chain[i + 1 :] if opaque(n)), snap["total_bytes"])
    return below, above


def oracle_available(a, name):
    """Pages ``alloc`` may hand out, counted page by page on the pool's grid."""
    snap = a.snapshot()
    p = snap["pools"][name]
    epp, num, low_page = p["geometry"]["epp"], p["geometry"]["num_pages"], p["geometry"]["min_page"]
    lo, hi = p["span"]
    below, above = _walk(snap, name)
    fits = lambda q: low_page <= q < num and q * epp >= below and (q + 1) * epp <= above  # noqa: E731

    def run(start, step):
        k, q = 0, start
        while fits(q):
            k, q = k + 1, q + step
        return k

    holes = len(p["holes"])
    index_room = num - low_page - p["live"]
    grow = p["pool"]["grow"]
    if grow == "up":
        return run(hi, 1) + holes
    if grow == "down":
        return run(lo - 1, -1) + holes
    if p["live"] == 0:
        return min(sum(1 for q in range(num) if fits(q)), index_room)
    return min(max(run(hi, 1), run(lo - 1, -1)) + holes, index_room)


def check_gate(a, name):
    """available is exact: alloc(available) succeeds cleanly, alloc(available + 1) fails."""
    avail = a.available_pages(name)
    assert avail == oracle_available(a, name), name
    assert a.available_size(name) == avail * a.pool(name).page_size
    ok = copy.deepcopy(a)
    got = ok.alloc(name, avail)
    assert got is not None and len(got) == avail
    check_all(ok)
    over = copy.deepcopy(a)
    with unchanged(over):
        assert over.alloc(name, avail + 1) is None
    return avail


def off_grid(a):
    """How many opaque neighbour frontiers are off some other pool's grid."""
    n = 0
    for name in a.chain:
        below, above = a.below(name), a.above(name)
        epp = a.geometry(name).epp
        n += (below % epp != 0) + (above % epp != 0)
    return n


CONFIGS = {
    # name: (total, pools); page sizes 1, 2, 4, 16 and 64 appear in every role
    "state1-f16-d4": (
        5003,
        [SubPool("u", 24, 1, "up", "state"), SubPool("f", 2, 16, "float"), SubPool("d", 10, 4, "down")],
    ),
    "u64-d2": (4099, [SubPool("u", 1, 64, "up"), SubPool("d", 24, 2, "down")]),
    "u2-f1-f64-d16": (
        6007,
        [
            SubPool("u", 7, 2, "up"),
            SubPool("f1", 40, 1, "float", "state"),
            SubPool("f2", 1, 64, "float"),
            SubPool("d", 3, 16, "down"),
        ],
    ),
    "u4-f4-d1": (3001, [SubPool("u", 5, 4, "up"), SubPool("f", 9, 4, "float"), SubPool("d", 16, 1, "down")]),
    "u16-f2-d64": (9001, [SubPool("u", 3, 16, "up"), SubPool("f", 11, 2, "float"), SubPool("d", 1, 64, "down")]),
    "u1-f64-d64": (
        8000,
        [SubPool("u", 48, 1, "up", "state"), SubPool("f", 2, 64, "float"), SubPool("d", 1, 64, "down")],
    ),
}


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_alloc_available_succeeds_and_available_plus_one_fails(cfg, lazy):
    total, pools = CONFIGS[cfg]
    a = Arena(total, pools, lazy=lazy)
    rng = random.Random(cfg)
    for name in a.chain:  # the first allocation after boot (anchor bug 1)
        check_gate(a, name)
    offgrid = 0
    for step in range(40):
        name = rng.choice(a.chain)
        live = live_ids(a, name)
        if live and rng.random() < 0.4:
            a.free(name, rng.sample(live, rng.randint(1, len(live))))
        else:
            avail = a.available_pages(name)
            assert a.alloc(name, rng.randint(0, max(0, avail // 3))) is not None
        if step % 7 == 6:
            a.flush(rng.choice(a.chain))
        for n in a.chain:
            check_gate(a, n)
        offgrid += off_grid(a)
    assert offgrid > 0  # the walk did visit off-grid frontiers


def test_oracle_catches_an_overpromising_gate(monkeypatch):
    """Plant: END capacity rounds the gap up.  check_gate must notice."""
    from kvarena.spec import arith

    total, pools = CONFIGS["state1-f16-d4"]
    a = Arena(total, pools)
    a.alloc("u", 7)
    monkeypatch.setattr(arith, "end_available", lambda gap, epp, room, holes: min(-(-gap // epp), room) + holes)
    with pytest.raises(AssertionError):
        check_gate(a, "d")


def test_exhaustion_fills_to_the_byte_grid():
    total, pools = CONFIGS["u16-f2-d64"]
    a = Arena(total, pools)
    for name in ("f", "u", "d"):
        assert a.alloc(name, a.available_pages(name)) is not None
        assert a.available_pages(name) == 0
        assert a.alloc(name, 1) is None
    check_all(a)
    for name in a.chain:
        assert a.gap_bytes(name) < a.geometry(name).epp


# ------------------------------------------------------------- the views


def test_available_size_is_pages_times_page_size():
    total, pools = CONFIGS["u2-f1-f64-d16"]
    a = Arena(total, pools)
    a.alloc("f2", 3)
    a.alloc("u", 11)
    for p in pools:
        assert a.available_size(p.name) == a.available_pages(p.name) * p.page_size
    assert a.available_size("d") == a.available_pages("d") * 16


def _sched_arena():
    # u: epp 16 (page_size 2), eager; d: epp 48, lazy.  1600 bytes; sink 48.
    a = Arena(1600, [SubPool("u", 8, 2, "up"), SubPool("d", 12, 4, "down")], lazy={"d"})
    assert a.geometry("d").num_pages == 33 and a.geometry("u").min_page == 3
    a.alloc("d", 10)  # d low frontier 23 * 48 = 1104
    a.alloc("u", 60)  # u high frontier 63 * 16 = 1008: gap 96
    a.free("d", [3, 5, 7, 9])  # four lazy holes, none at the frontier
    return a


def test_schedulable_credits_lazy_neighbour_holes():
    a = _sched_arena()
    assert a.gap_bytes("u") == 96
    assert a.available_size("u") == (96 // 16) * 2 == 12
    assert a.schedulable_available_size("u") == ((96 + 4 * 48) // 16) * 2 == 36
    # d's own holes are its own availability; its neighbour u is eager: no credit
    assert a.available_pages("d") == 96 // 48 + 4
    assert a.schedulable_available_size("d") == a.available_size("d") == 6 * 4
    assert a.flush("d") > 0
    assert a.available_size("u") == 36 == a.schedulable_available_size("u")
    check_all(a)


def test_schedulable_no_credit_through_an_opaque_float():
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")], lazy=True)
    a.alloc("d", 10)
    a.free("d", [2, 4, 6])
    # float transparent: u's growth-side neighbour is the lazy d
    assert a.schedulable_available_size("u") == a.available_size("u") + 3
    a.alloc("f", 5)  # now the float is u's neighbour: no credit
    assert a.schedulable_available_size("u") == a.available_size("u")
    assert a.schedulable_available_size("f") == a.available_size("f")


def test_conserved_is_capacity_minus_allocated():
    a = Arena(1600, [SubPool("u", 8, 2, "up"), SubPool("d", 12, 4, "down")], lazy=True)
    cap_u, cap_d = (100 - 3) * 2, (33 - 1) * 4
    assert a.conserved_available_size("u") == cap_u and a.conserved_available_size("d") == cap_d
    a.alloc("u", 10)
    a.alloc("d", 5)
    a.free("u", [4, 6])  # ids start at min_page 3; holes are free for the leak view
    assert a.conserved_available_size("u") == cap_u - 8 * 2
    assert a.conserved_available_size("d") == cap_d - 5 * 4
    a.flush("u")
    assert a.conserved_available_size("u") == cap_u - 8 * 2


def test_parked_float_frontiers():
    total, pools = CONFIGS["u2-f1-f64-d16"]
    a = Arena(total, pools)
    for f in ("f1", "f2"):
        g = a.geometry(f)
        assert a.frontiers(f) == (g.num_pages * g.epp, g.num_pages * g.epp)


def test_translate_maps_tombstones_and_minus_one_to_zero():
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")], lazy=True)
    ids = a.alloc("u", 6)
    a.free("u", [2, 3])
    assert a.translate("u", ids) == [1, 0, 0, 4, 5, 6]
    assert a.translate("u", [-1, 0, 50]) == [0, 0, 0]
    a.free("u", [1])
    a.flush("u")  # ids 4, 5, 6 relocate into holes 1, 2, 3: translate follows
    assert a.translate("u", [4, 5, 6]) == [a.v2p("u")[4], a.v2p("u")[5], a.v2p("u")[6]] == [1, 2, 3]
    assert a.translate("u", [1, 2, 3]) == [0, 0, 0]
    for bad in ([-2], [100]):
        with unchanged(a), pytest.raises(ValueError, match="'u'"):
            a.translate("u", bad)


# ------------------------------------------------- Knuth's two-stack guarantee


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from([((8, 2), (4, 4)), ((16, 1), (16, 1)), ((1, 64), (4, 16)), ((24, 1), (12, 2))]),
    total=st.integers(300, 3000),
    lazy=st.booleans(),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "alloc", "free"]),
            st.booleans(),
            st.sampled_from(["exact", "over", "any"]),
            st.integers(0, 200),
            st.integers(0, 2**32),
        ),
        max_size=30,
    ),
)
def test_two_stacks_never_refuse_while_free_pages_suffice(shape, total, lazy, ops):
    (eu, pu), (ed, pd) = shape
    up, down = SubPool("u", eu, pu, "up"), SubPool("d", ed, pd, "down")
    assert up.epp == down.epp
    total = max(total, 2 * 64 + up.epp * 3)
    a = Arena(total, [up, down], lazy=lazy)
    g = a.geometry("u")
    for op, on_up, size, n, seed in ops:
        name = "u" if on_up else "d"
        free_pages = g.num_pages - g.min_page - a.live_pages("u") - a.live_pages("d")
        if op == "alloc":
            n = {"exact": free_pages, "over": free_pages + 1}.get(size, n % (free_pages + 2))
            if lazy:  # the other END's holes need a flush first: relieve does it
                assert a.relieve(name, n) == (n <= free_pages)
            got = a.alloc(name, n)
            assert (got is not None) == (n <= free_pages), (name, n, free_pages)
        else:
            live = live_ids(a, name)
            a.free(name, random.Random(seed).sample(live, min(len(live), n % 7)))
        if not lazy:  # eager: each END sees every free page
            free_pages = g.num_pages - g.min_page - a.live_pages("u") - a.live_pages("d")
            assert a.available_pages("u") == a.available_pages("d") == free_pages
    check_all(a)
