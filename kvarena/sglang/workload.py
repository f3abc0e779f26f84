"""A serving workload over one of SGLang's unified-memory stacks, with every
byte checked.

Requests arrive with prompts that may share a live request's page-aligned
prefix (counted once, as the radix cache shares it), prefill in chunks,
decode together, free their sliding-window pages as the window passes (a
page is freed once no sharer still needs it), hold a mamba state slot where
the stack has one, and finish.  When an allocation comes back None the
oldest request finishes and the step is tried again, so the buffer stays
full and relief relocates pages in every band.

Each token's K and V are written into every layer of the KV pool's own
buffers at the location the allocator translates to, and each state slot's
conv and temporal state likewise; after every step every live token's data
(and every live slot's state) is read back through the same translations
and compared.  ``run`` returns what held.

With ``overlap=True`` the workload runs as SGLang's overlap scheduler does
(docs/design.md §12): each step's batch is a forward (``overlap.Device``)
that translates its write rows on the forward stream at launch (the
allocator's ``translate_write_loc``), is handed to the allocator through
``set_latest_forward_done_event`` / ``set_inflight_forward``, and lands only
when the next step processes its result; meanwhile the next batch is
prepared (admissions, allocations that relieve, window frees) and finished
requests are freed.  ``flush_opportunistic`` runs where SGLang's scheduler
calls it: at an overlap-off boundary, nothing in flight, and once idle.
Each landed write is checked at its token's current translation
(``inflight_lost`` counts those that did not survive) and each read row
against what the forward read (``reads_corrupted``).

With ``retract=True`` every few steps a decoding request of the batch just
launched is retracted to the host as SGLang's PD decode server does it
(``Req.offload_kv_cache``): the allocator's ``get_cpu_copy`` copies its
tokens (every layer, K and V; SWA where it still has an entry) and its
mamba state while its forward may still be writing them, then it is freed.
A few steps later it is resumed on fresh pages and a fresh slot
(``Req.load_kv_cache``: ``load_cpu_copy``), every byte it had is compared
there, and it finishes.

With ``draft=True`` the stack is built with a speculative draft's K/V fused
into its full entries (SGLang's ``place_fused_draft``) and the draft
runner's pool is bound by SGLang's ``bind_fused_draft``; the draft's layer is
written and checked with the target's, so every relocation must carry it.

With ``hicache=True`` the allocator serves HiCache (``hicache.HostCache``,
SGLang's own controller calls, its move gate installed): every sixth step
a request's prompt is loaded back from the host (full rows alone, SWA pages
reserved by physical id and bound at commit, a mamba slot), and three steps
later a running request is backed up to the host; each copy is submitted
with its rows resolved then and lands one to three steps later, so a
transfer is in flight about half the time and the scheduler's work goes on
under SGLang's gate.  A loaded request then decodes like any other, every
byte it loaded checked every step; a backup must read the bytes its rows
held at submit.
"""

import contextlib
import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvarena.anchor.loader import import_sglang

from .hicache import Backup, HostCache, Load
from .overlap import Device, Read, Write
from .stacks import Geometry, build, draft_placement

I64 = torch.int64
DRAFT_CODE = 32  # a draft layer's values are keyed by this plus its layer id


@dataclass
class Request:
    rid: int
    target: int  # prompt length
    finish_at: int  # length at which it finishes
    tokens: list[int] = field(default_factory=list)  # virtual token ids, by position
    swa_from: int = 0  # positions below have no SWA entry left
    slot: int | None = None  # the mamba state slot (virtual)
    track: list[int] = field(default_factory=list)  # its tracking slots (the mamba extra buffer)
    decoding: bool = False
    launched: int = 0  # its state's last version a forward was launched to write
    version: int = 0  # its state's last version written (0: none yet)


@dataclass
class Report:
    kind: str
    page_size: int
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    shared_tokens: int = 0
    refused: int = 0  # allocations that came back None (then the oldest request finished)
    swa_pages_freed: int = 0
    tokens_checked: int = 0
    slots_checked: int = 0
    pages_moved: dict[str, int] = field(default_factory=dict)
    overlap: bool = False
    forwards: int = 0  # forwards launched (overlap)
    inflight_writes: int = 0  # tokens and state slots a forward wrote late, still live when it landed
    inflight_lost: int = 0  # of those, the ones not at their current translation once it landed
    reads_checked: int = 0  # token and slot rows a forward read, checked when it landed
    reads_corrupted: int = 0  # of those, rows overwritten before it landed
    waits: int = 0  # forwards the allocator waited for (its settles)
    idle_audits: int = 0  # SGLang's idle flush and audit, run once the scheduler went idle
    retracted: int = 0  # requests retracted to the host (retract)
    restored: int = 0  # of those, resumed and compared
    restored_tokens: int = 0  # tokens compared after a resume
    loads: int = 0  # HiCache load-backs submitted (hicache)
    loads_landed: int = 0  # of those, landed and checked from then on
    loaded_tokens: int = 0  # tokens they loaded
    backups: int = 0  # HiCache backups (device to host) submitted and landed (hicache)
    backed_up_rows: int = 0  # rows they read
    backup_rows_lost: int = 0  # of those, rows that did not hold the bytes they held at submit
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _value(
    ids: torch.Tensor, layer: int, part: int, width: int, dtype: torch.dtype, gens: torch.Tensor | None = None
) -> torch.Tensor:
    """Distinct, exactly representable values per (id, layer, K or V): the id
    in base-1024 digits, then the layer and the part, then a ramp shifted by
    the id's generation (how many times it was handed out), so the bytes of
    an id's earlier life never pass for its current ones."""
    ids = ids.to(I64)
    gen = torch.zeros_like(ids) if gens is None else gens.to(I64)
    v = torch.empty(len(ids), width, dtype=I64)
    v[:, 0], v[:, 1], v[:, 2], v[:, 3] = ids % 1024, ids // 1024, layer, part
    ramp = torch.arange(4, width, dtype=I64) + 7 * layer + 3 * part
    v[:, 4:] = (ramp + (ids + 13 * gen).unsqueeze(1)) % 512
    return v.to(dtype)


