"""The discrete-time scheduler: one trace through one backend.

A step is what an engine does in ``page_tokens`` decode iterations: every
decoding request gains one unit (a page), since the model is page-granular
(``kvarena.sim.presets``).  Each step, in this order:

1. **arrivals** join the back of the queue;
2. **decode**: one ``decode`` call for every request whose prefill is done.
   On a shortfall (``None``, after the arena's own ladder) the refusal is
   counted, then ``relieve(units, evict=...)`` runs with an evictor that
   retracts the newest admitted request (its memory freed, the request
   back at the front of the queue, its prompt and generated tokens to be
   recomputed, as engines do), and the batch, less the retracted, asks
   again;
3. **finish**: a request with all its output is released (full, SWA and
   its state slot);
4. **window free**: each request's SWA pages that left the window go back
   in one ``free_window`` call (the anchor's rule, ``swa_window_end``);
5. **admission**: chunked prefill (``chunk_tokens`` a chunk, at most one
   chunk per decode iteration), requests that started prefilling first,
   then the queue in order.  A chunk is admitted while the joint view
   allows: ``chunk + reserve + state slots x state_price() <=
   available()``, the reserve being ``reserve_ratio`` of the output the
   decoding requests still owe.  When it does not, and the free bytes
   could cover the demand, ``relieve`` without eviction runs once (flush,
   slide); if that fails too the refusal is counted and admission stops
   for the step.  After each chunk the request's SWA
   pages outside the window are freed, so a long prompt holds at most a
   chunk plus a window of SWA.

**Admitted concurrency** is counted at the end of each step (the requests
that hold memory and decode next step); its mean is taken over the
**memory-bound** steps, those in which memory turned the queue head away,
which is what a buffer's layout decides (the other steps are limited by
arrivals or by the prefill budget, the same for every setup).  Utilisation
is averaged over the same steps.

**False OOM**: a refusal (an allocation or ladder that said no) while the
buffer's free bytes (every byte not holding a live page; for a static split,
the free pages of every pool) covered the demand plus the grid rounding that
no placement can avoid (``backends._slack``: a full page and two SWA pages).

A request that could not run even in an empty setup is **rejected** on
arrival at the queue head; one that the empty setup still refuses is
**stuck** (dropped, so the run ends; expected never).  Conservation:
``finished + rejected + stuck == requests``, and every admitted request
finishes.
"""

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    chunk_tokens: int = 8192
    reserve_ratio: float = 0.3
    max_steps: int = 2_000_000
    record: bool = True  # keep per-step series (for the plot)

    def check(self):
        if self.chunk_tokens < 1:
            raise ValueError(f"simulate: chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if not 0 <= self.reserve_ratio <= 1:
            raise ValueError(f"simulate: reserve_ratio must be in [0, 1], got {self.reserve_ratio}")


@dataclass
class Result:
    setup: str
    requests: int = 0
    finished: int = 0
    rejected: int = 0
    stuck: int = 0
    lost: int = 0  # admitted and never finished: must be 0
    steps: int = 0
    memory_bound_steps: int = 0  # steps in which memory turned the queue head away
    peak_concurrency: int = 0
    mean_concurrency: float = 0.0  # over the memory-bound steps
    mean_concurrency_all: float = 0.0
    tokens_per_step: float = 0.0
    decode_tokens_per_step: float = 0.0
    retractions: int = 0
    evictions: int = 0
    recomputed_tokens: int = 0
    utilisation: float = 0.0  # mean live bytes / buffer over the memory-bound steps
    bytes_allocated: int = 0
    bytes_moved: int = 0
    moved_per_allocated: float = 0.0
    refusals: int = 0
    false_oom: int = 0
    peak_live: dict = field(default_factory=dict)  # units (slots) per kind
    capacity: dict = field(default_factory=dict)  # a static split's walls, in units (slots)
    split: dict = field(default_factory=dict)  # a static split's ratios (set by kvarena simulate)
    series: dict = field(default_factory=dict)

    def numbers(self):
        """The report without the per-step series."""
        return {k: v for k, v in self.__dict__.items() if k != "series"}


class _Req:
    __slots__ = (
        "admitted",
        "ever_admitted",
        "generated",
        "ids",
        "out_units",
        "output_len",
        "prefill_units",
        "prompt_len",
        "rid",
        "slot",
        "swa_done",
    )

    def __init__(self, r, sizes):
        self.rid, self.prompt_len, self.output_len = r.rid, r.prompt_len, r.output_len
        self.prefill_units = sizes.units(r.prompt_len)
        self.out_units = sizes.units(r.output_len)
        self.generated = 0
        self.ids, self.slot, self.swa_done = [], None, 0
        self.admitted = self.ever_admitted = False

    @property
    def decoding(self):
        return len(self.ids) >= self.prefill_units

    @property
    def owed(self):
        return self.out_units - self.generated


class _Sim:
    def __init__(self, backend, sizes, trace, cfg, setup):
        cfg.check()
        self.b, self.sizes, self.cfg = backend, sizes, cfg
        self.pt = sizes.page_tokens
        self.window = sizes.preset.window
        self.chunk = sizes.units(cfg.chunk_tokens)
        self.budget = self.chunk * self.pt  # units a step: one chunk per decode iteration
        self.arrivals = deque(sorted(trace, key=lambda r: (r.arrival, r.rid)))
        self.queue = deque()
        self.running = []  # admission order: the evictor takes the last
        self.prefilling = deque()
        self.owed = 0  # output units the decoding requests still owe: the reserve's base
        self.res = Result(setup, requests=len(self.arrivals))
        self.admitted_ids, self.finished_ids = set(), set()
        self.series = {"step": [], "concurrency": [], "utilisation": [], "bands": []}
        self.conc_sum = self.conc_bound_sum = self.util_sum = 0.0
        self.blocked = False  # this step's admission stopped for memory
        self.tokens = self.decode_tokens = 0
        self.peak_live = {}

    # ------------------------------------------------------------ the loop

    def run(self):
        step = 0
        while self.arrivals or self.queue or self.running:
            if not self.queue and not self.running and self.arrivals[0].arrival > step:
                step = math.ceil(self.arrivals[0].arrival)  # an empty system: skip the idle time
            while self.arrivals and self.arrivals[0].arrival <= step:
                self.queue.append(_Req(self.arrivals.popleft(), self.sizes))
            self._decode()
            self._window()
            self.blocked = False
            self._admit()
            self._record(step)
            step += 1
            self.res.steps += 1
            if self.res.steps > self.cfg.max_steps:
                raise RuntimeError(f"simulate: {self.res.setup}: no end after {self.cfg.max_steps} steps")
        return self._result()

    def _record(self, step):
        """End of a step: the requests admitted (they decode next step)."""
        n = len(self.running)
        util = self.b.live_bytes() / self.sizes.total
        self.conc_sum += n
        if self.blocked:
            self.res.memory_bound_steps += 1
            self.conc_bound_sum += n
            self.util_sum += util
        self.res.peak_concurrency = max(self.res.peak_concurrency, n)
        for k, v in self.b.live_by_kind().items():
            self.peak_live[k] = max(self.peak_live.get(k, 0), v)
        if self.cfg.record:
            s = self.series
            s["step"].append(step)
            s["concurrency"].append(n)
            s["utilisation"].append(util)
            s["bands"].append(self.b.boundaries())

    # --------------------------------------------------------------- decode

    def _decode(self):
        batch = [r for r in self.running if r.decoding]
        while batch:
            ids = self.b.decode([len(r.ids) + 1 for r in batch], [r.ids[-1] for r in batch])
            if ids is not None:
                break
            self._refused(len(batch), 0)
            self.res.evictions += 1
            self.b.relieve(len(batch), 0, evict=self._evict)
            batch = [r for r in batch if r.admitted]
        if not batch:
            return
        for r, i in zip(batch, ids):
            r.ids.append(i)
            r.generated += 1
        self.owed -= len(batch)
        self.decode_tokens += len(batch) * self.pt
        done = [r for r in batch if r.generated >= r.out_units]
        if done:
            keep = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in keep]
            self.b.release([i for r in done for i in r.ids], [r.slot for r in done if r.slot is not None])
            for r in done:
                r.admitted = False
                self.res.finished += 1
                self.finished_ids.add(r.rid)
                self.tokens += r.prompt_len + r.output_len

    def _evict(self, shortfall):
        """Retract the newest admitted request; units freed (0: none left)."""
        if not self.running:
            return 0
        r = self.running.pop()
        if r in self.prefilling:
            self.prefilling.remove(r)
        self.b.release(r.ids, [r.slot] if r.slot is not None else [])
        freed = len(r.ids)
        self.res.retractions += 1
        self.res.recomputed_tokens += freed * self.pt
        if r.decoding:
            self.owed -= r.owed
        r.prefill_units = self.sizes.units(r.prompt_len) + r.generated  # prompt and output so far, recomputed
        r.ids, r.slot, r.swa_done, r.admitted = [], None, 0, False
        self.queue.appendleft(r)
        return max(1, freed)

    # ---------------------------------------------------------- window free

    def _window_ids(self, r):
        """The ids that left the window: ``swa_window_end(len*pt, window, pt)
        // pt`` (the anchor's rule), which on whole pages is ``len -
        window_units`` (``tests/sim/test_simulate.py`` checks the two agree)."""
        if not self.window:
            return []
        end = len(r.ids) - self.sizes.window_units
        if end <= r.swa_done:
            return []
        out = r.ids[r.swa_done : end]
        r.swa_done = end
        return out

    def _window(self):
        if self.window:
            self.b.free_window([i for r in self.running for i in self._window_ids(r)])

    # ------------------------------------------------------------ admission

    def _footprint(self, r):
        """Full units, SWA peak units and slots the request needs to run alone."""
        total = r.prefill_units + r.owed
        swa = min(total, self.sizes.window_units + self.chunk) if self.b.has_swa else 0
        return total, swa, 1 if self.b.has_state else 0

    def _refused(self, units, slots):
        self.blocked = True
        self.res.refusals += 1
        if self.b.free_bytes() >= self.b.demand_bytes(units, slots) + self.b.slack_bytes:
            self.res.false_oom += 1

    def _admit(self):
        budget = self.budget
        while budget > 0:
            r = self.prefilling[0] if self.prefilling else (self.queue[0] if self.queue else None)
            if r is None:
                return
            first = not r.admitted
            if first and not self.b.fits_empty(*self._footprint(r)):
                self.queue.popleft()
                self.res.rejected += 1
                continue
            n = min(self.chunk, r.prefill_units - len(r.ids), budget)
            slots = 1 if first and self.b.has_state else 0
            reserve = math.ceil(self.cfg.reserve_ratio * self.owed)
            if not self.b.admits(n, slots, reserve):
                # The ladder only when the free bytes could cover the demand:
                # otherwise no placement fits it, and a flush would move data in vain.
                could = self.b.free_bytes() >= self.b.demand_bytes(n + reserve, slots)
                if not (could and self.b.relieve(n + reserve, slots)):
                    self._refused(n + reserve, slots)
                    self._stuck_check(r, first)
                    return
                if not self.b.admits(n, slots, reserve):
                    self.blocked = True
                    return
            slot = None
            if slots:
                slot = self.b.alloc_state()
                if slot is None:
                    self._refused(n, slots)
                    self._stuck_check(r, first)
                    return
            ids = self.b.extend(len(r.ids), n, r.ids[-1] if r.ids else -1)
            if ids is None:
                self._refused(n, slots)
                if slot is not None:
                    self.b.release([], [slot])
                self._stuck_check(r, first)
                return
            if first:
                self.queue.popleft()
                r.admitted = r.ever_admitted = True
                r.slot = slot
                self.admitted_ids.add(r.rid)
                self.running.append(r)
                self.prefilling.append(r)
            r.ids += ids
            budget -= n
            if r.decoding:
                self.prefilling.popleft()
                self.owed += r.owed
            self.b.free_window(self._window_ids(r))  # chunked prefill frees SWA between chunks

    def _stuck_check(self, r, first):
        """Nothing else runs and ``r`` is still refused: nothing will
        change, so drop it (counted as stuck; the run would never end)."""
        if any(o is not r for o in self.running):
            return
        if first:
            self.queue.popleft()
        else:
            self.running.remove(r)
            self.prefilling.remove(r)
            self.b.release(r.ids, [r.slot] if r.slot is not None else [])
            r.admitted = False
        self.res.stuck += 1

    # --------------------------------------------------------------- report

    def _result(self):
        res, b = self.res, self.b
        res.lost = len(self.admitted_ids - self.finished_ids)
        res.mean_concurrency_all = self.conc_sum / max(1, res.steps)
        bound = res.memory_bound_steps
        res.mean_concurrency = self.conc_bound_sum / bound if bound else res.mean_concurrency_all
        res.utilisation = self.util_sum / bound if bound else 0.0
        res.tokens_per_step = self.tokens / max(1, res.steps)
        res.decode_tokens_per_step = self.decode_tokens / max(1, res.steps)
        scale = self.sizes.byte_scale
        res.bytes_allocated = b.allocated_bytes * scale
        res.bytes_moved = b.moved_bytes * scale
        res.moved_per_allocated = b.moved_bytes / b.allocated_bytes if b.allocated_bytes else 0.0
        res.peak_live = dict(self.peak_live)
        if b.static:
            res.capacity = {n: p.pages for n, p in b.pools.items()}
        res.series = self.series if self.cfg.record else {}
        return res


def run(backend, sizes, trace, cfg=Config(), setup="?"):
    """Serve ``trace`` on ``backend``; a ``Result``."""
    return _Sim(backend, sizes, trace, cfg, setup).run()
