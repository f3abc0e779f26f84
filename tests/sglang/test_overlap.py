"""Overlap scheduling, SGLang's default, on SGLang's own stacks on the CPU
(issue 40 item 4; docs/design.md §12).

SGLang launches batch N's forward and prepares batch N+1 while it runs; after
each launch its scheduler calls ``set_latest_forward_done_event(ev)`` and
``set_inflight_forward(ev, out_cache_loc)``.  A CPU cannot run a forward late
(``torch.cpu.Event`` is always done), so ``kvarena.sglang.overlap.Device``
injects that timing: a forward translates its write rows on the forward
stream when it is launched (through the allocator's ``translate_write_loc``,
as SGLang's forward does) and writes there only when it is waited on (the
scheduler processing its result, or the schedule stream's ``wait_event`` in
an allocator's settle); in between, the scheduler's next-batch work runs.
When a forward lands, every row it read must still hold what it read, and
every token it wrote must read back at its current translation; after every
step every live token does.

Two drivers, both in SGLang's call order (``flush_opportunistic`` only at an
overlap-off boundary, nothing in flight, and once idle):

- the byte-checked workload (``kvarena.sglang.workload`` with
  ``overlap=True``): admissions, allocations that relieve, window frees,
  finishes of requests in and out of the batch in flight, on every stack,
  lazy and eager, at page sizes 1, 4 and 16, under both policies;
- ``Server`` below: SGLang's own event loop pieces (``ScheduleBatch``'s
  ``prepare_for_extend``/``prepare_for_decode``, ``check_decode_mem``,
  ``retract_decode``, ``release_kv_cache`` into ``UnifiedRadixCache``, which
  frees through its own calls, the scheduler's own
  ``is_disable_overlap_for_batch``) in ``event_loop_overlap``'s order.

Each driver runs SGLang's own allocator too (its hooks honoured: nothing
lost; ignored: it loses writes), and planted kvarenas lose writes: the
harness can fail.  The composite's non-urgent flush while a forward runs is
a feature of the spec, not a call SGLang makes; it is tested apart
(``compact_in_flight``).  The hooks' unit tests use real ``torch.cpu``
events where a forward is done, and the Device's only where one is still
running.
"""

from array import array
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from kvarena import sglang as ks
from kvarena.anchor.loader import import_sglang
from kvarena.sglang import allocators, dropin, forwards, overlap, stacks, surface, workload
from tests.impl.test_host_sync import _poison
from tests.sglang import test_host_sync
from tests.sglang.test_scheduler import BIG, _free_state_slots, _mods, _state_of, budget

GEOMETRY = stacks.Geometry(full_layers=(0,), swa_layers=(1,), mamba_layers=(2,), head_num=1)
HOOKS = ("set_latest_forward_done_event", "set_inflight_forward")


def _geometry(ps: int) -> stacks.Geometry:
    """Small pools that run full and relocate: 64 tokens and a window of 8
    at page size 1, 24 pages at 4, 16 pages at 16."""
    return replace(GEOMETRY, tokens={1: 64, 4: 24, 16: 16}[ps], window=8 if ps == 1 else GEOMETRY.window)


def _ignore_hooks(monkeypatch, classes) -> None:
    """The planted bug: the two hooks do nothing (the event is ignored)."""
    for cls in classes:
        for hook in HOOKS:
            monkeypatch.setattr(cls, hook, lambda self, *args: None)


def _sglang_classes():
    mods = [import_sglang(f"sglang.srt.mem_cache.allocator.{m}") for m in ("unified_hybrid_swa", "unified_mamba")]
    sub = import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
    return [getattr(m, n) for m in mods for n in dir(m) if n.startswith("Unified") and n.endswith("Allocator")] + [
        sub.MultiEndedAllocator
    ]


# --------------------------------------------------------- the workload

# (stack, page size, lazy, policy): every stack, page size and mode once; the
# policies alternate so that each stack, page size and mode meets both
CASES = [
    (kind, ps, lazy, ("planner", "anchor")[(k + j + lazy) % 2])
    for k, kind in enumerate(stacks.KINDS)
    for j, ps in enumerate((1, 4, 16))
    for lazy in (True, False)
]
STEPS = 24


def _run(kind: str, ps: int, lazy: bool, steps: int = STEPS, **kw) -> workload.Report:
    return workload.run(kind, steps, ps, lazy, seed=1, geometry=_geometry(ps), overlap=True, **kw)


def _lost(r: workload.Report) -> int:
    return r.inflight_lost + r.reads_corrupted


