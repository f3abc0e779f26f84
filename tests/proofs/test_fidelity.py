"""Fidelity: the z3 encodings are tied to the executable spec.

- the shim: every ``arith``/``policy`` formula evaluated by z3 on concrete
  values equals the Python result;
- the layout terms equal ``make_layout``;
- the abstract state and transitions predict the real ``spec.Arena``: before
  every operation the invariants hold and every view (available, region,
  gap, walks) agrees; afterwards the real outcome lies in the operation's
  relation (which variant, exactly).
"""

import random

import pytest
import z3
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvarena.proofs import abstract as A
from kvarena.proofs import layout as L
from kvarena.proofs import policy as P
from kvarena.spec import Arena, SubPool, arith, make_layout
from kvarena.spec.policy import short_side_decision

ints = st.integers(-1000, 1000)
pos = st.integers(1, 80)


def z3_eval(fn, *args):
    """Run ``fn`` on z3 constants, then substitute the values and simplify."""
    syms, subs = [], []
    for k, v in enumerate(args):
        if isinstance(v, bool):
            x = z3.Bool(f"a{k}")
            subs.append((x, z3.BoolVal(v)))
        else:
            x = z3.Int(f"a{k}")
            subs.append((x, z3.IntVal(v)))
        syms.append(x)
    out = fn(*syms)

    def conc(e):
        if isinstance(e, (bool, int)):
            return e
        e = z3.simplify(z3.substitute(e, *subs))
        return z3.is_true(e) if z3.is_bool(e) else e.as_long()

    return tuple(conc(e) for e in out) if isinstance(out, tuple) else conc(out)


@settings(max_examples=200, deadline=None)
@given(ints, pos)
def test_shim_division(a, b):
    assert z3_eval(arith.fdiv, a, b) == arith.fdiv(a, b) == a // b
    assert z3_eval(arith.cdiv, a, b) == arith.cdiv(a, b) == -(-a // b)
    assert z3_eval(arith.max_, a, b) == max(a, b) and z3_eval(arith.min_, a, b) == min(a, b)
    assert z3_eval(lambda c, x, y: arith.ite(c, x, y), a > b, a, b) == (a if a > b else b)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 5000), pos, ints, ints, st.integers(0, 50), st.integers(0, 50), st.booleans())
def test_shim_formulas(total, epp, x, y, h, r, flag):
    lowest, npg = 1 + h % 5, 1 + r + h
    cases = [
        (arith.num_pages, (total, epp, 1 + h % 8)),
        (arith.min_page, (abs(x), epp)),
        (arith.up_gap, (x, y)),
        (arith.down_gap, (x, y)),
        (arith.golden_gap, (h, epp, r, 1 + h % 7)),
        (arith.float_region, (x, y, epp, lowest, npg)),
        (arith.end_available, (abs(x), epp, r, h)),
        (arith.float_available, (flag, x % 40, y % 40, h, h + r, r, h)),
        (arith.park_start, (x, x + h + r, h)),
        (arith.make_room_feasible, (flag, x, y, h, h + r, r, epp, abs(y))),
        (arith.make_room_need, (x, x + 1 + abs(y), epp)),
        (short_side_decision, (h, r, abs(x), abs(y), h * r, epp)),
    ]
    for fn, args in cases:
        assert z3_eval(fn, *args) == fn(*args), fn.__name__


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 4000), st.lists(st.tuples(st.integers(1, 9), st.sampled_from(L.PAGE_SIZES)), min_size=2, max_size=4)
)
def test_layout_terms_match_make_layout(total, cfg):
    grows = ["up"] + ["float"] * (len(cfg) - 2) + ["down"]
    pools = [SubPool(f"p{i}", e, ps, g) for i, ((e, ps), g) in enumerate(zip(cfg, grows))]
    try:
        lay = make_layout(total, pools)
    except ValueError:
        sink, geo = L.layout_terms(total, [e for e, _ in cfg], [p for _, p in cfg])
        assert not all(L._valid(total, sink, geo))
        return
    sink, geo = L.layout_terms(total, [e for e, _ in cfg], [p for _, p in cfg])
    assert sink == lay.sink_bytes and all(L._valid(total, sink, geo))
    for p, (epp, npg, mp) in zip(pools, geo):
        g = lay.geometry[p.name]
        assert (g.epp, g.num_pages, g.min_page) == (epp, npg, mp)
        assert npg == arith.fdiv(total, epp)  # layout.num_pages_by_epp, concretely


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40), st.integers(0, 12)), min_size=2, max_size=5))
def test_first_pages_z3_matches_python(raw):
    """``arith.first_pages`` on z3 terms, substituted and simplified, equals
    the Python result: the layout obligations reason about the code that runs."""
    grids = [(e, m + 1 + k, m) for e, k, m in raw]
    flat = [x for g in grids for x in g]

    def fn(*xs):
        out = arith.first_pages([tuple(xs[i : i + 3]) for i in range(0, len(xs), 3)])
        return tuple(x for pf in out for x in pf)

    want = tuple(x for pf in arith.first_pages(grids) for x in pf)
    assert z3_eval(fn, *flat) == want


