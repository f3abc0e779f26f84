"""In-flight forwards on real bytes (docs/design.md §12): what the guards
are for.

A simulated forward captures, at launch, the physical page of every page
it writes (its launch-time translation) and of every live page (what it
reads, conservatively), with the bytes each holds.  While it is in flight
the scheduler runs random calls: allocations whose pages the engine fills
at once (SGLang zeroes a page it hands out), frees, the non-urgent walk,
urgent flushes, slides and reliefs.  It completes when the arena settles
(the stream wait; ``Arena.settle`` is wrapped so that an urgent settle
inside any call completes it first), and then:

- every page it read still holds the bytes it held at launch, for every
  id still live (a pending page handed out or moved over fails this: the
  read race);
- its writes land at the launch-time pages, and every live id then reads
  its expected bytes where the tables say (a pinned page moved before
  settle loses its late write: the write race).

The planted tests at the end show each check failing on the bug it is
for."""

import random

import pytest
import torch

from kvarena.impl import AccountingError, Arena, HybridSWA, SubPool, TriPool
from tests.support import live_ids

EPP = 16
POOLS = [SubPool("u", EPP, 1, "up"), SubPool("f", EPP, 1, "float"), SubPool("d", EPP, 1, "down")]


class Forward:
    """One forward on arena ``a``: it writes ``writes`` (``{pool: ids}``)
    and reads every live page; ``done`` once it has completed."""

    def __init__(self, a, writes, gen):
        self.a, self.done = a, False
        self.slot = {}  # launch-time pages of the allocations it knows
        for n in a.chain:
            self.slot.update({(n, v): p for v, p in enumerate(a.v2p(n).tolist()) if v > 0 and p >= 0})
        self.alive = set(self.slot)
        self.read = {n: a.page_view(n).clone() for n in a.chain}  # what each page held at launch
        self.data = {
            (n, v): torch.randint(0, 256, (EPP,), dtype=torch.uint8, generator=gen) for n in writes for v in writes[n]
        }
        a.launch(writes)

    def freed(self, name, ids):
        self.alive -= {(name, int(v)) for v in ids}

    def complete(self, expected):
        """The forward's end: its reads, then its late writes, then every
        live id where the tables say."""
        for n, v in sorted(self.alive):
            got, held = self.a.page_view(n)[self.slot[n, v]], self.read[n][self.slot[n, v]]
            assert torch.equal(got, held), f"pool {n!r}: id {v}: a page the forward reads was overwritten"
        for k, data in self.data.items():
            self.a.page_view(k[0])[self.slot[k]] = data  # at the launch-time page, as a kernel writes
            if k in self.alive:
                expected[k] = data
        check_bytes(self.a, expected)
        self.done = True


def completing(a, state):
    """Make every settle of ``a`` (its own, or an urgent one inside a call)
    complete the forward in flight first."""
    real = a.settle

    def settle():
        if a.in_flight and state["forward"] is not None and not state["forward"].done:
            state["forward"].complete(state["expected"])
        real()

    a.settle = settle


def fill(a, name, ids, expected, gen):
    """The engine fills the pages it was handed (zeroes them, writes them)."""
    if len(ids):
        data = torch.randint(0, 256, (len(ids), EPP), dtype=torch.uint8, generator=gen)
        a.write_pages(name, ids, data)
        for v, row in zip(ids.tolist(), data):
            expected[name, v] = row


def check_bytes(a, expected):
    for (name, v), data in expected.items():
        got = a.read_pages(name, [v])[0]
        assert torch.equal(got, data), f"pool {name!r}: id {v} lost its bytes (a late write lost, or overwritten)"


def run(seed, steps=60, lazy=True):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    a = Arena(EPP * 64, POOLS, lazy=lazy, policy=rng.choice(["anchor", "planner"]))
    state = {"forward": None, "expected": {}}
    expected = state["expected"]
    completing(a, state)
    for name, n in (("u", 14), ("f", 12), ("d", 14)):
        fill(a, name, a.alloc(name, n), expected, gen)
    for _ in range(steps):
        fwd = state["forward"]
        if fwd is None or fwd.done:
            writes = {n: rng.sample(live_ids(a, n), min(3, len(live_ids(a, n)))) for n in a.chain}
            state["forward"] = fwd = Forward(a, writes, gen)
        name = rng.choice(a.chain)
        op = rng.choice(["alloc", "alloc", "free", "free", "walk", "walk", "flush", "relieve", "settle"])
        if op == "alloc":
            ids = a.alloc(name, rng.randint(1, 3))
            if ids is not None:
                fill(a, name, ids, expected, gen)
        elif op == "free" and live_ids(a, name):
            live = live_ids(a, name)
            ids = rng.sample(live, rng.randint(1, min(3, len(live))))
            fwd.freed(name, ids)
            for v in ids:
                expected.pop((name, v), None)
            a.free(name, ids)
        elif op == "walk":
            a.flush(name, max_moves=rng.choice([None, 1, 2]), urgent=False)
        elif op == "flush":
            a.flush(name)
        elif op == "relieve":
            a.relieve(name, a.available_pages(name) + rng.randint(1, 4))
        elif op == "settle":
            a.settle()
    a.settle()
    check_bytes(a, expected)
    a.verify()
    return a


