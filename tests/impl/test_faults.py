"""Faults (issue 24, item 1): a torch operation that raises in the middle of
a call leaves the arena exactly as the call found it.

The rule is ``impl/journal.py``'s; the harness ``kvarena.verification.faults``
(``FaultAt(k)``: the ``k``-th torch operation raises, once).  Each case is a
state and one call that moves or rebinds pages; the sweep runs the call on
a fresh copy of the state once per operation it makes, the ``k``-th
failing, and checks every time that the fault came out, the snapshot
(spans, tables, hole lists, free-id rings) is the one before the call,
``verify()`` passes, and every live id's bytes are the ones stamped before
the call.  The call without a fault must change the state (else the case
tests nothing).  ``relieve`` with an evictor is the one call that is not
one scope: its attempts are (the evictor's frees cannot be undone), so its
fault leaves the state of an attempt boundary.
"""

import copy
import random

import pytest
import torch

from kvarena import impl
from kvarena.impl import Arena, SubPool, kernels
from kvarena.impl import arena as arena_mod
from kvarena.verification.faults import FaultAt, InjectedFault, count_ops, fault_at, unfaulted
from tests.api.test_composites import make as make_composite
from tests.api.test_composites import random_walk

EPP = 24


def arena(lazy=False, policy="anchor", mover=None, floats=1):
    names = ["f"] if floats == 1 else ["f", "g"]
    pools = [SubPool("lo", EPP, 1, "up"), *(SubPool(n, EPP, 1, "float") for n in names), SubPool("hi", EPP, 1, "down")]
    a = Arena(EPP * 64, pools, lazy=lazy, policy=policy, mover=mover)
    lo, f, hi = a.alloc("lo", 8), a.alloc("f", 12), a.alloc("hi", 6)
    if floats == 2:
        a.alloc("g", 6)
    a.free("f", f[1:10:2])  # holes in the float
    a.free("lo", lo[[1, 2, 6]])  # lazy: holes; eager: compaction
    a.free("hi", hi[[1, 4]])
    return a


def stamp(a):
    """Give every live id of every pool its own bytes; the marks by pool."""
    marks = {}
    for name in a.chain:
        v2p, _ = a.live_tables(name)
        ids = [i for i in range(1, a.id_end(name)) if int(v2p[i]) >= 0]
        gen = torch.Generator().manual_seed(len(ids) * 31 + len(name))
        data = torch.randint(0, 256, (len(ids), a.geometry(name).epp), dtype=torch.uint8, generator=gen)
        if ids:
            a.write_pages(name, ids, data)
        marks[name] = dict(zip(ids, data))
    return marks


def bytes_kept(a, marks):
    """Every id live now and stamped before reads its own bytes."""
    for name, by_id in marks.items():
        v2p, _ = a.live_tables(name)
        live = [i for i in by_id if int(v2p[i]) >= 0]
        if live:
            got = a.read_pages(name, live)
            for row, i in zip(got, live):
                assert torch.equal(row, by_id[i]), f"pool {name!r}: id {i} lost its bytes"


def sweep(base, call, arena_of=lambda x: x, boundaries=None):
    """Fail each operation of ``call(copy of base)`` in turn; see the module
    docstring.  ``boundaries(x)`` (relieve with an evictor) lists the
    snapshots a fault may leave instead of the one before the call."""
    marks = stamp(arena_of(base))
    before = arena_of(base).snapshot()
    x = copy.deepcopy(base)
    _, n = count_ops(lambda: call(x))
    after = arena_of(x).snapshot()
    assert after != before, "the call changed nothing: the case tests nothing"
    allowed = [before] + (boundaries(copy.deepcopy(base)) if boundaries else [])
    for k in range(n):
        x = copy.deepcopy(base)
        raised, _ = fault_at(k, lambda x=x: call(x))
        a = arena_of(x)
        assert raised, f"operation {k} of {n}: the fault was swallowed"
        assert a.snapshot() in allowed, f"operation {k} of {n}: the state is neither before nor a boundary"
        a.verify()
        bytes_kept(a, marks)
    return n


# --------------------------------------------------------------- the arena


class Copier:
    """An engine's mover: whole envelopes through ``page_view``, one batch
    (an object, so a deep copy of the arena gets one bound to the copy)."""

    arena = None

    def __call__(self, name, dst, src):
        view = self.arena.page_view(name)
        view.index_copy_(0, dst, view.index_select(0, src))


