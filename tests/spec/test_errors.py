"""Every ValueError: it names the pool, and nothing changes."""

import re

import pytest

from kvarena import impl, spec
from kvarena.spec import Arena, SubPool
from tests.support import check_all

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

U = SubPool("u", 24, 1, "up", "state")
F = SubPool("f", 8, 2, "float")
D = SubPool("d", 16, 4, "down")


# ---------------------------------------------------------- configuration

CONFIG_ERRORS = [
    ("duplicate name", "a", lambda: Arena(4096, [SubPool("a", 8, 1, "up"), SubPool("a", 8, 1, "down")])),
    ("duplicate float", "f", lambda: Arena(4096, [U, F, SubPool("f", 8, 1, "float"), D])),
    ("two up pools", "u2", lambda: Arena(4096, [U, SubPool("u2", 8, 1, "up"), D])),
    ("two down pools", "d2", lambda: Arena(4096, [U, D, SubPool("d2", 8, 1, "down")])),
    ("no down pool", "u", lambda: Arena(4096, [U, F])),
    ("no up pool", "d", lambda: Arena(4096, [F, D])),
    ("zero entry_bytes", "x", lambda: SubPool("x", 0, 1, "up")),
    ("negative entry_bytes", "x", lambda: SubPool("x", -8, 1, "up")),
    ("zero page_size", "x", lambda: SubPool("x", 8, 0, "down")),
    ("negative page_size", "x", lambda: SubPool("x", 8, -2, "float")),
    ("bool entry_bytes", "x", lambda: SubPool("x", True, 1, "up")),
    ("state page_size != 1", "s", lambda: SubPool("s", 8, 2, "up", "state")),
    ("bad grow", "x", lambda: SubPool("x", 8, 1, "sideways")),
    ("bad kind", "x", lambda: SubPool("x", 8, 1, "up", "blob")),
    ("buffer below sink + pages", "d", lambda: Arena(150, [SubPool("u", 64, 1, "up"), SubPool("d", 64, 1, "down")])),
    ("no page above sink", "big", lambda: Arena(100, [SubPool("small", 1, 1, "up"), SubPool("big", 64, 1, "down")])),
    (
        "buffer too small for a float",
        "f",
        lambda: Arena(150, [SubPool("u", 8, 1, "up"), SubPool("f", 80, 1, "float"), SubPool("d", 8, 1, "down")]),
    ),
    # docs/design.md §3: F's only page overlaps U's empty frontier, so F never allocates
    (
        "float's only page overlaps an END",
        "F",
        lambda: Arena(86, [SubPool("U", 10, 1, "up"), SubPool("F", 33, 1, "float"), SubPool("D", 10, 1, "down")]),
    ),
    ("lazy names a float", "f", lambda: Arena(4096, [U, F, D], lazy={"f"})),
    ("lazy names an unknown pool", "zz", lambda: Arena(4096, [U, F, D], lazy={"zz"})),
]


@pytest.mark.parametrize("why,pool,make", CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS])
def test_bad_configuration_raises_value_error_naming_the_pool(why, pool, make):
    with pytest.raises(ValueError, match=re.escape(repr(pool))):
        make()


def test_buffer_exactly_big_enough_is_accepted():
    # sink 64 + one page of each (64 + 64) = 192 bytes
    a = Arena(192, [SubPool("u", 64, 1, "up"), SubPool("d", 64, 1, "down")])
    assert a.available_pages("u") == a.available_pages("d") == 2  # both see the shared gap
    with pytest.raises(ValueError, match="'d'"):
        Arena(191, [SubPool("u", 64, 1, "up"), SubPool("d", 64, 1, "down")])


# ------------------------------------------------------------- operations


def busy_arena(Arena=Arena):
    """A state with lazy holes, a holey float, and live pages in every band
    (the spec's, or any package's ``Arena``)."""
    a = Arena(8192, [U, F, D], lazy=True)
    a.alloc("u", 10)
    a.alloc("d", 6)
    a.alloc("f", 12)
    a.free("u", [5, 7])
    a.free("d", [3])
    a.free("f", [4, 9])
    if Arena is spec.Arena:
        check_all(a)  # with the content model, which only the spec keeps
    else:
        a.verify()
    return a


def _first_live(a, name):
    return next(v for v, p in enumerate(a.v2p(name)) if v > 0 and p >= 0)