@pytest.mark.parametrize(("kind", "ps", "lazy", "policy"), CASES)
def test_kvarena_keeps_every_in_flight_write(kind, ps, lazy, policy):
    ks.install(policy)
    r = _run(kind, ps, lazy)
    assert r.ok and _lost(r) == 0, r.errors[:3]
    assert r.forwards == STEPS and r.inflight_writes > 100 and r.reads_checked > 1000
    assert r.refused > 0 and r.waits > 0  # the pool ran full, and the ladder waited for a forward
    assert sum(r.pages_moved.values()) > 0  # pages moved while a forward ran
    assert r.idle_audits >= 1  # it went idle (at the end at least), and audited


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_the_composites_non_urgent_flush_skips_what_a_forward_holds(kind, monkeypatch):
    """Not SGLang's call order: the composite's ``flush_opportunistic`` (the
    spec's non-urgent flush; the drop-in's returns 0) every step while the
    forward runs.  The walk stops at pinned pages and leaves the pages it
    vacates pending; no write is lost, no read corrupted.  (On the mamba
    stack every live state slot is pinned and the batch's full pages face
    the frontier, so the walk rarely gets to move a page there.)"""
    seen = {"pinned": 0, "pending": 0}
    real = workload.Workload._compact

    def count(self):  # what the flush left, the forward still running
        real(self)
        arena = self.alloc.composite.arena
        for name in self.alloc.CHAIN:
            seen["pinned"] += int(arena.pinned(name).numel())
            seen["pending"] += int(arena.pending(name).numel())

    monkeypatch.setattr(workload.Workload, "_compact", count)
    ks.install()
    r = _run(kind, 4, True, compact_in_flight=True)
    assert r.ok and _lost(r) == 0, r.errors[:3]
    assert seen["pinned"] > 0 and seen["pending"] > 0, seen


def _no_wait(monkeypatch) -> None:
    monkeypatch.setattr(dropin._Dropin, "_wait_forward_done", lambda self: None)


def _wait_on_the_forward_stream(monkeypatch) -> None:
    """The drop-in's waits issued on the forward stream, not the schedule
    stream it works on: a GPU orders nothing by them (the forward stream is
    in order already), and neither does the harness."""
    monkeypatch.setattr(dropin._Dropin, "_current_stream", lambda self: self.forward_stream)


def _state_unpinned(monkeypatch) -> None:
    """SGLang's None for the mamba pool taken as "writes no slot"."""
    real = dropin._Dropin._take_forward

    def take(self):
        c = self._composite
        launch = c.launch
        c.launch = lambda toks, state_slots=None, check=True: launch(toks, state_slots=[], check=check)
        try:
            real(self)
        finally:
            del c.launch

    monkeypatch.setattr(dropin._Dropin, "_take_forward", take)


PLANTS = {
    "ignore-the-event": lambda mp: _ignore_hooks(mp, allocators.ALLOCATORS),  # the hooks do nothing
    "settle-without-wait": _no_wait,  # the guards lift, the stream never waits on the forward
    "wait-on-the-forward-stream": _wait_on_the_forward_stream,  # a wait that orders nothing
    "state-unpinned": _state_unpinned,  # the state slots a forward writes move under it
}


@pytest.mark.parametrize(
    ("plant", "kind", "lazy"),
    [("ignore-the-event", kind, True) for kind in stacks.KINDS]
    + [("settle-without-wait", "swa", True), ("wait-on-the-forward-stream", "mamba", False)],
)
def test_a_planted_bug_loses_writes(plant, kind, lazy, monkeypatch):
    """Each plant in kvarena's hooks makes the same harness, in SGLang's
    call order, lose writes (or corrupt a read): it can fail."""
    PLANTS[plant](monkeypatch)
    ks.install()
    r = _run(kind, 4, lazy)
    assert not r.ok and _lost(r) > 0, (r.inflight_lost, r.reads_corrupted)


def test_unpinned_state_loses_writes_under_the_composites_non_urgent_flush(monkeypatch):
    """The state slots matter to the non-urgent flush only (an urgent move
    settles first), so this plant is caught by the composite's flush while
    the forward runs, a call SGLang never makes (the drop-in's is 0); in
    SGLang's call order the same run keeps every write."""
    PLANTS["state-unpinned"](monkeypatch)
    ks.install()
    assert _lost(_run("mamba_swa", 4, True)) == 0
    r = _run("mamba_swa", 4, True, compact_in_flight=True)
    assert not r.ok and _lost(r) > 0, (r.inflight_lost, r.reads_corrupted)


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("honoured", [True, False], ids=["hooks", "ignored"])
def test_sglang_own_allocator_in_the_same_harness(kind, honoured, monkeypatch):
    """SGLang's allocator with its hooks honoured loses nothing in its own
    scheduler's call order (``flush_opportunistic`` at an overlap-off
    boundary, nothing in flight); with them ignored it loses writes: the
    harness tells them apart."""
    if not honoured:
        _ignore_hooks(monkeypatch, _sglang_classes())
    with stacks.cpu_kernels():
        r = _run(kind, 4, True)
    assert (_lost(r) == 0) == honoured, (r.inflight_lost, r.reads_corrupted, r.errors[:3])
    assert r.ok == honoured and (r.forwards == STEPS or not honoured)


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_sglang_own_non_urgent_flush_in_flight_loses_writes(kind):
    """docs/findings.md, the anchor's bug 7 (``flush-opportunistic-in-flight``): SGLang's allocator,
    hooks honoured, loses in-flight writes or corrupts reads on every stack
    when its ``flush_opportunistic`` runs while a forward is in flight (its
    own scheduler calls it only with nothing in flight, so this is its
    allocator's contract, not its server's path); kvarena's composite flush
    keeps them (``test_the_composites_non_urgent_flush_skips_what_a_forward_holds``)."""
    with stacks.cpu_kernels():
        r = _run(kind, 4, True, compact_in_flight=True)
    assert _lost(r) > 0 and not r.ok, (r.inflight_lost, r.reads_corrupted)