def case_arena(lazy, policy="anchor", with_mover=False, floats=1):
    mover = Copier() if with_mover else None
    a = arena(lazy, policy, mover, floats)
    if mover:
        mover.arena = a
    return a


def wide(a, side):
    """A ``make_room`` target past what the side has: a real slide."""
    epp = a.geometry("f").epp
    low, high = a.frontiers("f")
    return (low - a.below("f") if side == "low" else a.above("f") - high) + 3 * epp


def leap(a):
    return a.above("f") - a.below("f") - a.live_pages("f") * a.geometry("f").epp


def queued(a, name, n):
    return a.free_ids(name)[:n]


CALLS = {
    "alloc END holes+extend": lambda a: a.alloc("lo", 5 + a.counts("lo").holes),
    "alloc float holes+extend": lambda a: a.alloc("f", 8),
    "alloc given ids": lambda a: a.alloc("f", 2, ids=queued(a, "f", 2).flip(0)),
    "free END": lambda a: a.free("lo", [v for v in range(1, a.id_end("lo")) if int(a.v2p("lo")[v]) >= 0][:3]),
    "free float all": lambda a: a.free("f", [v for v in range(1, a.id_end("f")) if int(a.v2p("f")[v]) >= 0]),
    "make_room low": lambda a: a.make_room("f", "low", wide(a, "low")),
    "make_room high": lambda a: a.make_room("f", "high", wide(a, "high")),
    "leapfrog high": lambda a: a.make_room("f", "high", leap(a)),
    "compact_holes low": lambda a: a.compact_holes("f", "low"),
    "compact_holes high": lambda a: a.compact_holes("f", "high"),
    "open_short_side": lambda a: a.open_short_side("f", {"hi": a.available_pages("hi") + 3}),
    "relieve": lambda a: a.relieve("hi", a.available_pages("hi") + 3),
}
LAZY_ONLY = {"flush END": lambda a: a.flush("lo")}


@pytest.fixture(params=["default", "one page"])
def temp(request, monkeypatch):
    """The move's temporary as built, or one envelope: every pair its own
    chunk, so a shift fails between chunks."""
    if request.param == "one page":
        monkeypatch.setattr(arena_mod, "TEMP_BYTES", {"cpu": 1, "cuda": 1})
    return request.param


@pytest.mark.parametrize(
    ("name", "lazy"), [(n, lazy) for n in CALLS for lazy in (False, True)] + [(n, True) for n in LAZY_ONLY]
)
def test_a_fault_in_an_arena_call_leaves_it_as_it_was(name, lazy, temp):
    assert sweep(case_arena(lazy), {**CALLS, **LAZY_ONLY}[name]) > 0


@pytest.mark.parametrize("name", ["make_room low", "leapfrog high", "compact_holes low", "compact_holes high"])
def test_a_fault_in_the_engines_mover_or_around_it(name, temp):
    """The mover's own operations fail too (it runs inside the mode); a
    shift through a mover goes in waves, each undone."""
    assert sweep(case_arena(True, with_mover=True), CALLS[name]) > 0


@pytest.mark.skipif(kernels.unavailable(torch.device("cpu")) is not None, reason="Triton cannot run here")
@pytest.mark.parametrize("with_mover", [False, True])
@pytest.mark.parametrize("name", ["make_room low", "make_room high", "leapfrog high"])
def test_a_fault_in_a_slide_on_the_triton_path(name, with_mover):
    """The slide planned on the device: each of its operations fails in turn,
    the move's one launch included (or the mover's copy)."""
    a = case_arena(True, with_mover=with_mover)
    a.kernels = "triton"
    assert sweep(a, CALLS[name]) > 0


@pytest.mark.parametrize("policy", ["anchor", "planner"])
def test_a_fault_in_the_planner_repacks_undoes_every_repack(policy):
    """``plan_floats`` on two floats repacks both, one move each: a fault in
    the second undoes the first too (the reverse copies, last first)."""

    def call(a):
        a.plan_floats({"hi": a.available_pages("hi") + 6})

    a = case_arena(True, policy, floats=2)
    moves = []
    real = Arena._move

    def counting(self, b, dst, src, *rest):
        moves.append(b.name)
        return real(self, b, dst, src, *rest)

    probe = copy.deepcopy(a)
    probe._move = counting.__get__(probe)
    call(probe)
    assert set(moves) == {"f", "g"}, moves
    assert sweep(a, call) > 0