@pytest.mark.parametrize("lazy", [True, False])
def test_every_late_write_lands_and_every_read_page_survives(lazy):
    for seed in range(8):
        run(seed, lazy=lazy)


def test_a_late_write_at_a_pinned_page_survives_the_non_urgent_walk():
    """By hand: the walk moves the survivors above the pinned one, the
    pinned one keeps its page, and the late write lands on its id."""
    a = Arena(EPP * 64, POOLS, lazy=True)
    ids = a.alloc("u", 10).tolist()
    gen = torch.Generator().manual_seed(1)
    expected = {}
    fill(a, "u", torch.tensor(ids), expected, gen)
    a.free("u", ids[1:4])
    for v in ids[1:4]:
        expected.pop(("u", v))
    state = {"forward": None, "expected": expected}
    completing(a, state)
    state["forward"] = fwd = Forward(a, {"u": [ids[8]]}, gen)
    assert a.flush("u", urgent=False) == 1  # page 10 moves; the walk stops at the pinned 9
    assert int(a.translate("u", [ids[8]])[0]) == 9 and a.in_flight
    a.settle()
    assert torch.equal(a.read_pages("u", [ids[8]])[0], fwd.data["u", ids[8]])
    check_bytes(a, expected)


def test_a_pending_pages_bytes_survive_until_settle():
    """The vacated pages keep the moved ids' old bytes while the forward may
    read them: an allocation takes the unguarded holes (one freed after
    them), and the next one, which would need a pending page, settles
    first (the forward completes, its reads checked), then takes it."""
    a = Arena(EPP * 64, POOLS, lazy=True)
    ids = a.alloc("u", 10).tolist()
    gen = torch.Generator().manual_seed(2)
    expected = {}
    fill(a, "u", torch.tensor(ids), expected, gen)
    state = {"forward": None, "expected": expected}
    completing(a, state)

    def free(vs):
        fwd.freed("u", vs)
        for v in vs:
            expected.pop(("u", v))
        a.free("u", vs)

    a.free("u", ids[1:4])
    for v in ids[1:4]:
        expected.pop(("u", v))
    state["forward"] = fwd = Forward(a, {"u": [ids[7]]}, gen)
    assert a.flush("u", urgent=False) == 2  # 9 and 10 move into 2 and 3, and wait; the walk stops at 8
    assert a.pending("u").tolist() == [9, 10]
    free([ids[4]])  # page 5: an unguarded hole behind the pending ones
    first = a.alloc("u", 2)
    fill(a, "u", first, expected, gen)
    assert a.in_flight
    second = a.alloc("u", 1)  # only pending holes left: settles first
    assert fwd.done and not a.in_flight
    assert a.translate("u", first).tolist() == [4, 5] and a.translate("u", second).tolist() == [9]
    fill(a, "u", second, expected, gen)
    check_bytes(a, expected)
    a.verify()


def test_a_composite_forward_survives_an_opportunistic_flush_and_window_frees():
    """The engine's step on a TriPool, with its trusted calls: the forward
    writes each request's newest token; flush_opportunistic and window
    frees run while it is in flight."""
    for cls, args in ((TriPool, (EPP * 4 * 64, EPP, EPP, EPP * 4)), (HybridSWA, (EPP * 4 * 64, EPP, EPP))):
        c = cls(*args, page_size=4, lazy=True)
        reqs = [c.alloc_extend([0], [n], [-1]) for n in (9, 13, 6, 11)]
        c.free(reqs[0])
        c.free(reqs[2])
        full = c.arena.kv_view("full")
        newest = torch.stack([r[-1] for r in reqs[1::2]])
        slots = c.translate(newest)  # the forward's launch-time slots
        c.launch(newest, check=False)
        assert c.flush_opportunistic() > 0 and c.arena.in_flight
        c.free_swa(reqs[1][:4], 0, check=False)
        marks = torch.tensor([[7] * EPP, [9] * EPP], dtype=torch.uint8)
        full.view(-1, EPP)[slots] = marks  # the late writes, at the launch-time slots
        c.settle()
        assert torch.equal(full.view(-1, EPP)[c.translate(newest)], marks)
        c.verify()


