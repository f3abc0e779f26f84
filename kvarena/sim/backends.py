"""What the scheduler drives: the unified arena, or a static split.

Both speak in **units** (one unit = one KV page of ``page_tokens`` tokens,
see ``kvarena.sim.presets``) and offer the same calls, so one scheduler runs
both:

- ``available()``: the joint view, in units a coupled bind (full and, where
  present, SWA) gets now;
- ``admits(units, slots, reserve)``: the admission gate: would ``slots``
  state slots and then ``units`` units be served now, exactly, without
  relief (a slot that reuses a free one costs nothing), with ``reserve``
  more units held back for the decodes to come (how a setup prices the
  reserve is its own: below);
- ``alloc_state()``, ``extend(prefix, n, last)``, ``decode(seqs, lasts)``,
  ``free_window(ids)``, ``release(ids, slots)``, ``relieve(units, slots,
  evict, reserve=0)``: make room for ``units`` and ``slots``, True once
  ``admits(units, slots, reserve)``;
- byte accounting: ``live_bytes()``, ``free_bytes()``, ``demand_bytes()``,
  ``slack_bytes``, ``allocated_bytes``, ``moved_bytes``.

``Unified`` makes the real calls of ``kvarena.impl``'s composites (one unit
is one page: ``page_size=1``).  ``StaticSplit`` is the textbook static
engine: one free list per kind behind fixed walls, and no relief but
eviction; unlike the anchor's stored static SWA allocator it gates both
sides before taking either (no leak), which only flatters it.
"""

from collections import deque

import torch

from kvarena.impl import MAX_EVICT_ROUNDS

KINDS = ("state", "swa", "full")


def _slack(epp):
    """Bytes that grid rounding can strand, which no placement avoids: less
    than a page of a KV grid at each boundary it meets (full: one; SWA: two,
    a float has two edges).  A state END's frontier lies on its own grid."""
    return epp["full"] + 2 * epp.get("swa", 0)


def count_moves(arena):
    """Count the bytes ``arena`` relocates, at its one relocation primitive
    (``Arena._move``): pairs whose source holds a live page and moves.
    Eager compaction pads its move sets with dead self-copies; those move
    nothing and are not counted.  Instrumentation: a host read per move,
    which a simulator or an untimed pass can afford, and outside any
    launch-counting mode, so the clock does not charge it to the allocator.  Returns a one-item
    list that the count accumulates in."""
    from torch.utils._python_dispatch import _disable_current_modes

    moved = [0]
    move = arena._move

    def counted(band, dst, src, disjoint=False):
        if src.numel():
            with _disable_current_modes():  # instrumentation: not the allocator's launches (kvarena.sim.launches)
                alive = (band.p2v.index_select(0, src) >= 0) & (src != dst)
                moved[0] += int(alive.sum()) * band.geom.epp
        return move(band, dst, src, disjoint)

    arena._move = counted
    return moved


