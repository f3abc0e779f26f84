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
"""

import copy
from unittest import mock

import pytest
import torch

from kvarena.anchor.loader import import_sglang
from kvarena.sglang import dropin, stacks, surface
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