def _chain_pools(cfg):
    grows = ["up"] + ["float"] * (len(cfg) - 2) + ["down"]
    return [SubPool(f"p{i}", e, ps, g) for i, ((e, ps), g) in enumerate(zip(cfg, grows))]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3000),
    st.lists(st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 4, 8])), min_size=2, max_size=5),
    st.randoms(use_true_random=False),
)
def test_make_layout_accepts_exactly_first_pages(total, cfg, rnd):
    """make_layout accepts iff every pool has a page above the sink and every
    ``first_pages`` fits holds (in chain order, whatever order the pools are
    given); an accepted layout lets every pool allocate in the empty arena
    (``layout.every_pool_allocates``, concretely), and the abstract boot state
    is the real one."""
    pools = _chain_pools(cfg)
    sink = max(p.epp for p in pools)
    grids = [(p.epp, arith.num_pages(total, p.entry_bytes, p.page_size), arith.min_page(sink, p.epp)) for p in pools]
    fits = [f for _, f in arith.first_pages(grids)]
    expect = all(n > m for _, n, m in grids) and all(fits)
    given_order = list(pools)
    if len(pools) == 2 or rnd.random() < 0.5:  # ENDs anywhere; floats keep their order
        ends, floats = [pools[0], pools[-1]], pools[1:-1]
        rnd.shuffle(ends)
        given_order = [ends[0], *floats, ends[1]] if rnd.random() < 0.5 else [*floats, *ends]
    try:
        a = Arena(total, given_order)
    except ValueError as e:
        assert not expect, e
        bad = [p.name for p, (_, n, m), f in zip(pools, grids, fits) if not (n > m and f)]
        assert any(repr(b) in str(e) for b in bad), (e, bad)
        return
    assert expect, (total, cfg)
    assert a.chain == tuple(p.name for p in pools)
    for p in pools:
        assert a.available_pages(p.name) >= 1, p.name
    s = A.from_arena(a)
    assert A.boot_state(s) == s and A.layout_ok(s) is True


def test_design_example_float_never_gets_a_page():
    """docs/design.md §3: F's only page would overlap the up END's first page."""
    pools = [SubPool("U", 10, 1, "up"), SubPool("F", 33, 1, "float"), SubPool("D", 10, 1, "down")]
    with pytest.raises(ValueError, match="'F'"):
        make_layout(86, pools)
    with pytest.raises(ValueError, match="'F'"):
        Arena(86, pools)
    grids = [(10, 8, 4), (33, 2, 1), (10, 8, 4)]
    assert [f for _, f in arith.first_pages(grids)] == [True, False, False]  # D packs above F
    # the old raw-byte check (sink + sum of epp <= total) accepted it
    assert 33 + 10 + 33 + 10 <= 86


# ------------------------------------------------- abstract vs spec.Arena