@pytest.mark.parametrize("policy", ["anchor", "planner"])
def test_relieve_with_an_evictor_stops_at_an_attempt_boundary(policy):
    """The evictor frees the float's newest page each round; a fault leaves
    the state where an attempt or an evictor call ended (or as before)."""
    a = case_arena(True, policy)

    def evictor_on(x, seen=None):
        def evict(shortfall):
            live = [v for v in range(1, x.id_end("f")) if int(x.v2p("f")[v]) >= 0]
            if not live:
                return 0
            if seen is not None:  # an attempt's end, then the evictor's
                seen.append(x.snapshot())
            x.free("f", live[-1:])
            if seen is not None:
                seen.append(x.snapshot())
            return 1

        return evict

    need = next(n for n in range(1, 64) if not copy.deepcopy(a).relieve("hi", n)) + 2  # past the slide alone

    def call(x):
        x.relieve("hi", need, evict=evictor_on(x))

    def boundaries(x):
        seen = []
        x.relieve("hi", need, evict=evictor_on(x, seen))
        return seen

    assert len(boundaries(copy.deepcopy(a))) >= 2
    assert sweep(a, call, boundaries=boundaries) > 0


def test_an_evictor_cannot_run_inside_an_atomic_block():
    a = case_arena(True)
    before = a.snapshot()
    with pytest.raises(ValueError, match="pool 'hi': relieve: an evictor cannot run inside atomic"), a.atomic():
        a.relieve("hi", 1, evict=lambda s: 0)
    assert a.snapshot() == before


def test_an_atomic_block_is_all_or_nothing():
    """Calls in one block: a raise after two calls undoes both."""
    a = case_arena(True)
    marks = stamp(a)
    before = a.snapshot()
    with pytest.raises(KeyError), a.atomic():
        a.free("f", a.free_ids("f")[:0])
        got = a.alloc("f", 3)
        assert got is not None
        a.compact_holes("f", "low")
        raise KeyError("the caller's own error")
    assert a.snapshot() == before
    a.verify()
    bytes_kept(a, marks)
    assert not a.in_atomic


# ---------------------------------------------------- an in-flight forward


def live(a, name):
    return [v for v in range(1, a.id_end(name)) if int(a.v2p(name)[v]) >= 0]


def flying():
    """A forward in flight (docs/design.md §12) over the lazy case arena:
    pins in every band, a freed pin in the float (a guarded hole)."""
    a = case_arena(True)
    lo, f = live(a, "lo"), live(a, "f")
    a.launch({"lo": lo[-2:-1], "f": f[:2], "hi": live(a, "hi")[:1]})
    a.free("f", f[:1])
    assert a.in_flight and a.pinned("f").numel() == 2
    return a


IN_FLIGHT = {
    "walk": lambda a: a.flush("lo", urgent=False),  # stops at the pin; what it vacates waits
    "free a pin": lambda a: a.free("lo", live(a, "lo")[-2:-1]),
    "alloc past the guarded hole": lambda a: a.alloc("f", 2),
    "alloc that settles": lambda a: a.alloc("f", a.counts("f").holes),
    "launch again": lambda a: a.launch({"lo": live(a, "lo"), "hi": live(a, "hi")}),  # two tables in place
    "launch every live page": lambda a: a.launch({"f": None}),
    "urgent flush": lambda a: a.flush("lo"),
    "a float parks": lambda a: a.free("f", live(a, "f")),
}


@pytest.mark.parametrize("name", IN_FLIGHT)
def test_a_fault_with_a_forward_in_flight_leaves_its_guards_as_they_were(name):
    """The snapshot the sweep compares holds ``in_flight``, the pins and
    the pending pages: a fault leaves them, and the guarded-hole bounds
    (``verify``'s "guarded holes"), as the call found them."""
    assert sweep(flying(), IN_FLIGHT[name]) > 0


def test_the_sweep_catches_a_write_without_its_undo(monkeypatch):
    """Planted: ``_bind`` without its undo entry; the sweep must see it."""
    monkeypatch.setattr(arena_mod, "_unbind", lambda *args: None)
    with pytest.raises(AssertionError, match="neither before"):
        sweep(case_arena(True), CALLS["alloc float holes+extend"])