# ------------------------------------------------- SGLang's own event loop


class Server:
    """SGLang's ``event_loop_overlap`` over one stack.  Each step picks the
    next batch (a prefill round with the radix cache while requests wait and
    fit, as SGLang tries prefill first; else a decode step with
    ``check_decode_mem`` and ``retract_decode``); at an overlap-off boundary
    (the scheduler's own ``is_disable_overlap_for_batch``; two prefills in a
    row with ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``) it processes the
    last result and calls ``flush_opportunistic`` first; it launches the
    batch as a forward; then it processes the last batch's result (finished
    requests released into ``UnifiedRadixCache``, which frees through its
    own calls), or, with no batch and none before it, goes idle
    (``on_idle``: ``flush_opportunistic`` and the pool audit once nothing is
    left).  Tokens are written by the forwards only."""

    def __init__(self, kind: str, ps: int, lazy: bool, policy: str | None) -> None:
        m = self.m = _mods()
        self.kind, self.ps = kind, ps
        self.scheduler = import_sglang("sglang.srt.managers.scheduler").Scheduler
        tokens = 48 if ps == 1 else 16 if kind == "mamba" else 20  # full, and relocating in every case
        g = self.g = replace(GEOMETRY, tokens=tokens, max_reqs=6, mamba_slots=12)
        self.gpu = overlap.Device()
        if policy is not None:
            ks.install(policy)
        try:
            self.bundle = stacks.build(kind, g, ps, lazy, forward_stream=self.gpu.forward_stream)
        finally:
            ks.uninstall()
        self.alloc, self.kv = self.bundle.token_to_kv_pool_allocator, self.bundle.token_to_kv_pool
        self.has_swa, self.has_state = kind != "mamba", kind != "swa"
        if self.has_state:
            self.rtp = self.bundle.req_to_token_pool
        else:
            self.rtp = m.mp.ReqToTokenPool(
                size=g.max_reqs, max_context_len=g.context_len * ps, device="cpu", enable_memory_saver=False
            )
        self.tree_state = self.has_state and ps == 1  # SGLang's MAMBA tree component needs page size 1
        ct = m.comp.ComponentType
        components = (ct.FULL,) + ((ct.SWA,) if self.has_swa else ()) + ((ct.MAMBA,) if self.tree_state else ())
        self.cache = m.urc.UnifiedRadixCache(
            m.cip.CacheInitParams(
                disable=False,
                req_to_token_pool=self.rtp,
                token_to_kv_pool_allocator=self.alloc,
                page_size=ps,
                sliding_window_size=g.window if self.has_swa else None,
                tree_components=components,
            )
        )
        self.model = SimpleNamespace(vocab_size=1000, is_encoder_decoder=False, context_len=g.context_len * ps)
        self.waiting: list = []
        self.running = None
        self.gen: dict[int, int] = {}  # token id -> times handed out
        self.landed: set[int] = set()  # token ids whose current bytes are written
        self.version: dict[str, int] = {}  # request -> its state's version written, and launched
        self.launched: dict[str, int] = {}
        self.results: list = []  # the scheduler's result queue: (event, batch, requests) of each forward in flight
        self.last_batch = None
        self.idle = False  # on_idle found nothing left
        self.stats = {"written": 0, "lost": 0, "finished": 0, "retracted": 0, "evictions": 0, "window frees": 0}
        self.stats |= {"boundaries": 0, "idle audits": 0, "idle in flight": 0}
        for method, key in (("evict", "evictions"), ("evict_for_alloc", "evictions")):
            setattr(self.cache, method, self._counted(key, getattr(self.cache, method)))
        swa_free = getattr(self.alloc, "free_swa_segment", None)
        if swa_free is not None:  # the tree's and the scheduler's window frees
            self.alloc.free_swa_segment = self._counted("window frees", swa_free)

    @property
    def last(self):
        """``(event, batch, requests)`` of the forward launched last, while in flight."""
        return self.results[-1] if self.results else None

    def _counted(self, key: str, method):
        def call(*args, **kwargs):
            self.stats[key] += 1
            return method(*args, **kwargs)

        return call

    # ------------------------------------------------------------ bytes

    def _layers(self) -> list[tuple[int, bool]]:
        return [(layer, False) for layer in self.g.full_layers] + (
            [(layer, True) for layer in self.g.swa_layers] if self.has_swa else []
        )

    def _kv(
        self, ids: list[int], write: bool = False
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool]]:
        """``(buffer, rows, values, held, swa)`` per layer and K/V: the
        tokens' rows now (``write``: as a forward translates its write slots,
        ``translate_write_loc``), the values their generation should hold,
        which of them the layer holds (SWA: those with an SWA entry), and
        whether it is an SWA layer."""
        t = torch.tensor(ids, dtype=torch.int64)
        gens = torch.tensor([self.gen.get(v, 0) % 64 for v in ids], dtype=torch.int64)
        full = self.alloc.translate_write_loc if write else self.alloc.translate_kv_loc
        out = []
        for layer, swa in self._layers():
            rows = self.alloc.translate_loc_from_full_to_swa(t) if swa else full(t)
            for part, buf in enumerate((self.kv.get_key_buffer(layer), self.kv.get_value_buffer(layer))):
                want = workload._value(t, layer, part, buf[0].numel(), buf.dtype, gens).view(-1, *buf.shape[1:])
                out.append((buf, rows, want, rows > 0, swa))
        return out

    def _bad(self, ids: list[int]) -> set[int]:
        """The tokens (still allocated) not at their current translation."""
        if ids:  # those still allocated
            pages = torch.div(torch.tensor(ids, dtype=torch.int64), self.ps, rounding_mode="floor")
            kept = (self.alloc.full_attn_allocator.virtual_to_physical[pages] > 0).tolist()
            ids = [t for t, k in zip(ids, kept) if k]
        bad: set[int] = set()
        if ids:
            for buf, rows, want, held, _ in self._kv(ids):
                wrong = (buf[rows] != want).reshape(len(ids), -1).any(dim=1) & held
                bad.update(t for t, w in zip(ids, wrong.tolist()) if w)
        return bad

    def _state(self, slot: int, version: int):
        phys = self.rtp.mamba_allocator.translate(torch.tensor([slot]))
        cache = self.rtp.mamba_pool.mamba_cache
        out = []
        for i, buf in [(i, c) for i, c in enumerate(cache.conv)] + [(-1, cache.temporal)]:
            like = buf[:, phys]
            ramp = torch.arange(like.numel()) % 97
            want = ((slot * 10 + i + ramp + 7 * version) % 251).view(like.shape).to(like.dtype)
            out.append((buf.movedim(1, 0), phys, want.movedim(1, 0)))
        return out

    def check(self) -> int:
        """Tokens and state slots not where they should be, now."""
        bad = len(self._bad(sorted(self.landed)))
        for r in self._holding():
            v = self.version.get(r.rid, 0)
            if v and any(bool((b[rows] != want).any()) for b, rows, want in self._state(r.slot, v)):
                bad += 1
        return bad

    def _holding(self) -> list:
        """Running requests that hold a state slot the script tracks."""
        reqs = [] if self.running is None else self.running.reqs
        return [r for r in reqs if self.has_state and r.kv.holds_kv and r.kv.mamba_pool_idx is not None]

    # ------------------------------------------------------------ forwards

    def launch(self, batch) -> None:
        """``run_batch``: the batch's forward, which translates on the forward
        stream at launch its writes at ``out_cache_loc`` and its requests'
        state slots, and its reads (every other token of its requests and
        their state); then SGLang's two hooks, and the result queued."""
        loc = batch.out_cache_loc.tolist()
        ps, new = self.ps, set(loc)
        for t in loc:
            self.gen[t] = self.gen.get(t, 0) + 1
            self.landed.difference_update(range(t, (t // ps + 1) * ps))  # a page's later slots: stale
            for u in range(t + 1, (t // ps + 1) * ps):
                if u in self.gen and u not in new:  # a forward in flight writes the page's earlier life there:
                    self.gen[u] += 1  # not checked when it lands
        written = [(t, self.gen[t]) for t in loc]
        states = []
        for r in batch.reqs:
            if self.has_state and r.kv.mamba_pool_idx is not None:
                if getattr(r, "slot", None) != int(r.kv.mamba_pool_idx):  # a new slot (admitted again): unwritten
                    r.slot, self.version[r.rid] = int(r.kv.mamba_pool_idx), 0
                self.launched[r.rid] = v = self.launched.get(r.rid, 0) + 1
                states.append((r, r.slot, v))

        def work():
            writes = [(buf, rows, want) for buf, rows, want, *_ in self._kv(loc, write=True)]
            for _, slot, v in states:
                writes += self._state(slot, v)
            return writes, self._reads(batch, set(loc))

        def land():
            mine = [t for t, g in written if self.gen.get(t) == g]
            self.landed.update(mine)
            lost = len(self._bad(mine))
            for r, slot, v in states:
                if r.kv.holds_kv and getattr(r, "slot", None) == slot:
                    self.version[r.rid] = v
                    lost += any(bool((b[rows] != w).any()) for b, rows, w in self._state(slot, v))
            self.stats["written"] += len(mine) + len(states)
            self.stats["lost"] += lost

        ev = self.gpu.launch(work, land)
        self.alloc.set_latest_forward_done_event(ev)
        self.alloc.set_inflight_forward(ev, batch.out_cache_loc)
        self.results.append((ev, batch, list(batch.reqs)))

    def _reads(self, batch, new: set[int]) -> list[overlap.Read]:
        """Every other token its requests hold (where the layer holds it),
        and their state slots, with what they should hold."""
        owners = []  # (request, its row, token)
        for i, r in enumerate(batch.reqs):
            row = self.rtp.req_to_token[r.kv.req_pool_idx, : int(batch.seq_lens_cpu[i])].tolist()
            owners += [(r, r.kv.req_pool_idx, t) for t in row if t not in new]
        reads = []
        toks = [t for *_, t in owners]

        def live(held: torch.Tensor, swa: bool) -> torch.Tensor:
            mine = torch.tensor([r.kv.holds_kv and r.kv.req_pool_idx == idx for r, idx, _ in owners])
            if swa:  # an SWA entry the scheduler freed since is no longer read
                mine &= self.alloc.translate_loc_from_full_to_swa(torch.tensor(toks)) > 0
            return mine & held

        if toks:
            for buf, rows, want, held, swa in self._kv(toks):
                reads.append(overlap.Read(buf, rows, want, lambda held=held, swa=swa: live(held, swa)))
        for r in batch.reqs:
            if self.has_state and r.kv.mamba_pool_idx is not None and self.version.get(r.rid):
                slot, v = int(r.kv.mamba_pool_idx), self.launched[r.rid] - 1  # what the forwards before it wrote

                def still(r=r, slot=slot) -> torch.Tensor:
                    return torch.tensor([r.kv.holds_kv and getattr(r, "slot", None) == slot])

                reads += [overlap.Read(b, rows, w, still) for b, rows, w in self._state(slot, v)]
        return reads

    # ------------------------------------------------------------ the loop

    def new_req(self, rid: str, ids: list[int], max_new: int) -> None:
        sp = self.m.spp.SamplingParams(max_new_tokens=max_new)
        sp.normalize(None)
        r = self.m.sb.Req(
            rid=rid, origin_input_text="", origin_input_ids=array("q", ids), sampling_params=sp, vocab_size=1000
        )
        self.waiting.append(r)

    def prefill(self):
        """A prefill round for the head of the queue (SGLang's budget), or None."""
        room, reqs = budget(self), []
        tokens = room["tokens"]
        for r in self.waiting[:3]:
            r.init_next_round_input(self.cache)
            r.extend_end = len(r.full_untruncated_fill_ids)
            need = r.extend_end - r.prefix_len + 2 * self.ps + room.get("slot_tokens", 0)
            if need > tokens or len(reqs) == room["rows"] or len(reqs) == room.get("slots", BIG):
                break
            before = self.cache.full_evictable_size()
            r.lock = self.cache.lock(r.last_node)
            tokens -= need + before - self.cache.full_evictable_size()
            reqs.append(r)
        if not reqs:
            return None
        self.waiting = self.waiting[len(reqs) :]
        b = self.m.sb.ScheduleBatch.init_new(
            reqs, self.rtp, self.alloc, self.cache, self.model, False, self.m.spec.SpeculativeAlgorithm.NONE
        )
        b.prepare_for_extend()
        return b

    def decode(self):
        b = self.running
        if not b.check_decode_mem():
            slots = _state_of(self, b.reqs)
            retracted, _, aborted = b.retract_decode()
            self.stats["retracted"] += len(retracted)
            gone = [r.rid for r in retracted + aborted]
            _free_state_slots(self, {rid: slots[rid] for rid in gone if rid in slots})
            self.waiting = list(retracted) + self.waiting
        if b.is_empty():
            return None
        b.prepare_for_decode()
        return b

    def process(self, batch, reqs) -> None:
        """The last batch's result: one token each, the finished released
        into the tree (one free group) and dropped from the running batch."""
        reqs = [r for r in reqs if r.kv.holds_kv and not r.finished()]
        for r in reqs:
            r.output_ids.append(7 + len(r.output_ids))
            r.update_finish_state()
        done = [r for r in reqs if r.finished()]
        if done:
            _free_state_slots(self, _state_of(self, done))
            self.alloc.free_group_begin()
            for r in done:
                self.m.common.release_kv_cache(r, self.cache, checkpoint=True)
            self.alloc.free_group_end()
            self.stats["finished"] += len(done)
        if self.running is not None and not self.running.is_empty():
            self.running.filter_batch(keep_indices=[i for i, r in enumerate(self.running.reqs) if not r.finished()])

    def pop_and_process(self) -> None:
        """The oldest result: its event synchronized (SGLang's
        ``copy_done.synchronize()``: the forward is done), then processed."""
        ev, batch, reqs = self.results.pop(0)
        ev.synchronize()
        self.process(batch, reqs)

    def on_idle(self) -> None:
        """SGLang's ``on_idle``: once fully idle, ``flush_opportunistic`` and
        the pool audit ``verify_byte_accounting``."""
        if self.waiting or (self.running is not None and not self.running.is_empty()) or self.results:
            return
        self.alloc.flush_opportunistic()
        self.stats["idle audits"] += 1
        self.stats["idle audit"] = self.alloc.verify_byte_accounting()
        if isinstance(self.alloc, dropin._Dropin):  # the last forward settled: nothing held for it
            self.stats["idle in flight"] += self.alloc.composite.arena.in_flight
        self.idle = True

    def step(self, k: int) -> None:
        """One pass of ``event_loop_overlap``."""
        last_batch = self.last_batch
        if last_batch is not None and last_batch.forward_mode.is_extend():
            done = [i for i, r in enumerate(last_batch.reqs) if not r.finished() and r.kv.holds_kv]
            if done:
                if len(done) < len(last_batch.reqs):
                    last_batch.filter_batch(keep_indices=done)
                if self.running is None or self.running.is_empty():
                    self.running = last_batch
                elif self.running is not last_batch:
                    self.running.merge_batch(last_batch)
        batch = None
        if self.waiting:
            batch = self.prefill()
        if batch is None and self.running is not None and not self.running.is_empty():
            batch = self.decode()
        loop = SimpleNamespace(require_mlp_sync=False, result_queue=self.results)
        off = self.scheduler.is_disable_overlap_for_batch(loop, batch, last_batch)
        if off:  # the overlap-off boundary: the last result first, then the flush, the forward stream idle
            self.pop_and_process()
            self.alloc.flush_opportunistic()
            self.stats["boundaries"] += 1
        if batch is not None:
            self.launch(batch)
        if last_batch is not None:
            if not off:
                self.pop_and_process()
        elif batch is None:
            self.on_idle()
        self.last_batch = batch

    def serve(self, n: int, steps: int, sglang_stream: bool = True) -> dict:
        """``sglang_stream``: answer SGLang's own allocator's ``torch.cuda.current_stream`` with the loop's
        stream (it asks torch.cuda even on CPU)."""
        shared = list(range(900, 900 + 8 * self.ps))
        for i in range(n):
            self.new_req(f"r{i}", shared + list(range(100 * i, 100 * i + 3 * self.ps + 2 * i + 1)), 4 + 3 * (i % 5))
        bad = 0
        with self.gpu.current(sglang_allocator=sglang_stream and not isinstance(self.alloc, dropin._Dropin)):
            for k in range(steps):
                self.step(k)
                bad += self.check()
                if self.idle:
                    break
            self.gpu.land_all()
            bad += self.check()
            self.cache.evict(self.m.bpc.EvictParams(num_tokens=BIG, swa_num_tokens=BIG, mamba_num=BIG))
        self.stats |= {"bad": bad, "reads_corrupted": self.gpu.reads_corrupted, "waits": self.gpu.waits}
        self.stats["moved"] = sum(getattr(self.alloc, "pages_moved", {}).values())
        self.stats["audit"] = self.alloc.verify_byte_accounting()
        return self.stats


# every stack at page sizes 1 and 4, lazy at one and eager at the other, under both policies
SERVER_CASES = [
    (kind, ps, lazy, ("planner", "anchor")[(k + lazy) % 2])
    for k, kind in enumerate(stacks.KINDS)
    for ps, lazy in (((1, True), (4, False)) if k % 2 == 0 else ((1, False), (4, True)))
]


def _serve(kind, ps, lazy, policy) -> dict:
    return Server(kind, ps, lazy, policy).serve(12, 160)


@pytest.fixture
def event_loop(monkeypatch):
    """SGLang's settings for the loop: window frees every other token, and
    two prefills in a row not overlapped (an overlap-off boundary, where
    the scheduler calls ``flush_opportunistic`` with nothing in flight)."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    monkeypatch.setenv("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP", "1")


@pytest.mark.parametrize(("kind", "ps", "lazy", "policy"), SERVER_CASES)
def test_kvarena_under_sglangs_event_loop(kind, ps, lazy, policy, event_loop):
    s = _serve(kind, ps, lazy, policy)
    assert s["lost"] == s["bad"] == s["reads_corrupted"] == 0 and s["audit"] == [], s
    assert s["finished"] == 12 and s["written"] > 200, s
    assert s["evictions"] > 0 and s["moved"] > 0 and s["waits"] > 0, s  # the tree freed, pages moved, the ladder waited
    assert s["window frees"] > 0 or kind == "mamba", s
    assert s["boundaries"] > 0 or (ps, lazy) == (4, False), s  # two prefills in a row, where the pool fits them
    # idle after the last forward: its audit clean, nothing held for a forward (SGLang never reports "none")
    assert s["idle audits"] == 1 and s["idle audit"] == [] and s["idle in flight"] == 0, s


def test_the_drop_ins_event_loop_leaves_torch_cuda_untouched(event_loop):
    """The loop selects its stream through ``torch.cpu.stream`` only; kvarena's
    waits reach it through ``torch.get_device_module``.  A call to
    ``torch.cuda.current_stream`` on this path fails on a CPU build of torch
    (issue 53: SGLang's engine on CPU died on its first decode step), so the
    loop passing here, with its waits counted, shows none is made."""
    untouched = torch.cuda.current_stream
    waits = 0
    for kind in stacks.KINDS:
        s = _serve(kind, 4, False, "planner")
        assert s["lost"] == s["bad"] == s["reads_corrupted"] == 0 and s["finished"] == 12, s
        waits += s["waits"]
    assert torch.cuda.current_stream is untouched and waits > 0


def test_the_drop_in_names_no_cuda_module():
    """The drop-in's runtime modules reach streams and events through the
    pool's device (``torch.get_device_module``), never ``torch.cuda`` by
    name: an AST walk, so a comment or docstring does not count."""
    import ast
    import pathlib

    named = []
    for path in sorted(pathlib.Path(allocators.__file__).parent.glob("*.py")):
        if path.name in ("bench.py", "overlap.py", "engine.py"):
            # the CUDA timer (guarded by the device), the CPU harness, and the A/B, which asks whether torch has
            # CUDA and, for SGLang's own allocator only, answers its torch.cuda call on a CPU
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "cuda" and getattr(node.value, "id", "") == "torch":
                named.append(f"{path.name}:{node.lineno}")
    assert named == [], named


def test_sglangs_allocator_asks_torch_cuda_for_its_stream_on_cpu(event_loop):
    """docs/findings.md: SGLang's own ``_settle_inflight_forward`` calls
    ``torch.cuda.current_stream()`` whatever the pool's device, so on a CPU
    build its first settle raises.  Fails once SGLang asks the device's
    module instead."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA build answers torch.cuda on a CPU path")
    with stacks.cpu_kernels(), pytest.raises(AssertionError, match="not compiled with CUDA"):
        Server("mamba_swa", 4, True, None).serve(12, 160, sglang_stream=False)


@pytest.mark.parametrize(("kind", "ps"), [("mamba_swa", 4), ("swa", 1)])
def test_sglang_under_its_own_event_loop(kind, ps, event_loop):
    """SGLang's allocator, its hooks honoured, through the same loop (its
    ``flush_opportunistic`` at the boundaries and when idle)."""
    with stacks.cpu_kernels():
        s = _serve(kind, ps, True, None)
    assert s["lost"] == s["bad"] == s["reads_corrupted"] == 0 and s["finished"] == 12, s
    assert s["idle audits"] == 1 and s["idle audit"] == [], s


@pytest.mark.parametrize("plant", ["ignore-the-event", "wait-on-the-forward-stream"])
def test_a_planted_bug_loses_writes_under_the_event_loop(plant, monkeypatch, event_loop):
    PLANTS[plant](monkeypatch)
    s = _serve("mamba_swa", 4, True, "planner")
    assert s["lost"] + s["bad"] + s["reads_corrupted"] > 0, s


# ------------------------------------------------------------- the hooks


def _drop_in(kind="swa", ps=4, lazy=True, device="cpu"):
    ks.install()
    return stacks.build(kind, _geometry(ps), ps, lazy, device=device).token_to_kv_pool_allocator


def _extend(a, n: int) -> torch.Tensor:
    """One new request of ``n`` tokens."""
    return a.alloc_extend(*[torch.tensor([0])] * 2, *[torch.tensor([n])] * 2, torch.tensor([-1]), n)


def _report(a, ev, out) -> None:
    """SGLang's two hooks, after a launch."""
    a.set_latest_forward_done_event(ev)
    a.set_inflight_forward(ev, out)


@pytest.fixture
def gpu():
    """Forwards still running: a CPU cannot make one (``torch.cpu.Event`` is
    always done), so these tests take the fault injector, its schedule
    stream the current CPU stream through torch's own stream API
    (``torch.cpu.stream``).  ``torch.cuda`` is left untouched, so a call to
    it on this CPU path fails the test."""
    device = overlap.Device()
    with device.current():
        yield device


def test_the_hooks_keep_references_and_the_next_call_pins(gpu):
    """The hooks do no work (nothing pinned yet); the next call hands the
    forward over (its pages pinned); an urgent settle waits on its event."""
    a = _drop_in()
    out = _extend(a, 10)
    arena = a._composite.arena
    ev = gpu.launch()
    _report(a, ev, out)
    assert not arena.in_flight and arena.pinned("full").numel() == 0
    a.available_size()
    assert arena.in_flight and arena.pinned("full").numel() == 3 and arena.pinned("swa").numel() == 3
    a.free(out)  # pinned pages freed: they stay holes, nothing waits
    assert gpu.waits == 0 and not ev.query() and arena.in_flight
    a.composite.settle()
    assert gpu.waits == 1 and ev.query() and not arena.in_flight


def test_a_done_forward_settles_at_the_next_call_without_a_wait(gpu):
    """SGLang never reports "no forward in flight": a forward whose result
    was processed (its event done) is settled by the next call, with
    nothing left to wait for, whether or not another forward is reported."""
    a = _drop_in("mamba")
    slot = a.mamba_allocator.alloc(1)
    assert slot is not None
    out = _extend(a, 6)
    arena = a._composite.arena
    first = gpu.launch()
    _report(a, first, out)
    a.available_size()
    assert arena.pinned("state").numel() == 1  # the mamba pool: every live slot (SGLang names none)
    first.synchronize()  # the scheduler processed its result
    second = gpu.launch()
    _report(a, second, None)  # a forward that writes none of these pools: it still reads them
    a.available_size()
    assert arena.in_flight and arena.pinned("full").numel() == 0 and arena.pinned("state").numel() == 0
    second.synchronize()  # the last forward's result processed; nothing launched after it
    a.available_size()
    assert not arena.in_flight and gpu.waits == 0  # idle, and no wait landed anything


def test_two_forwards_reported_before_a_call_are_both_pinned(gpu):
    """Forwards the scheduler launched without an allocator call between
    them are handed over in order: the first's pins are kept (its event has
    not fired), the second's added; one settle waits for both, in order."""
    a = _drop_in()
    one, two = _extend(a, 4), _extend(a, 4)
    first, second = gpu.launch(), gpu.launch()
    _report(a, first, one)
    _report(a, second, two)
    arena = a.composite.arena
    assert arena.pinned("full").numel() == 2 and gpu.waits == 0
    a.composite.settle()
    assert gpu.waits == 2 and first.query() and second.query() and arena.pinned("full").numel() == 0


def test_the_event_alone_hands_over_a_forward_that_only_reads(gpu):
    a = _drop_in()
    out = _extend(a, 4)
    a.set_latest_forward_done_event(gpu.launch())
    arena = a.composite.arena
    assert arena.in_flight and arena.pinned("full").numel() == 0 and out is not None


def test_forwards_on_a_cpu_stream_hold_nothing_past_the_next_call():
    """SGLang on a CPU (``kvarena.sglang.engine``): each forward runs on a
    real ``torch.cpu`` stream and reports a real ``torch.cpu.Event``, done
    by the time the hooks run.  The drop-in holds nothing for it once the
    next call has run."""
    a = _drop_in()
    forward = torch.cpu.Stream()
    arena = a.composite.arena
    for _ in range(3):
        out = _extend(a, 4)
        ev = torch.cpu.Event()
        ev.record(forward)
        _report(a, ev, out)
        a.available_size()
    a.available_size()
    assert not arena.in_flight and arena.pinned("full").numel() == 0 and arena.pinned("swa").numel() == 0


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_the_step_path_with_a_forward_in_flight_reads_nothing_back(kind, monkeypatch, gpu):
    """The hooks, the hand-over (a scatter) and the decode step after it,
    with every sync-forcing tensor method poisoned."""
    a, first = test_host_sync.warm(kind, 4)
    ev = gpu.launch()
    _poison(monkeypatch)
    _report(a, ev, first)
    out = test_host_sync.step(a, kind, 4, first)
    assert a._composite.arena.in_flight
    monkeypatch.undo()
    assert a.verify_byte_accounting() == [] and bool((a.translate_kv_loc(out) > 0).all())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("honoured", [True, False], ids=["hooks", "ignored"])
def test_a_late_write_on_a_cuda_stream_survives_a_relocation(honoured, monkeypatch):
    """On a GPU, with real streams: a forward on a side stream, held back by
    ``torch.cuda._sleep``, writes request C's page late; meanwhile an urgent
    flush moves C's page into the hole B left.  With the hooks the move
    waits on the forward's event and C's bytes follow it; with them ignored
    the copy runs first and the late write is lost."""
    if not honoured:
        _ignore_hooks(monkeypatch, allocators.ALLOCATORS)
    a = _drop_in("swa", 4, True, device="cuda")
    zero, four = torch.zeros(1, dtype=torch.int64), torch.full((1,), 4, dtype=torch.int64)
    reqs = [a.alloc_extend(zero.cuda(), zero, four.cuda(), four, torch.full((1,), -1).cuda(), 4) for _ in range(3)]
    a.free(reqs[1])  # B's page: a hole between A's and C's
    c = reqs[2]
    buf = a.get_kvcache().get_key_buffer(GEOMETRY.full_layers[0])
    rows = a.translate_kv_loc(c)
    values = torch.full((len(c), *buf.shape[1:]), 7.0, dtype=buf.dtype, device="cuda")
    forward = torch.cuda.Stream()
    forward.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(forward):
        torch.cuda._sleep(200_000_000)  # the forward is still running
        buf[rows] = values
    ev = torch.cuda.Event()
    ev.record(forward)
    a.set_latest_forward_done_event(ev)
    a.set_inflight_forward(ev, c)
    moved = a.composite.arena.flush("full")  # urgent: it moves C's page into B's hole
    torch.cuda.synchronize()
    assert moved > 0 and bool((a.translate_kv_loc(c) != rows).all())
    assert bool((buf[a.translate_kv_loc(c)] == values).all()) == honoured


def test_the_hooks_are_no_longer_unsupported():
    for cls in allocators.ALLOCATORS:
        for hook in HOOKS:
            assert hook not in surface.UNSUPPORTED
            assert getattr(cls, hook).__module__ == forwards.__name__
