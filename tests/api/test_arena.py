"""The Arena's behaviour both packages share, run on each: the constructor's
``lazy``, ``policy`` and ``borrow`` arguments (docs/design.md §3, §4 and §10)
and bools where counts or ids belong, borrowing, a pool that could never
allocate, ``relieve``'s verdict (an evictor that frees but returns 0;
the ladder's edges) and the conservation rule.

History: the sections "bug 1" to "bug 4" are the regressions of the
core-hardening review (this file was ``test_hardening.py``): the spec and
the implementation shared each bug, so the differential tests could not see
it."""

import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import AccountingError, SubPool
from tests.support import busy

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

ARENAS = [pytest.param(spec.Arena, id="spec"), pytest.param(impl.Arena, id="impl")]

# The geometry of docs/spec.md's API example: mamba state (up END), SWA KV (float), full KV (down END).
README = [SubPool("mamba", 4096, 1, "up", "state"), SubPool("swa", 256, 16, "float"), SubPool("full", 512, 16, "down")]


def ids_of(x):
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def live(a, name):
    return [v for v, p in enumerate(ids_of(a.v2p(name))) if v > 0 and p >= 0]


# ---------------------------------------------------------------- bug 1


@pytest.mark.parametrize("Arena", ARENAS)
def test_bug1_relieve_reports_the_fit_an_evictor_made_while_returning_0(Arena):
    """An evictor that frees pages but returns 0 ends the rounds; relieve must
    still report the fit it now has (it used to return False).  (None and
    False were accepted as 0 then; now they are no count: test_evictors.py.)"""
    returns = 0
    a = Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")])
    a.alloc("d", 40)
    a.alloc("u", a.available_pages("u"))
    assert a.available_pages("u") == 0
    victims = live(a, "d")[:10]

    def evict(shortfall):
        a.free("d", victims)
        return returns

    assert a.relieve("u", 10, evict) is True
    assert a.available_pages("u") >= 10 and a.alloc("u", 10) is not None
    a.verify()


# ---------------------------------------------------------------- bug 2


@pytest.mark.parametrize("Arena", ARENAS)
def test_bug2_borrowing_on_the_readme_geometry(Arena):
    """``alloc("swa", 2, ids=full_ids)`` used to raise "id 1 out of range
    [2, 256)": the borrower checked ids against its own grid."""
    a = Arena(1 << 20, README, lazy={"full"}, borrow={"swa": "full"})
    full_ids = ids_of(a.alloc("full", 4))
    assert 1 in full_ids  # an id below the borrower's own min_page
    assert ids_of(a.alloc("swa", 2, ids=full_ids[:2])) == full_ids[:2]
    assert a.lender("swa") == "full" and a.borrowers("full") == ["swa"]
    assert a.live_pages("swa") == 2
    assert len(ids_of(a.v2p("swa"))) == a.geometry("full").num_pages  # tables cover the lender's ids
    a.verify()


@pytest.mark.parametrize("Arena", ARENAS)
def test_borrowers_are_listed_in_chain_order(Arena):
    """Two borrowers of one lender, given against the chain's order: both
    packages list them as the chain runs (the implementation used to list
    them in the order ``borrow`` named them)."""
    pools = [
        SubPool("full", 256, 16, "up"),
        SubPool("swa1", 64, 16, "float"),
        SubPool("swa2", 64, 16, "float"),
        SubPool("state", 64, 1, "down", "state"),
    ]
    a = Arena(1 << 20, pools, borrow={"swa2": "full", "swa1": "full"})
    assert a.borrowers("full") == ["swa1", "swa2"]
    assert a.borrowers("swa1") == [] and a.lender("swa2") == "full"


@pytest.mark.parametrize("Arena", ARENAS)
def test_an_ends_region_runs_from_the_buffers_end_to_its_neighbour(Arena):
    """``region`` of an END: its own grid's pages from the buffer's end (its
    first page) to the last whole page below its inner neighbour."""
    a = Arena(1 << 20, README)
    a.alloc("mamba", 3)
    for _ in range(2):
        g = a.geometry("mamba")
        lo, hi = a.region("mamba")
        assert lo == g.min_page and a.below("mamba") == 0
        assert hi * g.epp <= a.above("mamba") < (hi + 1) * g.epp or hi == g.num_pages
        g = a.geometry("full")
        lo, hi = a.region("full")
        assert hi == g.num_pages and a.above("full") == 1 << 20
        assert (lo - 1) * g.epp < a.below("full") <= lo * g.epp or lo == g.min_page
        a.alloc("swa", 5)  # the float becomes opaque: both ENDs' regions end at it


