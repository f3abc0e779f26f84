"""Retraction to host on kvarena's drop-in, through SGLang's own code
(issue 43; docs/guides/integrating.md, "SGLang on kvarena").

In PD decode mode SGLang backs a retracted request up to the host before
freeing it (``release_req`` -> ``backup_kv_cache`` -> ``Req.offload_kv_cache``
-> the allocator's ``get_cpu_copy``, the ``cpu_tensor`` backend) and, when it
resumes the request, allocates it again and loads the copy back
(``restore_kv_cache`` -> ``Req.load_kv_cache`` -> ``load_cpu_copy``).

``RetractingServer`` is the overlap event loop of
``tests/sglang/test_overlap.py`` (SGLang's ``ScheduleBatch``,
``UnifiedRadixCache``; ``overlap.Device``, forwards that land late) whose
scheduler, at given steps right after a launch, retracts a request of the forward in
flight with SGLang's ``release_req`` as ``retract_decode`` calls it on a PD
decode server (SGLang's disagg config seen in decode mode, ``cpu_tensor``):
the forward may still be writing the request's tokens and state.  Once the
loop has drained, each retracted request is resumed on a fresh row, state
slot and pages (SGLang's ``alloc_extend``, as PD decode's pre-allocation)
and ``restore_kv_cache``; then every token it had written (every layer, K
and V, full and SWA where it held SWA) and its mamba state must read back
from the new pages with the bytes it held.

``DecodeNode`` (issue 55) is the same loop as a PD decode node under memory
pressure: SGLang's own ``retract_decode`` picks the requests and backs them
up, SGLang's own ``resume_retracted_reqs`` preallocates them again
(``alloc_for_decode_prealloc``: the SWA tail only, at page size > 1) and
restores them, and they rejoin the running batch as SGLang's prebuilt batch
and decode on from the restored KV; its docstring says which SGLang calls
run.  SGLang's own allocator runs there too, and two SGLang 0.5.23
behaviours it shows on both allocators are pinned: the resume's admission
misprices a state slot, and the tri pool's resume stalls on the decode
radix cache.
"""

import contextlib
import copy
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from kvarena.anchor.loader import import_sglang
from kvarena.sglang import dropin, holds, overlap, stacks, surface
from tests.sglang.test_overlap import SERVER_CASES, Server
from tests.sglang.test_scheduler import _free_state_slots, _state_of


class _DecodeMode:
    """SGLang's disagg config bag, seen as a PD decode server with the
    ``cpu_tensor`` retraction backup; everything else as configured."""

    def __init__(self, bag) -> None:
        self._bag = bag

    disaggregation_mode = "decode"
    disaggregation_decode_retraction_backup = "cpu_tensor"

    def __getattr__(self, name):
        return getattr(self._bag, name)


def _copies_to_host(pool) -> None:
    """On the CPU SGLang's ``.to("cpu")`` returns the tensor itself, and a
    state slot picked by a 0-dim index is a view of the pool: the "host"
    copy would follow later writes to the pool.  Make ``pool``'s
    ``get_cpu_copy`` return the copy a device-to-host transfer makes, when
    it is called."""
    take = pool.get_cpu_copy

    def get_cpu_copy(*args, **kwargs):
        return copy.deepcopy(take(*args, **kwargs))

    pool.get_cpu_copy = get_cpu_copy


