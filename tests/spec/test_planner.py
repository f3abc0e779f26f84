"""The chain planner (docs/design.md §4b), against a brute-force oracle and the
anchor policy's findings.

The oracle shares no code with the spec: it enumerates every page-aligned
placement of the floats (live pages packed, in chain order, each on its own
grid) and prices the demanded pool with its own arithmetic.  Whenever some
placement meets the demand, ``relieve(..., evict=None)`` under the planner
must return True; when none does, it must return False and move nothing.
"""

import copy
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvarena import impl, spec
from kvarena.spec import Arena, SubPool, contracts, planner
from tests.support import check_all, live_ids

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

# ------------------------------------------------------------- the oracle


def _cdiv(a, b):
    return -(-a // b)


def oracle_fits(a, name, need):
    """Does some packed placement of ``a``'s floats give ``name`` ``need`` pages?

    ``a`` is a spec arena; only its numbers are read (frontiers, counts,
    grids).  The ENDs stay where they are; each opaque float may sit at any
    start of its grid, packed; a transparent float takes no space.
    """
    chain = a.chain
    u, d = a.bands[chain[0]], a.bands[chain[-1]]
    floats = [a.bands[n] for n in chain[1:-1]]
    opaque = [f for f in floats if f.live > 0]
    ranges = [range(f.geom.min_page, f.geom.num_pages - f.live + 1) for f in opaque]
    for starts in itertools.product(*ranges):
        spans = [(u.lo * u.geom.epp, u.hi * u.geom.epp, u)]
        spans += [(s * f.geom.epp, (s + f.live) * f.geom.epp, f) for s, f in zip(starts, opaque)]
        spans.append((d.lo * d.geom.epp, d.hi * d.geom.epp, d))
        if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
            continue
        if _pages_for(a, spans, name, floats) >= need:
            return True
    return False


def _pages_for(a, spans, name, floats):
    """What ``name`` could allocate at once, in the placement ``spans``."""
    b = a.bands[name]
    g = b.geom
    idx = [i for i, (_, _, o) in enumerate(spans) if o is b]
    if idx:  # an END or an opaque float
        i = idx[0]
        low, high, _ = spans[i]
        prev_high = spans[i - 1][1] if i > 0 else 0
        next_low = spans[i + 1][0] if i + 1 < len(spans) else a.total_bytes
        if b.is_end:
            gap = next_low - high if b.grow == "up" else low - prev_high
            return min(gap // g.epp, g.num_pages - g.min_page - b.span) + len(b.holes)
        region_lo = max(_cdiv(prev_high, g.epp), g.min_page)
        region_hi = min(next_low // g.epp, g.num_pages)
        free = max(low // g.epp - region_lo, region_hi - high // g.epp)
        return min(free, g.num_pages - g.min_page - b.live)
    # a parked float: its region between the opaque bands around its chain slot
    pos = a.chain.index(name)
    below = max((h for _, h, o in spans if a.chain.index(o.name) < pos), default=0)
    above = min((lo for lo, _, o in spans if a.chain.index(o.name) > pos), default=a.total_bytes)
    region = min(above // g.epp, g.num_pages) - max(_cdiv(below, g.epp), g.min_page)
    return max(0, min(region, g.num_pages - g.min_page))


# -------------------------------------------------------- the property


@st.composite
def small_arenas(draw):
    """Up to 2 floats, page sizes 1-3, totals under 120 bytes, a random
    history; also the recipe ``(total, pools, lazy, ops)`` that rebuilds it."""
    n_floats = draw(st.sampled_from([0, 1, 1, 2, 2, 2]))
    names = ["u"] + [f"f{i + 1}" for i in range(n_floats)] + ["d"]
    grows = ["up"] + ["float"] * n_floats + ["down"]
    grids = [(draw(st.integers(1, 3)), draw(st.integers(1, 3))) for _ in names]
    total = draw(st.integers(30, 119))
    lazy = draw(st.sampled_from([False, True, frozenset({"u"}), frozenset({"d"})]))
    lazy = set(lazy) if isinstance(lazy, frozenset) else lazy
    pools = [SubPool(n, e, p, g) for n, (e, p), g in zip(names, grids, grows)]
    try:
        a = Arena(total, pools, lazy=lazy, policy="planner")
    except ValueError:
        assume(False)
    ops = []
    for op, name, k in draw(
        st.lists(
            st.tuples(
                st.sampled_from(["alloc", "alloc", "free", "flush"]), st.sampled_from(names), st.integers(0, 10**6)
            ),
            max_size=14,
        )
    ):
        step = ("flush", name, None)
        if op == "alloc":
            avail = a.available_pages(name)
            step = ("alloc", name, 1 + k % min(avail, 5)) if avail else None
        elif op == "free":
            ids = live_ids(a, name)
            step = ("free", name, [v for i, v in enumerate(ids) if (k >> (i % 20)) & 1] or ids[:1]) if ids else None
        if step:
            ops.append(step)
            apply(a, [step])
    check_all(a)
    name = draw(st.sampled_from(names))
    need = a.available_pages(name) + draw(st.integers(1, 3))  # near the edge of what placements allow
    return a, name, need, (total, pools, lazy, ops)


def apply(a, ops):
    for op, name, arg in ops:
        getattr(a, op)(name, *([] if arg is None else [arg]))


PROPERTY = settings(
    deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


@PROPERTY
@given(small_arenas())
def test_planner_relieves_exactly_when_a_placement_exists(case):
    a, name, need, _ = case
    flushed = copy.deepcopy(a)
    flushed.urgent_flush(name)  # rung 1 runs first; the oracle judges what it leaves
    exists = oracle_fits(flushed, name, need)
    fits_in_place = need <= flushed.available_pages(name)
    floats_before = {n: (flushed.bands[n].lo, flushed.bands[n].hi) for n in a.chain[1:-1]}

    got = a.relieve(name, need)
    check_all(a)
    assert got == exists, f"relieve said {got}, oracle {exists}"
    moved = any((a.bands[n].lo, a.bands[n].hi) != floats_before[n] for n in a.chain[1:-1])
    if moved:
        assert not fits_in_place  # the planner moves only when the demand needed moving
    if not exists:
        assert a.snapshot() == flushed.snapshot()  # infeasible: nothing beyond the flush


@PROPERTY
@given(small_arenas())
def test_second_relieve_is_a_fixpoint_under_the_planner(case):
    """Finding 6's property holds under the planner: after a failed run a
    second one fails too and changes nothing; after a successful run a second
    one changes nothing."""
    a, name, need, _ = case
    first = a.relieve(name, need)
    before = a.snapshot()
    assert a.relieve(name, need) is first
    assert a.snapshot() == before


def _plan_of(a, demand):
    return a.plan(demand)


@PROPERTY
@given(small_arenas())
def test_plan_floats_keeps_the_content_and_meets_the_demand(case):
    """``plan_floats`` under the contracts: every invariant and the content
    model survive, and a feasible plan meets the demand."""
    a, name, need, _ = case
    feasible = _plan_of(a, {name: need}).feasible
    with contracts.checking():
        a.plan_floats({name: need})
    check_all(a)
    assert feasible == (need <= a.available_pages(name)) or not feasible
    if feasible:
        assert need <= a.available_pages(name)


# ----------------------------------------------- the anchor's findings, fixed


def pools(entry_bytes, *names_grows):
    """One pool per ``(name, grow)``, every one of ``entry_bytes`` bytes a page."""
    return [SubPool(n, entry_bytes, 1, g) for n, g in names_grows]


def both(build):
    """The same scenario under each policy: ``{policy: arena}``."""
    return {p: build(p) for p in ("anchor", "planner")}


def _two_floats(policy):
    a = Arena(160, pools(16, ("u", "up"), ("f1", "float"), ("f2", "float"), ("d", "down")), policy=policy)
    a.alloc("f2", 1)
    a.alloc("f1", 1)
    return a


def test_finding_6_two_floats_one_run_suffices():
    """docs/findings.md, policy finding 6 (two floats): the anchor needs two runs, the planner one."""
    arenas = both(_two_floats)
    assert arenas["anchor"].relieve("u", 4) is False
    assert arenas["planner"].relieve("u", 4) is True
    a = arenas["planner"]
    check_all(a)
    assert a.available_pages("u") >= 4
    assert a.frontiers("f1") == (80, 96) and a.frontiers("f2") == (96, 112)  # both moved, the least


@pytest.mark.parametrize("freed", [[2, 4], [1, 2]])
def test_finding_6_float_own_need_one_run_suffices(freed):
    """docs/findings.md, policy finding 6 (one float short on its own pages)."""

    def build(policy):
        a = Arena(160, pools(16, ("u", "up"), ("f1", "float"), ("d", "down")), policy=policy)
        a.alloc("f1", 5)
        a.free("f1", freed)
        return a

    arenas = both(build)
    assert arenas["anchor"].relieve("f1", 5) is False
    a = arenas["planner"]
    assert a.relieve("f1", 5) is True
    check_all(a)
    assert a.holes("f1") == [] and a.available_pages("f1") >= 5


def _ids_at(a, name, pages):
    v2p = a.v2p(name)
    return [v for v, p in enumerate(v2p) if v > 0 and p in set(pages)]


def test_finding_1_far_side_kept():
    """docs/findings.md, policy finding 1 (``policy.far_side_kept``): the anchor's leapfrog makes
    the far END short; the planner meets both demands."""

    def build(policy):
        a = Arena(400, pools(4, ("up", "up"), ("f", "float"), ("down", "down")), policy=policy)
        a.alloc("up", 10)
        a.alloc("f", 2)
        a.alloc("down", 40)
        return a

    demand = {"up": 30, "down": 10}  # 30 + 10 + f's 2 live pages <= the 49 free ones
    arenas = both(build)
    anchor = arenas["anchor"]
    anchor.open_short_side("f", demand)
    assert anchor.available_pages("up") < demand["up"]
    a = arenas["planner"]
    assert a.plan_floats(demand) > 0
    check_all(a)
    assert all(a.available_pages(n) >= k for n, k in demand.items())


def test_finding_2_float_short_holes_assumed_to_survive():
    """docs/findings.md, policy finding 2 (``policy.float_short_fits_after``): the anchor moves
    a page and the float still does not fit; no placement could have met the
    demand, and the planner sees that and moves nothing."""

    def build(policy):
        a = Arena(100, pools(5, ("up", "up"), ("f", "float"), ("down", "down")), policy=policy)
        a.alloc("up", 8)
        a.alloc("down", 6)
        a.alloc("f", 4)
        a.free("f", _ids_at(a, "f", [9, 11, 12]))
        return a

    arenas = both(build)
    anchor = arenas["anchor"]
    assert anchor.open_short_side("f", {"f": 6}) == 1  # a page moves in vain
    assert anchor.available_pages("f") < 6
    a = arenas["planner"]
    assert not oracle_fits(a, "f", 6)  # 5 free pages, 1 live: no placement gives 6
    before = a.snapshot()
    assert a.relieve("f", 6) is False
    assert a.snapshot() == before  # the planner moves nothing in vain


def test_finding_3_far_float_moves_in_vain():
    """docs/findings.md, policy finding 3 (``policy.short_side_fits_after.n4_far_float``)."""

    def build(policy):
        a = Arena(400, pools(4, ("up", "up"), ("f1", "float"), ("f2", "float"), ("down", "down")), policy=policy)
        a.alloc("up", 10)
        a.alloc("down", 10)
        a.alloc("f1", 75)
        a.free("f1", [v for v in _ids_at(a, "f1", range(100)) if a.v2p("f1")[v] not in (16, 17)])
        a.flush("f1")
        a.alloc("f2", 1)
        return a

    arenas = both(build)
    anchor = arenas["anchor"]
    before = anchor.available_pages("up")
    anchor.open_short_side("f2", {"up": 36})
    assert anchor.available_pages("up") == before
    a = arenas["planner"]
    assert a.relieve("up", 36) is True
    check_all(a)


# ------------------------------------------------------------ the decision


def test_infeasible_demand_moves_nothing():
    a = _two_floats("planner")
    before = a.snapshot()
    assert a.plan_floats({"u": 9}) == 0 and not _plan_of(a, {"u": 9}).feasible
    assert a.snapshot() == before


def test_a_float_inside_its_range_stays():
    """Only the float that blocks moves; one whose span already lies in its
    feasible range keeps its place, holes and all."""
    a = Arena(320, pools(16, ("u", "up"), ("f1", "float"), ("f2", "float"), ("d", "down")), policy="planner")
    a.alloc("f2", 1)  # mid-region
    a.alloc("f1", 3)
    a.free("f1", [2])  # a hole in f1
    f2 = a.frontiers("f2")
    need = a.available_pages("u") + 1
    assert a.relieve("u", need) is True
    assert a.frontiers("f2") == f2
    check_all(a)


def test_move_order_up_movers_first_highest_first():
    f = planner.Float
    floats = [f(1, 1, 20, 2, 3, 1, 0, 0, 18), f(1, 1, 20, 5, 6, 1, 0, 0, 18), f(1, 1, 20, 9, 10, 1, 0, 0, 18)]
    plan = planner.Plan(True, [True, True, True], [4, 6, 8], [False] * 3)
    assert planner.move_order(floats, plan) == [1, 0, 2]


def test_bad_demand_is_a_value_error_naming_the_pool():
    a = _two_floats("planner")
    before = a.snapshot()
    with pytest.raises(ValueError, match="'nope'"):
        a.plan_floats({"nope": 1})
    with pytest.raises(ValueError, match="'u'"):
        a.plan_floats({"u": -1})
    assert a.snapshot() == before


def test_bad_policy_names_the_choices():
    with pytest.raises(ValueError, match="planner"):
        Arena(160, pools(16, ("u", "up"), ("d", "down")), policy="greedy")


# ------------------------------------------------------ spec and impl agree


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(small_arenas())
def test_impl_relieve_matches_the_spec_byte_for_byte(case):
    """The same history on the implementation, then relieve on both: the
    tables agree, and every live page's bytes moved with it."""
    import torch

    a, name, need, (total, pools, lazy, ops) = case
    b = impl.Arena(total, pools, lazy=lazy, policy="planner")
    apply(b, ops)
    pattern = {}
    for n in b.chain:
        ids = live_ids(a, n)
        if ids:
            epp = b.geometry(n).epp
            pattern[n] = (ids, ((torch.tensor(ids)[:, None] * 7 + torch.arange(epp)[None, :]) % 251).to(torch.uint8))
            b.write_pages(n, torch.tensor(ids), pattern[n][1])
    assert a.snapshot() == b.snapshot()
    assert a.relieve(name, need) == b.relieve(name, need)
    assert a.snapshot() == b.snapshot()
    b.verify()
    for n, (ids, data) in pattern.items():
        assert torch.equal(b.read_pages(n, torch.tensor(ids)), data)


@given(st.lists(st.integers(0, 40), unique=True, max_size=12).map(sorted), st.integers(0, 30))
def test_pack_plan_moves_exactly_the_pages_outside_the_target(live, start):
    from kvarena.spec import moves

    dst, src = moves.pack_plan(live, start)
    target = set(range(start, start + len(live)))
    assert src == sorted(p for p in live if p not in target)  # only the pages outside move
    assert len(dst) == len(src) <= len(live) and dst == sorted(dst)
    after = (set(live) - set(src)) | set(dst)
    assert after == target  # packed: the live pages fill the target exactly


@pytest.mark.parametrize("Arena", [spec.Arena, impl.Arena], ids=["spec", "impl"])
def test_plan_floats_counts_the_pages_of_every_float_it_moves(Arena):
    """The up END asks for 80 pages: both floats pack at the top, four pages
    each.  The count is checked against the ids whose pages changed."""
    a = Arena(
        1600,
        [
            SubPool("u", 16, 1, "up"),
            SubPool("f1", 16, 1, "float"),
            SubPool("f2", 16, 1, "float"),
            SubPool("d", 16, 1, "down"),
        ],
        policy="planner",
    )
    a.alloc("u", 5)
    a.alloc("d", 5)
    a.alloc("f1", 4)
    a.alloc("f2", 4)
    assert a.available_pages("u") == 42
    before = {n: list(a.v2p(n)) for n in ("f1", "f2")}
    moved = a.plan_floats({"u": 80})
    changed = sum(p != q for n in ("f1", "f2") for p, q in zip(before[n], a.v2p(n)))
    assert moved == changed == 8
    assert a.available_pages("u") == 80
    a.verify()