@pytest.mark.parametrize("Arena", ARENAS)
def test_borrower_rules(Arena):
    a = Arena(1 << 20, README, borrow={"swa": "full"})
    full = ids_of(a.alloc("full", 4))
    a.alloc("swa", 2, ids=full[:2])
    before = a.snapshot()
    bad = [
        (lambda: a.alloc("swa", 1), "pass ids="),  # a borrower mints no ids
        (lambda: a.alloc("swa", 1, ids=[full[-1] + 1]), "not live in its lender"),
        (lambda: a.alloc("swa", 1, ids=[full[0]]), "already allocated"),
        (lambda: a.free("full", [full[0]]), f"id {full[0]} is still bound in its borrower 'swa'; free it there first"),
        (lambda: a.free("full", [full[2], full[1]]), "still bound"),  # nothing freed, even full[2]
    ]
    for call, why in bad:
        with pytest.raises(ValueError, match=f"pool '(swa|full)'.*{why}"):
            call()
        assert a.snapshot() == before
    a.free("swa", [full[0]])  # the borrower's entry first ...
    a.free("full", [full[0]])  # ... then the lender's
    assert live(a, "swa") == [full[1]] and full[0] not in live(a, "full")
    assert ids_of(a.free_ids("full") if hasattr(a, "free_ids") else a.bands["full"].free_ids)[-1] == full[0]
    assert a.snapshot()["pools"]["swa"]["free_ids"] == []  # a borrower keeps no queue
    a.verify()


@pytest.mark.parametrize("Arena", ARENAS)
def test_verify_checks_the_borrowed_subset(monkeypatch, Arena):
    """Plant: a borrower binds an id its lender does not hold (the spec with
    its id check skipped; the impl on its unchecked path, where bad ids are
    the caller's fault).  ``verify`` names the borrower and the rule."""
    a = Arena(1 << 20, README, borrow={"swa": "full"})
    full = ids_of(a.alloc("full", 3))
    a.alloc("swa", 2, ids=full[:2])
    a.verify()
    stray = full[-1] + 1  # not live in full
    if Arena is spec.Arena:
        monkeypatch.setattr(Arena, "_ids", lambda self, b, ids, bound: list(ids))
        a.alloc("swa", 1, ids=[stray])
    else:
        a.alloc("swa", 1, ids=torch.tensor([stray]), check=False)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == f"pool 'swa': borrowed ids live in the lender (ids [{stray}] are not live in 'full')"


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize(
    "borrow,pool,why",
    [
        ({"swa": "nope"}, "nope", "unknown pool"),
        ({"swa": "swa"}, "swa", "its own ids"),
        ({"swa": "full", "full": "mamba"}, "full", "lends ids"),
        ({"mamba": "full"}, "mamba", "page_size"),
        (["swa", "full"], "arena", "dict"),
    ],
)
def test_bad_borrow_is_a_value_error(Arena, borrow, pool, why):
    with pytest.raises(ValueError, match=f"{pool}.*{why}|{why}.*{pool}"):
        Arena(1 << 20, README, borrow=borrow)


# ---------------------------------------------------------------- bug 3


@pytest.mark.parametrize("Arena", ARENAS)
def test_bug3_a_pool_that_could_never_allocate_is_rejected(Arena):
    """F's only page (33 bytes) overlaps U's empty frontier at byte 40."""
    with pytest.raises(ValueError, match=r"pool 'F'.*never gets a page"):
        Arena(86, [SubPool("U", 10, 1, "up"), SubPool("F", 33, 1, "float"), SubPool("D", 10, 1, "down")])
    with pytest.raises(ValueError, match=r"pool 'D'.*never gets a page"):
        Arena(109, [SubPool("U", 10, 1, "up"), SubPool("F", 33, 1, "float"), SubPool("D", 10, 1, "down")])
    # U's page [40, 50), F's [66, 99), D's top page [100, 110): the smallest buffer
    a = Arena(110, [SubPool("U", 10, 1, "up"), SubPool("F", 33, 1, "float"), SubPool("D", 10, 1, "down")])
    for name in a.chain:  # and every pool allocates
        assert a.available_pages(name) >= 1
        assert a.alloc(name, 1) is not None
    a.verify()