OP_ERRORS = [
    # unknown pool, through every entry point
    ("alloc unknown", "zz", lambda a: a.alloc("zz", 1)),
    ("free unknown", "zz", lambda a: a.free("zz", [1])),
    ("flush unknown", "zz", lambda a: a.flush("zz")),
    ("make_room unknown", "zz", lambda a: a.make_room("zz", "low", 16)),
    ("compact_holes unknown", "zz", lambda a: a.compact_holes("zz", "low")),
    ("available unknown", "zz", lambda a: a.available_pages("zz")),
    ("available_size unknown", "zz", lambda a: a.available_size("zz")),
    ("schedulable unknown", "zz", lambda a: a.schedulable_available_size("zz")),
    ("conserved unknown", "zz", lambda a: a.conserved_available_size("zz")),
    ("gap unknown", "zz", lambda a: a.gap_bytes("zz")),
    ("above unknown", "zz", lambda a: a.above("zz")),
    ("below unknown", "zz", lambda a: a.below("zz")),
    ("frontiers unknown", "zz", lambda a: a.frontiers("zz")),
    ("holes unknown", "zz", lambda a: a.holes("zz")),
    ("geometry unknown", "zz", lambda a: a.geometry("zz")),
    ("translate unknown", "zz", lambda a: a.translate("zz", [1])),
    ("relieve unknown", "zz", lambda a: a.relieve("zz", 1)),
    ("open_short_side unknown float", "zz", lambda a: a.open_short_side("zz", {"u": 1})),
    ("open_short_side unknown demand", "zz", lambda a: a.open_short_side("f", {"zz": 1})),
    # counts
    ("alloc n < 0", "u", lambda a: a.alloc("u", -1)),
    ("alloc float n < 0", "f", lambda a: a.alloc("f", -3)),
    ("alloc n not an int", "d", lambda a: a.alloc("d", 1.5)),
    ("alloc n a string", "d", lambda a: a.alloc("d", "2")),
    ("flush max_moves < 0", "u", lambda a: a.flush("u", max_moves=-1)),
    ("make_room min_bytes < 0", "f", lambda a: a.make_room("f", "low", -1)),
    ("relieve need < 0", "d", lambda a: a.relieve("d", -2)),
    ("open_short_side demand < 0", "u", lambda a: a.open_short_side("f", {"u": -1})),
    # bad ids on free
    ("free unallocated id", "u", lambda a: a.free("u", [5])),
    ("free never-allocated id", "d", lambda a: a.free("d", [40])),
    ("free repeated id", "u", lambda a: a.free("u", [4, 4])),
    ("free sink id 0", "u", lambda a: a.free("u", [0])),
    ("free sink id 0 on a float", "f", lambda a: a.free("f", [0])),
    ("free -1 sentinel", "d", lambda a: a.free("d", [-1])),
    ("free out of range", "f", lambda a: a.free("f", [10**6])),
    ("free below min_page", "u", lambda a: a.free("u", [1])),
    ("free good ids then a bad one", "u", lambda a: a.free("u", [3, 4, 6, 5])),
    ("free float good then repeated", "f", lambda a: a.free("f", [5, 6, 5])),
    ("free non-int ids", "d", lambda a: a.free("d", ["x"])),
    # bad borrowed ids on alloc
    ("borrowed ids wrong length (short)", "u", lambda a: a.alloc("u", 3, ids=[40, 41])),
    ("borrowed ids wrong length (long)", "u", lambda a: a.alloc("u", 1, ids=[40, 41])),
    ("borrowed ids for n=0", "d", lambda a: a.alloc("d", 0, ids=[30])),
    ("borrowed id already allocated", "u", lambda a: a.alloc("u", 1, ids=[4])),
    ("borrowed sink id", "u", lambda a: a.alloc("u", 1, ids=[0])),
    ("borrowed -1", "f", lambda a: a.alloc("f", 1, ids=[-1])),
    ("borrowed out of range", "d", lambda a: a.alloc("d", 1, ids=[10**5])),
    ("borrowed repeated", "u", lambda a: a.alloc("u", 2, ids=[40, 40])),
    # float-only operations, and sides
    ("make_room on the up END", "u", lambda a: a.make_room("u", "high", 16)),
    ("make_room on the down END", "d", lambda a: a.make_room("d", "low", 16)),
    ("compact_holes on the up END", "u", lambda a: a.compact_holes("u", "low")),
    ("compact_holes on the down END", "d", lambda a: a.compact_holes("d", "high")),
    ("open_short_side on an END", "u", lambda a: a.open_short_side("u", {"u": 1})),
    ("make_room bad side", "f", lambda a: a.make_room("f", "up", 16)),
    ("compact_holes bad side", "f", lambda a: a.compact_holes("f", "middle")),
    ("translate out of range", "f", lambda a: a.translate("f", [10**6])),
    ("translate below -1", "u", lambda a: a.translate("u", [-2])),
]


@pytest.mark.parametrize("why,pool,op", OP_ERRORS, ids=[c[0] for c in OP_ERRORS])
def test_bad_call_raises_value_error_naming_the_pool_and_changes_nothing(why, pool, op):
    a = busy_arena()
    before = a.snapshot()
    with pytest.raises(ValueError, match=re.escape(repr(pool))):
        op(a)
    assert a.snapshot() == before
    check_all(a)


UNKNOWN_POOL = [c for c in OP_ERRORS if c[1] == "zz"]