@st.composite
def arenas(draw, laziness=(False, True, "up", "down")):
    """Arenas of 2 to 4 pools, small grids; ``laziness`` the draws of
    ``lazy`` (an END's name: that END alone)."""
    n = draw(st.integers(2, 4))
    grows = ["up"] + ["float"] * (n - 2) + ["down"]
    pools = [
        SubPool(f"p{i}", draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 4])), g) for i, g in enumerate(grows)
    ]
    total = draw(st.integers(60, 600))
    lazy = draw(st.sampled_from(laziness))
    if isinstance(lazy, str):
        lazy = {pools[0].name if lazy == "up" else pools[-1].name}
    try:
        return Arena(total, pools, lazy=lazy)
    except ValueError:
        assume(False)


OPS = ("alloc", "alloc", "alloc", "free", "free", "flush", "make_room", "compact", "policy")


def _check_views(a, s):
    assert A.layout_ok(s) is True
    assert A.inv_grid(s) is True and A.inv_cons(s) is True and A.inv_order(s) is True
    for i, name in enumerate(a.chain):
        assert A.available(s, i) == a.available_pages(name)
        assert A.above(s, i) == a.above(name) and A.below(s, i) == a.below(name)
        if s.pools[i].grow == "float":
            assert A.region(s, i) == a.region(name)
        else:
            assert A.gap(s, i) == a.gap_bytes(name)


def _apply(a, rng, op):
    """Apply one random operation to ``a``; return the relation its outcome must satisfy."""
    i = rng.randrange(len(a.chain))
    name = a.chain[i]
    b = a.bands[name]
    grow = b.grow
    s = A.from_arena(a)
    if op == "alloc":
        avail = a.available_pages(name)
        n = rng.randint(1, max(1, avail + 1))
        got = a.alloc(name, n)
        t = A.from_arena(a)
        if got is None:
            assert n > avail and t == s
            return "alloc_refused", True
        if grow != "float":
            return "alloc_end", A.rel_alloc_end(s, t, i, n)
        if not A.opaque(s, i):
            return "alloc_parked", A.rel_alloc_float_parked(s, t, i, n)
        if n <= s.bands[i].holes:
            return "alloc_holes", A.rel_alloc_float_holes(s, t, i, n)
        lo_rel = A.rel_alloc_float_extend_low(s, t, i, n)
        hi_rel = A.rel_alloc_float_extend_high(s, t, i, n)
        assert lo_rel != hi_rel  # exactly one variant describes what the spec did
        return ("alloc_low" if lo_rel else "alloc_high"), True
    if op == "free":
        live = [v for v, p in enumerate(b.v2p) if v > 0 and p >= 0]
        if not live:
            return "noop", True
        k = rng.randint(1, len(live))
        a.free(name, rng.sample(live, k))
        t = A.from_arena(a)
        if grow == "float":
            return "free_float", A.rel_free_float(s, t, i, k)
        if b.lazy:
            return "free_lazy", A.rel_free_lazy(s, t, i, k)
        return "free_eager", A.rel_free_eager(s, t, i, k)
    if op == "flush":
        a.flush(name, rng.choice([None, 0, 1, 2]))
        t = A.from_arena(a)
        rel = A.rel_flush_float(s, t, i) if grow == "float" else A.rel_flush_end(s, t, i)
        return "flush", rel
    floats = [k for k, nm in enumerate(a.chain) if a.bands[nm].grow == "float"]
    if not floats:
        return "noop", True
    i = rng.choice(floats)
    name = a.chain[i]
    side_low = rng.random() < 0.5
    if op == "compact":
        a.compact_holes(name, "low" if side_low else "high")
        return "compact", A.rel_compact_holes(s, A.from_arena(a), i, side_low)
    if op == "make_room":
        mb = rng.randint(0, a.total_bytes // 2)
        moved = a.make_room(name, "low" if side_low else "high", mb)
        t = A.from_arena(a)
        return _make_room_outcome(s, t, i, side_low, mb, moved)
    # the demand-vector policy: proofs.policy.decision predicts open_short_side
    demand = {nm: rng.randint(0, 8) for nm in a.chain if rng.random() < 0.7}
    d = [demand.get(nm, 0) for nm in a.chain]
    skip, act, side, target, _ = P.decision(s, i, d)
    moved = a.open_short_side(name, demand)
    t = A.from_arena(a)
    if skip or not act:
        assert moved == 0 and t == s
        return "policy_idle", True
    assert short_side_decision(*P.decision(s, i, d)[4].values())[0]
    kind, ok = _make_room_outcome(s, t, i, side, target, moved)
    return "policy_" + kind, ok


def _make_room_outcome(s, t, i, side, mb, moved):
    if not A.make_room_moves(s, i, side, mb):
        assert t == s and moved == 0
        return "make_room_idle", True
    _, _, need = A.make_room_terms(s, i, side, mb)
    # the cost bound that policy.cost_bound proves over its window model
    assert 0 <= moved <= min(s.bands[i].live, need)
    if need < s.bands[i].live:
        return "make_room_boundary", A.rel_make_room_boundary(s, t, i, side, mb)
    return "make_room_leapfrog", A.rel_make_room_leapfrog(s, t, i, side, mb)


SEEN = set()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(arenas(), st.lists(st.sampled_from(OPS), min_size=5, max_size=30), st.integers(0, 2**32))
def test_abstract_transitions_match_spec(a, ops, seed):
    rng = random.Random(seed)
    for op in ops:
        s = A.from_arena(a)
        _check_views(a, s)
        kind, ok = _apply(a, rng, op)
        SEEN.add(kind)
        assert ok is True, (kind, s, A.from_arena(a))
        a.verify()
    _check_views(a, A.from_arena(a))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    arenas(),
    st.lists(st.sampled_from(OPS), min_size=0, max_size=15),
    st.integers(0, 2**32),
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["lo", "hi"]), st.integers(-2, 2)), max_size=2),
)
def test_conservation_matches_spec(a, ops, seed, drifts):
    """``abstract.cons_bytes`` is ``Arena._conservation``: on reachable states
    both hold, and after planting frontier drifts both reject or both accept."""
    rng = random.Random(seed)
    for op in ops:
        _apply(a, rng, op)
    assert A.cons_bytes(A.from_arena(a)) is True
    for k, field, d in drifts:
        b = a.bands[a.chain[k % len(a.chain)]]
        setattr(b, field, getattr(b, field) + d)
    opaque = [n for n in a.chain if a.bands[n].opaque]
    try:
        a._conservation(opaque)
        spec_ok = True
    except AssertionError:
        spec_ok = False
    assert A.cons_bytes(A.from_arena(a)) is spec_ok


