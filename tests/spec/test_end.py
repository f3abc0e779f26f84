"""END bands: eager compaction, lazy holes, flush, FIFO ids, borrowed ids."""

import pytest

from kvarena import impl, spec
from kvarena.spec import Arena, SubPool
from tests.support import check_all, ints, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

U = SubPool("u", 16, 1, "up")
D = SubPool("d", 16, 1, "down")
TOTAL = 16 * 40  # both grids: 40 pages, min_page 1; up starts at page 1, down at 40


def mk(lazy=False):
    a = Arena(TOTAL, [U, D], lazy=lazy)
    assert a.geometry("u").num_pages == 40 and a.geometry("u").min_page == 1
    return a


def test_up_binds_ascending_at_wm_with_fifo_ids():
    a = mk()
    assert a.alloc("u", 3) == [1, 2, 3]
    assert a.alloc("u", 2) == [4, 5]
    assert [a.v2p("u")[v] for v in range(1, 6)] == [1, 2, 3, 4, 5]
    assert a.frontiers("u") == (16, 6 * 16)
    a.free("u", [2])
    # freed ids go to the back of the queue
    assert a.alloc("u", 1) == [6]
    assert a.alloc("u", 0) == []
    check_all(a)


def test_down_binds_ascending_range_below_wm():
    a = mk()
    assert a.alloc("d", 3) == [1, 2, 3]
    assert [a.v2p("d")[v] for v in (1, 2, 3)] == [37, 38, 39]
    assert a.alloc("d", 2) == [4, 5]
    assert [a.v2p("d")[v] for v in (4, 5)] == [35, 36]
    assert a.frontiers("d") == (35 * 16, 40 * 16)
    check_all(a)


def test_borrowed_ids_pair_with_pages_in_order():
    a = mk()
    assert a.alloc("u", 2, ids=[7, 5]) == [7, 5]
    v2p = a.v2p("u")
    assert (v2p[7], v2p[5]) == (1, 2)
    assert a.alloc("u", 2) == [1, 2]  # FIFO skips the borrowed ids
    assert 5 not in a.snapshot()["pools"]["u"]["free_ids"]
    a.free("u", [7, 5])
    assert a.snapshot()["pools"]["u"]["free_ids"][-2:] == [7, 5]
    check_all(a)


# ------------------------------------------------------------------ eager


def test_eager_up_free_compacts():
    a = mk()
    a.alloc("u", 10)  # ids 1..10 on pages 1..10
    a.free("u", [2, 5])  # pages 2 and 5
    # frontier retreats by 2: vacated [9, 11) holds ids 9, 10; they fill holes 2, 5 (ascending)
    v2p = a.v2p("u")
    assert a.frontiers("u") == (16, 9 * 16)
    assert (v2p[9], v2p[10]) == (2, 5)
    assert [v2p[v] for v in (1, 3, 4, 6, 7, 8)] == [1, 3, 4, 6, 7, 8]  # others stay
    assert v2p[2] == v2p[5] == -1
    assert a.holes("u") == []
    check_all(a)


def test_eager_up_free_when_freed_pages_are_in_vacated_band():
    a = mk()
    a.alloc("u", 10)
    a.free("u", [1, 9, 10])  # 9, 10 are vacated; id 8 (page 8) moves to hole 1
    v2p = a.v2p("u")
    assert a.frontiers("u")[1] == 8 * 16
    assert v2p[8] == 1
    assert sorted(v2p[v] for v in live_ids(a, "u")) == list(range(1, 8))
    check_all(a)


def test_eager_down_free_compacts():
    a = mk()
    a.alloc("d", 6)  # ids 1..6 on pages 34..39
    a.free("d", [2, 5])  # pages 35, 38
    # frontier retreats up by 2: vacated [34, 36) holds id 1 (page 34) -> hole 38
    v2p = a.v2p("d")
    assert a.frontiers("d") == (36 * 16, 40 * 16)
    assert v2p[1] == 38
    assert [v2p[v] for v in (3, 4, 6)] == [36, 37, 39]
    check_all(a)


def test_eager_free_survivors_ascending_into_holes_ascending():
    a = mk()
    a.alloc("u", 10)
    a.free("u", [1, 2, 3])
    v2p = a.v2p("u")
    assert (v2p[8], v2p[9], v2p[10]) == (1, 2, 3)
    a2 = mk()
    a2.alloc("d", 10)  # pages 30..39
    a2.free("d", [8, 9, 10])  # pages 37, 38, 39; vacated [30, 33) ids 1, 2, 3
    v2p = a2.v2p("d")
    assert (v2p[1], v2p[2], v2p[3]) == (37, 38, 39)
    check_all(a2)


# ------------------------------------------------------------------- lazy


def test_lazy_free_leaves_holes_and_moves_nothing():
    a = mk(lazy=True)
    a.alloc("u", 10)
    before = a.v2p("u")
    a.free("u", [7, 3, 9])
    after = a.v2p("u")
    assert all(after[v] == before[v] for v in live_ids(a, "u"))
    assert a.frontiers("u") == (16, 11 * 16)
    assert a.holes("u") == [3, 7, 9]
    assert a.available_pages("u") == (40 - 11) + 3  # gap + holes
    check_all(a)