def test_the_sweep_catches_a_move_without_its_reverse_copy(monkeypatch):
    """Planted: a finished move that does not copy its bytes back (a shift
    overwrote its own sources: its table writes then fail)."""
    monkeypatch.setattr(Arena, "_copy_back", lambda *args: None)
    with pytest.raises(AssertionError, match="lost its bytes"):
        sweep(case_arena(True), CALLS["compact_holes low"])


def test_the_sweep_catches_a_free_whose_pages_are_not_kept(monkeypatch):
    """Planted: eager compaction overwrites the pages its free released;
    without keeping their bytes an undone free brings back garbage."""
    monkeypatch.setattr(arena_mod.Journal, "keep_rows", lambda *args: None)
    with pytest.raises(AssertionError, match="lost its bytes"):
        sweep(case_arena(False), CALLS["free END"])


def test_the_sweep_catches_a_shift_that_leaves_chunks_moved(monkeypatch):
    """Planted: a shift that raises midway without copying its chunks back."""
    monkeypatch.setattr(arena_mod, "TEMP_BYTES", {"cpu": 1, "cuda": 1})
    real = arena_mod._copy_in_chunks
    monkeypatch.setattr(arena_mod, "_copy_in_chunks", lambda *a, shift=False, **k: real(*a, **k))
    with pytest.raises(AssertionError, match="lost its bytes"):
        sweep(case_arena(True), CALLS["compact_holes low"])


def test_fault_at_counts_and_fails_exactly_one_operation():
    x = torch.arange(4)
    _, n = count_ops(lambda: (x + 1) * 2)
    assert n == 2
    assert fault_at(1, lambda: (x + 1) * 2) == (True, None)
    raised, out = fault_at(2, lambda: (x + 1) * 2)
    assert not raised and torch.equal(out, (x + 1) * 2)
    with pytest.raises(InjectedFault), FaultAt(0):
        torch.zeros(1)


# ------------------------------------------------------------ the composites

COMPOSITE_CALLS = ("alloc_extend", "alloc_decode", "free", "free_swa", "alloc_state", "free_state")


def captured_calls(kind, lazy, seed=0, steps=120):
    """Run the api tests' random walk on a composite, keeping, before each
    public call, a copy of the composite and the call: the cases."""
    c = make_composite(impl, kind, 4, pages=24, lazy=lazy)
    cases = []
    for name in COMPOSITE_CALLS:
        if not hasattr(c, name):
            continue
        real = getattr(c, name)

        def recording(*args, _name=name, _real=real, **kw):
            snap = copy.deepcopy(c)
            for n in COMPOSITE_CALLS:
                snap.__dict__.pop(n, None)  # the copy runs its own methods, not these wrappers
            cases.append((_name, snap, args, kw))
            return _real(*args, **kw)

        setattr(c, name, recording)
    random_walk(c, random.Random(seed), steps, 4, lambda c: None)
    return cases


def moves_of(case):
    """Pages the call moves and whether it changes the state, on a copy."""
    name, snap, args, kw = case
    x = copy.deepcopy(snap)
    moved = []
    real = x.arena._move
    x.arena._move = lambda *a, **k: moved.append(real(*a, **k)) or moved[-1]
    before = x.arena.snapshot()
    getattr(x, name)(*args, **kw)
    del x.arena._move
    return sum(moved), x.arena.snapshot() != before


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_a_fault_in_a_composite_call_leaves_it_as_it_was(kind, lazy):
    """Per call, the case that moves the most pages (relief before a bind,
    eager compaction after a free), else one that changes the state."""
    chosen = {}
    for case in captured_calls(kind, lazy):
        moved, changed = moves_of(case)
        if changed and moved >= chosen.get(case[0], (-1,))[0]:
            chosen[case[0]] = (moved, case)
    assert {"alloc_extend", "alloc_decode", "free"} <= set(chosen)
    assert any(moved for moved, _ in chosen.values()), "no case moved a page"
    for _, (name, snap, args, kw) in chosen.values():
        sweep(snap, lambda x, name=name, args=args, kw=kw: getattr(x, name)(*args, **kw), lambda x: x.arena)