@pytest.mark.parametrize("cls", [HybridSWA, TriPool])
def test_the_trusted_launch_pins_what_the_checked_one_does(cls):
    """``launch(check=False)`` (a tensor, or a list: no host read) pins the
    pages the checked launch pins: padding (-1, page 0), pages not live in
    swa and a repeated token pin nothing more."""
    args = (EPP * 4 * 64, EPP, EPP) if cls is HybridSWA else (EPP * 4 * 64, EPP, EPP, EPP * 4)
    twins = [cls(*args, page_size=4, lazy=True) for _ in range(3)]
    for c in twins:
        reqs = [c.alloc_extend([0], [n], [-1]) for n in (9, 13, 6)]
        c.free_swa(reqs[1][:4], 0)  # request 1's first page: not live in swa
        if cls is TriPool:
            c.alloc_state(2)
    toks = [int(reqs[1][0]), int(reqs[1][0]) + 1, -1, 2, int(reqs[0][-1]), int(reqs[2][3])]
    twins[0].launch(toks)
    twins[1].launch(torch.tensor(toks), check=False)
    twins[2].launch(toks, check=False)
    snaps = [c.snapshot() for c in twins]
    assert snaps[0] == snaps[1] == snaps[2] and snaps[0]["arena"]["pools"]["full"]["pinned"]
    for c in twins:
        c.verify()


def guarded_arena():
    """In flight: ``u``'s page 9 pinned, 10 pending (the walk moved it into
    2), page 3 a freed pin."""
    a = Arena(EPP * 64, POOLS, lazy=True)
    ids = a.alloc("u", 10).tolist()
    a.launch({"u": [ids[2], ids[8]]})
    a.free("u", ids[1:3])
    assert a.flush("u", urgent=False) == 1
    assert a.pinned("u").tolist() == [3, 9] and a.pending("u").tolist() == [10]
    a.verify()
    return a


def _pin_moved(a):
    a.bands["u"].guard[9] = 7  # page 9 holds id 9, not 7


def _pending_bound(a):
    b = a.bands["u"]
    b.guard[2] = -2 - 5  # page 2 is live: a pending page handed out


def _freed_pin_live(a):
    a.bands["u"].guard[1] = 0  # page 1 is live, not a hole


def _guards_left(a):
    a.in_flight = False


def _bounds_off(a):
    a.bands["u"].g_hi = 0  # two guarded holes, bounds [0, 0]


@pytest.mark.parametrize(
    ("corrupt", "rule"),
    [
        (_pin_moved, "pinned page kept"),
        (_freed_pin_live, "pinned page kept"),
        (_pending_bound, "pending page untouched"),
        (_guards_left, "guards without a forward"),
        (_bounds_off, "guarded holes"),
    ],
)
def test_verify_names_each_broken_guard_rule(corrupt, rule):
    """Each in-flight rule of ``verify`` can fail, under the spec's name
    (and the implementation's own bounds rule)."""
    a = guarded_arena()
    corrupt(a)
    with pytest.raises(AccountingError, match=rule):
        a.verify()


# ------------------------------------------------------------- planted bugs


def test_planted_a_walk_past_a_pinned_survivor_loses_a_late_write(monkeypatch):
    def walk(self, b, src, dst):
        return src, dst[b.guard.index_select(0, dst) == -1]  # no stop at the pinned survivor

    monkeypatch.setattr(Arena, "_walk", walk)
    with pytest.raises(AssertionError, match="lost its bytes"):
        for seed in range(8):
            run(seed)


def test_planted_a_pending_page_handed_out_corrupts_a_read(monkeypatch):
    def take(self, b, n):  # pending pages taken as if unguarded
        h = b.holes
        rows = b.guard.index_select(0, h)
        free = (rows == -1) | (rows <= -2)
        order = torch.sort((~(free & (torch.cumsum(free, 0) <= n))).to(torch.int8), stable=True).indices
        b.holes = h.index_select(0, order[n:])
        return h.index_select(0, order[:n])

    monkeypatch.setattr(Arena, "_take_unguarded", take)
    with pytest.raises(AssertionError, match="a page the forward reads was overwritten"):
        test_a_pending_pages_bytes_survive_until_settle()


def test_planted_an_alloc_that_ignores_guarded_holes_is_caught(monkeypatch):
    monkeypatch.setattr(Arena, "_skips_guards", lambda self, b, n: False)  # never settles, never skips
    with pytest.raises(AssertionError, match=r"overwritten|lost its bytes"):
        for seed in range(8):
            run(seed)