class Workload:
    """One stack (built by SGLang's own factory) and the requests on it;
    with ``overlap``, its forwards land late (``overlap.Device``)."""

    def __init__(
        self,
        kind: str,
        geometry: Geometry,
        page_size: int,
        lazy: bool,
        seed: int,
        device: str = "cpu",
        overlap: bool = False,
        compact_in_flight: bool = False,
        extra_buffer: bool = False,
        retract: bool = False,
        draft: bool = False,
        hicache: bool = False,
    ) -> None:
        self.kind, self.g, self.ps, self.dev = kind, geometry, page_size, torch.device(device)
        self.retract_every = 5 if retract else 0  # steps between retractions to the host
        self.parked: list[tuple[dict, Any, int]] = []  # retracted: (what must come back, host copy, resume step)
        self.in_flight: list[int] = []  # the requests of the forward in flight
        self.gpu = Device() if overlap else None  # the forward stream, when forwards land late
        self.compact_in_flight = compact_in_flight  # the non-urgent compaction every step (``_compact``)
        stream = None if self.gpu is None else self.gpu.forward_stream  # as SGLang's scheduler passes it
        self.bundle = build(
            kind,
            geometry,
            page_size=page_size,
            lazy=lazy,
            device=device,
            forward_stream=stream,
            extra_buffer=extra_buffer,
            fused_draft=draft_placement(kind, geometry) if draft else None,
        )
        self.alloc = self.bundle.token_to_kv_pool_allocator
        self.kv = self.bundle.token_to_kv_pool
        self.draft: Any = self._bind_draft() if draft else None
        self.slots: Any = getattr(getattr(self.bundle, "req_to_token_pool", None), "mamba_allocator", None)
        self.state: Any = self.bundle.req_to_token_pool.mamba_pool if self.slots is not None else None
        # the extra buffer's tracking slots a request takes with its state slot (SGLang's alloc_req_slots)
        self.tracking = self.bundle.req_to_token_pool.mamba_initial_tracking_slots if extra_buffer else 0
        self.has_swa = kind != "mamba"
        self.rng = random.Random(seed)
        self.live: dict[int, Request] = {}
        self.refs: dict[int, int] = {}  # virtual page -> requests holding it
        self.gen: dict[int, int] = {}  # token id -> times handed out
        self.landed: set[int] = set()  # token ids whose current bytes are written
        self.batch_ids: list[int] = []  # this step's batch: the ids it writes
        self.batch: dict[int, Request] = {}  # and its requests
        self.last: Any = None  # the done event of the forward in flight
        self.next_rid = 0
        self.report = Report(kind, page_size, overlap=overlap)
        self.width = geometry.head_num * geometry.head_dim
        self.host = HostCache(self.alloc, self.kv, self.slots, self.state, self.gpu) if hicache else None
        self.backing: set[int] = set()  # requests a backup is reading: the tree holds their nodes
        self.held_back: list[tuple[Request, bool]] = []  # finished while backed up: freed at the ack

    def _bind_draft(self) -> Any:
        """The draft runner's KV pool, bound by SGLang's own binder over the
        lanes fused into the full sub-pool: a one-layer draft model (one
        ``RadixAttention``, as an EAGLE or MTP head has) translating through
        the target's allocator."""
        radix = import_sglang("sglang.srt.layers.radix_attention")
        binder = import_sglang("sglang.srt.mem_cache.unified_draft_pool")
        g = self.g
        model = torch.nn.Module()
        model.attn = radix.RadixAttention(
            num_heads=g.head_num, head_dim=g.head_dim, scaling=1.0, num_kv_heads=g.head_num, layer_id=0
        )
        binding = binder.bind_fused_draft(
            placement=self.bundle.unified_memory_pool.fused_draft,
            runner=0,
            unified_buffer=self.bundle.unified_memory_pool,
            host_allocator=self.alloc,
            model=model,
            model_config=None,
            req_to_token_pool=getattr(self.bundle, "req_to_token_pool", None),
            page_size=self.ps,
        )
        return binding.token_to_kv_pool

    # -------------------------------------------------------- bytes

    def _layers(self, target_only: bool = False) -> list[tuple[int, bool, Any, int]]:
        """``(layer, in_swa, pool, code)`` for every layer whose K/V the
        workload writes: the target's, then a fused draft's (``code`` keys
        the values, so a draft lane never passes for a target layer)."""
        out = [(layer, False, self.kv, layer) for layer in self.g.full_layers]
        if self.has_swa:
            out += [(layer, True, self.kv, layer) for layer in self.g.swa_layers]
        if self.draft is not None and not target_only:
            out += [(layer, False, self.draft, DRAFT_CODE + layer) for layer in sorted(self.draft.layer_lanes)]
        return out

    def _where(self, ids: torch.Tensor, swa: bool, write: bool = False) -> torch.Tensor:
        """The rows of ``ids`` now; ``write``: as a forward translates its
        write slots (SGLang's plan: ``translate_write_loc``, and the full-to-SWA
        map for the window)."""
        if swa:
            return self.alloc.translate_loc_from_full_to_swa(ids)
        if write:
            return self.alloc.translate_write_loc(ids)
        return self.alloc.translate_kv_loc(ids)

    def _t(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=I64, device=self.dev)

    def _kv(
        self, full: list[int], swa: list[int], write: bool = False
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]]:
        """``(buffer, rows, values, in_swa)`` for these tokens in every layer
        (``swa`` in the SWA layers): their rows at the current translation
        (``write``: the write translation) and the values their current
        generation should hold there."""
        out = []
        for layer, in_swa, pool, code in self._layers():
            ids = swa if in_swa else full
            if not ids:
                continue
            t = self._t(ids)
            gens = torch.tensor([self.gen.get(v, 0) % 64 for v in ids], dtype=I64)
            rows = self._where(t, in_swa, write)
            for part, buf in enumerate((pool.get_key_buffer(layer), pool.get_value_buffer(layer))):
                want = _value(t.cpu(), code, part, self.width, buf.dtype, gens).view(-1, *buf.shape[1:])
                out.append((buf, rows, want.to(self.dev), in_swa))
        return out

    def _write(self, ids: list[int]) -> None:
        """New tokens of this step's batch: written now, or by its forward."""
        for t in ids:
            self.gen[t] = self.gen.get(t, 0) + 1
        if self.gpu is not None:
            self.batch_ids += ids
            self.landed.difference_update(ids)
            return
        for buf, rows, values, _ in self._kv(ids, ids):
            buf[rows] = values
        self.landed.update(ids)

    def _state_values(self, slot: int, i: int, like: torch.Tensor, version: int = 0) -> torch.Tensor:
        """Slot ``slot``'s values for its conv state ``i`` (``i = -1``:
        temporal) at ``version``; integers below 256, exact in bfloat16."""
        n = like.numel()
        base = slot * 3 if i < 0 else slot * 10 + i
        ramp = torch.arange(n, device=self.dev) % (89 if i < 0 else 97)
        return ((base + ramp + 7 * version) % 251).view(like.shape).to(like.dtype)

    def _state(self, slot: int, version: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(buffer, rows, values)`` of a state slot at its translation now:
        each state's slot-major view, so a write lands in the pool's own buffer."""
        phys = self.slots.translate(self._t([slot]))
        cache = self.state.mamba_cache
        out = []
        for i, buf in [(i, conv) for i, conv in enumerate(cache.conv)] + [(-1, cache.temporal)]:
            out.append((buf.movedim(1, 0), phys, self._state_values(slot, i, buf[:, phys], version).movedim(1, 0)))
        return out

    def _write_state(self, slot: int) -> None:
        for buf, rows, values in self._state(slot, 0):
            buf[rows] = values

    def _bad(self, full: list[int], swa: list[int]) -> tuple[set[int], list[str]]:
        """The tokens whose bytes are not at their current translation, and why."""
        bad: set[int] = set()
        errors = []
        for buf, rows, want, in_swa in self._kv(full, swa):
            ids = swa if in_swa else full
            if bool((rows <= 0).any()):
                errors.append("a live token translates to the sink")
            wrong = (buf[rows] != want).reshape(len(rows), -1).any(dim=1)
            if bool(wrong.any()):
                lost = [t for t, w in zip(ids, wrong.tolist()) if w]
                errors.append(f"token {lost[0]} corrupted ({len(lost)} tokens)")
                bad.update(lost)
        return bad, errors

    def _state_bad(self, r: Request) -> list[str]:
        if r.slot is None or (self.gpu is not None and r.version == 0):
            return []
        self.report.slots_checked += 1
        bad = [buf[rows] != want for buf, rows, want in self._state(r.slot, r.version)]
        return [f"state slot {r.slot} corrupted"] if any(bool(b.any()) for b in bad) else []

    def _held(self) -> tuple[list[int], list[int]]:
        """The landed tokens live requests hold (full), and those in their windows (swa)."""
        full = {t for r in self.live.values() for t in r.tokens if t in self.landed}
        swa = {t for r in self.live.values() for t in r.tokens[r.swa_from :] if t in self.landed}
        return sorted(full), sorted(swa) if self.has_swa else []

    def check(self) -> None:
        """Every live token's K/V in every layer, and every live slot's state."""
        full, swa = self._held()
        _, errors = self._bad(full, swa)
        self.report.tokens_checked += sum(len(swa if in_swa else full) for _, in_swa, _, _ in self._layers())
        for r in self.live.values():
            errors += self._state_bad(r)
            for slot in r.track:  # written once, when taken
                self.report.slots_checked += 1
                if any(bool((buf[rows] != want).any()) for buf, rows, want in self._state(slot, 0)):
                    errors.append(f"tracking slot {slot} corrupted")
        self.report.errors += [f"step {self.report.steps}: {e}" for e in errors]

    # ------------------------------------------------------- forwards

    def _launch(self) -> Any:
        """Launch this step's batch as a forward and hand it over with
        SGLang's two hooks; returns its done event (None: no batch).  The
        forward translates on the forward stream at launch (``overlap.Device``):
        its writes, and its reads (every other token its requests hold,
        every state slot) with what they should hold."""
        ids, batch = self.batch_ids, [r for r in self.batch.values() if r.rid in self.live]
        self.batch_ids, self.batch = [], {}
        self.in_flight = [r.rid for r in batch]
        if not ids:
            return None
        written = [(t, self.gen[t]) for t in ids]
        states = []
        for r in batch:
            if r.slot is not None:
                r.launched += 1
                states.append((r.rid, r.slot, r.launched))

        def work() -> tuple[list[Write], list[Read]]:
            writes = [(buf, rows, values) for buf, rows, values, _ in self._kv(ids, ids, write=True)]
            for _, slot, version in states:
                writes += self._state(slot, version)
            return writes, self._reads(batch, set(ids))

        def land() -> None:
            self._landed(written, states)

        assert self.gpu is not None  # only with forwards
        ev = self.gpu.launch(work, land)
        self.report.forwards += 1
        self.alloc.set_latest_forward_done_event(ev)
        self.alloc.set_inflight_forward(ev, self._t(ids))
        return ev

    def _process(self, ev: Any) -> None:
        """SGLang's result processing of a forward: its event synchronized
        (it is done), then the requests at their end finished (some may be
        in the forward launched since)."""
        ev.synchronize()
        for r in list(self.live.values()):
            if len(r.tokens) >= r.finish_at and r.decoding:
                self.finish(r)

    def _compact(self) -> None:
        """Not a call SGLang's scheduler makes: the allocator's non-urgent
        compaction while a forward runs (kvarena's composite's
        ``flush_opportunistic``; SGLang's allocator's own), a stress of the
        in-flight guards (SGLang calls it only with nothing in flight)."""
        composite = getattr(self.alloc, "composite", None)
        (self.alloc.flush_opportunistic if composite is None else composite.flush_opportunistic)()

    def _reads(self, batch: list[Request], new: set[int]) -> list[Read]:
        """What the forward reads: its requests' other tokens (in the SWA
        layers, those in the window) and their state slots."""
        owners = [(r.rid, k, t) for r in batch for k, t in enumerate(r.tokens) if t not in new]
        window = [(rid, k, t) for rid, k, t in owners if k >= self.live[rid].swa_from] if self.has_swa else []

        def live(in_swa: bool) -> Callable[[], torch.Tensor]:
            """Which of the rows are still read when the forward lands."""
            mine = window if in_swa else owners

            def now() -> torch.Tensor:
                keep = [rid in self.live and (not in_swa or k >= self.live[rid].swa_from) for rid, k, _ in mine]
                return torch.tensor(keep, dtype=torch.bool, device=self.dev)

            return now

        reads = []
        for buf, rows, want, in_swa in self._kv([t for *_, t in owners], [t for *_, t in window]):
            reads.append(Read(buf, rows, want, live(in_swa)))
        for r in batch:
            if r.slot is not None and r.launched > 1:

                def still(rid=r.rid, slot=r.slot) -> torch.Tensor:
                    r = self.live.get(rid)
                    return torch.tensor([r is not None and r.slot == slot], device=self.dev)

                reads += [Read(buf, rows, want, still) for buf, rows, want in self._state(r.slot, r.launched - 1)]
        return reads

    def _landed(self, written: list[tuple[int, int]], states: list[tuple[int, int, int]]) -> None:
        """A forward landed: its tokens (not handed out again since) are
        written; each one still live must read back at its translation now."""
        mine = [t for t, g in written if self.gen.get(t) == g]
        self.landed.update(mine)
        full, swa = self._held()
        mine_set = set(mine)
        full = [t for t in full if t in mine_set]
        swa = [t for t in swa if t in mine_set]
        bad, errors = self._bad(full, swa)
        lost = len(bad)
        for rid, slot, version in states:
            r = self.live.get(rid)
            if r is None or r.slot != slot:
                continue
            r.version = version
            state_errors = self._state_bad(r)
            lost += bool(state_errors)
            errors += state_errors
            self.report.inflight_writes += 1
        self.report.inflight_writes += len(full)
        self.report.inflight_lost += lost
        self.report.errors += [f"step {self.report.steps}: in-flight write lost: {e}" for e in errors]

    # ---------------------------------------------------- requests

    def _pages(self, tokens: list[int]) -> list[int]:
        return sorted({t // self.ps for t in tokens})

    def finish(self, r: Request, done: bool = True) -> None:
        """Free what only ``r`` held: its SWA entries left, then full
        (``done``: it finished, and is counted; else it was retracted).  A
        request a backup is reading is freed when the backup is acknowledged
        (SGLang's tree keeps a node locked while it is written to the host)."""
        del self.live[r.rid]
        if r.rid in self.backing:
            self.held_back.append((r, done))
            return
        self._release(r, done)

    def _release(self, r: Request, done: bool) -> None:
        last = []
        for p in self._pages(r.tokens):
            self.refs[p] -= 1
            if self.refs[p] == 0:
                del self.refs[p]
                last.append(p)
        if last:
            owned = [t for t in r.tokens if t // self.ps in set(last)]
            self.alloc.free(self._t(owned))
        if r.slot is not None:
            self.slots.free(self._t([r.slot] + r.track))
        self.report.finished += done

    # ------------------------------------------- retraction to host

    def retract(self) -> None:
        """Retract a decoding request of the forward in flight to the host,
        as SGLang's PD decode server does (``Req.offload_kv_cache``): the
        allocator's ``get_cpu_copy`` of its tokens and state slot, then its
        memory freed.  What the copy must hold is what the forwards launched
        so far write, the one in flight included."""
        rids = [rid for rid in self.in_flight if rid in self.live and self.live[rid].decoding]
        rids = rids or [rid for rid, r in self.live.items() if r.decoding]
        if not rids:
            return
        r = self.live[rids[-1]]
        truth = {"tokens": list(r.tokens), "gens": [self.gen.get(t, 0) for t in r.tokens], "swa_from": r.swa_from}
        truth["state"] = None
        if r.slot is not None:  # the version its last launched forward writes (or the one written at admission)
            truth["state"] = [want for *_, want in self._state(r.slot, r.launched if self.gpu is not None else 0)]
        mamba = None if r.slot is None else torch.tensor(r.slot, dtype=I64, device=self.dev)  # SGLang's 0-dim index
        host = self.alloc.get_cpu_copy(self._t(r.tokens), mamba_indices=mamba, req_pool_index=None)
        # On the CPU, "host" tensors can alias the pool (``.to("cpu")`` returns
        # the tensor itself): keep the copy a device-to-host transfer makes.
        host = copy.deepcopy(host) if self.dev.type == "cpu" else host
        self.finish(r, done=False)
        self.report.retracted += 1
        self.parked.append((truth, host, self.report.steps + 3))

    def resume(self) -> None:
        """Resume the parked requests whose time has come (SGLang's
        ``Req.load_kv_cache``): fresh tokens and slot, ``load_cpu_copy``,
        then every byte compared at the new pages; then it finishes.  Room
        is made as for any allocation (the oldest request finishes)."""
        due = [p for p in self.parked if p[2] <= self.report.steps]
        self.parked = [p for p in self.parked if p[2] > self.report.steps]
        for truth, host, _ in due:
            self._resume(truth, host)

    def _resume(self, truth: dict, host: Any) -> None:
        n = len(truth["tokens"])
        slot = None
        if truth["state"] is not None:
            slot = self._take_slot()
            if slot is None:
                self.report.errors.append(f"step {self.report.steps}: no state slot to resume into, nothing live")
                return
        zero, seq = torch.zeros(1, dtype=I64), torch.tensor([n], dtype=I64)
        out = None
        while out is None:
            if self.ps == 1:
                out = self.alloc.alloc(n)
            else:
                out = self.alloc.alloc_extend(zero.to(self.dev), zero, seq.to(self.dev), seq, self._t([-1]), n)
            if out is None and not self._make_room():
                self.report.errors.append(f"step {self.report.steps}: no room to resume {n} tokens, nothing live")
                return
        mamba = None if slot is None else torch.tensor(slot, dtype=I64, device=self.dev)
        self.alloc.load_cpu_copy(host, out, mamba_indices=mamba, req_pool_index=None)
        new = out.tolist()
        errors = []
        old = torch.tensor(truth["tokens"], dtype=I64)
        gens = torch.tensor([g % 64 for g in truth["gens"]], dtype=I64)
        for layer, in_swa, pool, code in self._layers(target_only=True):  # SGLang's copy holds no draft lane
            keep = slice(truth["swa_from"], n) if in_swa else slice(0, n)
            if keep.start >= n:
                continue
            rows = self._where(self._t(new[keep]), in_swa)
            for part, buf in enumerate((pool.get_key_buffer(layer), pool.get_value_buffer(layer))):
                want = _value(old[keep], code, part, self.width, buf.dtype, gens[keep]).view(-1, *buf.shape[1:])
                if bool((buf[rows] != want.to(self.dev)).any()):
                    errors.append(f"a resumed request's {'SWA' if in_swa else 'full'} layer {layer} lost bytes")
        if slot is not None:
            for (buf, rows, _), want in zip(self._state(slot, 0), truth["state"]):
                if bool((buf[rows] != want).any()):
                    errors.append("a resumed request's mamba state lost bytes")
            self.slots.free(self._t([slot]))
        self.alloc.free(out)
        self.report.restored += 1
        self.report.restored_tokens += n
        self.report.errors += [f"step {self.report.steps}: {e}" for e in errors]

    def _make_room(self) -> bool:
        """An allocation came back None: finish the oldest request."""
        self.report.refused += 1
        if not self.live:
            return False
        self.finish(self.live[min(self.live)])
        return True

    def _take_slot(self) -> int | None:
        """A state slot, as SGLang's scheduler takes one (the allocator asked
        to make room first), finishing the oldest requests while it is
        refused; None when nothing is left to finish."""
        if hasattr(self.alloc, "prepare_mamba_allocation"):
            self.alloc.prepare_mamba_allocation(1)
        got = self.slots.alloc(1)
        while got is None and self._make_room():
            got = self.slots.alloc(1)
        return None if got is None else int(got.reshape(-1)[0])

    def admit(self) -> None:
        ps, rng = self.ps, self.rng
        r = Request(self.next_rid, rng.randint(2, 12) * ps + rng.randrange(ps), 0)
        r.finish_at = r.target + rng.randint(4, 12 * ps + 24)
        donors = [d for d in self.live.values() if len(d.tokens) >= 2 * ps and d.swa_from == 0]
        if donors and rng.random() < 0.5:  # share a page-aligned prefix, counted once
            d = rng.choice(donors)
            k = min(rng.randint(1, len(d.tokens) // ps), (r.target - 1) // ps) * ps
            r.tokens = d.tokens[:k]
            for p in self._pages(r.tokens):
                self.refs[p] += 1
            self.report.shared_tokens += k
        if self.slots is not None:
            r.slot = self._take_slot()
            if r.slot is None:
                for p in self._pages(r.tokens):
                    self.refs[p] -= 1
                return
            if self.gpu is None:  # with forwards, the request's first forward writes its state
                self._write_state(r.slot)
            if self.tracking:  # the extra buffer: the tracking slots too, or the state slot goes back
                track = self.slots.alloc(self.tracking)
                while track is None and self._make_room():
                    track = self.slots.alloc(self.tracking)
                if track is None:
                    self.slots.free(self._t([r.slot]))
                    for p in self._pages(r.tokens):
                        self.refs[p] -= 1
                    return
                r.track = track.reshape(-1).tolist()
                for slot in r.track:
                    self._write_state(slot)
        self.live[r.rid] = r
        self.next_rid += 1
        self.report.admitted += 1

    def _extend(self, batch: list[Request], chunk: int) -> None:
        """One chunk of prefill for each request of ``batch``."""
        batch = [r for r in batch if r.rid in self.live]
        if not batch:
            return
        prefix = [len(r.tokens) for r in batch]
        seq = [min(r.target, p + chunk) for r, p in zip(batch, prefix)]
        last = [r.tokens[-1] if r.tokens else -1 for r in batch]
        n = sum(seq) - sum(prefix)
        p_cpu, s_cpu = torch.tensor(prefix, dtype=I64), torch.tensor(seq, dtype=I64)
        if self.ps == 1:  # SGLang's scheduler takes plain slots at page size 1 (alloc_token_slots)
            out = self.alloc.alloc(n)
        else:
            dev = self.dev
            out = self.alloc.alloc_extend(p_cpu.to(dev), p_cpu, s_cpu.to(dev), s_cpu, self._t(last), n)
        if out is None:
            if self._make_room():
                self._extend(batch, chunk)
            return
        ids = out.tolist()
        k = 0
        for r, p, s in zip(batch, prefix, seq):
            new = ids[k : k + s - p]
            k += s - p
            fresh = [q for q in self._pages(new) if q not in self.refs]
            for q in fresh:
                self.refs[q] = 1
            r.tokens += new
            r.decoding = len(r.tokens) == r.target
            self.batch[r.rid] = r
        self._write(ids)

    def _decode(self) -> None:
        batch = [r for r in self.live.values() if r.decoding]
        if not batch:
            return
        seq = torch.tensor([len(r.tokens) + 1 for r in batch], dtype=I64)
        last = self._t([r.tokens[-1] for r in batch])
        out = self.alloc.alloc(len(batch)) if self.ps == 1 else self.alloc.alloc_decode(seq.to(self.dev), seq, last)
        if out is None:
            if self._make_room():
                self._decode()
            return
        ids = out.tolist()
        for r, t in zip(batch, ids):
            if t // self.ps not in self.refs:
                self.refs[t // self.ps] = 1
            r.tokens.append(t)
            self.batch[r.rid] = r
        self._write(ids)
        if self.gpu is not None:  # with forwards, a request finishes when its result is processed
            return
        for r in list(batch):
            if len(r.tokens) >= r.finish_at and r.rid in self.live:
                self.finish(r)

    def _slide_windows(self) -> None:
        """Free each request's SWA pages the window has passed, once no
        sharer still needs them (a segment of whole pages, all live)."""
        if not self.has_swa:
            return
        ps = self.ps
        for r in self.live.values():
            if r.rid in self.backing:  # a backup reads its window: the tree holds it
                continue
            upto = max(0, (len(r.tokens) - self.g.window) // ps * ps)
            if upto <= r.swa_from:
                continue
            pages = self._pages(r.tokens[r.swa_from : upto])
            if any(self.refs[p] > 1 for p in pages):
                continue
            self.alloc.free_swa_segment(self._t(r.tokens[r.swa_from : upto]), start_pos=r.swa_from)
            self.report.swa_pages_freed += len(pages)
            r.swa_from = upto

    # ------------------------------------------- HiCache load-back

    def load_back(self) -> None:
        """A request whose prompt is on the host: SGLang's load-back takes its
        full rows, SWA pages for its window and a state slot, and submits
        the copy (rows resolved now); it lands one to three steps later.
        Room is made as for any allocation (the oldest request finishes)."""
        assert self.host is not None
        ps = self.ps
        n = self.rng.randint(2, 8) * ps
        swa = min(n, (self.g.window // ps + 1) * ps) if self.has_swa else 0
        got = self.host.load(n, swa, self.slots is not None)
        while got is None and self._make_room():
            got = self.host.load(n, swa, self.slots is not None)
        if got is None:
            self.report.errors.append(f"step {self.report.steps}: no room to load {n} tokens back, nothing live")
            return
        tokens, swa_rows, slot = got
        for t in tokens:
            self.gen[t] = self.gen.get(t, 0) + 1
            self.landed.discard(t)
        for q in self._pages(tokens):
            self.refs[q] = 1
        full_rows = self.host.resolve(self.kv.full_kv_pool, self._t(tokens))  # SGLang's transfer engine
        writes = []
        for buf, _rows, values, in_swa in self._kv(tokens, tokens[n - swa :]):
            writes.append((buf, self._t(swa_rows) if in_swa else full_rows, values))
        if slot is not None:
            writes += self._state(slot, 0)
        self.host.submit(Load(tokens, n - swa, slot, writes, self.report.steps + self.rng.randint(1, 3)))
        self.report.loads += 1

    def back_up(self) -> None:
        """A backup of a running request's landed tokens (every layer; SWA in
        its window) and its state slot, rows resolved now as SGLang's
        engine resolves them (full by ``host_transfer_translate``, SWA by
        ``translate_swa_indices_for_transfer``), read one to four steps
        later; the request is held until then."""
        assert self.host is not None
        rids = [rid for rid, r in self.live.items() if r.decoding and rid not in self.backing]
        if not rids:
            return
        r = self.live[self.rng.choice(rids)]
        full = [t for t in r.tokens if t in self.landed]
        swa = [t for t in r.tokens[r.swa_from :] if t in self.landed] if self.has_swa else []
        if not full:
            return
        rows = {False: self.host.resolve(self.kv.full_kv_pool, self._t(full))}
        if swa:
            rows[True] = self.alloc.translate_swa_indices_for_transfer(self._t(swa))
        reads = [(buf, rows[in_swa], want.clone()) for buf, _rows, want, in_swa in self._kv(full, swa)]
        self.backing.add(r.rid)
        self.host.back_up(Backup(r.rid, reads, self.report.steps + self.rng.randint(1, 3)))

    def _land_loads(self, step: int | None) -> None:
        """The copies acknowledged by ``step``: a load-back's request joins
        the running ones; a backup is compared, and its request let go."""
        assert self.host is not None
        for x in self.host.poll(step):
            if isinstance(x, Backup):
                self._backed_up(x)
                continue
            r = Request(self.next_rid, len(x.tokens), len(x.tokens) + self.rng.randint(4, 24))
            r.tokens, r.swa_from, r.slot, r.decoding = list(x.tokens), x.swa_from, x.slot, True
            self.live[r.rid] = r
            self.next_rid += 1
            self.landed.update(x.tokens)
            self.report.loads_landed += 1
            self.report.loaded_tokens += len(x.tokens)

    def _backed_up(self, x: Backup) -> None:
        self.backing.discard(x.rid)
        self.report.backups += 1
        self.report.backed_up_rows += sum(len(rows) for _, rows, _ in x.reads)
        self.report.backup_rows_lost += x.lost
        if x.lost:
            self.report.errors.append(f"step {self.report.steps}: a backup read {x.lost} rows that had moved")
        for r, done in [h for h in self.held_back if h[0].rid == x.rid]:
            self.held_back.remove((r, done))
            self._release(r, done)

    def _forward(self) -> None:
        """The end of an overlap step, in SGLang's order: this batch is
        launched, then the last batch's result is processed while it runs.
        Every fourth step is an overlap-off boundary (SGLang's
        ``is_disable_overlap_for_batch``: two prefills in a row with
        ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``, or a grammar sync): the
        last result is processed first and ``flush_opportunistic`` runs, the
        forward stream idle, before the launch.  With no batch and nothing
        left, the scheduler is idle (``on_idle``)."""
        last, self.last = self.last, None
        if self.compact_in_flight:
            self._compact()
        if last is not None and self.report.steps % 4 == 3:
            self._process(last)
            last = None
            self.alloc.flush_opportunistic()
        self.last = self._launch()
        if last is not None:
            self._process(last)
        elif self.last is None and not self.live:
            self.on_idle()

    def on_idle(self) -> None:
        """SGLang's ``on_idle`` once fully idle (the last result processed):
        ``flush_opportunistic``, then the pool audit ``verify_byte_accounting``."""
        self.alloc.flush_opportunistic()
        self.report.idle_audits += 1
        self.report.errors += [
            f"step {self.report.steps}: idle audit: {e}" for e in self.alloc.verify_byte_accounting()
        ]

    def step(self) -> None:
        if self.host is not None:
            self._land_loads(self.report.steps)
            k = self.report.steps % 6  # a transfer in flight about half the time: the gate opens between
            if k == 0:
                self.load_back()
            elif k == 3:
                self.back_up()
        held = self.host is not None and bool(self.host.in_flight)  # until the next poll: no copy acknowledged
        moved = sum(getattr(self.alloc, "pages_moved", {}).values())
        if self.retract_every:
            self.resume()
            if self.report.steps % self.retract_every == self.retract_every - 1:
                self.retract()
        for _ in range(self.rng.randint(0, 3)):
            self.admit()
        prefilling = [r for r in self.live.values() if not r.decoding]
        if prefilling:
            self._extend(prefilling, self.rng.choice([2, 3, 5]) * self.ps)
        self._decode()
        self._slide_windows()
        if self.gpu is not None:
            self._forward()
        if held and sum(getattr(self.alloc, "pages_moved", {}).values()) != moved:
            self.report.errors.append(f"step {self.report.steps}: pages moved while a host transfer was in flight")
        self.report.steps += 1
        self.check()


def run(
    kind: str,
    steps: int = 120,
    page_size: int = 1,
    lazy: bool = True,
    seed: int = 0,
    geometry: Geometry | None = None,
    device: str = "cpu",
    overlap: bool = False,
    compact_in_flight: bool = False,
    extra_buffer: bool = False,
    retract: bool = False,
    draft: bool = False,
    hicache: bool = False,
) -> Report:
    """The workload on ``kind``'s stack as SGLang's factory builds it now
    (kvarena's allocator after ``install()``); with ``overlap``, as SGLang's
    overlap scheduler runs it (forwards land late, ``flush_opportunistic``
    called where SGLang calls it: ``Workload._forward``), ending idle
    (``Workload.on_idle``).  ``compact_in_flight``: also the allocator's
    non-urgent compaction every step while the forward runs, which SGLang's
    scheduler never does (``Workload._compact``).  ``extra_buffer``: the mamba
    stacks built with SGLang's mamba extra buffer, each request also taking
    its tracking slots (written once, checked every step).  ``retract``:
    every fifth step a request is retracted to the host, and resumed and
    compared three steps later (``Workload.retract``).  ``draft``: the
    stack built with a speculative draft's K/V fused into its full entries
    (SGLang's placement) and the draft runner's pool bound by SGLang's
    binder; the draft's layer is written and checked with the target's.
    ``hicache``: HiCache load-backs and backups through SGLang's own
    controller calls (``Workload.load_back``, ``Workload.back_up``), their
    copies landing late."""
    w = Workload(
        kind,
        geometry or Geometry(),
        page_size,
        lazy,
        seed,
        device,
        overlap,
        compact_in_flight,
        extra_buffer,
        retract,
        draft,
        hicache,
    )
    # the schedule stream, which the allocator waits on for a forward or a host transfer
    stream = w.gpu or (w.host.engine if w.host is not None else None)
    from .dropin import _Dropin

    sglang_allocator = not isinstance(w.alloc, _Dropin)  # SGLang's own asks torch.cuda for its stream
    with contextlib.nullcontext() if stream is None else stream.current(sglang_allocator):
        for _ in range(steps):
            w.step()
            if w.report.errors:
                break
        if w.last is not None:  # the last result
            w._process(w.last)
            w.last = None
            w.check()
        if w.host is not None:  # and the last load-backs
            w._land_loads(None)
            w.check()
        for truth, host, _ in w.parked:  # the ones still parked come back at the end
            w._resume(truth, host)
        while w.live:
            w.finish(w.live[min(w.live)])
        if w.gpu is not None:  # and the scheduler goes idle
            w.on_idle()
    w.report.pages_moved = dict(getattr(w.alloc, "pages_moved", {}))
    if w.gpu is not None:
        r = w.report
        r.waits, r.reads_checked, r.reads_corrupted = w.gpu.waits, w.gpu.reads_checked, w.gpu.reads_corrupted
        if r.reads_corrupted:
            r.errors.append(f"{r.reads_corrupted} rows a forward read were overwritten before it landed")
    return w.report