class RetractingServer(Server):
    """``Server`` whose scheduler retracts a request to the host at given
    steps, right after a launch (the forward in flight may write the
    request's tokens and state), with SGLang's ``release_req`` as
    ``retract_decode`` calls it on a PD decode server; every request
    retracted is resumed once the loop has drained, and checked."""

    RETRACT_AT = (2, 5, 9, 14, 20)

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.parked: list[tuple[object, dict]] = []  # retracted and backed up, with what the backup must hold
        for pool in (self.alloc, self.rtp.mamba_pool if self.has_state else None):
            if pool is not None:
                _copies_to_host(pool)
        self.stats |= {"to host": 0, "restored": 0, "restored tokens": 0, "restored states": 0, "restore bad": 0}

    def _truth(self, r) -> dict:
        """What ``r``'s backup must hold once the forwards launched so far
        have written: each written token's values per layer and K/V (where
        the layer holds it), and its state's version."""
        n = r.seqlen - 1
        ids = self.rtp.req_to_token[r.kv.req_pool_idx, :n].tolist()
        written = [i for i, t in enumerate(ids) if self.gen.get(t, 0) > 0]
        toks = [ids[i] for i in written]
        kv = [(want, held) for _, _, want, held, _ in self._kv(toks)] if toks else []
        state = None
        if self.has_state and r.kv.mamba_pool_idx is not None and self.launched.get(r.rid):
            state = [w for *_, w in self._state(int(r.kv.mamba_pool_idx), self.launched[r.rid])]
        return {"n": n, "at": written, "kv": kv, "state": state}

    def step(self, k: int) -> None:
        super().step(k)
        if k not in self.RETRACT_AT or self.last is None:
            return
        victims = [r for r in self.last[2] if r.kv.holds_kv and not r.finished() and r.seqlen > 1]
        if not victims:
            return
        r = victims[-1]
        truth = self._truth(r)
        slot = _state_of(self, [r]).get(r.rid)
        decode_mode = _DecodeMode(self.m.sb.get_disagg())
        with mock.patch.object(self.m.sb, "get_disagg", lambda: decode_mode):
            kept = self.m.sb.release_req(
                req=r,
                remaing_req_count=1,
                req_to_token_pool=self.rtp,
                token_to_kv_pool_allocator=self.alloc,
                tree_cache=self.cache,
                hisparse_coordinator=None,
            )
        assert kept and r.kv.retraction_backup is not None, "release_req kept no backup"
        _free_state_slots(self, {r.rid: slot})
        if self.running is not None and r in self.running.reqs:
            self.running.filter_batch(keep_indices=[i for i, q in enumerate(self.running.reqs) if q is not r])
        self.stats["to host"] += 1
        self.parked.append((r, truth))

    def resume_all(self) -> None:
        """PD decode's resume of each parked request: a row and state slot
        (the req-to-token pool's ``alloc``), ``n`` fresh tokens
        (``alloc_extend`` from an empty prefix), SGLang's
        ``restore_kv_cache``; then its bytes are checked at the new pages."""
        for r, truth in self.parked:
            n = truth["n"]
            assert self.rtp.alloc([r]) is not None
            zero, seq = torch.zeros(1, dtype=torch.int64), torch.tensor([n], dtype=torch.int64)
            loc = self.alloc.alloc_extend(zero, zero, seq, seq, torch.tensor([-1], dtype=torch.int64), n)
            assert loc is not None
            self.rtp.write((r.kv.req_pool_idx, slice(0, n)), loc.to(torch.int32))
            self.m.common.restore_kv_cache(r, self.cache, self.rtp, self.alloc, "cpu_tensor")
            assert r.kv.retraction_backup is None
            new = [loc.tolist()[i] for i in truth["at"]]
            if new:
                for (buf, rows, _, held, _), (want, had) in zip(self._kv(new), truth["kv"]):
                    keep = held & had  # SWA: loaded where it had an entry and has one now
                    wrong = (buf[rows] != want).reshape(len(new), -1).any(dim=1) & keep
                    self.stats["restore bad"] += int(wrong.sum())
            if truth["state"] is not None:
                got = self._state(int(r.kv.mamba_pool_idx), 0)
                self.stats["restore bad"] += sum(
                    bool((b[rows] != w).any()) for (b, rows, _), w in zip(got, truth["state"])
                )
                self.stats["restored states"] += 1
            self.stats["restored"] += 1
            self.stats["restored tokens"] += len(new)
            if self.has_state:  # done with it: the script frees its state slot, as the loop does
                self.rtp.mamba_allocator.free(r.kv.mamba_pool_idx.reshape(1))
            self.alloc.free(loc)
            self.rtp.free(r)
        self.stats["audit"] = self.alloc.verify_byte_accounting()


def _serve(kind, ps, lazy, policy, monkeypatch) -> dict:
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    s = RetractingServer(kind, ps, lazy, policy)
    with s.gpu.current():
        stats = s.serve(12, 160)
        s.resume_all()
    return stats


@pytest.mark.parametrize(("kind", "ps", "lazy", "policy"), SERVER_CASES)
def test_retraction_to_host_round_trips_every_byte(kind, ps, lazy, policy, monkeypatch):
    s = _serve(kind, ps, lazy, policy, monkeypatch)
    assert s["restore bad"] == s["lost"] == s["bad"] == s["reads_corrupted"] == 0 and s["audit"] == [], s
    assert s["finished"] + s["to host"] == 12 and s["restored"] == s["to host"] >= 3, s
    assert s["restored tokens"] > 0, s
    assert s["restored states"] > 0 or kind == "swa", s


def test_a_backup_that_does_not_settle_the_forward_is_caught(monkeypatch):
    """Planted: ``get_cpu_copy`` copies while the forward in flight has not
    written yet (no settle): the restored bytes are stale."""
    monkeypatch.setattr(dropin._Dropin, "_settle_for_host_copy", lambda self: None)
    bad = 0
    for kind, ps, lazy, policy in SERVER_CASES:
        if kind != "swa":
            bad += _serve(kind, ps, lazy, policy, monkeypatch)["restore bad"]
    assert bad > 0


def test_retraction_to_host_and_pd_are_supported():
    """Neither retraction to host nor any of PD's three calls is in ``UNSUPPORTED``."""
    pd = ("set_disagg_move_gate", "translate_kv_indices_for_transfer", "alloc_extend_swa_tail")
    assert not {"get_cpu_copy", "load_cpu_copy", *pd} & set(surface.UNSUPPORTED)


