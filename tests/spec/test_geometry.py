"""Layout, the sink, the chain, chain walks and the golden 2-END gap identity."""

import itertools

import pytest

from kvarena.spec import Arena, SubPool, arith, chain, make_layout
from tests.support import check_all

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

# state (up, epp 24), full KV (down, epp 16*4 = 64); sink = 64.
STATE = SubPool("state", 24, 1, "up", "state")
FULL = SubPool("full", 16, 4, "down")
TOTAL = 10000


def test_geometry_numbers():
    a = Arena(TOTAL, [STATE, FULL])
    assert a.sink_bytes == 64
    assert (a.geometry("state").epp, a.geometry("state").num_pages, a.geometry("state").min_page) == (24, 416, 3)
    assert (a.geometry("full").epp, a.geometry("full").num_pages, a.geometry("full").min_page) == (64, 156, 1)
    # boot frontiers: the up END sits on min_page, the down END on num_pages
    assert a.frontiers("state") == (72, 72)
    assert a.frontiers("full") == (156 * 64, 156 * 64)


def test_sink_covers_every_page0_and_page0_maps_to_0():
    pools = [
        SubPool("u", 24, 1, "up", "state"),
        SubPool("f", 8, 2, "float"),
        SubPool("g", 40, 1, "float"),
        SubPool("d", 16, 4, "down"),
    ]
    a = Arena(20000, pools)
    assert a.sink_bytes == max(p.epp for p in pools) == 64
    for p in pools:
        g = a.geometry(p.name)
        assert g.min_page == -(-64 // p.epp)
        assert g.min_page * g.epp >= a.sink_bytes > (g.min_page - 1) * g.epp
        assert g.num_pages * g.epp <= 20000 < (g.num_pages + 1) * g.epp
        assert a.v2p(p.name)[0] == 0 and a.p2v(p.name)[0] == 0
        assert a.translate(p.name, [0]) == [0]


def test_chain_order_up_floats_in_given_order_down():
    u, d = SubPool("u", 8, 1, "up"), SubPool("d", 8, 1, "down")
    f1, f2, f3 = (SubPool(n, 8, 1, "float") for n in ("f1", "f2", "f3"))
    assert Arena(4096, [d, f2, u, f1, f3]).chain == ("u", "f2", "f1", "f3", "d")
    assert Arena(4096, [f1, f2, f3, d, u]).chain == ("u", "f1", "f2", "f3", "d")


def _ops(a):
    """The same deterministic workload, by name."""
    names = a.chain
    for i, n in enumerate(names):
        a.alloc(n, 3 + i)
    for n in names:
        ids = [v for v, p in enumerate(a.v2p(n)) if v > 0 and p >= 0]
        a.free(n, ids[1::2])
    return a


def test_layout_independent_of_input_order():
    u = SubPool("u", 24, 1, "up", "state")
    d = SubPool("d", 16, 4, "down")
    f1, f2 = SubPool("f1", 8, 2, "float"), SubPool("f2", 40, 1, "float")
    ref = _ops(Arena(30000, [u, f1, f2, d])).snapshot()
    seen = 0
    for perm in itertools.permutations([u, f1, f2, d]):
        if [p.name for p in perm if p.grow == "float"] != ["f1", "f2"]:
            continue  # the float order is the one order that matters
        lay = make_layout(30000, perm)
        assert lay.chain == ("u", "f1", "f2", "d")
        assert lay.geometry == make_layout(30000, [u, f1, f2, d]).geometry
        a = Arena(30000, list(perm))
        assert _ops(a).snapshot() == ref
        seen += 1
    assert seen == 12


@pytest.mark.parametrize("lazy", [False, True])
def test_two_pool_layout_byte_identical_either_way_round(lazy):
    u, d = SubPool("swa", 12, 2, "up"), SubPool("full", 20, 2, "down")
    a, b = Arena(5000, [u, d], lazy=lazy), Arena(5000, [d, u], lazy=lazy)
    assert a.snapshot() == b.snapshot()
    assert _ops(a).snapshot() == _ops(b).snapshot()
    assert a.frontiers("swa") == b.frontiers("swa") and a.frontiers("full") == b.frontiers("full")


# ------------------------------------------------------- the golden identity

# Points are (pages used by the up END, pages used by the down END), so
# wm_up = min_page_up + used_up = 3 + u and wm_down = num_pages_down - 1 - used_down = 155 - d.
# Hand-computed gap = (wm_down + 1) * 64 - wm_up * 24:
GOLDEN = [
    ((0, 0), 156 * 64 - 3 * 24),  # 9984 - 72  = 9912
    ((8, 0), 156 * 64 - 11 * 24),  # 9984 - 264 = 9720
    ((8, 4), 152 * 64 - 11 * 24),  # 9728 - 264 = 9464
    ((32, 16), 140 * 64 - 35 * 24),  # 8960 - 840 = 8120
]
assert [g for _, g in GOLDEN] == [9912, 9720, 9464, 8120]

FLOATS = {
    "none": [],
    "one": [SubPool("w", 8, 2, "float")],
    "three": [SubPool("w", 8, 2, "float"), SubPool("x", 40, 1, "float"), SubPool("y", 64, 1, "float")],
}


def _golden_arena(floats, used_up, used_down, park_first):
    a = Arena(TOTAL, [STATE, *floats, FULL])
    assert a.sink_bytes == 64  # the floats must not change the END grids
    if park_first:  # floats that held pages and gave them all back are transparent again
        for f in floats:
            ids = a.alloc(f.name, 5)
            a.free(f.name, ids)
    assert a.alloc("state", used_up) is not None
    assert a.alloc("full", used_down) is not None
    return a


@pytest.mark.parametrize(
    "floats,park_first", [("none", False), ("one", False), ("one", True), ("three", False), ("three", True)]
)
@pytest.mark.parametrize("point,gap", GOLDEN)
def test_golden_gap_identity(point, gap, floats, park_first):
    used_up, used_down = point
    fl = FLOATS[floats]
    a = _golden_arena(fl, used_up, used_down, park_first)
    wm_up, wm_down = 3 + used_up, 155 - used_down
    assert a.frontiers("state") == (72, wm_up * 24)
    assert a.frontiers("full") == ((wm_down + 1) * 64, 156 * 64)
    assert arith.golden_gap(wm_up, 24, wm_down, 64) == gap
    assert a.gap_bytes("state") == gap
    assert a.gap_bytes("full") == gap
    for f in fl:  # a transparent float sees the whole gap, and is parked
        g = a.geometry(f.name)
        assert a.frontiers(f.name) == (g.num_pages * g.epp,) * 2
        assert a.gap_bytes(f.name) == gap
        assert a.above(f.name) == (wm_down + 1) * 64 and a.below(f.name) == wm_up * 24
    assert a.available_pages("state") == min(gap // 24, 416 - 3 - used_up)
    assert a.available_pages("full") == min(gap // 64, 156 - 1 - used_down)
    check_all(a)


def test_golden_identity_at_random_points():
    for u in range(0, 60, 7):
        for d in range(0, 60, 5):
            a = _golden_arena(FLOATS["three"], u, d, park_first=(u + d) % 2 == 0)
            g = arith.golden_gap(3 + u, 24, 155 - d, 64)
            assert a.gap_bytes("state") == a.gap_bytes("full") == g


def test_golden_check_catches_an_opaque_parked_float(monkeypatch):
    """Plant: a parked float is not transparent.  The identity check must fail."""
    a = _golden_arena(FLOATS["one"], 8, 4, park_first=True)
    assert a.gap_bytes("state") == 9464
    monkeypatch.setattr(chain, "opaque", lambda s, i: True)  # what every walk asks
    assert a.gap_bytes("state") != 9464


# ------------------------------------------------------ float region on the grid


def test_float_region_rounds_inward_off_grid():
    # up END frontier 72 is off the float's 16-byte grid; the down END's low
    # frontier 100*40 = 4000 is on it; make it off-grid with epp 48.
    u = SubPool("u", 24, 1, "up", "state")
    f = SubPool("f", 16, 1, "float")
    d = SubPool("d", 48, 1, "down")
    a = Arena(4000, [u, f, d])  # sink 48: u min_page 2 (48), f min_page 3, d num_pages 83 (3984)
    assert a.below("f") == 48 and a.above("f") == 3984
    assert a.region("f") == (3, 249)  # 3984 / 16 = 249 exactly
    a.alloc("u", 1)  # high frontier 72: ceil(72/16) = 5, not 4
    a.alloc("d", 1)  # low frontier 82*48 = 3936 = 246*16
    assert a.region("f") == (5, 246)
    a.alloc("d", 1)  # 81*48 = 3888 = 243*16
    a.alloc("u", 1)  # 96 = 6*16
    assert a.region("f") == (6, 243)
    a.alloc("u", 1)  # 120 -> ceil 7.5 = 8
    assert a.region("f") == (8, 243)
    assert arith.float_region(72, 3950, 16, 3, 249) == (5, 246)  # floor(3950/16) = 246


def test_walks_end_at_the_buffer_edges():
    """Nothing below the up END: its walk down gives 0; nothing above the
    down END: its walk up gives total_bytes (a mutant that starts the walk
    at 1 survived the mutation run before this test)."""
    a = Arena(1000, [SubPool("u", 4, 1, "up"), SubPool("f", 6, 1, "float"), SubPool("d", 8, 1, "down")])
    a.alloc("f", 2)
    assert a.below("u") == 0 and a.above("d") == 1000
    assert a.below("f") == a.frontiers("u")[1] and a.above("f") == a.frontiers("d")[0]