class Unified:
    """A composite over the whole buffer (``Sizes.build``)."""

    static = False

    def __init__(self, sizes, policy="anchor", lazy=True, max_running=None):
        self.sizes = sizes
        self.max_running = max_running  # the engine's cap on running requests (engines.Engine.running_cap)
        self.c = sizes.build(policy=policy, lazy=lazy)
        self.arena = self.c.arena
        self.has_swa = "swa" in self.arena.chain
        self.has_state = "state" in self.arena.chain
        self.epp = {n: self.arena.geometry(n).epp for n in self.arena.chain}
        self.unit_bytes = self.epp["full"] + self.epp.get("swa", 0)
        self.slack_bytes = _slack(self.epp)
        self.allocated_bytes = 0
        self._moved = count_moves(self.arena)

    @property
    def moved_bytes(self):
        return self._moved[0]

    # views and gates
    def available(self):
        return self.c.available_size()

    def admits(self, units, slots, reserve):
        """The chunk and its slot by the composite's own exact test
        (``fits``: the state END's free slots cost nothing, a slot that
        extends it costs what the extension takes from the joint view, to
        the page); the reserve by the free bytes.

        Why bytes for the reserve: its units are allocated later, by the
        decodes that take them, and each of those calls runs the ladder for
        what it takes.  Placing the reserve now would move data for pages
        nobody allocates yet, and the frees of the requests that finish
        first mostly make that move needless (docs/results/bench.md,
        "Churn").  SGLang prices its decode headroom the same way: its
        admission gate (``can_reserve``) reads the layout compaction would
        reach, and its allocator relieves only for an allocation
        (``ensure_capacity``).  With the planner the verdicts are the ones a
        relief for the reserve gave: its ladder finds every page-aligned
        placement that exists (``planner.complete``), and no run has seen
        it refuse with the free bytes covering a demand and the grid slack
        (false OOM 0), so only the moves changed."""
        slots = slots if self.has_state else 0
        if not self.c.fits(units, slots):
            return False
        return not reserve or self.free_bytes() >= self.demand_bytes(units + reserve, slots)

    def fits_empty(self, full_units, swa_units, slots):
        """Could a request of this footprint run in the empty arena?"""
        need = full_units * self.epp["full"] + swa_units * self.epp.get("swa", 0) + slots * self.epp.get("state", 0)
        return need + self.slack_bytes <= self.arena.total_bytes - self.arena.sink_bytes

    # allocation
    def alloc_state(self):
        ids = self.c.alloc_state(1)
        if ids is None:
            return None
        self.allocated_bytes += self.epp["state"]
        return int(ids[0])

    # The step calls go the way an engine makes them: the trusted path
    # (``check=False``) with the engine's host copies, so the launches the
    # clock charges are the production path's (``kvarena.sim.launches``);
    # ``verify`` checks the state.
    def extend(self, prefix, n, last, own=None):
        p, q = [prefix], [prefix + n]
        t = torch.tensor
        ids = self.c.alloc_extend(t(p), t(q), t([last]), False, prefix_lens_cpu=p, seq_lens_cpu=q, extend_num_tokens=n)
        if ids is None:
            return None
        self.allocated_bytes += n * self.unit_bytes
        return ids.tolist()

    def decode(self, seqs, lasts):
        ids = self.c.alloc_decode(torch.tensor(seqs), torch.tensor(lasts), False, seq_lens_cpu=seqs)
        if ids is None:
            return None
        self.allocated_bytes += len(seqs) * self.unit_bytes
        return ids.tolist()

    def free_window(self, ids):
        if ids:
            # page_size 1: every id is its page's representative, and live (the engine's count)
            self.c.free_swa(torch.tensor(ids), 0, False, num_live=len(ids))

    def release(self, ids, slots):
        if ids:
            self.c.free(torch.tensor(ids))
        if slots:
            self.c.free_state(torch.tensor(slots))

    def relieve(self, units, slots, evict=None, reserve=0):
        """The composite's ladder for ``units`` and ``slots``: the reserve
        moves nothing (``admits`` prices it in bytes, which a move does not
        change)."""
        return self.c.relieve(units, slots if self.has_state else 0, evict)

    # bytes
    def live_bytes(self):
        return sum(self.arena.live_pages(n) * e for n, e in self.epp.items())

    def free_bytes(self):
        return self.arena.total_bytes - self.arena.sink_bytes - self.live_bytes()

    def demand_bytes(self, units, slots):
        return units * self.unit_bytes + slots * self.epp.get("state", 0)

    def live_by_kind(self):
        return {n: self.arena.live_pages(n) for n in self.arena.chain}

    def boundaries(self):
        """Band frontiers as fractions of the buffer: ``{pool: (low, high)}``;
        a parked float reports ``None``."""
        out, t = {}, self.arena.total_bytes
        for n in self.arena.chain:
            c, epp = self.arena.counts(n), self.epp[n]
            out[n] = None if not c.opaque else (c.lo * epp / t, c.hi * epp / t)
        return out

    def verify(self):
        self.c.verify()


class FreeList:
    """A plain free list of page ids ``1..pages`` (0 is the sink), FIFO."""

    def __init__(self, name, pages, epp):
        self.name, self.pages, self.epp = name, pages, epp
        self.free = deque(range(1, pages + 1))
        self.peak = 0

    @property
    def live(self):
        return self.pages - len(self.free)

    def take(self, n):
        out = [self.free.popleft() for _ in range(n)]
        self.peak = max(self.peak, self.live)
        return out

    def put(self, ids):
        self.free.extend(ids)


