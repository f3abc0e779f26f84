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
   then the queue in order.  A chunk is admitted while the setup's gate
   says its state slot (a request's first chunk) and ``chunk`` units would
   be served now, exactly, with a reserve held back (``admits``), the
   reserve being a ratio of the output the decoding requests still owe
   (SGLang's ``new_token_ratio``, ``NewTokenRatio``: from 0.7, decaying
   each decode iteration to 0.098, set from the batch after a retraction,
   back to 0.7 when idle; ``Config.reserve_ratio`` holds it constant
   instead; an engine without ``decode_reserve``, vLLM, holds none): the
   unified arena prices the reserve in free bytes (the
   decodes that take it run the ladder then), a static setup in its own
   pools.  When the gate says no, and the free bytes could cover chunk,
   slot and reserve, ``relieve`` without eviction runs once for the chunk
   and its slot (flush, slide); if that fails too the refusal is counted
   and admission stops for the step.  After each chunk
   the request's SWA pages outside the window are freed, so a long prompt
   holds at most a chunk plus a window of SWA.

Every admission that stops for memory is one refusal under one named cause
(``BLOCK_CAUSES``), and a step is memory-bound exactly when its admission
stopped so: ``sum(blocked.values()) == memory_bound_steps``.

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

**Time** (``kvarena.sim.timing``): each step's length is the roofline of
its work (``page_tokens`` iterations over the decoding batch, its KV and
state read, and the step's prefill in chunks, each a pass of its own, or
under a mixing engine a decode iteration's extra tokens, the decodes then
sharing each chunk's budget: ``Clock.step_seconds``), plus the bytes its
relocations moved at copy bandwidth, the eager launches of a batch above
the engine's largest CUDA graph, and the allocator's cost
(``Config.alloc_cost``: its kernel launches, ``kvarena.sim.launches``, or
its CPU time measured around its calls).  Arrivals are in
seconds on that clock.  Per request: time to first token (arrival to the
end of the step its prefill finished in; a retracted request keeps its
first), and inter-token latency (each decode step's tokens share the time
since the request's previous token).  Goodput is the requests per second
that met both SLOs (``slo_ttft``; ``slo_itl`` on the request's mean
inter-token latency).

A request that could not run even in an empty setup is **rejected** on
arrival at the queue head; one that the empty setup still refuses is
**stuck** (dropped, so the run ends; expected never).  Conservation:
``finished + rejected + stuck == requests``, and every admitted request
finishes.
"""

import bisect
import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, field

# Why an admission stopped for memory (each is one refusal):
BLOCK_CAUSES = (
    "full",  # the gate said no and the free bytes could not cover the demand: no ladder tried
    "ladder",  # the gate said no, the free bytes could cover it, and the ladder found no fit
    "gate after relief",  # the ladder said it fits, the gate still said no (expected never)
    "state slot",  # the gate said yes, alloc_state said no (expected never)
    "extend",  # the gate said yes, alloc_extend said no (expected never)
    "running cap",  # SGLang's mamba cap: its slots over a request's share (engines.Engine.running_cap)
)
# how the clock charges the allocator: its launches as a GPU runs it (default), as its CPU torch path dispatches
# them (both kvarena.sim.launches), or its measured CPU time
ALLOC_COSTS = ("gpu", "torch", "cpu")

# SGLang 0.5.23's decode reserve, its ``new_token_ratio`` (``NewTokenRatio``),
# at its defaults (sglang/srt/environ.py; schedule_conservativeness 1.0,
# sglang/srt/arg_groups/fields/schedule.py).
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: the floor is init times this
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode iterations from init to floor
SGLANG_RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS: tokens a retraction assumes each request decodes


class NewTokenRatio:
    """SGLang's ``new_token_ratio``: the share of the running requests'
    remaining output (``max_new_tokens`` less what each has decoded) that
    admission holds back (sglang/srt/managers/schedule_policy.py,
    ``PrefillAdder._get_running_request_total_token_offset``).  As
    sglang/srt/managers/scheduler_components/new_token_ratio_tracker.py
    keeps it: it starts at ``init`` (0.7 x schedule_conservativeness, at
    most 1), falls by ``(init - min) / decay_steps`` every decode iteration
    that retracts nothing, to ``min`` (``init x 0.14`` = 0.098: 600
    iterations), is set after a retraction to the estimate of the batch that
    remains, ``min(1, (tokens decoded + 20 x requests) / (max_new_tokens
    summed + 1))`` (``estimate_new_token_ratio_after_retract``, applied in
    sglang/srt/managers/scheduler.py's ``update_running_batch``), and goes
    back to ``init`` when the server is idle (scheduler.py, ``on_idle``).
    SGLang clips each request's remaining output at 4,096 tokens
    (``CLIP_MAX_NEW_TOKENS``); no generated trace's outputs reach it."""

    def __init__(
        self,
        init=SGLANG_INIT_NEW_TOKEN_RATIO,
        min_factor=SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
        decay_steps=SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
    ):
        self.init = min(init, 1.0)
        self.min = min(self.init * min_factor, 1.0)
        self.decay = (self.init - self.min) / decay_steps
        self.current = self.init

    def decay_step(self, iterations=1):
        """``iterations`` decode iterations that retracted nothing."""
        self.current = max(self.current - self.decay * iterations, self.min)

    def reset(self):
        self.current = self.init

    def after_retract(self, decoded_tokens, max_new_tokens, requests):
        """The estimate from the batch left after a retraction: its
        ``requests``, the tokens they decoded and their ``max_new_tokens``."""
        self.current = min(1.0, (decoded_tokens + SGLANG_RETRACT_DECODE_STEPS * requests) / (max_new_tokens + 1))


@dataclass(frozen=True)
class Config:
    chunk_tokens: int = 8192
    reserve_ratio: float | None = None  # the decode reserve held constant (None: SGLang's decaying NewTokenRatio)
    max_steps: int = 2_000_000
    record: bool = True  # keep per-step series (for the plot)
    accelerator: str = "h200"  # timing.ACCELERATORS
    alloc_cost: str = "gpu"  # ALLOC_COSTS: the allocator's launches on a GPU (default), on CPU torch, or its CPU time
    slo_ttft: float = 2.0  # seconds
    slo_itl: float = 0.05  # seconds, a request's mean inter-token latency
    prefix_cache: bool = False  # a radix-style prefix cache on every setup (kvarena.sim.prefix)
    mamba_strategy: str = "extra_buffer"  # SGLang's mamba checkpoints with the cache on (engines.MAMBA_STRATEGIES)
    enable_mixed_chunk: bool = False  # SGLang's flag: a prefill chunk rides a decode iteration (vLLM always mixes)

    def check(self):
        from kvarena.sim.engines import MAMBA_STRATEGIES

        if self.chunk_tokens < 1:
            raise ValueError(f"simulate: chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if self.reserve_ratio is not None and not 0 <= self.reserve_ratio <= 1:
            raise ValueError(f"simulate: reserve_ratio must be in [0, 1], got {self.reserve_ratio}")
        if not (self.slo_ttft > 0 and self.slo_itl > 0):
            raise ValueError(f"simulate: SLOs must be > 0, got ttft {self.slo_ttft}, itl {self.slo_itl}")
        if self.alloc_cost not in ALLOC_COSTS:
            raise ValueError(f"simulate: alloc_cost must be one of {', '.join(ALLOC_COSTS)}, got {self.alloc_cost!r}")
        if self.mamba_strategy not in MAMBA_STRATEGIES:
            raise ValueError(
                f"simulate: mamba_strategy must be one of {', '.join(MAMBA_STRATEGIES)}, got {self.mamba_strategy!r}"
            )


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
    capped_steps: int = 0  # steps in which the engine's running limit turned it away
    max_running: int = 0  # the engine's running limit (0: none)
    graph_batch: int = 0  # the engine's largest CUDA graph batch (0: none)
    eager_steps: int = 0  # steps whose decode batch no CUDA graph held
    mixed_chunk: bool = False  # prefill chunks rode decode iterations (False: passes of their own)
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
    blocked: dict = field(default_factory=dict)  # memory-bound steps by cause (BLOCK_CAUSES)
    seconds: float = 0.0  # the clock at the end: the trace's makespan
    output_tokens_per_s: float = 0.0
    tokens_per_s: float = 0.0  # prompt and output
    ttft_p50: float = 0.0
    ttft_p99: float = 0.0
    itl_p50: float = 0.0
    itl_p99: float = 0.0
    goodput: float = 0.0  # requests a second that met both SLOs
    slo_met: int = 0
    alloc_seconds: float = 0.0  # the allocator's time, all steps: its launches, or its measured CPU time
    launches: int = 0  # the allocator's kernel launches, all steps (alloc_cost "gpu" or "torch")
    copy_seconds: float = 0.0  # relocation at copy bandwidth, all steps
    prompt_tokens: int = 0  # prompt tokens of every admission (a retracted request's again)
    cache_hit_tokens: int = 0  # of those, tokens read from the prefix cache, not computed
    cache_hit_rate: float = 0.0
    cache_evictions: int = 0  # cache nodes freed or tombstoned under pressure
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
        "arrival",
        "block_tokens",
        "blocks",
        "branch",
        "ever_admitted",
        "first_token",
        "gaps",
        "generated",
        "ids",
        "last_token",
        "no_match",
        "out_units",
        "output_len",
        "path",
        "prefill_units",
        "prompt_len",
        "rid",
        "shared",
        "slot",
        "swa_done",
        "track",
        "track_slots",
    )

    def __init__(self, r, sizes):
        self.rid, self.prompt_len, self.output_len = r.rid, r.prompt_len, r.output_len
        self.arrival = r.arrival
        self.blocks, self.block_tokens = r.blocks, r.block_tokens
        self.path, self.shared = [], 0  # the prefix cache's locked match; its units (the first ids)
        self.no_match = False  # refused alone with its match held: it tries again without one
        self.prefill_units = sizes.units(r.prompt_len)
        self.out_units = sizes.units(r.output_len)
        self.generated = 0
        self.ids, self.slot, self.swa_done = [], None, 0
        self.track, self.track_slots, self.branch = None, [], None  # engines.Checkpoints: last snapshot (units)
        self.admitted = self.ever_admitted = False
        self.first_token = self.last_token = None  # seconds
        self.gaps = 0.0  # inter-token time summed: mean ITL = gaps / generated

    @property
    def decoding(self):
        return len(self.ids) >= self.prefill_units

    @property
    def own(self):
        """The ids this request holds itself (after its cached prefix)."""
        return self.ids[self.shared :]

    @property
    def owed(self):
        return self.out_units - self.generated

    @property
    def slots(self):
        """The state slots it holds: its own and its tracking slots."""
        return ([self.slot] if self.slot is not None else []) + self.track_slots


class _Sim:
    def __init__(self, backend, sizes, trace, cfg, setup, engine=None):
        from kvarena.sim import launches, timing

        cfg.check()
        self.max_running = engine.running_limit(sizes, getattr(backend, "full_units", None)) if engine else None
        graph = engine.graph_batch if engine else None
        self.new_token_ratio = None  # SGLang's decaying reserve ratio (None: held at reserve_ratio)
        if engine is not None and not engine.decode_reserve:
            self.reserve_ratio = 0.0  # vLLM holds none
        elif cfg.reserve_ratio is not None:
            self.reserve_ratio = cfg.reserve_ratio
        else:
            self.new_token_ratio = NewTokenRatio()
            self.reserve_ratio = self.new_token_ratio.current
        self.clock = timing.clock(
            sizes.preset.name,
            cfg.accelerator,
            sizes.page_tokens,
            sum(sizes.preset.layers),
            graph,
            prefill_graph=engine.prefill_graph if engine else None,
            chunk_tokens=cfg.chunk_tokens,
            mixed=cfg.enable_mixed_chunk or (engine is not None and engine.mixed_chunk),
        )
        counted = cfg.alloc_cost in launches.RULES
        self.b = launches.Counted(backend, cfg.alloc_cost) if counted else _Timed(backend)
        self.sizes, self.cfg = sizes, cfg
        self.pt = sizes.page_tokens
        self.window = sizes.preset.window
        self.chunk = sizes.units(cfg.chunk_tokens)
        self.budget = self.chunk * self.pt  # units a step: one chunk per decode iteration
        self.waiting = {}  # rid -> the requests that arrive once it finishes (later turns)
        for r in trace:
            if r.after >= 0:
                self.waiting.setdefault(r.after, []).append(r)
        self.arrivals = deque(sorted((r for r in trace if r.after < 0), key=lambda r: (r.arrival, r.rid)))
        self.ckpt = None  # engines.Checkpoints: where states are kept for the cache (None: at the whole length)
        if cfg.prefix_cache and engine is not None:
            layout = getattr(backend, "layout", None)
            self.ckpt = engine.checkpoints(sizes.preset, cfg.mamba_strategy, layout.block_tokens if layout else 0)
        self.track_slots = self.ckpt.track_slots if self.ckpt else 0
        self.cache, self.node_units = _cache(trace, sizes, backend, self.ckpt) if cfg.prefix_cache else (None, 0)
        self.queue = deque()
        self.running = []  # admission order: the evictor takes the last
        self.prefilling = deque()
        self.owed = 0  # output units the decoding requests still owe: the reserve's base
        self.res = Result(
            setup,
            requests=len(trace),
            max_running=self.max_running or 0,
            graph_batch=graph or 0,
            mixed_chunk=self.clock.mixed,
        )
        self.admitted_ids, self.finished_ids = set(), set()
        self.series = {"step": [], "concurrency": [], "utilisation": [], "bands": [], "prefill": []}
        self.conc_sum = self.conc_bound_sum = self.util_sum = 0.0
        self.blocked = None  # why this step's admission stopped for memory (a BLOCK_CAUSES entry)
        self.tokens = self.decode_tokens = 0
        self.peak_live = {}
        self.now = 0.0  # seconds
        self.ttft, self.itl = [], []  # seconds: one per request; one per decode step of a request
        self.step_kv = 0.0  # bytes of KV and state one iteration of this step reads
        self.step_decoded, self.step_first = [], []  # requests that decoded / finished prefill this step
        self.step_prefill = 0  # prefill tokens this step
        self.step_released = []  # later turns released this step
        self.moved_before = 0
        self.done_reqs = []

    # ------------------------------------------------------------ the loop

    def run(self):
        step = 0
        while self.arrivals or self.queue or self.running:
            if not self.queue and not self.running and self.arrivals[0].arrival > self.now:
                self.now = self.arrivals[0].arrival  # an empty system: skip the idle time
            while self.arrivals and self.arrivals[0].arrival <= self.now:
                self.queue.append(_Req(self.arrivals.popleft(), self.sizes))
            self._decode()
            self._window()
            self.blocked, self.capped = None, False
            self._admit()
            self._tick()
            self._record(step)
            step += 1
            self.res.steps += 1
            if self.res.steps > self.cfg.max_steps:
                raise RuntimeError(f"simulate: {self.res.setup}: no end after {self.cfg.max_steps} steps")
        return self._result()

    def _tick(self):
        """Advance the clock by this step's time; stamp its tokens."""
        moved = self.b.moved_bytes
        copy = self.clock.copy_seconds((moved - self.moved_before) * self.sizes.byte_scale)
        self.moved_before = moved
        if self.cfg.alloc_cost != "cpu":  # counted launches (launches.RULES)
            n = self.b.take_launches()
            self.res.launches += n
            alloc = self.clock.launch_seconds(n)
        else:
            alloc = self.b.take_seconds()
        t = self.clock.step_seconds(len(self.step_decoded), self.step_prefill, self.step_kv) + copy + alloc
        if self.clock.eager_seconds(len(self.step_decoded)):
            self.res.eager_steps += 1
        self.res.copy_seconds += copy
        self.res.alloc_seconds += alloc
        self.now += t
        pt = self.sizes.page_tokens
        for r in self.step_decoded:
            gap = (self.now - r.last_token) / pt  # the step's tokens share the time since the last
            self.itl.append(gap)
            r.gaps += gap * pt
            r.last_token = self.now
        for r in self.step_first:
            if r.first_token is None:  # a retracted request recomputed keeps its first, and its gap runs on
                r.first_token = r.last_token = self.now
                self.ttft.append(self.now - r.arrival)
        if self.cfg.record:
            self.series["prefill"].append(self.step_prefill)
        self.step_decoded, self.step_first = [], []
        self.step_kv, self.step_prefill = 0.0, 0
        for f in self.step_released:  # later turns whose earlier one finished this step
            t = max(f.arrival, self.now)
            at = bisect.bisect_right(self.arrivals, (t, f.rid), key=lambda q: (q.arrival, q.rid))
            self.arrivals.insert(at, dataclasses.replace(f, arrival=t))
        self.step_released = []

    def _record(self, step):
        """End of a step: the requests admitted (they decode next step)."""
        n = len(self.running)
        util = self.b.live_bytes() / self.sizes.total
        self.conc_sum += n
        if self.capped:
            self.res.capped_steps += 1
        if self.blocked:
            self.res.memory_bound_steps += 1
            self.res.blocked[self.blocked] = self.res.blocked.get(self.blocked, 0) + 1
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
        idle, retractions = not self.running, self.res.retractions
        stalled = False
        while batch:
            ids = self.b.decode([len(r.ids) + 1 for r in batch], [r.ids[-1] for r in batch])
            if ids is not None:
                break
            if self._evict_cache(len(batch)):  # the cache yields first
                continue
            if stalled:  # a backend whose relief says yes to a decode it then refuses: fail, do not spin
                raise RuntimeError(f"simulate: {self.res.setup}: relief retracted nothing and the decode still fails")
            self._refused(len(batch), 0, None)
            self.res.evictions += 1
            before = self.res.retractions
            self.b.relieve(len(batch), 0, evict=self._evict)
            stalled = self.res.retractions == before
            batch = [r for r in batch if r.admitted]
        self._decay_reserve(batch, self.res.retractions > retractions, idle)
        if not batch:
            return
        p, pt = self.sizes.preset, self.pt
        grid = self.ckpt.decode_grid // pt if self.ckpt else 0
        for r, i in zip(batch, ids):
            r.ids.append(i)
            r.generated += 1
            if grid and len(r.ids) % grid == 0:
                r.track = len(r.ids)  # a decode snapshot: SGLang every mamba_track_interval tokens
            ctx = len(r.ids) * pt
            self.step_kv += ctx * p.full_bytes + min(ctx, p.window + 1) * p.swa_bytes + 2 * p.state_bytes
        self.step_decoded += batch
        self.owed -= len(batch)
        self.decode_tokens += len(batch) * self.pt
        done = [r for r in batch if r.generated >= r.out_units]
        if done:
            keep = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in keep]
            if self.cache is None:
                self.b.release([i for r in done for i in r.ids], [s for r in done for s in r.slots])
            for r in done:
                if self.cache is not None:
                    self._insert(r)
                r.admitted = False
                self.done_reqs.append(r)
                self.res.finished += 1
                self.finished_ids.add(r.rid)
                self.tokens += r.prompt_len + r.output_len
                self._follow(r.rid, True)

    def _decay_reserve(self, batch, retracted, idle):
        """SGLang's reserve ratio after this step's retractions, before its
        ``page_tokens`` decode iterations (``NewTokenRatio``): back to its
        start after an idle spell (nothing ran since the last step); after
        a retraction, the estimate from the batch that remains (its tokens
        decoded so far, none of this step's), then ``page_tokens - 1``
        iterations of decay; else ``page_tokens`` of them.  A batch that
        retraction emptied leaves it as it was."""
        t = self.new_token_ratio
        if t is None:
            return
        if idle:
            t.reset()
        elif retracted and batch:
            pt = self.pt
            t.after_retract(sum(r.generated for r in batch) * pt, sum(r.out_units for r in batch) * pt, len(batch))
            t.decay_step(pt - 1)
        elif batch:
            t.decay_step(self.pt)
        self.reserve_ratio = t.current

    # --------------------------------------------------------- prefix cache

    def _free(self, freed):
        """Free what the cache handed back: ``(ids, window_ids, slots)``."""
        ids, window, slots = freed
        if window:
            self.b.free_window(window)
        if ids or slots:
            self.b.release(ids, slots)

    def _keys(self, r):
        """``r``'s cache keys, one a node: its trace blocks, each split into
        nodes of ``node_units``, then keys of its own past them (its output's
        KV is cached too, and no later request shares it)."""
        per = r.block_tokens // (self.node_units * self.pt) if r.blocks else 0
        keys = [(b, j) for b in r.blocks for j in range(per)] if per > 1 else list(r.blocks)
        return keys + [("own", r.rid, j) for j in range(len(keys), len(r.ids) // self.node_units)]

    def _insert(self, r):
        """A finished ``r`` into the cache: with checkpoints at a grid, its KV
        up to its last snapshot and the state there (none taken: nothing
        past its match); else all its KV and the state at its whole length."""
        if self.ckpt:
            at = r.track if r.track is not None else r.shared
            until = at
        else:
            at = len(r.ids) if self.b.has_state else None
            until = None
        release, window, slots = self.cache.insert(r.path, self._keys(r), r.ids, r.swa_done, r.slot, at, until)
        self._free((release, window, slots + r.track_slots))

    def _evict_cache(self, units=0, slots=0):
        """Free the cache's least recently used nodes, in one batch of frees
        (SGLang's ``evict(num_tokens)``): at least one, and enough to cover
        the bytes a demand of ``units`` and ``slots`` lacks; False when none
        can go."""
        if self.cache is None:
            return False
        lack = self.b.demand_bytes(units, slots) - self.b.free_bytes() if units or slots else 0
        ids, window, got = [], [], []
        while True:
            freed = self.cache.evict_one()
            if freed is None:
                break
            self.res.cache_evictions += 1
            ids += freed[0]
            window += freed[1]
            got += freed[2]
            lack -= self.b.demand_bytes(len(freed[0]), len(freed[2]))
            if lack <= 0:
                break
        if not (ids or window or got):
            return False
        self._free((ids, window, got))
        return True

    def _match(self, r):
        """Lock ``r``'s longest resumable cached prefix; it becomes ``r``'s first ids."""
        if self.cache is None or not r.blocks or r.no_match:
            return
        keys = self._keys(r)
        r.path = self.cache.match(keys, r.prefill_units - 1)
        self.cache.lock(r.path)
        r.ids = [i for n in r.path for i in n.ids]
        r.shared = r.swa_done = len(r.ids)
        if self.ckpt:  # the KV reaches past the checkpoint: the prefill snapshots at the branch point
            g = self.ckpt.prefill_grid // self.pt
            b = self.cache.kv_depth(keys, r.prefill_units - 1) // g * g
            r.branch = b if b > r.shared else None

    def _unmatch(self, r):
        """Drop ``r``'s hold on the cache (it releases its own ids itself)."""
        if r.path:
            self.cache.unlock(r.path)
        r.path, r.shared = [], 0

    def _follow(self, rid, finished):
        """Request ``rid`` is done: its later turns arrive now (or, if it did
        not finish, never: they count as rejected)."""
        for f in self.waiting.pop(rid, ()):
            if finished:
                self.step_released.append(f)  # arrives at the end of this step (_tick)
            else:
                self.res.rejected += 1
                self._follow(f.rid, False)

    def _evict(self, shortfall):
        """Retract the newest admitted request; units freed (0: none left)."""
        if not self.running:
            return 0
        r = self.running.pop()
        if r in self.prefilling:
            self.prefilling.remove(r)
        self.b.release(r.own, r.slots)
        freed = len(r.own)
        self._unmatch(r)
        self.res.retractions += 1
        self.res.recomputed_tokens += freed * self.pt
        if r.decoding:
            self.owed -= r.owed
        r.prefill_units = self.sizes.units(r.prompt_len) + r.generated  # prompt and output so far, recomputed
        r.ids, r.slot, r.swa_done, r.admitted = [], None, 0, False
        r.track, r.track_slots, r.branch = None, [], None
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
        out = r.ids[r.swa_done : end]  # swa_done starts past a cached prefix: the cache owns that SWA
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
        return total, swa, 1 + self.track_slots if self.b.has_state else 0

    def _refused(self, units, slots, cause):
        """Count a refusal; ``cause`` (admission only) marks the step
        memory-bound under that name."""
        self.blocked = cause or self.blocked
        self.res.refusals += 1
        if self.b.free_bytes() >= self.b.demand_bytes(units, slots) + self.b.slack_bytes:
            self.res.false_oom += 1

    def _admit(self):
        budget = self.budget
        if self.clock.mixed:  # the decodes take their share of each chunk's budget
            budget = max(budget - sum(r.decoding for r in self.running), 0)
        while budget > 0:
            r = self.prefilling[0] if self.prefilling else (self.queue[0] if self.queue else None)
            if r is None:
                return
            first = not r.admitted
            if first and not self.b.fits_empty(*self._footprint(r)):
                self.queue.popleft()
                self.res.rejected += 1
                self._follow(r.rid, False)
                continue
            cap = getattr(self.b, "max_running", None)
            if first and cap is not None and len(self.running) >= cap:
                self.blocked = "running cap"
                return
            if first and self.max_running is not None and len(self.running) >= self.max_running:
                self.capped = True  # the engine's limit, not memory
                return
            if first:
                self._match(r)
            n = min(self.chunk, r.prefill_units - len(r.ids), budget)
            slots = 1 + self.track_slots if first and self.b.has_state else 0
            reserve = math.ceil(self.reserve_ratio * self.owed)
            while not self.b.admits(n, slots, reserve) and self._evict_cache(n + reserve, slots):
                pass  # the cache yields before any relief
            if not self.b.admits(n, slots, reserve):
                # The ladder only when the free bytes could cover the demand:
                # otherwise no placement fits it, and a flush would move data in vain.
                could = self.b.free_bytes() >= self.b.demand_bytes(n + reserve, slots)
                if not could:
                    cause = "full"
                elif not self.b.relieve(n, slots, reserve=reserve):
                    cause = "ladder"
                elif not self.b.admits(n, slots, reserve):
                    cause = "gate after relief"
                else:
                    cause = None
                if cause:
                    self._refused(n + reserve, slots, cause)
                    self._stuck_check(r, first)
                    return
            got = []
            for _ in range(slots):
                s = self.b.alloc_state()
                if s is None:
                    break
                got.append(s)
            if len(got) < slots:
                if got:
                    self.b.release([], got)
                self._refused(n, slots, "state slot")
                self._stuck_check(r, first)
                return
            ids = self.b.extend(len(r.ids), n, r.ids[-1] if r.ids else -1, own=len(r.own))
            if ids is None:
                self._refused(n, slots, "extend")
                if got:
                    self.b.release([], got)
                self._stuck_check(r, first)
                return
            if first:
                self.res.cache_hit_tokens += r.shared * self.pt
                self.res.prompt_tokens += r.prefill_units * self.pt
                self.queue.popleft()
                r.admitted = r.ever_admitted = True
                r.slot, r.track_slots = (got[0], got[1:]) if got else (None, [])
                self.admitted_ids.add(r.rid)
                self.running.append(r)
                self.prefilling.append(r)
            start = len(r.ids)
            r.ids += ids
            if self.ckpt:  # a prefill snapshot: at the branch point, else the chunk's last grid multiple
                g = self.ckpt.prefill_grid // self.pt
                if r.branch is not None and start < r.branch <= len(r.ids):
                    r.track = r.branch
                elif len(r.ids) // g * g > start:
                    r.track = len(r.ids) // g * g
            budget -= n
            self.step_prefill += n * self.pt
            if r.decoding:
                self.prefilling.popleft()
                self.owed += r.owed
                self.step_first.append(r)  # its first token comes out of this step's last chunk
            self.b.free_window(self._window_ids(r))  # chunked prefill frees SWA between chunks

    def _stuck_check(self, r, first):
        """Nothing else runs and ``r`` is still refused: nothing will
        change, so drop it (counted as stuck; the run would never end)."""
        if any(o is not r for o in self.running):
            if first:
                self._unmatch(r)  # it matches again when next tried
                r.ids = []
            return
        if first and r.path:  # alone, and its own match may be in the way: once more without one
            self._unmatch(r)
            r.ids, r.no_match = [], True
            return
        if first:
            self.queue.popleft()
        else:
            self.running.remove(r)
            self.prefilling.remove(r)
            self.b.release(r.own, r.slots)
            r.admitted = False
        self._unmatch(r)
        r.ids = []
        self.res.stuck += 1
        self._follow(r.rid, False)

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
        res.seconds = self.now
        if self.now > 0:
            res.output_tokens_per_s = sum(r.output_len for r in self.done_reqs) / self.now
            res.tokens_per_s = self.tokens / self.now
        res.ttft_p50, res.ttft_p99 = _quantile(self.ttft, 0.5), _quantile(self.ttft, 0.99)
        res.itl_p50, res.itl_p99 = _quantile(self.itl, 0.5), _quantile(self.itl, 0.99)
        cfg = self.cfg
        res.slo_met = sum(
            1
            for r in self.done_reqs
            if r.first_token - r.arrival <= cfg.slo_ttft and r.gaps / max(1, r.generated * self.pt) <= cfg.slo_itl
        )
        res.goodput = res.slo_met / self.now if self.now > 0 else 0.0
        res.cache_hit_rate = res.cache_hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
        return res


def _cache(trace, sizes, backend, ckpt=None):
    """The run's prefix cache and its node in units: the trace's block on a
    model without state; else fine enough to hold a state where the
    engine keeps one (``ckpt``'s grids; None: at any page)."""
    from kvarena.sim import prefix

    sizes_seen = {r.block_tokens for r in trace if r.blocks}
    if len(sizes_seen) > 1:
        raise ValueError(f"simulate: one prefix block size a trace, got {sorted(sizes_seen)}")
    bt = sizes_seen.pop() if sizes_seen else sizes.page_tokens
    if bt % sizes.page_tokens:
        raise ValueError(f"simulate: prefix blocks of {bt} tokens are not whole pages of {sizes.page_tokens}")
    need = -(-sizes.preset.window // sizes.page_tokens)  # the units a resumed request attends over in SWA
    node = bt
    if backend.has_state:
        node = math.gcd(bt, ckpt.prefill_grid, ckpt.decode_grid) if ckpt else sizes.page_tokens
    if node % sizes.page_tokens:
        raise ValueError(f"simulate: checkpoints every {node} tokens are not whole pages of {sizes.page_tokens}")
    units = node // sizes.page_tokens
    return prefix.PrefixCache(units, need, backend.has_swa, backend.has_state), units


def _quantile(xs, q):
    """The ``q`` quantile of ``xs`` (nearest rank; 0.0 for none)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class _Timed:
    """A backend whose allocator calls are timed (``perf_counter``): the
    views, gates, allocations, frees and the ladder; not the simulator's own
    byte bookkeeping (``live_bytes``, ``free_bytes``, ...)."""

    CALLS = frozenset(("available", "admits", "alloc_state", "extend", "decode", "free_window", "release", "relieve"))

    def __init__(self, backend):
        self._b = backend
        self._seconds = 0.0

    def take_seconds(self):
        """The CPU time since the last call."""
        s, self._seconds = self._seconds, 0.0
        return s

    def __getattr__(self, name):
        attr = getattr(self._b, name)
        if name not in self.CALLS:
            return attr

        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return attr(*args, **kw)
            finally:
                self._seconds += time.perf_counter() - t

        return timed


def run(backend, sizes, trace, cfg=Config(), setup="?", engine=None):
    """Serve ``trace`` on ``backend`` with ``engine``'s limits
    (``kvarena.sim.engines``; None: no running or graph limit, and the
    reserve of ``cfg``); a ``Result``."""
    return _Sim(backend, sizes, trace, cfg, setup, engine).run()