def test_lazy_holes_reused_oldest_first():
    a = mk(lazy=True)
    a.alloc("u", 10)
    a.free("u", [7, 3, 9])  # holes made in the order 7, 3, 9
    assert a.alloc("u", 2) == [11, 12]
    v2p = a.v2p("u")
    assert (v2p[11], v2p[12]) == (7, 3)
    assert a.holes("u") == [9]
    assert a.frontiers("u") == (16, 11 * 16)  # no extension while holes last
    assert a.alloc("u", 2) == [13, 14]
    assert (a.v2p("u")[13], a.v2p("u")[14]) == (9, 11)  # last hole, then the frontier
    check_all(a)


def _lazy_up_case():
    a = mk(lazy=True)
    a.alloc("u", 10)  # pages 1..10
    a.free("u", [2, 3, 5, 10])  # holes 2, 3, 5 and the frontier page 10
    return a


def test_lazy_up_flush():
    a = _lazy_up_case()
    assert a.flush("u") == 3
    # hole 10 absorbed; survivors 7, 8, 9 (nearest the frontier) -> holes 2, 3, 5, paired ascending
    v2p = a.v2p("u")
    assert (v2p[7], v2p[8], v2p[9]) == (2, 3, 5)
    assert (v2p[1], v2p[4], v2p[6]) == (1, 4, 6)
    assert a.frontiers("u") == (16, 7 * 16)
    assert a.holes("u") == []
    assert a.flush("u") == 0
    check_all(a)


def test_lazy_up_capped_flush():
    a = _lazy_up_case()
    assert a.flush("u", max_moves=2) == 2
    v2p = a.v2p("u")
    assert (v2p[8], v2p[9]) == (2, 3)  # the two nearest the frontier, into the two furthest holes
    assert v2p[7] == 7
    assert a.frontiers("u") == (16, 8 * 16)
    assert a.holes("u") == [5]
    check_all(a)
    assert a.flush("u", max_moves=5) == 1
    assert a.v2p("u")[7] == 5 and a.frontiers("u")[1] == 7 * 16
    check_all(a)


def test_lazy_flush_with_zero_moves_only_absorbs_frontier_holes():
    a = _lazy_up_case()
    v2p = a.v2p("u")
    assert a.flush("u", max_moves=0) == 0
    assert a.v2p("u") == v2p
    assert a.frontiers("u") == (16, 10 * 16)
    assert a.holes("u") == [2, 3, 5]
    check_all(a)


def test_lazy_down_flush_and_cap():
    def case():
        a = mk(lazy=True)
        a.alloc("d", 10)  # ids 1..10 on pages 30..39
        a.free("d", [1, 5, 7, 8])  # pages 30 (frontier), 34, 36, 37
        return a

    a = case()
    assert a.flush("d") == 3
    v2p = a.v2p("d")
    assert (v2p[2], v2p[3], v2p[4]) == (34, 36, 37)
    assert a.frontiers("d") == (34 * 16, 40 * 16)
    assert a.holes("d") == []
    check_all(a)

    a = case()
    assert a.flush("d", max_moves=2) == 2
    v2p = a.v2p("d")
    assert (v2p[2], v2p[3], v2p[4]) == (36, 37, 33)  # nearest the frontier -> furthest holes
    assert a.frontiers("d") == (33 * 16, 40 * 16)
    assert a.holes("d") == [34]
    check_all(a)


def test_lazy_set_names_one_end():
    a = Arena(TOTAL, [U, D], lazy={"d"})
    assert not a.is_lazy("u") and a.is_lazy("d")
    a.alloc("u", 4)
    a.free("u", [2])
    assert a.holes("u") == []  # eager compaction
    a.alloc("d", 4)
    a.free("d", [2])
    assert a.holes("d") == [37]  # ids 1..4 on pages 36..39
    check_all(a)


def test_flush_on_eager_end_is_a_noop():
    a = mk()
    a.alloc("u", 5)
    a.free("u", [2])
    with unchanged(a):
        assert a.flush("u") == 0
        assert a.flush("d", max_moves=3) == 0


def test_lazy_free_everything_then_flush_returns_to_boot():
    a = mk(lazy=True)
    a.alloc("u", 5)
    a.alloc("d", 5)
    a.free("u", [1, 2, 3, 4, 5])
    a.free("d", [5, 4, 3, 2, 1])
    assert a.flush("u") == 0 and a.flush("d") == 0
    assert a.frontiers("u") == (16, 16) and a.frontiers("d") == (640, 640)
    assert a.holes("u") == a.holes("d") == []
    check_all(a)


# ------------------------------------- in the spec and the implementation

ARENAS = [pytest.param(spec.Arena, id="spec"), pytest.param(impl.Arena, id="impl")]
TRI = [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")]


@pytest.mark.parametrize("Arena", ARENAS)
def test_a_capped_flush_keeps_the_hole_at_the_far_edge(Arena):
    """``flush(max_moves=0)`` only absorbs holes at the frontier; a hole at
    the up END's first page (its far edge) stays a hole."""
    a = Arena(1600, TRI, lazy=True)
    ids = ints(a.alloc("u", 5))
    assert a.v2p("u")[ids[0]] == a.geometry("u").min_page
    a.free("u", [ids[0], ids[-1]])  # the first page, and the one at the frontier
    assert a.flush("u", max_moves=0) == 0
    assert ints(a.holes("u")) == [a.geometry("u").min_page]
    assert a.frontiers("u")[1] == 5 * 16  # the frontier hole was absorbed
    a.verify()