@pytest.mark.parametrize("Arena", [spec.Arena, impl.Arena], ids=["spec", "impl"])
@pytest.mark.parametrize("why,pool,op", UNKNOWN_POOL, ids=[c[0] for c in UNKNOWN_POOL])
def test_an_unknown_pool_is_named_by_every_entry_point_of_both_packages(Arena, why, pool, op):
    """The implementation's ``above``/``below`` once raised ``tuple.index``'s message, which names no pool."""
    a = busy_arena(Arena)
    with pytest.raises(ValueError, match=re.escape("pool 'zz': unknown pool")):
        op(a)


def test_the_error_ids_are_really_in_the_states_described():
    """Guard the table above: its 'bad' ids are bad for the reason it says."""
    a = busy_arena()
    assert a.v2p("u")[5] == -1 and a.v2p("u")[7] == -1  # freed (tombstones)
    assert a.v2p("d")[40] == -1  # never allocated
    assert a.v2p("u")[4] >= 0 and a.v2p("u")[3] >= 0 and a.v2p("u")[6] >= 0
    assert a.v2p("f")[5] >= 0 and a.v2p("f")[6] >= 0
    assert a.geometry("u").min_page == 3  # id 1 is below min_page
    assert a.v2p("u")[40] == -1 and a.v2p("d")[30] == -1
    # and the good halves alone succeed
    a.free("u", [3, 4, 6])
    a.free("f", [5, 6])
    assert a.alloc("u", 2, ids=[40, 41]) == [40, 41]
    check_all(a)


def test_the_unchanged_check_catches_a_partial_free(monkeypatch):
    """Plant: free validates lazily, so good ids are freed before the bad one raises."""
    from kvarena.spec.arena import Arena as A

    def sloppy_free(self, name, ids):
        for v in ids:
            A._ids(self, self.bands[name], [v], bound=True)
            self.bands[name].holes.extend(self.bands[name].unbind([v]))

    a = busy_arena()
    before = a.snapshot()
    monkeypatch.setattr(A, "free", sloppy_free)
    with pytest.raises(ValueError, match="'u'"):
        a.free("u", [3, 4, 6, 5])
    assert a.snapshot() != before


# ----------------------------------------------- the words, in both packages

ARENAS = [pytest.param(spec.Arena, id="spec"), pytest.param(impl.Arena, id="impl")]


# The message each bad argument gets, word for word: the pool, which argument,
# and what was wrong with it.
MESSAGES = [
    (lambda a: a.alloc("u", -1), "pool 'u': n must be >= 0, got -1"),
    (lambda a: a.alloc("d", 1.5), "pool 'd': n must be an int, got 1.5"),
    (lambda a: a.flush("u", max_moves=-1), "pool 'u': max_moves must be >= 0, got -1"),
    (lambda a: a.flush("u", max_moves="x"), "pool 'u': max_moves must be an int, got 'x'"),
    (lambda a: a.make_room("f", "low", -1), "pool 'f': min_bytes must be >= 0, got -1"),
    (lambda a: a.relieve("d", -2), "pool 'd': need_pages must be >= 0, got -2"),
    (lambda a: a.open_short_side("f", {"u": -1}), "pool 'u': demand must be >= 0, got -1"),
    (lambda a: a.plan_floats({"u": -3}), "pool 'u': demand must be >= 0, got -3"),
    (lambda a: a.alloc("zz", 1), "pool 'zz': unknown pool (arena has u, f, d)"),
    (lambda a: a.compact_holes("f", "middle"), "pool 'f': retreat_side must be 'low' or 'high', got 'middle'"),
    (lambda a: a.make_room("u", "high", 16), "pool 'u': only a float band can slide; this is the up END"),
    (lambda a: a.compact_holes("d", "low"), "pool 'd': only a float band can slide; this is the down END"),
    (lambda a: a.free("u", [5]), "pool 'u': id 5 is not allocated"),
    (lambda a: a.alloc("u", 1, ids=[4]), "pool 'u': id 4 is already allocated"),
    # one past the last id: a range error, not an index error
    (lambda a: a.free("d", [128]), "pool 'd': id 128 out of range [1, 128)"),
    (lambda a: a.alloc("d", 1, ids=[128]), "pool 'd': id 128 out of range [1, 128)"),
]


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize("op,message", MESSAGES, ids=[m for _, m in MESSAGES])
def test_each_bad_argument_gets_its_own_message(Arena, op, message):
    a = busy_arena(Arena)
    assert a.geometry("d").num_pages == 128  # the table's last id
    before = a.snapshot()
    with pytest.raises(ValueError) as e:
        op(a)
    assert str(e.value) == message
    assert a.snapshot() == before


def test_band_bytes_names_a_bad_side():
    with pytest.raises(ValueError) as e:
        busy_arena().band_bytes("f", "up")
    assert str(e.value) == "pool 'f': side must be 'low' or 'high', got 'up'"
