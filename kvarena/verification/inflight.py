"""In-flight forwards in the differential machines (docs/design.md §12).

A machine launches a forward over a batch on both twins, runs its other
rules while the forward is in flight, and completes it: ``settle``, or an
operation that settles first (the urgent path).  What the forward does to
real bytes is simulated on the implementation's buffer, as an engine's
forward does it:

- at launch it captures the physical pages it writes (translated at
  launch) and the bytes of every page it reads (every page live at launch,
  at its launch translation: a copy of the buffer);
- at completion, first every page it read must still hold its launch bytes,
  for every id still live (a page a move vacated and then overwrote, or
  handed out, before the forward was done corrupts its read); then its
  late write lands: new bytes at the launch-time pages, which become those
  ids' expected bytes.  A pinned page moved before completion leaves its id
  with the old bytes, which the machine's read-back through the tables
  then finds.  An id the settling call itself unbound (a free that waits
  before its eager compaction) keeps the write as its bytes: if the call
  completes the id is gone anyway, and if it faults, its undo binds the id
  again at the very page the write landed on (issue 52: deciding by the
  table at landing left the machine expecting the bytes from before the
  forward).

The same completion writes the spec's content model at the launch-time
pages (the late write holds the written id's bytes), so a page the spec
handed out while the forward still wrote it fails the spec's own
``Band.check`` too.

Completion is hooked on both arenas' ``settle`` (``Flight``), so it runs at
the point where the arena settles, inside an urgent operation too, before
that operation moves or hands out anything.
"""

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvarena.verification.faults import unfaulted

Rows = dict[str, list[tuple[int, int, int]]]  # pool -> (id, page at launch, life of the id)


@dataclass
class Forward:
    """One launch: what it writes late and what it reads."""

    writes: Rows
    reads: Rows
    buffer: torch.Tensor  # the implementation's bytes at launch
    spec_done: bool = False
    impl_done: bool = False


def page_rows(buffer: torch.Tensor, num_pages: int, epp: int) -> torch.Tensor:
    """A pool's pages as rows of ``buffer`` (every pool's grid starts at byte 0)."""
    return buffer[: num_pages * epp].view(num_pages, epp)


def hook_settle(arena, complete: Callable[[], None]) -> None:
    """Make ``arena.settle`` run ``complete`` first whenever a forward is in
    flight: the arena's own urgent operations call ``self.settle()``, so the
    forward completes exactly where the arena waits for it."""
    real = arena.settle

    def settle():
        if arena.in_flight:
            complete()
        real()

    arena.settle = settle