def test_fidelity_run_reaches_every_variant():
    """The random run above must exercise every relation (else it proves little)."""
    rng = random.Random(7)
    seen = set()
    for _ in range(400):
        n = rng.randint(2, 4)
        grows = ["up"] + ["float"] * (n - 2) + ["down"]
        pools = [SubPool(f"p{k}", rng.randint(1, 5), rng.choice([1, 2]), g) for k, g in enumerate(grows)]
        try:
            a = Arena(rng.randint(80, 400), pools, lazy=rng.choice([False, True]))
        except ValueError:
            continue
        for _ in range(25):
            kind, ok = _apply(a, rng, rng.choice(OPS))
            assert ok is True, kind
            seen.add(kind)
    want = {
        "alloc_end",
        "alloc_parked",
        "alloc_holes",
        "alloc_low",
        "alloc_high",
        "alloc_refused",
        "free_float",
        "free_lazy",
        "free_eager",
        "flush",
        "compact",
        "make_room_boundary",
        "make_room_leapfrog",
        "make_room_idle",
        "policy_idle",
    }
    assert want <= seen, want - seen
    assert any(k.startswith("policy_make_room_") and k != "policy_make_room_idle" for k in seen), seen


def test_fidelity_catches_a_wrong_relation():
    """Teeth: a relation that mispredicts the spec is caught by the same check."""
    a = Arena(200, [SubPool("u", 4, 1, "up"), SubPool("d", 4, 1, "down")])
    s = A.from_arena(a)
    a.alloc("u", 3)
    t = A.from_arena(a)
    assert A.rel_alloc_end(s, t, 0, 3) is True
    assert A.rel_alloc_end(s, t, 0, 2) is False  # three pages bound, not two
    assert A.rel_alloc_end(s, t, 1, 3) is False  # the other END did not move