# ---------------------------------------------------------------- bug 4


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize("pool,field,delta", [("f", "hi", 1), ("u", "hi", 2), ("d", "lo", -1)])
def test_bug4_conservation_catches_a_drift_no_other_rule_sees(monkeypatch, Arena, pool, field, delta):
    a = busy(Arena)
    b = a.bands[pool]
    setattr(b, field, getattr(b, field) + delta)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert (e.value.pool, e.value.rule) == (pool, "conservation")
    monkeypatch.setattr(Arena, "_conservation", lambda self, *args: None)
    a.verify()  # every other rule accepts the drift


# ------------------------------------------- lazy, bools, policy


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize("lazy", [None, 0, 1, 1.0, "u", {"u": True}, {"nope"}, {"f"}])
def test_every_bad_lazy_is_a_value_error(Arena, lazy):
    with pytest.raises(ValueError, match="lazy"):
        Arena(1600, [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")], lazy=lazy)


@pytest.mark.parametrize("Arena", ARENAS)
def test_lazy_as_a_string_is_an_error(Arena):
    with pytest.raises(ValueError, match=r"pool 'b'.*not a string"):
        Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")], lazy="b")


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.alloc("a", True),
        lambda a: a.free("a", [True]),
        lambda a: a.flush("a", max_moves=False),
        lambda a: a.translate("a", [True]),
    ],
)
def test_booleans_are_not_counts_or_ids(Arena, call):
    """Spec and implementation alike: a bool is neither a count nor an id."""
    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    a.alloc("a", 2)
    before = a.snapshot()
    with pytest.raises(ValueError, match="pool 'a'"):
        call(a)
    assert a.snapshot() == before


@pytest.mark.parametrize("Arena", ARENAS)
def test_policy_is_anchor_planner_or_a_value_error(Arena):
    pools = [SubPool("u", 16, 1, "up"), SubPool("d", 16, 1, "down")]
    assert Arena(1600, pools).policy == "anchor"
    assert Arena(1600, pools, policy="anchor").snapshot()["policy"] == "anchor"
    assert Arena(1600, pools, policy="planner").snapshot()["policy"] == "planner"
    for bad in ("Planner", "Anchor", "greedy", None, 1):
        with pytest.raises(ValueError, match="policy"):
            Arena(1600, pools, policy=bad)


# ------------------------------------------- the ladder's edges, both packages

TRI = [SubPool("u", 16, 1, "up"), SubPool("f", 16, 1, "float"), SubPool("d", 16, 1, "down")]


def float_with_a_boundary_hole(Arena):
    """u at [1, 6), d at [95, 100), f at [47, 53) with its page 47 freed:
    the up END's gap is 41 pages, and 42 once f's flush absorbs the hole."""
    a = Arena(1600, TRI, lazy={"u", "d"})
    a.alloc("u", 5)
    a.alloc("d", 5)
    ids = ids_of(a.alloc("f", 6))
    a.free("f", [v for v in ids if ids_of(a.v2p("f"))[v] == 47])
    assert a.available_pages("u") == 41
    return a


@pytest.mark.parametrize("Arena", ARENAS)
def test_a_need_that_fits_exactly_runs_no_rung(Arena):
    a = float_with_a_boundary_hole(Arena)
    before = a.snapshot()
    assert a.relieve("u", 41) is True
    assert a.snapshot() == before  # not even f's free flush


@pytest.mark.parametrize("Arena", ARENAS)
def test_a_need_the_flush_meets_exactly_ends_the_ladder_with_true(Arena):
    a = float_with_a_boundary_hole(Arena)
    assert a.relieve("u", 42) is True
    assert a.frontiers("f") == (48 * 16, 53 * 16)  # flushed, not slid
    assert a.available_pages("u") == 42


@pytest.mark.parametrize("Arena", ARENAS)
def test_flush_targets_and_pool_facts(Arena):
    a = float_with_a_boundary_hole(Arena)
    assert [a.flush_targets(n) for n in ("u", "f", "d")] == [["f"], ["u", "d"], ["f"]]
    a.free("f", [v for v, p in enumerate(ids_of(a.v2p("f"))) if v and p >= 0])  # f parks: transparent
    assert [a.flush_targets(n) for n in ("u", "f", "d")] == [["d"], ["u", "d"], ["u"]]
    assert [a.pool(n) for n in ("u", "f", "d")] == TRI
    assert [a.is_lazy(n) for n in ("u", "f", "d")] == [True, False, True]
    assert a.layout == spec.make_layout(1600, TRI)