def _serve_sglang(kind: str, monkeypatch) -> dict:
    """SGLang's own allocator in the same loop, the pools' device
    synchronize landing every forward (as on a GPU)."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    s = RetractingServer(kind, 1, True, None)
    platform = import_sglang("sglang.srt.mem_cache.memory_pool").current_platform
    monkeypatch.setattr(platform, "synchronize", lambda *a, **k: s.gpu.land_all(waited=True), raising=False)
    with s.gpu.current(sglang_allocator=True), stacks.cpu_kernels():
        stats = s.serve(12, 160)
        s.resume_all()
    return stats


def test_sglang_own_tri_pool_backs_up_another_slots_state(monkeypatch):
    """SGLang 0.5.23's own allocator: on the mamba stack its backup round
    trips (its KV pool translates the slot); on the mamba + SWA stack
    ``Req.offload_kv_cache`` hands the mamba pool the virtual slot id, a
    row there, and every restored state is another slot's.  kvarena's
    drop-in carries the state itself (the test above)."""
    mamba = _serve_sglang("mamba", monkeypatch)
    assert mamba["restore bad"] == 0 and mamba["restored states"] > 0, mamba
    tri = _serve_sglang("mamba_swa", monkeypatch)
    assert tri["restored states"] > 0 and tri["restore bad"] >= tri["restored states"], tri


# ------------------------------------------- a PD decode node under pressure

_dec = import_sglang("sglang.srt.disaggregation.decode")
_brp = import_sglang("sglang.srt.managers.scheduler_components.batch_result_processor")
_du = import_sglang("sglang.srt.disaggregation.utils")


class DecodeNode(RetractingServer):
    """``Server`` as a PD decode node: SGLang's disagg config reads decode
    mode, the ``cpu_tensor`` backup, for the whole run (``_decode_node``),
    and the loop's tree is SGLang's decode-node default, the same
    ``UnifiedRadixCache`` disabled (``radix``: enabled, with
    ``disaggregation_decode_enable_radix_cache``).  No fixed-step
    retraction: every retraction is SGLang's, under memory pressure.

    What runs is SGLang's own code, in ``event_loop_overlap_disagg_decode``'s
    order:

    - each decode step, ``update_running_batch``'s ``check_decode_mem``
      and, on a shortfall, ``retract_decode``, which picks the requests and
      backs each up to the host through ``ScheduleBatch.release_req`` ->
      ``release_req`` -> ``backup_kv_cache`` -> ``Req.offload_kv_cache`` ->
      the allocator's ``get_cpu_copy``, then frees it; the test wraps the
      batch's ``release_req`` only to take each request's truth (what its
      backup must hold) before the call.  The retracted go to
      ``DecodePreallocQueue.add(req, is_retracted=True)``;
    - at the start of each step (``process_decode_queue``; here the end of
      the last), ``DecodePreallocQueue.resume_retracted_reqs`` on a queue
      built bare (``object.__new__``) with the fields it reads: its
      admission (``ensure_mamba_capacity``, ``_prealloc_required_tokens``,
      ``prealloc_fits``), ``_pre_alloc`` (a row and state slot,
      ``req_to_token_pool.alloc``; ``alloc_for_decode_prealloc``:
      ``alloc_extend_swa_tail`` with ``_swa_tail_len``'s tail and
      ``set_evicted_seqlen`` on the SWA stacks at page size > 1,
      ``alloc_extend`` on the mamba stack, ``alloc`` at page size 1), the
      schedule stream's ``wait_stream`` on the forward stream, and
      ``restore_kv_cache`` -> ``Req.load_kv_cache`` -> ``load_cpu_copy``;
    - then ``Scheduler._get_new_prebuilt_batch`` (``init_next_round_input``,
      ``ScheduleBatch.init_new``, ``prepare_for_prebuilt``),
      ``process_prebuilt``, ``process_batch_result_prebuilt``, and the
      prebuilt batch merges into the running batch, as
      ``get_next_disagg_decode_batch_to_run`` does; the next decode steps'
      ``prepare_for_decode`` allocate the resumed requests' new tokens and
      the forwards write them (checked like every other token).

    Once resumed (``_check_restored``), a request's every written token reads
    back from its new pages (full: every layer; SWA: where it had an entry
    and has one now), SWA is bound for ``_swa_tail_len``'s tail only, and its
    state comes back.  The restored tokens are then checked after every step
    and read by every forward of the request at the bytes they were restored
    to, until freed or rewritten; its restored state is read by its first
    forward after the resume.  A request joins decoding once its first token
    is known, as a transferred one does (the loop's prefill stands in for
    the transfer); no new request is admitted while any retracted one
    waits."""

    RETRACT_AT = ()

    def __init__(self, kind: str, ps: int, lazy: bool, policy: str | None, radix: bool = False) -> None:
        super().__init__(kind, ps, lazy, policy)
        self.radix = radix
        if not radix:  # SGLang's default decode node: the same tree, disabled
            self.cache = self.m.urc.UnifiedRadixCache(
                self.m.cip.CacheInitParams(
                    disable=True,
                    req_to_token_pool=self.rtp,
                    token_to_kv_pool_allocator=self.alloc,
                    page_size=ps,
                    sliding_window_size=self.g.window if self.has_swa else None,
                    tree_components=self.cache.tree_components,
                )
            )
            for method in ("evict", "evict_for_alloc"):
                setattr(self.cache, method, self._counted("evictions", getattr(self.cache, method)))
        self.truths: dict[str, dict] = {}  # retracted -> what its backup must hold
        # restored token -> its values per layer and K/V, and whether its SWA entry came back
        self.kept: dict[int, tuple[list[torch.Tensor], bool]] = {}
        self.kept_state: dict[str, tuple[object, int, list]] = {}  # resumed, no forward launched since: its state
        self.resumed: set[str] = set()
        self.stats |= {"aborted": 0, "restored bad states": 0, "outside tail": 0, "tail swa restored": 0}
        self.stats |= {"swa outside tail": 0, "swa tail unbound": 0, "decoded after resume": 0}
        self.stats |= {"kept checks": 0, "kept bad": 0}
        self.queue = self._prealloc_queue()

    def _prealloc_queue(self):
        """SGLang's ``DecodePreallocQueue``, built bare with the fields its
        retraction paths read; its scheduler a namespace of the fields they
        and ``_get_new_prebuilt_batch`` read."""
        q = object.__new__(_dec.DecodePreallocQueue)
        q.retracted_queue = []
        q.req_to_token_pool, q.token_to_kv_pool_allocator, q.token_to_kv_pool = self.rtp, self.alloc, self.kv
        q.tree_cache, q.max_total_num_tokens = self.cache, self.alloc.size
        q.transfer_queue = SimpleNamespace(queue=[])
        # room for a decode step per request, and on the mamba stacks for a state slot's share of the pool:
        # the admission prices tokens only (test_resume_admission_misprices_the_state_slot)
        q.num_reserved_decode_tokens = max(self.ps, self.alloc.mamba_slot_full_token_cost() if self.has_state else 0)
        pre_alloc = q._pre_alloc

        def handed_out(req, *args, **kwargs):  # the queue's own _pre_alloc, seen as it returns
            loc = pre_alloc(req, *args, **kwargs)
            self._handed_out(loc.tolist())
            return loc

        q._pre_alloc = handed_out
        q.scheduler = SimpleNamespace(
            waiting_queue=[],
            last_batch=None,
            enable_hisparse=False,
            enable_overlap=True,
            schedule_stream=self.gpu.stream,
            forward_stream=self.gpu.forward_stream,
            sliding_window_size=self.g.window if self.has_swa else None,
            tp_worker=SimpleNamespace(is_hybrid_swa=self.has_swa),
            grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
            enable_priority_scheduling=False,
            req_to_token_pool=self.rtp,
            token_to_kv_pool_allocator=self.alloc,
            tree_cache=self.cache,
            max_running_requests=self.g.max_reqs,
            model_config=self.model,
            spec_algorithm=self.m.spec.SpeculativeAlgorithm.NONE,
            disaggregation_mode=_du.DisaggregationMode.DECODE,
            hisparse_coordinator=None,
            output_streamer=SimpleNamespace(stream_output=lambda *a, **k: None),
        )
        return q

    def new_req(self, rid: str, ids: list[int], max_new: int) -> None:
        """``Server.serve``'s requests without their shared prefix and
        decoding 16 tokens more: the pool runs short while they decode."""
        super().new_req(rid, ids[8 * self.ps :], max_new + 16)

    # ------------------------------------------------------------ truth

    def _truth(self, r) -> dict:
        """As ``RetractingServer``'s, restored tokens (and a restored state
        no forward has rewritten yet) at what they were restored to."""
        n = r.seqlen - 1
        ids = self.rtp.req_to_token[r.kv.req_pool_idx, :n].tolist()
        written = [i for i, t in enumerate(ids) if t in self.kept or self.gen.get(t, 0) > 0]
        toks = [ids[i] for i in written]
        kv = []
        for j, (_, _, want, held, swa) in enumerate(self._kv(toks) if toks else []):
            want, held = want.clone(), held.clone()
            for i, t in enumerate(toks):
                if t in self.kept:
                    values, had = self.kept[t]
                    want[i] = values[j]
                    held[i] &= had or not swa
            kv.append((want, held))
        state = None
        slot = None if r.kv.mamba_pool_idx is None else int(r.kv.mamba_pool_idx)
        if r.rid in self.kept_state and self.kept_state[r.rid][1] == slot:
            state = self.kept_state[r.rid][2]
        elif self.has_state and slot is not None and self.launched.get(r.rid):
            state = [w for *_, w in self._state(slot, self.launched[r.rid])]
        return {"n": n, "at": written, "kv": kv, "state": state}

    # ------------------------------------------------------------ the loop

    def prefill(self):
        """No new request while any retracted one waits (``process_decode_queue``)."""
        return None if self.queue.retracted_queue else super().prefill()

    def decode(self):
        """``update_running_batch``: ``check_decode_mem`` and, on a
        shortfall, ``retract_decode``; the retracted to the prealloc queue."""
        b = self.running
        if any(not r.output_ids for r in b.reqs):
            return None  # a request joins decoding with its first token known, as a transferred one does
        if not b.check_decode_mem():
            slots = _state_of(self, b.reqs)
            release = b.release_req

            def observed(idx, remaing_req_count, offload_kv=True):
                if offload_kv:  # backed up: what the backup must hold, before release_req copies and frees
                    self.truths[b.reqs[idx].rid] = self._truth(b.reqs[idx])
                return release(idx, remaing_req_count, offload_kv=offload_kv)

            b.release_req = observed
            try:
                retracted, _, aborted = b.retract_decode()
            finally:
                del b.release_req
            gone = [r.rid for r in retracted + aborted]
            _free_state_slots(self, {rid: slots[rid] for rid in gone if rid in slots})
            for r in retracted:
                assert r.kv.retraction_backup is not None, "retract_decode kept no backup"
                self.queue.add(r, is_retracted=True)
                assert r in self.queue.retracted_queue, f"{r.rid} refused"
            self.stats["retracted"] += len(retracted)
            self.stats["to host"] += len(retracted)
            self.stats["aborted"] += len(aborted)
        if b.is_empty():
            return None
        b.prepare_for_decode()
        return b

    def on_idle(self) -> None:
        if not self.queue.retracted_queue:
            super().on_idle()

    def step(self, k: int) -> None:
        super().step(k)
        self.process_decode_queue()

    def process_decode_queue(self) -> None:
        """``resume_retracted_reqs``, then the resumed as a prebuilt batch
        merged into the running batch (``get_next_disagg_decode_batch_to_run``)."""
        q = self.queue
        if not q.retracted_queue:
            return
        s = q.scheduler
        reqs = [] if self.running is None else list(self.running.reqs)
        s.running_batch = SimpleNamespace(reqs=reqs, batch_size=lambda: len(reqs))
        s.last_batch, s.waiting_queue = self.last_batch, []
        resumed = q.resume_retracted_reqs()
        for r in resumed:
            self._check_restored(r)
        if not resumed:
            return
        s.waiting_queue = list(resumed)
        batch = _dec.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch(s, s.running_batch)
        batch.process_prebuilt(SimpleNamespace(stash=lambda *a, **k: None))  # the first decode's input: unused
        _brp.SchedulerBatchResultProcessor.process_batch_result_prebuilt(s, batch)
        batch.filter_batch()
        if not batch.is_empty():
            if self.running is None or self.running.is_empty():
                self.running = batch
            else:
                self.running.merge_batch(batch)

    # ------------------------------------------------------------ resume

    def _handed_out(self, loc: list[int]) -> None:
        """Fresh pages for a resumed request, before anything is restored
        there: what a forward wrote there before is gone, and a forward
        still in flight that writes their earlier life (a request that
        finished last step) is not checked when it lands (as ``launch``)."""
        ps = self.ps
        for t in loc:
            for u in range(t // ps * ps, (t // ps + 1) * ps):
                self.landed.discard(u)
                self.kept.pop(u, None)
                if u in self.gen:
                    self.gen[u] += 1

    def _check_restored(self, r) -> None:
        """``r`` just resumed: every token it had written reads back from its
        new pages (full: every layer; SWA: where it had an entry and has one
        now), SWA bound for the window's tail only, and its state."""
        truth = self.truths.pop(r.rid)
        n, q = truth["n"], self.queue
        assert r.kv.kv_committed_len == n and r.kv.retraction_backup is None, (r.rid, r.kv.kv_committed_len, n)
        row = self.rtp.req_to_token[r.kv.req_pool_idx, :n].tolist()
        new = [row[i] for i in truth["at"]]
        # SGLang's tail (_swa_tail_len): SWA bound from tail_from on, none before; at page size 1 every token's
        tail_from = n - q._swa_tail_len(n) if q._uses_swa_tail_prealloc() else 0
        if self.has_swa:
            bound = (self.alloc.translate_loc_from_full_to_swa(torch.tensor(row, dtype=torch.int64)) > 0).tolist()
            self.stats["outside tail"] += tail_from
            self.stats["swa outside tail"] += sum(bound[:tail_from])
            self.stats["swa tail unbound"] += bound[tail_from:].count(False)
        at_tail = torch.tensor([i >= tail_from for i in truth["at"]], dtype=torch.bool)
        values: list[list[torch.Tensor]] = [[] for _ in new]
        swa_back, wrong = [True] * len(new), torch.zeros(len(new), dtype=torch.bool)
        if new:
            for (buf, rows, _, held, swa), (want, had) in zip(self._kv(new), truth["kv"]):
                keep = held & had  # SWA: loaded where it had an entry and has one now
                wrong |= (buf[rows] != want).reshape(len(new), -1).any(dim=1) & keep
                if swa:  # and the tail's: an entry it had and has none now did not come back
                    wrong |= had & at_tail & ~held
                    swa_back = [a and k for a, k in zip(swa_back, keep.tolist())]
                for i in range(len(new)):
                    values[i].append(want[i])
        self.stats["restore bad"] += int(wrong.sum())
        self.kept.update((t, (values[i], swa_back[i])) for i, t in enumerate(new))
        if self.has_swa:
            self.stats["tail swa restored"] += sum(swa_back)
        if truth["state"] is not None:
            slot = int(r.kv.mamba_pool_idx)
            got = self._state(slot, 0)
            bad = any(bool((b[rows] != w).any()) for (b, rows, _), w in zip(got, truth["state"]))
            self.stats["restore bad"] += bad
            self.stats["restored bad states"] += bad
            self.stats["restored states"] += 1
            r.slot, self.version[r.rid] = slot, 0  # its slot now; the loop checks what forwards write there
            self.kept_state[r.rid] = (r, slot, truth["state"])
        self.stats["restored"] += 1
        self.stats["restored tokens"] += len(new)
        self.resumed.add(r.rid)

    # ------------------------------------------------------------ forwards and checks

    def launch(self, batch) -> None:
        ps = self.ps
        for t in batch.out_cache_loc.tolist():  # rewritten: no longer what was restored
            for u in range(t, (t // ps + 1) * ps):
                self.kept.pop(u, None)
        if batch.forward_mode.is_decode():
            self.stats["decoded after resume"] += sum(r.rid in self.resumed for r in batch.reqs)
        super().launch(batch)
        for r in batch.reqs:  # the forward rewrites the state it reads
            self.kept_state.pop(r.rid, None)

    def _reads(self, batch, new: set[int]) -> list[overlap.Read]:
        """The loop's reads, restored tokens and states at what they were restored to."""
        owners = []
        for i, r in enumerate(batch.reqs):
            row = self.rtp.req_to_token[r.kv.req_pool_idx, : int(batch.seq_lens_cpu[i])].tolist()
            owners += [(r, r.kv.req_pool_idx, t) for t in row if t in self.kept and t not in new]
        toks = [t for *_, t in owners]
        reads = super()._reads(batch, new | set(toks))
        if toks:
            t64 = torch.tensor(toks, dtype=torch.int64)
            had = torch.tensor([self.kept[t][1] for t in toks])

            def live(swa: bool) -> torch.Tensor:
                mine = torch.tensor([r.kv.holds_kv and r.kv.req_pool_idx == idx for r, idx, _ in owners])
                if swa:  # an SWA entry restored, and not freed since
                    mine &= had & (self.alloc.translate_loc_from_full_to_swa(t64) > 0)
                return mine

            for j, (buf, rows, _, _, swa) in enumerate(self._kv(toks)):
                want = torch.stack([self.kept[t][0][j] for t in toks])
                reads.append(overlap.Read(buf, rows, want, lambda swa=swa: live(swa)))
        for r in batch.reqs:
            if r.rid in self.kept_state and self.kept_state[r.rid][1] == getattr(r, "slot", None):
                _, slot, want = self.kept_state[r.rid]

                def still(r=r, slot=slot) -> torch.Tensor:
                    return torch.tensor([r.kv.holds_kv and getattr(r, "slot", None) == slot])

                reads += [overlap.Read(b, rows, w, still) for (b, rows, _), w in zip(self._state(slot, 0), want)]
        return reads

    def check(self) -> int:
        """The loop's check, then every restored token still allocated (and
        every restored state no forward has rewritten) at what it was
        restored to."""
        bad = super().check()
        ids = sorted(self.kept)
        if ids:
            pages = torch.div(torch.tensor(ids, dtype=torch.int64), self.ps, rounding_mode="floor")
            alive = (self.alloc.full_attn_allocator.virtual_to_physical[pages] > 0).tolist()
            ids = [t for t, a in zip(ids, alive) if a]
        kept_bad = 0
        if ids:
            wrong = torch.zeros(len(ids), dtype=torch.bool)
            had = torch.tensor([self.kept[t][1] for t in ids])
            for j, (buf, rows, _, held, swa) in enumerate(self._kv(ids)):
                want = torch.stack([self.kept[t][0][j] for t in ids])
                wrong |= (buf[rows] != want).reshape(len(ids), -1).any(dim=1) & (held & had if swa else held)
            kept_bad += int(wrong.sum())
        for r, slot, want in self.kept_state.values():
            if r.kv.holds_kv and getattr(r, "slot", None) == slot:
                kept_bad += any(bool((b[rows] != w).any()) for (b, rows, _), w in zip(self._state(slot, 0), want))
        self.stats["kept checks"] += len(ids)
        self.stats["kept bad"] += kept_bad
        return bad + kept_bad


def _decode_node(kind, ps, policy, monkeypatch, sglang_allocator=False, radix=False, reserve=None) -> dict:
    """One run of ``DecodeNode`` (lazy compaction), SGLang's disagg config in
    decode mode for the whole run; SGLang's own allocator as in
    ``_serve_sglang``.  ``reserve``: the prealloc queue's
    ``num_reserved_decode_tokens``, if not ``DecodeNode``'s."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    disagg = import_sglang("sglang.srt.runtime_context").get_disagg()
    mode = {
        "disaggregation_mode": "decode",
        "disaggregation_decode_retraction_backup": "cpu_tensor",
        "disaggregation_decode_enable_radix_cache": radix,
    }
    s = DecodeNode(kind, ps, True, None if sglang_allocator else policy, radix)
    if reserve is not None:
        s.queue.num_reserved_decode_tokens = reserve
    kernels = stacks.cpu_kernels() if sglang_allocator else contextlib.nullcontext()
    if sglang_allocator:
        platform = import_sglang("sglang.srt.mem_cache.memory_pool").current_platform
        monkeypatch.setattr(platform, "synchronize", lambda *a, **k: s.gpu.land_all(waited=True), raising=False)
    with disagg.override(**mode), s.gpu.current(sglang_allocator=sglang_allocator), kernels:
        stats = s.serve(12, 400)
    stats["left retracted"] = len(s.queue.retracted_queue)
    return stats


def _clean(s: dict) -> bool:
    return s["restore bad"] == s["kept bad"] == s["lost"] == s["bad"] == s["reads_corrupted"] == 0


# every stack at page sizes 1 and 4, lazy, under both policies; the decode radix cache (SGLang's experimental
# option, on the stacks where its resume works: test_the_tri_pools_resume_stalls_on_the_decode_radix_cache) with
# its tree's relocations besides
DECODE_CASES = [
    (kind, ps, ("planner", "anchor")[(k + j) % 2], False)
    for k, kind in enumerate(stacks.KINDS)
    for j, ps in enumerate((1, 4))
] + [(kind, ps, "planner", True) for kind in ("swa", "mamba") for ps in (1, 4)]


@pytest.mark.parametrize(("kind", "ps", "policy", "radix"), DECODE_CASES)
def test_a_decode_node_retracts_under_pressure_and_decodes_on_from_the_restored_kv(
    kind, ps, policy, radix, monkeypatch
):
    s = _decode_node(kind, ps, policy, monkeypatch, radix=radix)
    print(kind, ps, policy, radix, {k: v for k, v in s.items() if k not in ("audit", "idle audit")})
    assert _clean(s) and s["audit"] == [] and s["idle audit"] == [], s
    assert s["finished"] == 12 and s["aborted"] == s["left retracted"] == 0, s
    assert s["retracted"] >= 2 and s["restored"] == s["retracted"], s  # SGLang's retract_decode, several times
    assert s["restored tokens"] > 0 and s["decoded after resume"] > 0 and s["kept checks"] > 0, s
    assert s["restored states"] == (s["restored"] if kind != "swa" else 0), s
    if kind != "mamba":  # SWA for the tail only, and the tail's came back
        assert s["swa outside tail"] == s["swa tail unbound"] == 0 and s["tail swa restored"] > 0, s
        assert s["outside tail"] > 0 or ps == 1, s  # at page size 1 SGLang binds SWA for every token (alloc)


@pytest.mark.parametrize(("kind", "ps"), [(kind, ps) for kind in stacks.KINDS for ps in (1, 4)])
def test_sglang_own_allocator_as_a_decode_node(kind, ps, monkeypatch):
    """SGLang's own allocator in the same decode node: on the SWA and mamba
    stacks every byte comes back and decodes on; on the mamba + SWA stack
    every token does, but a restored state is another slot's
    (``retraction-backup-virtual-slot``: ``Req.offload_kv_cache`` and
    ``load_kv_cache`` hand its mamba pool the virtual slot id, a row there),
    and loading it overwrites a live request's state, which the loop then
    reads and checks wrong.  kvarena's drop-in carries the state itself."""
    s = _decode_node(kind, ps, None, monkeypatch, sglang_allocator=True)
    print(kind, ps, {k: v for k, v in s.items() if k not in ("audit", "idle audit")})
    assert s["finished"] == 12 and s["aborted"] == s["left retracted"] == 0 and s["audit"] == [], s
    assert s["retracted"] >= 2 and s["restored"] == s["retracted"] and s["decoded after resume"] > 0, s
    assert s["restored states"] == (s["restored"] if kind != "swa" else 0), s
    if kind != "mamba":
        assert s["swa outside tail"] == s["swa tail unbound"] == 0 and s["tail swa restored"] > 0, s
    if kind != "mamba_swa":
        assert _clean(s) and s["idle audit"] == [], s
    else:  # every token back (the bad are states), the states not, and another request's state overwritten
        assert 0 < s["restored bad states"] == s["restore bad"] and s["bad"] + s["reads_corrupted"] > 0, s


@pytest.mark.parametrize(("kind", "ps"), [("swa", 4), ("mamba", 1), ("mamba_swa", 4)])
def test_a_restore_that_loads_nothing_is_caught(kind, ps, monkeypatch):
    """Planted: the drop-in's ``load_cpu_copy`` restores no KV."""
    monkeypatch.setattr(holds.HostTransfers, "load_cpu_copy", lambda self, *args, **kwargs: None)
    s = _decode_node(kind, ps, "planner", monkeypatch)
    assert s["restored"] > 0 and s["restore bad"] > 0, s


@pytest.mark.parametrize("what", ["kv", "state"])
def test_restored_bytes_overwritten_after_the_resume_are_caught(what, monkeypatch):
    """Planted after a correct restore: the resumed request's first token's
    full K, or its state, overwritten before it decodes on; the loop's
    checks and its forwards' reads of the restored bytes catch it."""
    check = DecodeNode._check_restored

    def overwrite(self, r):
        check(self, r)
        if what == "kv":
            rows = self.alloc.translate_kv_loc(self.rtp.req_to_token[r.kv.req_pool_idx, :1].long())
            self.kv.get_key_buffer(self.g.full_layers[0])[rows] += 1
        else:
            slot = self.rtp.mamba_allocator.translate(torch.tensor([int(r.kv.mamba_pool_idx)]))
            self.rtp.mamba_pool.mamba_cache.temporal[:, slot] += 1

    monkeypatch.setattr(DecodeNode, "_check_restored", overwrite)
    s = _decode_node("mamba", 4, "planner", monkeypatch)
    assert s["restore bad"] == 0 and s["kept bad"] >= s["restored"] > 0 and s["reads_corrupted"] > 0, s


class _Caught(Exception):
    pass


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_a_tail_preallocation_that_binds_no_swa_is_caught(kind, monkeypatch):
    """Planted: the drop-in's ``alloc_extend_swa_tail`` binds SWA for no
    page: the tail's SWA entries do not come back, and the first resume's
    check says so.  (The run stops there: the decode node's
    ``set_evicted_seqlen`` still says the tail is bound, a state neither
    allocator survives, SGLang's own included.)"""
    real = holds.SWAHostTransfers.alloc_extend_swa_tail

    def no_tail(self, *args, swa_tail_len, **kwargs):
        return real(self, *args, swa_tail_len=0, **kwargs)

    check = DecodeNode._check_restored

    def stop_at_the_first(self, r):
        check(self, r)
        raise _Caught(dict(self.stats))

    monkeypatch.setattr(holds.SWAHostTransfers, "alloc_extend_swa_tail", no_tail)
    monkeypatch.setattr(DecodeNode, "_check_restored", stop_at_the_first)
    with pytest.raises(_Caught) as caught:
        _decode_node(kind, 4, "planner", monkeypatch)
    s = caught.value.args[0]
    assert s["restored"] == 1 and s["swa tail unbound"] > 0 and s["restore bad"] > 0, s


@pytest.mark.parametrize("sglang_allocator", [False, True], ids=["kvarena", "sglang"])
def test_resume_admission_misprices_the_state_slot(sglang_allocator, monkeypatch):
    """SGLang 0.5.23, on its own allocator as on kvarena's: with
    ``num_reserved_decode_tokens`` below a state slot's share of the unified
    pool (``mamba_slot_full_token_cost``), ``resume_retracted_reqs`` admits
    a request (``ensure_mamba_capacity`` counts slots, ``prealloc_fits``
    prices tokens, each alone fits), then ``_pre_alloc``'s
    ``req_to_token_pool.alloc`` takes the slot's bytes from the same pool
    and the KV allocation after it comes up short: SGLang's own assert."""
    with pytest.raises(AssertionError, match="Bug in memory estimation"):
        _decode_node("mamba", 1, "planner", monkeypatch, sglang_allocator=sglang_allocator, reserve=1)


@pytest.mark.parametrize("sglang_allocator", [False, True], ids=["kvarena", "sglang"])
def test_the_tri_pools_resume_stalls_on_the_decode_radix_cache(sglang_allocator, monkeypatch):
    """SGLang 0.5.23, on its own allocator as on kvarena's: the mamba + SWA
    allocator's ``prealloc_fits`` prices the pool as it stands (it does not
    assume a reclaim: ``prealloc_fits_assumes_reclaim`` is False), so with
    the decode radix cache on, once the tree holds the room a retracted
    request needs and nothing runs, ``resume_retracted_reqs`` refuses it at
    every step and nothing evicts the tree: retracted requests are left,
    and no new request is admitted while they are."""
    s = _decode_node("mamba_swa", 1, "planner", monkeypatch, sglang_allocator=sglang_allocator, radix=True)
    assert s["retracted"] > 0 and s["left retracted"] > 0 and s["finished"] < 12 and s["audit"] == [], s