@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_composite_relieve_with_an_evictor_stops_at_an_attempt_boundary(kind):
    c = make_composite(impl, kind, 4, pages=24, lazy=True)
    reqs = []
    while (got := c.alloc_extend([0], [12], [-1])) is not None:
        reqs.append(got)
    c.free(reqs.pop(1))  # a hole the rungs can use

    def evictor_on(x, seen=None):
        left = list(reqs)

        def evict(shortfall):
            if not left:
                return 0
            if seen is not None:  # an attempt's end, then the evictor's
                seen.append(x.arena.snapshot())
            x.free(left.pop())
            if seen is not None:
                seen.append(x.arena.snapshot())
            return 12

        return evict

    def call(x):
        x.relieve(tokens=40, evict=evictor_on(x))

    def boundaries(x):
        seen = []
        x.relieve(tokens=40, evict=evictor_on(x, seen))
        return seen

    assert len(boundaries(copy.deepcopy(c))) >= 1
    sweep(c, call, lambda x: x.arena, boundaries)


# ------------------------------------- a composite's free that waits for the forward


def forward_lands(x, launch_pages, marks):
    """``x``'s engine wait (``on_settle``): the forward in flight writes new
    bytes for the ids it writes, at the pages they had at launch, and those
    become the ids' bytes (``marks``): as a real forward's late write does."""

    def land():
        with unfaulted():  # the forward's work, not the call's: never the faulted operation
            write()

    def write():
        for name, pages in launch_pages.items():
            view = x.arena.page_view(name)
            for v, p in pages.items():
                view[p] = 255 - view[p]
                marks[name][v] = view[p].clone()

    x.arena.on_settle = land


def waiting_free(kind):
    """An eager composite with requests, a forward in flight that writes the
    last request's tokens, and that request's free: its SWA pages go first,
    then full's eager END waits for the forward before its compaction."""
    c = make_composite(impl, kind, 1, pages=24, lazy=False)
    reqs = [c.alloc_extend([0], [n], [-1]) for n in (3, 2, 4, 1)]
    c.free(reqs[1])  # a hole below the last request: the free's compaction moves
    c.launch(reqs[-1], None)
    assert c.arena.in_flight
    return c, reqs[-1]


@pytest.mark.parametrize("kind", ["hybrid", "tri"])
def test_a_fault_after_the_free_waits_keeps_the_forwards_write(kind):
    """Issue 52 on the implementation alone: a fault anywhere in the free
    leaves it as it was, and an id the forward wrote, unbound by the free
    before the wait and bound again by the undo, holds the forward's bytes
    when the fault came after the wait, its own before.  Both happen."""
    base, tokens = waiting_free(kind)
    tokens = tokens.tolist()  # page size 1: a token is its page's id
    marks = stamp(base.arena)
    before = base.arena.snapshot()
    pools = ["full", "swa"]
    launch_pages = {n: {v: int(base.arena.v2p(n)[v]) for v in tokens} for n in pools}
    x = copy.deepcopy(base)
    forward_lands(x, launch_pages, copy.deepcopy(marks))
    _, n = count_ops(lambda: x.free(tokens))
    landed = []
    for k in range(n):
        x, mk = copy.deepcopy(base), copy.deepcopy(marks)
        forward_lands(x, launch_pages, mk)
        raised, _ = fault_at(k, lambda x=x: x.free(tokens))
        assert raised, f"operation {k} of {n}: the fault was swallowed"
        assert x.arena.snapshot() == before, f"operation {k} of {n}: the state is not the one before"
        x.verify()
        bytes_kept(x.arena, mk)
        landed.append(any(not torch.equal(mk[p][v], marks[p][v]) for p in pools for v in tokens))
    assert any(landed) and not all(landed), "every fault fell on one side of the wait"


def test_the_sweep_catches_an_undo_that_loses_the_forwards_write(monkeypatch):
    """Planted: a free that keeps its pages' bytes when it frees them (not
    when they are overwritten) puts back, on undo, the bytes from before
    the forward's write."""
    from tests.support import mutant_module
    from tests.verification.test_fault_in_flight import KEEPS_AT_FREE

    monkeypatch.setattr(Arena, "free", mutant_module(arena_mod, *KEEPS_AT_FREE).Arena.free)
    with pytest.raises(AssertionError, match="lost its bytes"):
        test_a_fault_after_the_free_waits_keeps_the_forwards_write("tri")