@dataclass
class Flight:
    """The forwards in flight over a spec arena ``ref`` and its implementation
    ``twin``, and the byte bookkeeping they share with a machine.

    ``expected`` is the machine's ``{pool: {id: generation}}`` of every
    live id's bytes, ``index`` each byte-tracked pool's pattern index,
    ``pattern`` the machine's page pattern, ``new_gen`` hands out a fresh
    generation and ``note`` counts a coverage event; ``events`` names the
    machine's two events counted here (``"urgent"``, ``"reused"``).
    """

    ref: Any  # the spec arena
    twin: Any  # the implementation's
    expected: dict[str, dict[int, int]]
    index: dict[str, int]
    pattern: Callable
    new_gen: Callable[[], int]
    note: Callable[[str], None]
    events: dict[str, str]
    forwards: list[Forward] = field(default_factory=list)
    lives: dict[str, dict[int, int]] = field(default_factory=dict)  # pool -> id -> allocations of that id so far
    was_pending: dict[str, set[int]] = field(default_factory=dict)  # pages pending when a forward completed
    explicit: bool = False  # inside the machine's own settle call
    alone: bool = False  # inside a faulted call on the implementation only: the spec makes it later, or never

    def __post_init__(self):
        hook_settle(self.ref, self._complete_spec)
        hook_settle(self.twin, self._complete_impl)

    # ------------------------------------------------------- bookkeeping

    def born(self, pool: str, ids) -> None:
        """``ids`` of ``pool`` were just allocated: a new life each."""
        lives = self.lives.setdefault(pool, {})
        for v in ids:
            lives[v] = lives.get(v, 0) + 1

    def handed_out(self, pool: str, pages) -> None:
        """Physical ``pages`` of ``pool`` were just bound; count those that
        were pending when a forward completed."""
        seen = self.was_pending.get(pool, set())
        reused = seen & set(pages)
        if reused:
            self.note(self.events["reused"])
            seen -= reused

    def _same_life(self, pool: str, v: int, life: int) -> bool:
        """Is id ``v`` in the life it had at launch, by the machine's books?
        Its table is not asked: inside a faulted call an id the call has
        unbound is bound again by the undo, with the bytes written meanwhile."""
        return self.lives.get(pool, {}).get(v) == life and v in self.expected.get(pool, {})

    def _alive(self, pool: str, v: int, life: int, v2p: list[int]) -> bool:
        """Is id ``v`` still in the life it had at launch, by the machine's
        books and the implementation's table?"""
        return self._same_life(pool, v, life) and v2p[v] > 0

    def _v2p(self, pool: str) -> list[int]:
        t = self.twin.v2p(pool)
        return t.tolist() if isinstance(t, torch.Tensor) else list(t)

    # ------------------------------------------------------------ launch

    def launch(self, writes: dict[str, list[int]]) -> None:
        """Record a forward both arenas have just launched; ``writes`` holds
        the live ids it writes in each pool (``None`` resolved, padding
        dropped)."""
        f = Forward({}, {}, self.twin.buffer.clone())
        for pool in self.index:
            v2p = self._v2p(pool)
            lives = self.lives.get(pool, {})
            f.reads[pool] = [(v, v2p[v], lives.get(v, 0)) for v in sorted(self.expected.get(pool, {}))]
            if pool in writes:
                f.writes[pool] = [(v, v2p[v], lives.get(v, 0)) for v in sorted(set(writes[pool]))]
        self.forwards.append(f)

    @contextlib.contextmanager
    def impl_only(self) -> Iterator[None]:
        """A call on the implementation alone (a faulted one): it may settle
        where the spec, which makes the call after it or never, has not yet."""
        self.alone = True
        try:
            yield
        finally:
            self.alone = False

    def settle(self, spec_obj=None, impl_obj=None) -> None:
        """The machine waits for the forward: ``settle`` on both twins, called
        on the objects the machine drives (a traced machine records the
        spec's call), by default the two arenas."""
        self.explicit = True
        try:
            (spec_obj or self.ref).settle()
            (impl_obj or self.twin).settle()
        finally:
            self.explicit = False

    # -------------------------------------------------------- completion

    def _complete_spec(self) -> None:
        """The spec settles: its content model takes the late writes."""
        for f in self.forwards:
            if f.spec_done:
                continue
            for pool, rows in f.writes.items():
                content = self.ref.bands[pool].content
                for v, p, _ in rows:
                    content[p] = v
            f.spec_done = True
        self._drop_done()
        for pool in self.ref.chain:
            self.was_pending.setdefault(pool, set()).update(self.ref.pending(pool))
        if not self.explicit:
            self.note(self.events["urgent"])

    def _complete_impl(self) -> None:
        """The implementation settles: check the reads, land the late writes
        (uncounted by a fault injected into the call that settles)."""
        with unfaulted():
            self._land()

    def _land(self) -> None:
        todo = [f for f in self.forwards if not f.impl_done]
        if not self.alone:  # the spec made the same call first
            assert all(f.spec_done for f in todo), "the implementation settled a forward the spec still has in flight"
        tables = {pool: self._v2p(pool) for pool in self.index}
        for f in todo:  # every read before any late write lands
            for pool, rows in f.reads.items():
                kept = [p for v, p, life in rows if self._alive(pool, v, life, tables[pool])]
                if not kept:
                    continue
                g = self.twin.geometry(pool)
                pages = torch.tensor(kept, device=self.twin.buffer.device)
                now = page_rows(self.twin.buffer, g.num_pages, g.epp).index_select(0, pages)
                then = page_rows(f.buffer, g.num_pages, g.epp).index_select(0, pages)
                same = (now == then).all(dim=1).tolist()
                bad = [p for p, ok in zip(kept, same) if not ok]
                assert not bad, f"pool {pool!r}: pages {bad} that a forward reads were overwritten before it was done"
        for f in todo:  # then its writes land where they were translated at launch
            for pool, rows in f.writes.items():
                if not rows:
                    continue
                gen = self.new_gen()
                g = self.twin.geometry(pool)
                ids = [v for v, _, _ in rows]
                data = self.pattern(self.index[pool], ids, [gen] * len(ids), g.epp).to(self.twin.buffer.device)
                pages = torch.tensor([p for _, p, _ in rows], device=self.twin.buffer.device)
                page_rows(self.twin.buffer, g.num_pages, g.epp).index_copy_(0, pages, data)
                # The write is the id's bytes for the rest of its life, though the call that
                # settles may have unbound it: a faulted call's undo binds it again at that page
                # (issue 52), and a call that completes drops it (``forget``, ``forget_dead``).
                for v, _, life in rows:
                    if self._same_life(pool, v, life):
                        self.expected[pool][v] = gen
            f.impl_done = True
        self._drop_done()

    def _drop_done(self) -> None:
        """Forget the forwards both twins have completed (the implementation
        first, inside a faulted call, and the spec when it makes the call)."""
        self.forwards = [f for f in self.forwards if not (f.spec_done and f.impl_done)]

    def check(self) -> None:
        """After a step: both twins agree on whether a forward is in flight,
        and one that neither has in flight is complete on both."""
        assert self.ref.in_flight == self.twin.in_flight, (self.ref.in_flight, self.twin.in_flight)
        if not self.ref.in_flight:
            assert not self.forwards, "a forward settled on one twin only"


def walk(S, name: str, cap: int | None) -> tuple[int, bool]:
    """A non-urgent flush of lazy END ``name`` of spec arena ``S`` with a
    forward in flight, read afresh from its tables (an oracle that shares no
    code with ``moves.guarded_flush_plan``): the pages it moves, and whether
    a pinned survivor stopped its walk while it had room and moves left.

    The walk takes the survivors beyond the packed edge from the frontier
    inward and stops at the first pinned one; the destinations are the holes
    inside the edge that are neither pinned nor pending.
    """
    b = S.bands[name]
    g = b.geom
    live = [p for p in range(g.min_page, g.num_pages) if b.p2v[p] > 0]
    pinned = set(S.pinned(name))
    guarded = pinned | set(S.pending(name))
    up = b.grow == "up"
    edge = g.min_page + len(live) if up else g.num_pages - len(live)
    outside = [p for p in reversed(live) if p >= edge] if up else [p for p in live if p < edge]
    reach = next((k for k, p in enumerate(outside) if p in pinned), len(outside))
    room = sum(1 for h in S.holes(name) if (h < edge if up else h >= edge) and h not in guarded)
    if cap is not None:
        room = min(room, cap)
    return min(reach, room), reach < min(len(outside), room)
