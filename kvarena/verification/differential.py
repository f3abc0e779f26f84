"""Differential fuzzing: the torch implementation against the executable spec.

A Hypothesis state machine boots a spec arena and an impl arena from one
random geometry (2-5 pools: one up, one down, 0-3 floats; page sizes 1-64;
entry sizes that put frontiers off each other's grids; lazy or eager; a
pool that borrows another's ids, or none) and applies every operation to
both, with the spec's PEP 316 contracts checked on every call.  After every
step the invariant compares page tables, FIFOs, frontiers, holes and every
capacity view, checks the impl's memo against a fresh recomputation, runs
both ``verify()``s, and reads back every live page's byte pattern through
``translate``.

The ladder (``relieve``) is written independently in the two arenas, and
they could still share a wrong idea, so it is also held to oracles that
share no code with either: its verdict must equal a fresh read of the gate,
evictors of every kind a scheduler writes (honest, returning 0, freeing
more than asked, lying, raising) must leave both arenas consistent, and a
second identical relieve after a failed one must fail too (always under
the planner; under the anchor policy on chains of at most one float, for an
END's need, as it breaks for a float's own need and on two floats:
documented findings, ``tests/spec/test_relieve_second_run.py``).  Both relief
policies run (``policy`` is drawn per run), and the planner's rung
(``plan_floats``) is also a rule of its own: a feasible plan must meet its
demand vector, an infeasible one move nothing.

Host transfers (docs/design.md §13): the machine closes and opens the
gate and queues loads (``reserve``: the bytes of the id that will own
each page are written straight into the reserved physical page), which
it later binds to those ids (``bind_reserved``: from then on the ordinary
read-back through ``translate`` checks the load's bytes) or cancels.  The
machine keeps its own model of the hold, and after every step that began
with moves held, an oracle that reads only the public tables checks, in
each twin, that no id that stayed bound changed its page and no reserved
page was lost; every move of a held step must report 0 pages.

Explicit examples (``EXAMPLES``, issue 57): fixed boots and steps, each
rule with its draws, replayed by ``replay`` before Hypothesis's own
examples in every ``run_machine``.  Together they reach every event the
tests require, so a Hypothesis version that draws other examples from the
same seed cannot miss one (``tests/verification/test_coverage_seeds.py``).

Profiles: the default is sized for CI (a couple of minutes on two cores);
``KVARENA_PROFILE=long`` runs thousands of examples.  ``tests/verification/test_differential.py``
runs it under pytest; ``kvarena verify`` runs it through ``run_differential``.
"""

import contextlib
import copy
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, currently_in_test_context, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvarena import impl, spec
from kvarena.impl import kernels
from kvarena.spec import SubPool
from kvarena.spec.contracts import checking, unchecked
from kvarena.verification.draws import same_draws
from kvarena.verification.faults import fault_at, record_fault
from kvarena.verification.inflight import Flight, walk

# CI skips shrinking: a failure still prints its full step list, and
# shrinking a 40-step machine can take many minutes on two cores.
# KVARENA_PROFILE=long explores far more and shrinks what it finds.
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
PROFILES = {
    "ci": {"max_examples": 180, "stateful_step_count": 40, "phases": NO_SHRINK},
    "long": {"max_examples": 3000, "stateful_step_count": 60},
}
COMMON = {"deadline": None, "suppress_health_check": list(HealthCheck), "report_multiple_bugs": False}


def profile(profiles):
    """The settings of the profile ``KVARENA_PROFILE`` names, if ``profiles`` has it, else of ``"ci"``."""
    return profiles.get(os.environ.get("KVARENA_PROFILE", "ci"), profiles["ci"])


def run_as_test(machine_cls, profile_settings, examples=(), seed=None, **overrides):
    """Run a machine once under the spec's pre/post contracts and invariant:
    its explicit ``examples`` (``replay``), then Hypothesis's (from ``seed``,
    as ``@seed`` would, when given); raises on the first disagreement."""
    opts = {**profile_settings, **COMMON, **overrides}
    with checking():
        for i, (boot, steps) in enumerate(examples):
            try:
                replay(machine_cls, boot, steps)
            except Exception as e:
                e.add_note(f"in explicit example {i} of {machine_cls.__name__}")
                raise
    if seed is not None:  # ``machine_for`` makes a class per run: the seed stays on this one
        machine_cls = hypothesis.seed(seed)(machine_cls)
    with checking(), same_draws(bool(opts.get("derandomize")) or seed is not None):
        run_state_machine_as_test(machine_cls, settings=settings(**opts))


class Script:
    """A rule's ``data`` in an explicit example: hands out the rule's draws
    in the order it makes them, whatever the strategy (no Hypothesis engine)."""

    def __init__(self, draws):
        self.draws = list(draws)

    def draw(self, strategy, label=None):
        assert self.draws, "the rule drew more than its explicit example gives"
        return copy.deepcopy(self.draws.pop(0))  # a rule may change what it is handed


def replay(machine_cls, boot, steps, kernels=None):
    """One explicit example (issue 57) on a fresh ``machine_cls``: ``boot``'s
    arguments, then each step, ``(rule, its draws in order)`` (None: a rule
    that draws nothing), with the invariant after the boot and after every
    step.  ``kernels`` fixes every call's kernel choice (else the machine
    draws them, from the boot: ``kernel_draws``).  The machine, afterwards."""
    machine = machine_cls()
    machine.boot(**copy.deepcopy(boot))
    if kernels is not None:
        machine.kernels = lambda: kernels
    machine.agree()
    for name, draws in steps:
        if draws is None:
            getattr(machine, name)()
        else:
            data = Script(draws)
            getattr(machine, name)(data)
            assert not data.draws, f"{name}: the rule drew less than its explicit example gives"
        machine.agree()
    machine.teardown()
    return machine


# Every interesting case the machine must reach; test_differential fails on a zero.
CASES: Counter[str] = Counter()


def kernel_choices(device: str) -> tuple[str, ...]:
    """The kernels an implementation on ``device`` can run (docs/design.md §14)."""
    return ("torch",) + (("triton",) if kernels.unavailable(torch.device(device)) is None else ())


def kernel_draws(device: str, *seed: object) -> Callable[[], str]:
    """A draw of the kernels for each call (docs/design.md §14): among
    those that run on ``device``, from a generator seeded by ``seed`` (an
    example's boot draws).  Not Hypothesis's stream: drawing there would
    change every example a seed draws, and the planted-bug tests count on
    those."""
    rng, choices = random.Random(repr(seed)), kernel_choices(device)
    return lambda: rng.choice(choices)


def kernel_events(device: str) -> tuple[str, ...]:
    """A step on each kernel choice that runs on ``device``: events a run there must reach."""
    return tuple(f"kernels {k}" for k in kernel_choices(device))


REQUIRED = (
    "exhaustion",
    "exact fit",
    "slide low",
    "slide high",
    "leapfrog",
    "refusal both short",
    "lazy flush capped",
    "eviction round",
    "borrowed bind",
    "lender free refused",
    "evictor raised",
    "evictor returned 0 but freed",
    "evictor returned no count",
    "evictor relieved a pool itself",
    "relieve failed twice (anchor)",
    "relieve failed twice (planner)",
    "plan moved pages",
    "plan fits in place",
    "plan infeasible",
    "fault undone",
    "fault past the call",
    "urgent settle",
    "non-urgent walk stopped by a pin",
    "pending page reused after settle",
)
# The in-flight rules' own events, counted by tests/verification/test_differential.py (not by ``kvarena verify``).
IN_FLIGHT = (
    "launch",
    "launch while in flight",
    "launch refused",
    "settle",
    "non-urgent moves in flight",
    "fault in flight",
)
# The host-transfer rules' own events (docs/design.md §13), counted by tests/verification/test_differential.py.
HOLDS = (
    "hold: gate closed by host",
    "hold: gate closed by disagg",
    "hold: gate closed by both sources",
    "hold: gate opened",
    "hold: one source opened, the other holds",
    "hold: reserved",
    "hold: reservation short",
    "hold: bound",
    "hold: cancelled",
    "hold: refused (eager END)",
    "hold: bad input",
    "hold: flush",
    "hold: relieve",
    "hold: slide or plan",
    "hold: a plan that moves refused",
    "hold: forward in flight",
)
EVICTORS = ("honest", "zero", "more", "liar", "raise", "no count", "nested")


class EvictorError(RuntimeError):
    """What the raising evictor throws; ``relieve`` must pass it on."""


@contextlib.contextmanager
def raises_value_error(name):
    """A ``ValueError`` that names pool ``name`` must be raised in the block."""
    try:
        yield
    except ValueError as e:
        if not re.search(re.escape(name), str(e)):
            raise AssertionError(f"ValueError does not name pool {name!r}: {e}") from None
    else:
        raise AssertionError(f"pool {name!r}: bad input was accepted")