# ------------------------------------------------- the page tables on z3 arrays


@settings(max_examples=60, deadline=None)
@given(st.integers(6, 10), st.integers(0, 2**32))
def test_table_writers_on_z3_arrays_match_lists(n, seed):
    """``integrity.Table`` is the only encoding the integrity obligations add:
    the spec's ``bind_pages``/``unbind_ids``/``move_pages`` on z3 arrays
    (read back at every index) give what they give on lists."""
    from kvarena.proofs.integrity import Table
    from kvarena.spec.bands import bind_pages, move_ok, move_pages, unbind_ids

    rng = random.Random(seed)
    v2p, p2v, content = [-1] * n, [-1] * n, dict.fromkeys(range(n), -1)
    zt = [Table(f"f{seed}_{k}") for k in range(3)]
    for k, lst in enumerate((v2p, p2v, content)):
        for x in range(n):
            zt[k][x] = lst[x]

    def same():
        for k, lst in enumerate((v2p, p2v, content)):
            assert [z3.simplify(zt[k][x]).as_long() for x in range(n)] == [lst[x] for x in range(n)]

    ids, pages = rng.sample(range(1, n), 3), rng.sample(range(1, n), 3)
    bind_pages(v2p, p2v, content, ids, pages)
    bind_pages(*zt, ids, pages)
    same()
    live = [p for p in range(1, n) if p2v[p] >= 0]
    free = [p for p in range(1, n) if p2v[p] < 0]
    src = sorted(rng.sample(live, 2))
    dst = sorted(rng.sample(free + src[:1], 2))
    if move_ok(p2v, dst, src):
        move_pages(v2p, p2v, content, dst, src)
        move_pages(*zt, dst, src)
        same()
    gone = list(ids[:2])
    assert [z3.simplify(p).as_long() for p in unbind_ids(zt[0], zt[1], gone)] == unbind_ids(v2p, p2v, gone)
    same()


# ------------------------------------------------- views (proofs/views.py)


def _schedulable_case(a):
    """``views.flushed_whole`` is what ``Arena.flush`` of the other END does
    (lazy: whole; eager: nothing), and each END's ``schedulable_pages`` is
    exactly its ``available_pages`` after that flush: the obligations'
    relation and their claim, on the spec's arena.  Which cases it saw."""
    import copy

    from kvarena.proofs import views

    s = A.from_arena(a)
    seen = set()
    for i, j in ((0, len(a.chain) - 1), (len(a.chain) - 1, 0)):
        name, other = a.chain[i], a.chain[j]
        promised = a.schedulable_available_size(name) // a.pool(name).page_size
        after = copy.deepcopy(a)
        after.flush(other)
        assert views.flushed_whole(s, A.from_arena(after), j) is True
        assert after.available_pages(name) == promised
        seen.add("credited" if promised > a.available_pages(name) else "nothing to credit")
    return seen


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(arenas(), st.lists(st.sampled_from(OPS), min_size=0, max_size=25), st.integers(0, 2**32))
def test_schedulable_is_what_the_other_ends_flush_delivers(a, ops, seed):
    rng = random.Random(seed)
    for op in ops:
        _apply(a, rng, op)
    _schedulable_case(a)


def test_the_views_check_reaches_a_credit():
    """A seeded run of the check above sees a view that credits a flush and
    one with nothing to credit (else it checks little)."""
    rng = random.Random(11)
    seen = set()
    while len(seen) < 2:
        pools = [SubPool("lo", rng.randint(1, 5), 1, "up"), SubPool("hi", rng.randint(1, 5), 1, "down")]
        a = Arena(rng.randint(80, 400), pools, lazy=True)
        for _ in range(20):
            _apply(a, rng, rng.choice(("alloc", "alloc", "free")))
        seen |= _schedulable_case(a)
    assert seen == {"credited", "nothing to credit"}