class StaticSplit:
    """Fixed walls (``presets.Split``): a free list per kind.  Unit ids are
    full's ids; ``swa_of[id]`` maps one to its SWA page (0: none), as the
    anchor's ``full_to_swa_index_mapping`` does."""

    static = True

    def __init__(self, sizes, split, max_running=None):
        self.sizes, self.split = sizes, split
        kinds = sizes.preset.kinds
        self.has_swa, self.has_state = "swa" in kinds, "state" in kinds
        self.pools = {"full": FreeList("full", split.full_units, sizes.unit_full)}
        if self.has_swa:
            self.pools["swa"] = FreeList("swa", split.swa_units, sizes.unit_swa)
        if self.has_state:
            self.pools["state"] = FreeList("state", split.slots, sizes.slot)
        self.swa_of = [0] * (split.full_units + 1)
        self.max_running = max_running  # the engine's cap on running requests (engines.Engine.running_cap)
        self.full_units = split.full_units  # the engine's running limit reads its full pool
        self.epp = {n: p.epp for n, p in self.pools.items()}
        self.unit_bytes = self.epp["full"] + self.epp.get("swa", 0)
        self.slack_bytes = _slack(self.epp)
        self.allocated_bytes = 0
        self.moved_bytes = 0  # a static split never moves data

    def _free(self, name):
        p = self.pools.get(name)
        return len(p.free) if p is not None else 0

    def available(self):
        """``min(full, swa)`` free units (docs/anchor.md §2)."""
        return min(self._free("full"), self._free("swa")) if self.has_swa else self._free("full")

    def _fits(self, units, slots):
        return units <= self.available() and slots <= self._free("state")

    def admits(self, units, slots, reserve):
        return self._fits(units + reserve, slots)

    def fits_empty(self, full_units, swa_units, slots):
        need = {"full": full_units, "swa": swa_units, "state": slots}
        return all(need[k] <= p.pages for k, p in self.pools.items())

    def alloc_state(self):
        if not self._free("state"):
            return None
        self.allocated_bytes += self.epp["state"]
        return self.pools["state"].take(1)[0]

    def _bind(self, n):
        if n > self.available():
            return None
        ids = self.pools["full"].take(n)
        if self.has_swa:
            for i, s in zip(ids, self.pools["swa"].take(n)):
                self.swa_of[i] = s
        self.allocated_bytes += n * self.unit_bytes
        return ids

    def extend(self, prefix, n, last, own=None):
        return self._bind(n)

    def decode(self, seqs, lasts):
        return self._bind(len(seqs))

    def free_window(self, ids):
        if not self.has_swa:
            return
        swa = [self.swa_of[i] for i in ids if self.swa_of[i] > 0]
        for i in ids:
            self.swa_of[i] = 0
        self.pools["swa"].put(swa)

    def release(self, ids, slots):
        self.free_window(ids)
        self.pools["full"].put(ids)
        if slots:
            self.pools["state"].put(slots)

    def relieve(self, units, slots, evict=None, reserve=0):
        """No ladder: only eviction rounds (at most 4, as the arena's).  The
        reserve is part of the demand: behind walls, a later decode can
        take only what its own pool holds."""
        units += reserve
        for _ in range(MAX_EVICT_ROUNDS if evict is not None else 0):
            if self._fits(units, slots):
                return True
            short = max(0, units - self.available()) + max(0, slots - self._free("state"))
            if not evict(short):
                break
        return self._fits(units, slots)

    def live_bytes(self):
        return sum(p.live * p.epp for p in self.pools.values())

    def free_bytes(self):
        return sum(len(p.free) * p.epp for p in self.pools.values())

    def demand_bytes(self, units, slots):
        return units * self.unit_bytes + slots * self.epp.get("state", 0)

    def live_by_kind(self):
        return {n: p.live for n, p in self.pools.items()}

    def boundaries(self):
        return None

    def verify(self):
        for p in self.pools.values():
            if not 0 <= p.live <= p.pages or len(set(p.free)) != len(p.free):
                raise AssertionError(f"static pool {p.name!r}: {p.live} live of {p.pages}, free list corrupt")