def event(case):
    """Hypothesis's ``event``, in a Hypothesis test; an explicit example (``replay``) runs outside one."""
    if currently_in_test_context():
        hypothesis.event(case)


def note(case):
    CASES[case] += 1
    event(case)


# ------------------------------------------------------------- geometry


@st.composite
def geometries(draw):
    n_float = draw(st.integers(0, 3))
    grows = ["up", "down"] + ["float"] * n_float
    names = ["U", "D"] + [f"F{i}" for i in range(1, n_float + 1)]
    pools = []
    for name, grow in zip(names, grows):
        state = draw(st.integers(0, 4)) == 0
        page_size = 1 if state else draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16, 64]))
        entry = draw(st.integers(1, 12))
        pools.append(SubPool(name, entry, page_size, grow, "state" if state else "kv"))
    sink = max(p.epp for p in pools)
    finest = min(p.epp for p in pools)
    # Grid of the coarsest pool: room for every pool's page, small enough that
    # the finest grid stays a few thousand pages (the spec scans whole grids).
    t_max = max(len(pools) + 4, min(40, 3000 * finest // sink))
    t = draw(st.integers(len(pools) + 2, t_max))
    total = sink * t + draw(st.integers(0, sink - 1))
    borrow = None
    if draw(st.integers(0, 2)) == 0:  # a third of the arenas have a borrower
        borrower, lender = draw(st.permutations(range(len(pools))))[:2]
        b, ln = pools[borrower], pools[lender]
        pools[borrower] = SubPool(
            b.name, b.entry_bytes, ln.page_size, b.grow, b.kind if ln.page_size == 1 else "kv"
        )  # one token id addresses both
        borrow = {b.name: ln.name}
    sink = max(p.epp for p in pools)
    total = max(total, sink * (len(pools) + 2))
    while True:  # grid padding can leave a tight total one page short of valid
        try:
            spec.make_layout(total, pools)
            break
        except ValueError:
            total += sink
    order = draw(st.permutations(pools))
    lazy = draw(st.sampled_from([("U",), True, False, True, ("D",)]))  # holds (§13) need lazy ENDs
    lazy = set(lazy) if isinstance(lazy, tuple) else lazy
    return total, order, lazy, borrow


def pattern(pool_index, ids, gens, epp):
    """Bytes of a page: a hash of (pool, virtual id, generation, byte offset)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    gens = torch.as_tensor(gens, dtype=torch.int64)
    base = (pool_index * 1_000_003 + ids * 7919 + gens * 104_729)[:, None]
    h = base * 2_654_435_761 + torch.arange(epp, dtype=torch.int64)[None, :] * 40_503 + 12_345
    h = (h ^ (h >> 15)) * 2_246_822_519
    return ((h >> 17) & 255).to(torch.uint8)


def ints(x):
    """A list of ints from a tensor or a sequence."""
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def placement(arena):
    """Each pool's ``({id: page}, reserved pages)``, read from an arena's
    public tables alone: what a hold must keep (docs/design.md §13)."""
    out = {}
    for n in arena.chain:
        ids = {v: p for v, p in enumerate(ints(arena.v2p(n))) if v > 0 and p >= 0}
        out[n] = (ids, set(ints(arena.reserved(n))))
    return out


def plan_moves(S, demand):
    """Whether the planner's decision for ``demand`` moves a page: a float
    it repacks whose pages (bound and reserved, from the public tables)
    are not all inside their new place already."""
    plan = S.plan(demand)
    if not plan.feasible:
        return False
    for f, repacked, start in zip(S.chain[1:-1], plan.moves, plan.starts):
        pages = [p for p, v in enumerate(ints(S.p2v(f))) if p > 0 and v >= 0] + ints(S.reserved(f))
        if repacked and any(not start <= p < start + len(pages) for p in pages):
            return True
    return False


def both_short(S, f, demand):
    """Would the spec's open_short_side refuse ``f`` because both sides are short?"""
    b = S.bands[f]
    if not b.opaque or not any(demand.values()):
        return False
    if any(d > S.bands[n].index_room for n, d in demand.items()):
        return False

    def need(end):
        e = S.bands[end]
        return max(0, demand.get(end, 0) - len(e.holes)) * e.geom.epp

    low, high = b.frontiers
    return need(S.chain[0]) > low - S.below(f) and need(S.chain[-1]) > S.above(f) - high


# -------------------------------------------------------------- machine


class DiffMachine(RuleBasedStateMachine):
    device = "cpu"
    # Whether the machine starts holds (docs/design.md §13).  The tests, ``kvarena fuzz`` and
    # HypoFuzz run it with (their traces record the host-transfer calls, ``fuzz.ARENA_RECORDED``);
    # ``machine_for``'s default is without: the machine as it drew before holds existed (the
    # examples replayed rule by rule in tests/verification/test_fault_in_flight.py were drawn so).
    # Refusals and bad input, which change nothing, run either way.
    host_transfers = False

    @initialize(geo=geometries(), policy=st.sampled_from(spec.POLICIES))
    def boot(self, geo, policy):
        total, pools, lazy, borrow = geo
        S = spec.Arena(total, pools, lazy=lazy, borrow=borrow, policy=policy)
        self.I = impl.Arena(total, pools, lazy=lazy, borrow=borrow, device=self.device, policy=policy)
        self.kernels = kernel_draws(self.device, geo, policy)
        self.policy = policy
        assert S.chain == self.I.chain
        self.gen = 0
        self.expected = {n: {} for n in S.chain}  # live id -> generation of its bytes
        self.recent = {n: [] for n in S.chain}  # each pool's last allocation: a forward's batch
        events = {"urgent": "urgent settle", "reused": "pending page reused after settle"}
        index = {n: i for i, n in enumerate(S.chain)}
        self.flight = Flight(S, self.I, self.expected, index, pattern, self.next_gen, note, events)
        self.S = S  # after the hooks: a traced machine records what it is handed here
        self.floats = self.S.chain[1:-1]
        self.lender = dict(borrow or {})  # borrower -> lender
        # Host transfers (docs/design.md §13): the machine's own model of the hold, by gate source.
        self.gates: set[str] = set()
        self.transfers = 0  # transfers started: whose turn it is to close the gate
        self.loads = {n: [] for n in S.chain}  # reserved pages in order: (page, owner id, generation)
        self.eager = [n for n in S.chain if S.pool(n).grow != "float" and not S.is_lazy(n)]
        self.holds = self.host_transfers and not self.eager
        self.placed = None  # both twins' placements after a step that left moves held
        self.freed_now = {n: set() for n in S.chain}  # ids the step freed: they may come back elsewhere
        self.released_now = {n: set() for n in S.chain}  # reserved pages the step bound or cancelled

    # ---------------------------------------------------------- helpers

    def live_ids(self, name):
        return [v for v, p in enumerate(self.S.bands[name].v2p) if v > 0 and p >= 0]

    def freeable(self, name, arena=None):
        """Live ids of ``name`` that no borrower still holds, read from
        ``arena``'s own tables (the spec's by default)."""

        def live(n):
            v2p = (arena or self.S).v2p(n)
            v2p = v2p.tolist() if isinstance(v2p, torch.Tensor) else v2p
            return [v for v, p in enumerate(v2p) if v > 0 and p >= 0]

        held = {v for b, ln in self.lender.items() if ln == name for v in live(b)}
        return [v for v in live(name) if v not in held]

    def bindable(self, name):
        """Ids ``alloc(name, ids=...)`` accepts: the lender's live ids not yet
        bound here (a borrower), or the pool's own free ids."""
        if name in self.lender:
            mine = set(self.live_ids(name))
            return [v for v in self.live_ids(self.lender[name]) if v not in mine]
        return list(self.S.bands[name].free_ids)

    def pick(self, data, floats_first=True):
        """A pool, floats half the time: they need live pages to slide."""
        if floats_first and self.floats and data.draw(st.booleans()):
            return data.draw(st.sampled_from(self.floats))
        return data.draw(st.sampled_from(self.S.chain))

    def next_gen(self):
        self.gen += 1
        return self.gen

    def stamp(self, name, ids):
        """Give fresh pages a new byte pattern, written through the impl."""
        if not ids:
            return
        self.flight.born(name, ids)
        self.flight.handed_out(name, self.S.translate(name, ids))
        self.recent[name] = list(ids)
        self.gen += 1
        for v in ids:
            self.expected[name][v] = self.gen
        epp = self.S.geometry(name).epp
        data = pattern(self.S.chain.index(name), ids, [self.gen] * len(ids), epp)
        self.I.write_pages(name, ids, data)

    def forget(self, name, ids):
        for v in ids:
            del self.expected[name][v]
        self.freed_now[name].update(ids)

    def next_kernels(self):
        """Put the implementation's device work, before each of its
        allocations and frees, on kernels drawn for the call (torch's
        operations or Triton's fused launches where they run here;
        ``kernel_draws``, docs/design.md §14)."""
        choice = self.kernels()
        self.I.kernels = choice
        note(f"kernels {choice}")

    def free_both(self, name, ids, check=True, as_tensor=False):
        self.next_kernels()
        self.S.free(name, ids)
        arg = torch.tensor(ids, dtype=torch.int64, device=self.I.device) if as_tensor else ids
        self.I.free(name, arg, check=check)
        assert self.S.in_flight == self.I.in_flight, "one twin settled, the other did not"
        self.forget(name, ids)

    def alloc_both(self, name, n, data=None):
        """``alloc`` on both arenas; a borrower binds lender ids drawn from ``data``."""
        ids = None
        if name in self.lender:  # at most as many pages as the lender has ids to lend
            pool = self.bindable(name)
            n = min(n, len(pool))
            ids = data.draw(st.permutations(pool))[:n] if data is not None else pool[:n]
        r_spec = self.S.alloc(name, n, ids=ids)
        self.next_kernels()
        r_impl = self.I.alloc(name, n, ids=ids)
        assert (r_spec is None) == (r_impl is None), (name, n, r_spec, r_impl)
        assert self.S.in_flight == self.I.in_flight, "one twin settled, the other did not"
        if r_spec is not None:
            assert isinstance(r_impl, torch.Tensor) and r_impl.dtype == torch.int64
            assert r_spec == r_impl.tolist()
            self.stamp(name, r_spec)
            if r_spec and name in self.lender:
                note("borrowed bind")
        return n, r_spec

    # ------------------------------------------------------------ rules

    @rule(data=st.data())
    def populate(self, data):
        """Allocate a share of every pool's available pages, floats first."""
        for name in (*self.floats, self.S.chain[0], self.S.chain[-1]):
            avail = self.S.available_pages(name)
            self.alloc_both(name, data.draw(st.integers(0, max(0, avail // 2))), data)

    @rule(data=st.data())
    def alloc(self, data):
        name = self.pick(data)
        avail = self.S.available_pages(name)
        mode = data.draw(st.sampled_from(["exact", "over", "small", "small", "zero"]))
        n = {"exact": avail, "over": avail + 1, "zero": 0}.get(mode)
        if n is None:
            n = data.draw(st.integers(1, max(1, min(avail, 8))))
        n, got = self.alloc_both(name, n, data)
        if got is None:
            if n > 0:
                note("exhaustion")
        elif mode == "exact" and n == avail and n > 0:
            note("exact fit")

    @rule(data=st.data())
    def alloc_bad_count(self, data):
        name = data.draw(st.sampled_from(self.S.chain))
        for a in (self.S, self.I):
            with raises_value_error(name):
                a.alloc(name, -1)

    @rule(data=st.data())
    def alloc_borrowed(self, data):
        """Bind chosen ids: a borrower's from its lender, any pool's from its
        own queue; the impl sometimes on its sync-free path (``check=False``)."""
        name = data.draw(st.sampled_from(self.S.chain))
        pool = self.bindable(name)
        cap = min(self.S.available_pages(name), len(pool), 6)
        ids = data.draw(st.lists(st.sampled_from(pool), unique=True, max_size=cap)) if cap else []
        as_tensor = data.draw(st.booleans())
        check = data.draw(st.booleans()) if as_tensor else True
        r_spec = self.S.alloc(name, len(ids), ids=ids)
        self.next_kernels()
        arg = torch.tensor(ids, dtype=torch.int64, device=self.I.device) if as_tensor else ids
        r_impl = self.I.alloc(name, len(ids), ids=arg, check=check)
        assert r_spec == ids and r_impl.tolist() == ids
        if ids and name in self.lender:
            note("borrowed bind")
        self.stamp(name, ids)

    @rule(data=st.data())
    def alloc_borrowed_bad(self, data):
        """A borrower refuses ids its lender does not hold, ids it already
        holds, and a call without ids; nothing changes."""
        if not self.lender:
            return
        name = data.draw(st.sampled_from(sorted(self.lender)))
        lender = self.S.bands[self.lender[name]]
        bad = [None]
        if lender.free_ids:
            bad.append([lender.free_ids[0]])
        if self.live_ids(name):
            bad.append([self.live_ids(name)[0]])
        ids = data.draw(st.sampled_from(bad))
        before = self.I.snapshot()
        for a in (self.S, self.I):
            with raises_value_error(name):
                a.alloc(name, 1, ids=ids)
        assert self.I.snapshot() == before

    @rule(data=st.data())
    def free(self, data):
        name = self.pick(data)
        live = self.freeable(name)
        if data.draw(st.booleans()) or not live:
            ids = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=8)) if live else []
        else:
            ids = data.draw(st.permutations(live))[: data.draw(st.integers(1, len(live)))]
        self.free_both(name, ids, check=data.draw(st.booleans()), as_tensor=data.draw(st.booleans()))

    @rule(data=st.data())
    def free_bad(self, data):
        lenders = sorted(set(self.lender.values()))
        pools = lenders if lenders and data.draw(st.booleans()) else self.S.chain
        name = data.draw(st.sampled_from(pools))
        g = self.S.geometry(name)
        live = self.live_ids(name)
        unbound = self.S.bands[name].free_ids
        bad = [[0], [-1], [len(self.S.bands[name].v2p)]]
        if unbound:
            bad.append([unbound[0]])
        if live:
            bad.append([live[0], live[0]])
            if unbound:
                bad.append([live[0], unbound[-1]])
        held = sorted(set(live) - set(self.freeable(name)))
        if held and data.draw(st.booleans()):
            ids = [held[0]]  # still bound in a borrower
            note("lender free refused")
        else:
            ids = data.draw(st.sampled_from(bad))
        before = self.I.snapshot()
        for a in (self.S, self.I):
            with raises_value_error(name):
                a.free(name, ids)
        assert self.I.snapshot() == before
        assert g.num_pages == self.I.geometry(name).num_pages

    @rule(data=st.data())
    def flush(self, data):
        name = data.draw(st.sampled_from(self.S.chain))
        lazy = [n for n in self.S.chain if self.S.is_lazy(n)]
        if lazy and data.draw(st.booleans()):
            name = data.draw(st.sampled_from(lazy))
        cap = data.draw(st.one_of(st.none(), st.integers(0, 4)))
        if not data.draw(st.booleans()):  # non-urgent: compaction between steps
            self.flush_later(name, cap)
            return
        moved = self.S.flush(name, cap)
        assert self.I.flush(name, cap) == moved
        self.held_moves(moved, "hold: flush")
        if cap and moved == cap and self.S.is_lazy(name):
            note("lazy flush capped")

    @rule(data=st.data())
    def lazy_backlog_flush(self, data):
        """Punch holes behind a lazy END's frontier, then flush with a cap."""
        lazy = [n for n in self.S.chain if self.S.is_lazy(n)]
        if not lazy:
            return
        name = data.draw(st.sampled_from(lazy))
        b = self.S.bands[name]
        live = sorted(b.occupied_pages(), reverse=(b.grow == "up"))  # frontier page first
        free = set(self.freeable(name))
        if len(live) >= 2:
            inner = [b.p2v[p] for p in live[1:] if b.p2v[p] in free]
            if inner:
                ids = data.draw(st.lists(st.sampled_from(inner), unique=True, min_size=1, max_size=6))
                self.free_both(name, ids, check=data.draw(st.booleans()))
        cap = data.draw(st.integers(1, 4))
        moved = self.S.flush(name, cap)
        assert self.I.flush(name, cap) == moved
        self.held_moves(moved, "hold: flush")
        if moved == cap:
            note("lazy flush capped")

    # ----------------------------------------------- in-flight forwards

    def draw_writes(self, data, focus=None):
        """A forward's write set: for each pool drawn (``focus`` always), its
        last allocation (a decode's batch), some live ids, or None (every
        page), with padding (-1, the sink) now and then."""
        writes, ids_of = {}, {}
        for name in self.S.chain:
            live = self.live_ids(name)
            modes = ["recent", "recent", "some", "all"] + ([] if name == focus else ["skip"])
            mode = data.draw(st.sampled_from(modes))
            if mode == "skip":
                continue
            if mode == "all":
                writes[name], ids_of[name] = None, live
                continue
            if mode == "recent":
                ids = [v for v in self.recent[name] if v in set(live)]
            else:
                ids = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=6)) if live else []
            pad = data.draw(st.sampled_from([[], [], [-1], [0, -1]]))
            writes[name], ids_of[name] = ids + pad, ids
        return writes, ids_of

    def launch_both(self, data, focus=None):
        """Launch one forward on both twins (its writes as a list or a tensor)."""
        writes, ids_of = self.draw_writes(data, focus)
        if data.draw(st.booleans()):
            dev = self.I.device
            writes = {n: v if v is None else torch.tensor(v, dtype=torch.int64, device=dev) for n, v in writes.items()}
        note("launch while in flight" if self.S.in_flight else "launch")
        if self.held():
            note("hold: forward in flight")
        before = {n: set(self.S.pinned(n)) for n in self.S.chain}
        self.S.launch(writes)
        self.I.launch(writes)
        self.flight.launch(ids_of)
        for n in self.S.chain:  # an oracle of the pins: those before, and the launch pages of what it writes
            want = before[n] | set(self.S.translate(n, ids_of.get(n, [])))
            assert set(self.S.pinned(n)) == want, (n, sorted(want), self.S.pinned(n))

    @rule(data=st.data())
    def launch(self, data):
        """A forward launched: it writes its batch late and reads every live
        page.  Now and then the launch is bad input instead (``launch_bad``)."""
        if data.draw(st.integers(0, 4)) == 0:
            self.launch_bad(data)
        else:
            self.launch_both(data)

    def launch_bad(self, data):
        """A launch naming an unknown pool, an id not allocated there, one out
        of range or not an int is a ``ValueError`` naming the pool in both
        twins, and changes nothing."""
        name = data.draw(st.sampled_from(self.S.chain))
        b = self.S.bands[name]
        bad = [[len(b.v2p)], [-2], ["x"]]
        unbound = [v for v in range(1, len(b.v2p)) if b.v2p[v] < 0]
        if unbound:
            bad.append([unbound[0]])
        ids = data.draw(st.sampled_from(bad))
        if data.draw(st.integers(0, 3)) == 0:
            name, ids = "nowhere", []
        before = (self.S.snapshot(), self.I.snapshot())
        for a in (self.S, self.I):
            with raises_value_error(name):
                a.launch({name: ids})
        assert (self.S.snapshot(), self.I.snapshot()) == before
        note("launch refused")

    @rule()
    def settle(self):
        """The forward's done event fired, or the scheduler waits for it."""
        if self.S.in_flight:
            note("settle")
        self.flight.settle(self.S, self.I)

    def flush_later(self, name, cap):
        """A non-urgent flush on both twins (``urgent=False``): it never
        settles, and while a forward is in flight a lazy END moves what a
        walk from the frontier to the first pinned survivor reaches (``walk``)."""
        flying = self.S.in_flight
        held_cap = 0 if self.held() else cap  # a held flush only absorbs
        want, stopped = walk(self.S, name, held_cap) if flying and self.S.is_lazy(name) else (None, False)
        moved = self.S.flush(name, cap, urgent=False)
        assert self.I.flush(name, cap, urgent=False) == moved
        assert self.S.in_flight == self.I.in_flight == flying, "a non-urgent flush settled"
        self.held_moves(moved, "hold: flush")
        if want is not None:
            assert moved == want, (name, cap, moved, want)
            if stopped:
                note("non-urgent walk stopped by a pin")
            if moved:
                note("non-urgent moves in flight")
        return moved

    @rule(data=st.data())
    def overlap(self, data):
        """One step of an overlapped scheduler on a pool (a lazy END when
        there is one): allocate a batch, launch its forward, and prepare the
        next batch while it runs: finish requests (frees), compact between
        steps (a non-urgent flush), allocate for the next batch (which may
        need what the forward holds, and settle), and sometimes wait."""
        lazy = [n for n in self.S.chain if self.S.is_lazy(n)]
        name = data.draw(st.sampled_from(lazy or self.S.chain))
        self.alloc_both(name, data.draw(st.integers(1, max(1, min(4, self.S.available_pages(name))))), data)
        self.launch_both(data, focus=name)
        live = self.freeable(name)
        if live:
            ids = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=6))
            self.free_both(name, ids, check=data.draw(st.booleans()))
        self.flush_later(name, data.draw(st.one_of(st.none(), st.integers(1, 4))))
        for _ in range(data.draw(st.integers(1, 2))):  # the next batch: a few pages, or every hole and more
            if data.draw(st.booleans()):
                self.flight.settle(self.S, self.I)
            holes = len(self.S.holes(name))
            n, got = self.alloc_both(name, data.draw(st.sampled_from([1, holes, holes + 1, holes + 3])), data)
            if got is None and n > 0:  # short: the ladder, with an evictor, then the batch
                ok, _ = self.relieve_both(name, n, self.draw_script(data))
                if ok is True:
                    assert self.alloc_both(name, n, data)[1] is not None

    # ------------------------------------------------- host transfers

    def held(self):
        """Whether moves are held, by the machine's own model (docs/design.md §13)."""
        return bool(self.gates) or any(self.loads.values())

    def held_moves(self, moved, case):
        """A moving call returned ``moved``: while moves are held it must be 0.
        Whether they are held."""
        if not self.held():
            return False
        assert moved == 0, f"{moved} pages moved while moves were held"
        note(case)
        return True

    def owners_for(self, name, n):
        """Up to ``n`` ids that will own a load's pages once it lands: free
        ids from the back of the pool's FIFO (a borrower: ids its lender
        lends), none another load has taken.  An allocation may still take
        one before the bind: that load is then cancelled."""
        taken = {v for _, v, _ in self.loads[name]}
        pool = [v for v in self.bindable(name) if v not in taken]
        return pool[max(0, len(pool) - n) :]

    def bindable_loads(self, name):
        """The pool's loads whose owner is still free to bind."""
        free = set(self.bindable(name))
        return [load for load in self.loads[name] if load[1] in free]

    def record_load(self, name, pages, owners):
        """A load was queued on reserved ``pages``: the bytes of the ids that
        will own them land there now, written by physical page (no id owns
        them yet)."""
        if not pages:
            return
        assert len(owners) >= len(pages), (name, pages, owners)
        owners = owners[: len(pages)]
        self.flight.handed_out(name, pages)
        gen = self.next_gen()
        self.loads[name] += [(p, v, gen) for p, v in zip(pages, owners)]
        data = pattern(self.S.chain.index(name), owners, [gen] * len(pages), self.S.geometry(name).epp)
        rows = torch.tensor(pages, dtype=torch.int64, device=self.I.device)
        self.I.page_view(name).index_copy_(0, rows, data.to(self.I.device))
        note("hold: reserved")

    def loaded(self, name, loads):
        """``loads`` of ``name`` were bound to their owners: from now on the
        owners' bytes are the loads'."""
        ids = [v for _, v, _ in loads]
        self.flight.born(name, ids)
        self.recent[name] = ids
        for _, v, gen in loads:
            self.expected[name][v] = gen
        self.drop_loads(name, loads)
        note("hold: bound")

    def drop_loads(self, name, loads):
        gone = {p for p, _, _ in loads}
        self.loads[name] = [load for load in self.loads[name] if load[0] not in gone]
        self.released_now[name] |= gone
        self.hold_may_end()

    def hold_may_end(self):
        """Moves may run again once the hold ends, in the middle of a step:
        check what the hold kept up to here (``kept_since``), then stop."""
        if not self.held() and self.placed is not None:
            self.kept_since(self.placed)
            self.placed = None

    def reserve_both(self, name, n):
        """``reserve`` on both twins, then the load's bytes; the pages, or None."""
        owners = self.owners_for(name, n)
        if name in self.lender:  # a borrower's load binds ids its lender lends
            n = min(n, len(owners))
        r_spec = self.S.reserve(name, n)
        r_impl = self.I.reserve(name, n)
        assert (r_spec is None) == (r_impl is None), (name, n, r_spec, r_impl)
        assert self.S.in_flight == self.I.in_flight, "one twin settled, the other did not"
        if r_spec is None:
            note("hold: reservation short")
            return None
        assert isinstance(r_impl, torch.Tensor) and r_impl.dtype == torch.int64
        assert r_impl.tolist() == r_spec, (name, r_spec, r_impl)
        self.record_load(name, r_spec, owners)
        return r_spec

    def bind_both(self, name, loads, as_tensor=False):
        ids, pages = [v for _, v, _ in loads], [p for p, _, _ in loads]
        self.S.bind_reserved(name, ids, pages)
        if as_tensor:
            dev = self.I.device
            self.I.bind_reserved(name, torch.tensor(ids, device=dev), torch.tensor(pages, device=dev))
        else:
            self.I.bind_reserved(name, ids, pages)
        self.loaded(name, loads)

    def cancel_both(self, name, loads):
        pages = [p for p, _, _ in loads]
        self.S.cancel(name, pages)
        self.I.cancel(name, pages)
        assert self.S.in_flight == self.I.in_flight, "one twin settled, the other did not"
        self.drop_loads(name, loads)
        note("hold: cancelled")

    def refused(self, name, call):
        """``call(arena)`` is a ``ValueError`` naming ``name`` in both twins,
        with the same words, and changes nothing."""
        before = (self.S.snapshot(), self.I.snapshot())
        words = []
        for a in (self.S, self.I):
            with raises_value_error(name):
                try:
                    call(a)
                except ValueError as e:
                    words.append(str(e))
                    raise
        assert words[0] == words[1], words
        assert (self.S.snapshot(), self.I.snapshot()) == before

    @rule(data=st.data())
    def host_transfer(self, data):
        """Host transfers (HiCache, docs/design.md §13), one rule so that
        holds start and end about as often: with moves held, mostly the
        transfers end (``transfer_ends``), else one starts
        (``transfer_starts``); now and then bad input instead
        (``transfer_bad``).  An arena with an eager END refuses to hold."""
        if data.draw(st.integers(0, 4)) == 0:
            self.transfer_bad(data)
        elif self.held() and data.draw(st.integers(0, 3)):
            self.transfer_ends(data)
        else:
            self.transfer_starts(data)

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def hicache(self, data):
        """A HiCache load-back while the scheduler runs (docs/design.md §13),
        so that every kind of step runs under a hold in every run: a
        transfer starts (the gate, loads or both), the scheduler goes on
        for a few steps (relief, flushes, plans and slides, allocations,
        frees, forwards), none of which may move a page placed when it
        started (``kept_since``, after each), then the transfer ends, or
        runs on into the next steps."""
        self.transfer_starts(data)
        if not self.held():  # a load found no page
            return
        ops = {  # drawn by name, so that an explicit example (``EXAMPLES``) can give one
            "relieve": self.relieve,
            "flush": self.flush,
            "plan_that_moves": self.plan_that_moves,
            "faulted (hold)": lambda data: self.faulted(data, hold=True),
            "plan_floats": self.plan_floats,
            "alloc": self.alloc,
            "free": self.free,
            "launch": self.launch,
            "faulted": self.faulted,
            "lazy_backlog_flush": self.lazy_backlog_flush,
            "populate": self.populate,
            "settle": lambda data: self.settle(),
            "transfer_ends": lambda data: self.transfer_ends(data),
        }
        if self.floats:
            ops.update(make_room=self.make_room, compact_holes=self.compact_holes, open_short_side=self.open_short_side)
        before = self.kept_since(None)
        for _ in range(data.draw(st.integers(1, 3))):
            ops[data.draw(st.sampled_from(list(ops)))](data)
            self.kept_since(before)
            if not self.held():  # an op ended the transfer: moves are free again
                break
        if data.draw(st.integers(0, 3)):
            self.transfer_ends(data, everything=True)

    def plan_that_moves(self, data):
        """The planner's rung for the first demand (one pool, some pages
        past what it has) that it would meet by moving a page: while moves
        are held it must do nothing at all.  A float with no page gets a
        few first (allocation runs under a hold), so that there is one to move."""
        S = self.S
        empty = [f for f in self.floats if not S.live_pages(f) and S.available_pages(f)]
        if empty and len(empty) == len(self.floats):
            f = data.draw(st.sampled_from(empty))
            self.alloc_both(f, data.draw(st.integers(1, min(4, S.available_pages(f)))), data)
        for n in S.chain:
            for k in (1, 2, 4, 8, 16):
                demand = {n: S.available_pages(n) + k}
                if plan_moves(S, demand):
                    moved = S.plan_floats(demand)
                    assert self.I.plan_floats(demand) == moved
                    if self.held_moves(moved, "hold: slide or plan"):
                        note("hold: a plan that moves refused")
                    return

    def transfer_starts(self, data):
        """A transfer starts: a source (HiCache's host transfers, PD's KV
        transfers) closes the gate, or a load reserves pages in a pool (and
        its bytes land there), or both."""
        close = data.draw(st.sampled_from(["both", "load", "gate"]))
        # the sources take turns, drawing nothing: a draw here reshapes the seeded runs' programs
        source = spec.GATES[self.transfers % len(spec.GATES)]
        self.transfers += 1
        name = self.pick(data)
        if self.eager:
            if close == "load":
                self.refused(self.eager[0], lambda a: a.reserve(name, 1))
            else:
                self.refused(self.eager[0], lambda a: a.close_gate(source))
            note("hold: refused (eager END)")
            return
        if not self.holds:  # host_transfers off, or an eager END
            return
        if close != "load":
            self.S.close_gate(source)
            self.I.close_gate(source)
            self.gates.add(source)
            note(f"hold: gate closed by {source}")
            if len(self.gates) > 1:
                note("hold: gate closed by both sources")
        if close != "gate":
            avail = self.S.available_pages(name)
            mode = data.draw(st.sampled_from(["small", "small", "exact", "over", "zero"]))
            n = {"exact": avail, "over": avail + 1, "zero": 0}.get(mode)
            if n is None:
                n = data.draw(st.integers(1, max(1, min(avail, 6))))
            self.reserve_both(name, n)

    def transfer_ends(self, data, everything=None):
        """Loads land and are bound to their owners, or are cancelled (a
        load-back rolled back, or one whose owner an allocation took since),
        and the transfers end: the gate opens.  Some of it, or all of it."""
        if everything is None:
            everything = data.draw(st.booleans())
        for name in self.S.chain:
            loads = self.loads[name]
            if not loads:
                continue
            bindable = self.bindable_loads(name)
            if data.draw(st.integers(0, 3)) == 0:  # rolled back: every load of the pool is cancelled
                bind = []
            elif everything:
                bind = data.draw(st.permutations(bindable))
            else:
                bind = data.draw(st.lists(st.sampled_from(bindable), unique=True, max_size=4)) if bindable else []
            if bind:
                self.bind_both(name, bind, as_tensor=data.draw(st.booleans()))
            rest = self.loads[name]
            orphans = [load for load in rest if load not in bindable]
            if orphans:
                note("hold: load orphaned")
            if everything or not rest:
                cancel = rest
            else:  # the orphans, and a few more a rollback gives up
                cancel = list(dict.fromkeys(orphans + data.draw(st.lists(st.sampled_from(rest), max_size=2))))
            if cancel:
                self.cancel_both(name, cancel)
        for source in sorted(self.gates):
            if everything or data.draw(st.booleans()):
                self.S.open_gate(source)
                self.I.open_gate(source)
                self.gates.discard(source)
                note("hold: gate opened" if not self.gates else "hold: one source opened, the other holds")
        self.hold_may_end()

    def transfer_bad(self, data):
        """Bad input to the host-transfer calls is a ``ValueError`` naming
        the pool in both twins, in the same words, and changes nothing: a
        bad count, a page not reserved, repeated or not an int, a bad id,
        not one id per page, an unknown pool."""
        name = data.draw(st.sampled_from(self.S.chain))
        b = self.S.bands[name]
        loads = self.loads[name]
        stray = next((p for p in range(b.geom.num_pages) if p not in {q for q, _, _ in loads}), 0)
        owners = [v for v in self.bindable(name) if v not in {v for _, v, _ in loads}]
        cases = {  # by name, so that an explicit example (``EXAMPLES``) can give one
            "reserve: a negative count": (name, lambda a: a.reserve(name, -1)),
            "reserve: a count not an int": (name, lambda a: a.reserve(name, "x")),
            "reserve: an unknown pool": ("nowhere", lambda a: a.reserve("nowhere", 1)),
            "cancel: a page not reserved": (name, lambda a: a.cancel(name, [stray])),
            "cancel: a page not an int": (name, lambda a: a.cancel(name, ["x"])),
            "bind: a page not reserved": (name, lambda a: a.bind_reserved(name, [1], [stray])),
            "bind: an unknown pool": ("nowhere", lambda a: a.bind_reserved("nowhere", [1], [1])),
        }
        if loads:
            page = loads[0][0]
            cases["cancel: a page twice"] = (name, lambda a: a.cancel(name, [page, page]))
            cases["bind: the sink"] = (name, lambda a: a.bind_reserved(name, [0], [page]))
            cases["bind: an id out of range"] = (name, lambda a: a.bind_reserved(name, [len(b.v2p)], [page]))
            cases["bind: not one id per page"] = (name, lambda a: a.bind_reserved(name, [1, 2], [page]))
            live = self.live_ids(name)
            if live:
                cases["bind: an allocated id"] = (name, lambda a: a.bind_reserved(name, [live[0]], [page]))
            if len(owners) >= 2:
                cases["bind: two ids on one page"] = (name, lambda a: a.bind_reserved(name, owners[:2], [page, page]))
        pool, call = cases[data.draw(st.sampled_from(list(cases)))]
        self.refused(pool, call)
        note("hold: bad input")

    @precondition(lambda self: self.floats)
    @rule(data=st.data())
    def make_room(self, data):
        S = self.S
        f = data.draw(st.sampled_from(self.floats))
        side = data.draw(st.sampled_from(["low", "high"]))
        if not S.bands[f].live and S.available_pages(f) and data.draw(st.booleans()):
            self.alloc_both(f, data.draw(st.integers(1, min(4, S.available_pages(f)))), data)
        b, epp = S.bands[f], S.geometry(f).epp
        below, above = S.below(f), S.above(f)
        lo, hi = S.region(f)
        band_side = b.frontiers[0] - below if side == "low" else above - b.frontiers[1]
        reach = (hi - b.live) * epp - below if side == "low" else above - (lo + b.live) * epp
        if band_side < reach and data.draw(st.booleans()):
            min_bytes = data.draw(st.integers(max(0, band_side + 1), max(0, reach)))
        else:
            min_bytes = data.draw(st.integers(0, max(0, reach) + epp))
        moved = S.make_room(f, side, min_bytes)
        self.next_kernels()  # a slide on Triton's path plans on the device (docs/design.md §14)
        assert self.I.make_room(f, side, min_bytes) == moved
        self.held_moves(moved, "hold: slide or plan")
        if moved:
            note(f"slide {side}")
            if b.live and -(-(min_bytes - band_side) // epp) >= b.live:
                note("leapfrog")

    @precondition(lambda self: self.floats)
    @rule(data=st.data())
    def compact_holes(self, data):
        f = data.draw(st.sampled_from(self.floats))
        side = data.draw(st.sampled_from(["low", "high"]))
        moved = self.S.compact_holes(f, side)
        assert self.I.compact_holes(f, side) == moved
        self.held_moves(moved, "hold: slide or plan")

    @precondition(lambda self: self.floats)
    @rule(data=st.data())
    def open_short_side(self, data):
        S = self.S
        f = data.draw(st.sampled_from(self.floats))
        demand = {}
        ends = [S.chain[0], S.chain[-1]] if data.draw(st.booleans()) else []
        for n in ends + data.draw(st.lists(st.sampled_from(S.chain), unique=True, min_size=1)):
            demand[n] = max(0, S.available_pages(n) + data.draw(st.integers(-3, 8)))
        short = both_short(S, f, demand)
        before = self.I.snapshot()
        moved = S.open_short_side(f, demand)
        assert self.I.open_short_side(f, demand) == moved
        self.held_moves(moved, "hold: slide or plan")
        if short:
            assert moved == 0 and self.I.snapshot() == before
            note("refusal both short")

    @rule(data=st.data())
    def plan_floats(self, data):
        """The planner's rung alone, on either policy's arena, for a demand
        vector near what fits now; a feasible plan must meet it.  While
        moves are held, often one it would meet by moving (``plan_that_moves``)."""
        S = self.S
        if self.held() and data.draw(st.booleans()):
            self.plan_that_moves(data)
            return
        demand = {
            n: max(0, S.available_pages(n) + data.draw(st.integers(-2, 6)))
            for n in data.draw(st.lists(st.sampled_from(S.chain), unique=True, min_size=1, max_size=3))
        }
        feasible = S.plan(demand).feasible
        moves = self.held() and plan_moves(S, demand)
        moved = S.plan_floats(demand)
        assert self.I.plan_floats(demand) == moved
        if self.held_moves(moved, "hold: slide or plan"):
            if moves:
                note("hold: a plan that moves refused")
            return  # a plan that would move a page does nothing: the demand may stay unmet
        if feasible:
            assert all(S.available_pages(n) >= d for n, d in demand.items())
            note("plan moved pages" if moved else "plan fits in place")
        else:
            assert moved == 0
            note("plan infeasible")

    @rule(data=st.data())
    def faulted(self, data, hold=False):
        """A changing call on the implementation with its ``k``-th torch
        operation failing (``impl/journal.py``).  If the fault comes out, the
        spec does not make the call and every comparison must still hold:
        the call left nothing behind.  Else both make it.  ``hold``: a
        host-transfer call only (docs/design.md §13)."""
        S = self.S
        name = self.pick(data)
        kinds = [] if hold else ["flush", "relieve", "plan_floats", "free"]
        if name not in self.lender and not hold:
            kinds.append("alloc")
        if name in self.floats and not hold:
            kinds += ["make_room", "compact_holes"]
        if self.holds:  # host transfers (docs/design.md §13)
            kinds += ["reserve"] + (["cancel", "bind_reserved"] if self.loads[name] else [])
        if not kinds:
            return
        kind = data.draw(st.sampled_from(kinds))
        loads, owners = [], []
        if kind == "alloc":
            args: tuple[Any, ...] = (name, data.draw(st.integers(0, max(0, min(6, S.available_pages(name))))))
        elif kind == "free":
            live = self.freeable(name)
            args = (name, data.draw(st.lists(st.sampled_from(live), unique=True, max_size=6)) if live else [])
        elif kind == "relieve":
            args = (name, S.available_pages(name) + data.draw(st.integers(0, 6)))
        elif kind == "plan_floats":
            args = ({name: S.available_pages(name) + data.draw(st.integers(0, 6))},)
        elif kind == "make_room":
            side = data.draw(st.sampled_from(["low", "high"]))
            args = (name, side, S.gap_bytes(name) + data.draw(st.integers(1, 3)) * S.geometry(name).epp)
        elif kind == "compact_holes":
            args = (name, data.draw(st.sampled_from(["low", "high"])))
        elif kind == "reserve":
            n = data.draw(st.integers(0, max(0, min(6, S.available_pages(name)))))
            owners = self.owners_for(name, n)
            args = (name, min(n, len(owners)))
        elif kind == "cancel":
            loads = data.draw(st.lists(st.sampled_from(self.loads[name]), unique=True, min_size=1, max_size=4))
            args = (name, [p for p, _, _ in loads])
        elif kind == "bind_reserved":
            loads = self.bindable_loads(name)[: data.draw(st.integers(0, 4))]
            args = (name, [v for _, v, _ in loads], [p for p, _, _ in loads])
        else:
            args = (name,)
        # most calls make tens of operations; a host-transfer call, a few
        k = data.draw(st.integers(0, 5) if hold else st.one_of(st.integers(0, 30), st.integers(0, 400)))
        if S.in_flight:
            note("fault in flight")
        with self.flight.impl_only():
            raised, got = fault_at(k, lambda: getattr(self.I, kind)(*args))
        if raised:
            note("fault undone")
            record_fault(S, kind, k, self.I.kernels, *args)
            if kind in ("reserve", "cancel", "bind_reserved"):
                note("hold: fault undone")
            return
        note("fault past the call")
        want = getattr(S, kind)(*args)
        if kind in ("alloc", "reserve"):
            assert (want is None) == (got is None) and (want is None or want == got.tolist()), (kind, want, got)
            if kind == "alloc":
                self.stamp(name, want or [])
            else:
                self.record_load(name, want or [], owners)
        else:
            assert want == got, (kind, want, got)
        if kind == "free":
            self.forget(name, args[1])
        if kind == "cancel":
            self.drop_loads(name, loads)
        if kind == "bind_reserved" and loads:
            self.loaded(name, loads)

    def evictor(self, arena, log, script):
        """An ``evict`` callback of one of the kinds a scheduler writes.

        Each round takes ``(pool, count, kind)`` from ``script``: ``honest``
        frees ``count`` pages and says so; ``zero`` frees them and returns 0;
        ``more`` frees ``count`` plus the shortfall; ``liar`` frees nothing
        and returns a truthy count; ``raise`` frees them, then raises; ``no
        count`` frees them and returns -1 (a ``ValueError``, ``spec.evict``);
        ``nested`` frees them, then runs a ``relieve`` of its own, for one
        page more than the pool has.  The victims are the pool's lowest
        freeable ids, the same in both arenas.
        """
        rounds = iter(script)

        def evict(shortfall):
            pool, count, kind = next(rounds, (None, 0, "honest"))
            if pool is None:
                return 0
            if kind == "more":
                count += max(0, shortfall)
            ids = [] if kind == "liar" else self.freeable(pool, arena)[:count]
            arena.free(pool, ids)
            log.append((shortfall, pool, ids, kind))
            if kind == "raise":
                raise EvictorError(pool)
            if kind == "nested":
                arena.relieve(pool, arena.available_pages(pool) + 1)
            return {"honest": len(ids), "zero": 0, "more": len(ids), "liar": count + 1, "no count": -1}.get(
                kind, len(ids)
            )

        return evict

    def draw_script(self, data):
        """An evictor's rounds (``evictor``): pool, count, kind."""
        rounds = st.tuples(st.sampled_from(self.S.chain), st.integers(0, 4), st.sampled_from(EVICTORS))
        return data.draw(st.lists(rounds, max_size=5))

    def relieve_both(self, name, need, script):
        """``relieve`` on both arenas with the same evictor; the verdict each
        returns must be the gate read afresh (an oracle sharing no code)."""
        logs, results = {}, {}
        for key, arena in (("spec", self.S), ("impl", self.I)):
            log = logs.setdefault(key, [])
            evict = None if script is None else self.evictor(arena, log, script)
            try:
                results[key] = arena.relieve(name, need, evict)
            except EvictorError:
                results[key] = "raised"
            except ValueError as e:
                assert "evict must return the count it freed" in str(e), e
                results[key] = "refused"
        assert results["spec"] == results["impl"], (results, logs)
        assert logs["spec"] == logs["impl"], logs
        for _, pool, ids, kind in logs["spec"]:
            self.forget(pool, ids)
            if kind == "raise":
                note("evictor raised")
            if kind == "no count":
                note("evictor returned no count")
            if kind == "nested":
                note("evictor relieved a pool itself")
            if kind == "zero" and ids:
                note("evictor returned 0 but freed")
        if logs["spec"]:
            note("eviction round")
        ok = results["spec"]
        if ok not in ("raised", "refused"):
            assert ok == (need <= self.S.available_pages(name)) == (need <= self.I.available_pages(name))
        return ok, logs["spec"]

    @rule(data=st.data())
    def relieve(self, data):
        name = self.pick(data)
        need = self.S.available_pages(name) + data.draw(st.integers(0, 6))
        script = self.draw_script(data) if data.draw(st.booleans()) else None
        if self.held():
            note("hold: relieve")
        ok, _ = self.relieve_both(name, need, script)
        if ok is False and script is None:
            # the ladder did all it could: running it again must not find more
            again, _ = self.relieve_both(name, need, None)
            # Under the planner it always holds (the plan is complete); under
            # the anchor policy it holds with no float, and with one float for
            # an END's need, and breaks for a float's own need and on two
            # floats (tests/spec/test_relieve_second_run.py).
            if self.policy == "planner" or not self.floats or (len(self.floats) == 1 and name not in self.floats):
                assert again is False, "a second relieve found room the first did not"
            note("second relieve fits (anchor finding)" if again else f"relieve failed twice ({self.policy})")
            ok = again
        if ok is True:
            _, got = self.alloc_both(name, need, data)  # a borrower binds what its lender has
            assert got is not None

    # -------------------------------------------------------- invariant

    @invariant()
    def agree(self):
        if not hasattr(self, "S"):
            return
        with unchecked():  # reads only: the comparisons below are the oracle here
            self._agree()

    def _agree(self):
        S, Im = self.S, self.I
        for n in S.chain:
            sb, ib = S.bands[n], Im.bands[n]
            assert S.v2p(n) == Im.v2p(n).tolist(), n
            assert S.p2v(n) == Im.p2v(n).tolist(), n
            assert sb.free_ids == Im.free_ids(n).tolist(), n
            assert sb.holes == ib.holes.tolist(), n  # order too: reuse is oldest first
            assert S.holes(n) == Im.holes(n).tolist(), n
            assert S.frontiers(n) == Im.frontiers(n), n
            assert S.live_pages(n) == Im.live_pages(n), n
            assert (S.above(n), S.below(n)) == (Im.above(n), Im.below(n)), n
            for view in (
                "available_pages",
                "available_size",
                "schedulable_available_size",
                "conserved_available_size",
                "gap_bytes",
            ):
                assert getattr(S, view)(n) == getattr(Im, view)(n), (n, view)
            if n in self.floats:
                assert S.region(n) == Im.region(n), n
            for view in impl.arena.VIEWS:
                assert Im._view(view, n) == Im.fresh_view(view, n), (n, view)
        self.flight.check()
        for n in S.chain:  # the pages that wait for the forward
            assert S.pinned(n) == ints(Im.pinned(n)), (n, S.pinned(n), Im.pinned(n))
            assert S.pending(n) == ints(Im.pending(n)), (n, S.pending(n), Im.pending(n))
        S.verify()
        Im.verify()
        self._agree_on_holds()
        for n, live in self.expected.items():
            if not live:
                continue
            ids = sorted(live)
            want = pattern(S.chain.index(n), ids, [live[v] for v in ids], S.geometry(n).epp)
            assert torch.equal(Im.read_pages(n, ids).cpu(), want), n
            pages = Im.translate(n, torch.tensor(ids, device=Im.device))
            assert pages.tolist() == S.translate(n, ids)
            assert torch.equal(Im.page_view(n)[pages].cpu(), want), n

    def _agree_on_holds(self):
        """The hold (docs/design.md §13): both twins agree with the machine's
        model of it; every queued load's bytes are still on its reserved
        page; and after a step that began with moves held, no id that
        stayed bound changed its page and no reserved page was lost, in
        either twin (``placement``: the public tables, no arena code)."""
        S, Im = self.S, self.I
        held = self.held()
        assert set(S.closed_gates) == set(Im.closed_gates) == self.gates
        assert S.moves_held() == Im.moves_held() == held
        for n, loads in self.loads.items():
            pages = [p for p, _, _ in loads]
            assert S.reserved(n) == ints(Im.reserved(n)) == pages, (n, S.reserved(n), Im.reserved(n), pages)
            if loads:
                want = pattern(S.chain.index(n), [v for _, v, _ in loads], [g for _, _, g in loads], S.geometry(n).epp)
                got = Im.page_view(n)[torch.tensor(pages, device=Im.device)].cpu()
                assert torch.equal(got, want), f"pool {n!r}: a queued load's bytes left its reserved page"
        now = self.kept_since(self.placed)  # None: this step began with moves free
        self.placed = now if held else None
        for n in S.chain:
            self.freed_now[n].clear()
            self.released_now[n].clear()

    def kept_since(self, before):
        """Both twins' placements now (``placement``), checked against
        ``before`` (placements taken with moves held, or None): every id
        still bound that the machine did not free since is on its page,
        and every reserved page the machine did not bind or cancel since
        is still reserved.  An oracle on the public tables alone."""
        now = {"spec": placement(self.S), "impl": placement(self.I)}
        for twin, pools in (before or {}).items():
            for n, (ids, loads) in pools.items():
                ids_now, loads_now = now[twin][n]
                for v, p in ids.items():
                    if v not in self.freed_now[n]:
                        assert ids_now.get(v) == p, f"{twin}: pool {n!r}: id {v} left page {p} under a hold"
                lost = loads - self.released_now[n] - loads_now
                assert not lost, f"{twin}: pool {n!r}: reserved pages {sorted(lost)} lost under a hold"
        return now


def machine_for(device, host_transfers=False):
    """The machine on ``device``; ``host_transfers``: it starts holds too
    (``DiffMachine.host_transfers``); else the host-transfer rules are not
    drawn at all, so the other rules draw as they did before there were any."""
    attrs: dict[str, Any] = {"device": device, "host_transfers": host_transfers}
    if not host_transfers:
        attrs.update(host_transfer=None, hicache=None)
    return type(f"DiffMachine_{device}", (DiffMachine,), attrs)


def run_machine(device: str = "cpu", **overrides: Any) -> None:
    """Run the machine once, host transfers and all; raises on the first disagreement."""
    run_as_test(machine_for(device, host_transfers=True), profile(PROFILES), EXAMPLES, **overrides)


def fuzz_rows(label, run, cases, required, examples, steps):
    """Rows for ``kvarena verify``: a derandomized ``run`` on every device here.

    One row per device, with the case counts as the detail; a row fails on a
    disagreement or when a ``required`` case was never reached.
    """
    rows = []
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        cases.clear()
        t = time.perf_counter()
        try:
            run(
                device,
                max_examples=examples,
                stateful_step_count=steps,
                derandomize=True,
                phases=NO_SHRINK,
                database=None,
            )
            missing = [c for c in required if cases[c] == 0]
            ok = not missing
            detail = f"{examples} runs x {steps} steps; cases {dict(cases)}" + (
                f"; never reached: {missing}" if missing else ""
            )
        except Exception as e:  # the row reports the disagreement
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
        rows.append({"name": f"{label} on {device}", "ok": ok, "detail": detail, "seconds": time.perf_counter() - t})
    return rows


def run_differential(examples: int = 100, steps: int = 40) -> list[dict[str, Any]]:
    """``kvarena verify``'s arena fuzz rows (``fuzz_rows``)."""
    return fuzz_rows("differential impl vs spec", run_machine, CASES, REQUIRED, examples, steps)


# Explicit examples (issue 57): every event the tests require (``REQUIRED``, ``IN_FLIGHT``, ``HOLDS``
# and a call on each kernel choice) is reached by one of these, replayed (``replay``) before
# Hypothesis's own examples in every ``run_machine``, so a Hypothesis version that draws other
# examples from the same seed cannot miss it.  Each is a boot and its steps, (rule, its draws in
# order), cut down from seeded runs; the comment names the events only it reaches.  A rule whose
# draws change must have its steps here changed to match (``Script`` fails loudly until they are).
# fmt: off
EXAMPLES: list[tuple[dict[str, Any], list[tuple[str, list[Any] | None]]]] = [
    # borrowed bind, evictor raised, evictor relieved a pool itself, evictor returned no count, exact fit, exhaustion,
    # hold: reservation short, lender free refused, non-urgent walk stopped by a pin, plan infeasible
    ({"geo": (374, [SubPool("D", 11, 4, "down", "kv"), SubPool("U", 3, 4, "up", "kv")], True, {"D": "U"}),
        "policy": "anchor"}, [
        ("alloc_borrowed", ["U", [10, 30, 28, 23, 11, 21], False]),
        ("populate", [3, 0, [6, 4, 28, 23, 10, 30, 11, 21, 5]]),
        ("plan_floats", [["U"], 5]),
        ("overlap", ["D", 1, [28, 4, 5, 21, 23, 11, 6, 30, 10], "all", "recent", [0, -1], False, [], True, None, 2,
            True, 1, [5, 21, 10, 23, 4, 6, 30, 11], True, 1, [10, 23, 21, 4, 30, 6, 11]]),
        ("host_transfer", [2, "both", "U", "over"]),
        ("hicache", ["both", "U", "small", 3, 2, "launch", 3, "recent", [], "all", True, "alloc", "U", "exact", 3, 0]),
        ("alloc", ["D", "small", 1, [21, 8, 7, 23, 6, 11, 4, 30]]),
        ("relieve", ["D", 5, False]),
        ("overlap", ["U", 1, "recent", [], "skip", True, [30, 11, 8], True, 2, 1, False, 6, [("D", 3, "raise")]]),
        ("hicache", ["gate", "D", 1, "lazy_backlog_flush", "D", 4, 0]),
        ("populate", [7, 1, [17, 9, 15, 21, 6, 14, 16, 10, 18, 7, 13, 23, 28, 12, 4, 5]]),
        ("overlap", ["D", 1, [13, 7, 18, 6, 15, 4, 5, 28, 14, 9, 23, 12, 10, 21, 16], "recent", [-1], "recent", [],
            True, [], True, None, 2, False, 1, [16, 14, 21, 6, 10, 18, 7, 23, 12, 28, 5, 4, 15, 9], [("U", 2, "nested"),
            ("D", 4, "no count"), ("U", 3, "honest")], True, 1, [28, 12, 21, 10, 15, 23, 13, 18, 7, 16, 17, 14, 6, 9]]),
        ("overlap", ["D", 1, [17, 10, 15, 9, 18, 14, 23, 16, 6, 21, 12, 13, 7], "recent", [0, -1], "recent", [], False,
            [17], True, None, 2, False, 2, [9, 6, 18, 10, 13, 7, 21, 15, 23, 17, 12, 16, 14], [("U", 3, "raise"), ("D",
            3, "honest")], True, 1, [15, 10, 21, 12, 14, 17, 16, 13, 18, 23]]),
        ("hicache", ["load", "D", "small", 1, 3, "alloc", "D", "zero", [18, 12, 23, 21, 10, 16, 13, 17, 14],
            "plan_floats", False, ["U", "D"], 5, -2, "faulted", "U", "flush", 400, 1]),
        ("free_bad", [False, "U", True]),
    ]),
    # hold: a plan that moves refused, hold: relieve, leapfrog, plan moved pages, refusal both short, slide high, slide
    # low
    ({"geo": (9288, [SubPool("U", 11, 16, "up", "kv"), SubPool("F1", 4, 64, "float", "kv"), SubPool("D", 11, 1, "down",
        "state")], True, None), "policy": "anchor"}, [
        ("make_room", ["F1", "high", True, 3, False, 98]),
        ("overlap", ["U", 3, "some", [4, 3, 2], [], "all", "recent", [0, -1], False, [], False, None, 1, False, 1]),
        ("launch", [3, "some", [2], [-1], "skip", "all", False]),
        ("hicache", ["gate", True, "F1", 3, "launch", 2, "recent", [-1], "all", "some", [], False, "relieve", True,
            "F1", 4, False, "relieve", True, "F1", 1, False, 0]),
        ("launch", [2, "some", [2, 3, 4], [], "skip", "recent", [], True]),
        ("overlap", ["U", 3, "recent", [], "recent", [0, -1], "recent", [-1], False, [7, 2, 6, 4, 3, 8], False, 4, 2,
            True, 9, False, 1]),
        ("plan_floats", [True]),
        ("hicache", ["both", True, "F1", "small", 5, 1, "launch", 1, "recent", [], "some", [], [], "recent", [], False,
            3, 2, [(21, 32, 15), (24, 35, 15), (23, 34, 15), (20, 31, 15), (22, 33, 15)], True]),
        ("lazy_backlog_flush", ["U", [10, 16, 17, 9, 13, 11], False, 4]),
        ("make_room", ["F1", "high", True, 5168]),
        ("free", [False, "F1", False, [1, 31, 33, 35, 32, 2, 3, 34], 4, True, False]),
        ("open_short_side", ["F1", True, ["U", "F1", "D"], -3, 3, 6, 0, 7]),
        ("plan_floats", [["U", "D"], 3, 3]),
        ("make_room", ["F1", "low", True, 5781]),
    ]),
    # fault in flight, fault undone, launch refused, non-urgent moves in flight, pending page reused after settle,
    # settle
    ({"geo": (2686, [SubPool("U", 8, 64, "up", "kv"), SubPool("D", 3, 3, "down", "kv")], True, None),
        "policy": "anchor"}, [
        ("overlap", ["D", 4, "some", [-1], "some", [59, 57, 60, 58], [-1], False, [58], True, 2, 2, False, 4, True, 1]),
        ("launch", [1, "recent", [], "skip", False]),
        ("faulted", ["D", "plan_floats", 5, 0]),
        ("settle", None),
        ("overlap", ["D", 3, "some", [], "some", [59], [], False, [61, 67], False, 3, 1, False, 1]),
        ("overlap", ["D", 1, "all", "all", True, [62, 59, 60], True, None, 1, False, 4]),
        ("hicache", ["load", "U", "small", 1, 3, "free", "D", True, [70, 73, 66, 63, 71, 64, 57, 69], False, True,
            "plan_floats", True, "faulted (hold)", "D", "reserve", 6, 0, 0]),
        ("launch", [0, "D", ["x"], 1]),
    ]),
    # hold: bad input, hold: refused (eager END), lazy flush capped, plan fits in place, relieve failed twice (planner)
    ({"geo": (24621, [SubPool("F1", 10, 64, "float", "kv"), SubPool("U", 7, 16, "up", "kv"), SubPool("D", 9, 1, "down",
        "state"), SubPool("F2", 10, 1, "float", "state")], {"U"}, None), "policy": "planner"}, [
        ("relieve", [False, "D", 3, False]),
        ("alloc_borrowed", ["F2", [750, 136], False]),
        ("relieve", [False, "U", 3, True, [("F1", 4, "liar")]]),
        ("host_transfer", [2, "load", False, "F1"]),
        ("lazy_backlog_flush", ["U", [107], False, 1]),
        ("host_transfer", [0, "U", "reserve: a negative count"]),
        ("plan_floats", [["U"], 0]),
    ]),
    # evictor returned 0 but freed
    ({"geo": (163, [SubPool("D", 10, 1, "down", "state"), SubPool("U", 8, 1, "up", "state")], True, None),
        "policy": "anchor"}, [
        ("hicache", ["both", "D", "small", 5, 2, "flush", "D", False, 0, True, "plan_that_moves", 3, 1, [(13, 13, 1),
            (14, 14, 1), (15, 15, 1), (11, 11, 1), (12, 12, 1)], True]),
        ("alloc_borrowed", ["U", [7], False]),
        ("populate", [1, 3]),
        ("hicache", ["load", "D", "small", 3, 1, "transfer_ends", False, 2, [(6, 9, 5)], False, [(5, 8, 5), (5, 8, 5)],
            0]),
        ("overlap", ["D", 1, "skip", "recent", [0, -1], False, [3, 2], True, None, 1, False, 5, [("U", 3, "zero"), ("D",
            0, "nested")]]),
    ]),
]
# fmt: on
