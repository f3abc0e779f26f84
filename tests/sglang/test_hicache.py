"""HiCache on kvarena's drop-in, through SGLang's own code on the CPU
(issue 43; docs/design.md §13).

A HiCache server installs its move gate at startup and, per load-back,
runs ``HybridCacheController.load``: full rows alone from
``full_attn_allocator.alloc``, SWA pages through the callbacks
``_swa_allocation_callbacks`` picks, rolled back by
``_resolve_device_transfers`` on a shortfall, bound at the tree's commit by
``set_full_to_swa_mapping``; the copy is submitted with its rows resolved
then and lands later.  ``kvarena.sglang.hicache.HostCache`` runs those calls
of SGLang's over a controller holding only the queues its gate reads; the
copy engine (a GPU's) is played late, at the rows SGLang resolved.
"""

import argparse

import pytest
import torch

from kvarena import sglang as ks
from kvarena.sglang import allocators, cli, dropin, stacks, surface, workload
from kvarena.sglang.hicache import HostCache

I64 = torch.int64
HICACHE = ("set_host_transfer_move_gate", "set_hicache_transfer_done_event", "set_full_to_swa_mapping")
# page size 16 makes every step long: without forwards in flight only
CASES = [(kind, ps, overlap) for kind in stacks.KINDS for ps in (1, 4) for overlap in (False, True)]
CASES += [(kind, 16, False) for kind in stacks.KINDS]


def _stack(kind: str, ps: int = 4, lazy: bool = True):
    ks.install()
    return stacks.build(kind, page_size=ps, lazy=lazy)


def test_the_hicache_calls_are_kvarenas():
    """The issue's list: HiCache's calls are kvarena's (PD's too: tests/sglang/test_pd.py)."""
    assert not set(HICACHE) & set(surface.UNSUPPORTED)
    assert {"draft_virtual_id_space", "get_cpu_copy", "load_cpu_copy"}.isdisjoint(surface.UNSUPPORTED)


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_a_hicache_server_boots_on_kvarena(kind):
    """What the scheduler does at startup with HiCache on: install the move
    gate (``scheduler.py``); and what the composite sets on the KV pools for
    the transfer engine, as SGLang's does."""
    b = _stack(kind)
    alloc = b.token_to_kv_pool_allocator
    assert isinstance(alloc, allocators.ALLOCATORS)
    HostCache(alloc, b.token_to_kv_pool)  # SGLang's gate over an idle controller
    assert not alloc.moves_blocked() and not alloc.composite.arena.gate_closed
    assert b.token_to_kv_pool.full_kv_pool.host_transfer_translate == alloc.full_attn_allocator.translate_kv_loc
    if kind != "mamba":
        kv = b.token_to_kv_pool
        assert kv.full_kv_pool.host_capacity_tokens == alloc.size_full
        assert kv.swa_kv_pool.host_capacity_bytes == alloc.size_swa * b.unified_memory_pool.spec("swa").entry_bytes()


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_the_gate_needs_lazy_compaction(kind):
    """SGLang asserts lazy compaction when a gate is installed; kvarena says
    which pool is eager, and installs nothing."""
    alloc = _stack(kind, lazy=False).token_to_kv_pool_allocator
    with pytest.raises(ValueError, match=r"pool '\w+'.*lazy compaction"):
        alloc.set_host_transfer_move_gate(lambda: False)
    assert not alloc.moves_blocked()


def _filled(kind: str, ps: int):
    """A stack whose full band has holes behind live pages (every other
    allocation freed, the one at the frontier kept), so that relief would
    move pages."""
    b = _stack(kind, ps)
    alloc = b.token_to_kv_pool_allocator
    held = []
    while (got := alloc.full_attn_allocator.alloc(2 * ps)) is not None:
        held.append(got)
    freed = set(range(0, len(held) - 1, 2))  # the last one stays: a live page at the frontier, nothing to absorb
    for i in sorted(freed):
        alloc.full_attn_allocator.free(held[i])
    return b, alloc, [got for i, got in enumerate(held) if i not in freed]


def _other_end(alloc, ps):
    """A demand of the band at the other end from full, one page past what
    it can take without a move (full's holes block its growth): state
    slots where there is a state pool, else an SWA reservation."""
    if hasattr(alloc, "mamba_allocator"):
        view, n = alloc.mamba_allocator, alloc.mamba_allocator.available_size() + 1
    else:
        view, n = alloc.swa_attn_allocator, alloc.swa_attn_allocator.available_size() + ps
    return lambda: view.alloc(n)


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("ps", [1, 4])
def test_no_page_moves_while_a_transfer_is_in_flight(kind, ps):
    """With a transfer queued (the gate reads closed) a demand that needs
    compaction moves nothing and is refused, every live page where it was,
    and no view credits the holes; once the transfer is acknowledged the
    same demand compacts and succeeds."""
    b, alloc, kept = _filled(kind, ps)
    host = HostCache(alloc, b.token_to_kv_pool)
    arena = alloc.composite.arena
    rows = [alloc.translate_kv_loc(t) for t in kept]
    ask = _other_end(alloc, ps)
    host.ctl.write_queue.append("a backup in flight")
    allowed = getattr(alloc, "_compaction_allowed", None)  # the SWA stacks' (SGLang's reclaim_plan reads it)
    assert alloc.moves_blocked() and arena.gate_closed and not (allowed and allowed())
    for view in alloc._views():
        assert view.schedulable_available_size() == view.available_size()
    before = dict(alloc.pages_moved)
    assert ask() is None  # it needs a compaction: held
    assert alloc.pages_moved == before
    assert all(torch.equal(alloc.translate_kv_loc(t), r) for t, r in zip(kept, rows))
    host.ctl.write_queue.clear()  # acknowledged: the gate opens
    assert not alloc.moves_blocked() and (allowed is None or allowed())
    assert ask() is not None
    assert sum(alloc.pages_moved.values()) > sum(before.values())
    assert alloc.verify_byte_accounting() == []


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_a_swa_reservation_is_live_unowned_and_holds_moves(kind):
    """SGLang's SWA callbacks over kvarena's SWA view: ``alloc`` reserves
    pages by physical id (every view counts them, no id owns them, moves are
    held), ``set_full_to_swa_mapping`` gives them to full rows, ``free``
    cancels; bad ids are a ``ValueError`` naming the pool, nothing changed."""
    ps = 4
    b = _stack(kind, ps)
    alloc = b.token_to_kv_pool_allocator
    swa, arena = alloc.swa_attn_allocator, alloc.composite.arena
    live, avail = swa.allocated_count(), swa.available_size()
    phys = swa.alloc(2 * ps)
    assert phys is not None and phys.numel() == 2 * ps
    assert swa.allocated_count() == live + 2 * ps and swa.available_size() < avail
    assert alloc.moves_blocked() and sorted(arena.reserved("swa")) == sorted((phys[::ps] // ps).tolist())
    full = alloc.full_attn_allocator.alloc(3 * ps)
    with pytest.raises(ValueError, match="pool 'swa'"):
        alloc.set_full_to_swa_mapping(full[:ps], phys[:ps] + 1)  # not whole pages
    unreserved = (swa.num_pages - 1) * ps + torch.arange(ps, dtype=I64)
    with pytest.raises(ValueError, match=r"pool 'swa'.*not reserved"):
        alloc.set_full_to_swa_mapping(full[:ps], unreserved)
    assert alloc.moves_blocked() and len(arena.reserved("swa")) == 2
    alloc.set_full_to_swa_mapping(full[ps:], phys)
    assert not alloc.moves_blocked() and not len(arena.reserved("swa"))
    assert torch.equal(alloc.translate_loc_from_full_to_swa(full[ps:]), phys)
    assert bool((alloc.translate_loc_from_full_to_swa(full[:ps]) == 0).all())  # SWA unbound: the sink
    again = swa.alloc(ps)
    swa.free(again)  # a rolled-back load-back
    assert swa.allocated_count() == live + 2 * ps and not alloc.moves_blocked()
    assert alloc.verify_byte_accounting() == []


@pytest.mark.parametrize("kind, ps, overlap", CASES)
def test_every_loaded_byte_lands_and_survives(kind, ps, overlap):
    """The workload with HiCache load-backs and backups landing late, and
    with forwards in flight: every loaded byte is where the copy was
    resolved to and survives the relocations after it, every backup reads
    what its rows held at submit; pages moved between transfers."""
    ks.install()
    steps = 48 if ps < 16 else 30
    r = workload.run(kind, steps=steps, page_size=ps, lazy=True, seed=1, overlap=overlap, hicache=True)
    assert r.ok, r.errors[:3]
    assert r.loads_landed >= steps // 6 - 1 and r.backups >= steps // 6 - 2 and r.backed_up_rows > 0
    assert sum(r.pages_moved.values()) > 0, r.pages_moved


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("overlap", [False, True])
def test_sglang_runs_the_hicache_workload(kind, overlap):
    """SGLang's own allocator passes the same load-backs (it compacts only
    where its scheduler calls ``flush_opportunistic``: at a sync point)."""
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=42, page_size=4, seed=1, overlap=overlap, hicache=True)
    assert r.ok, r.errors[:3]
    assert r.loads_landed >= 6 and r.backups >= 6


def _ungated(monkeypatch) -> None:
    monkeypatch.setattr(dropin._Dropin, "set_host_transfer_move_gate", lambda self, gate: None)


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_a_planted_ungated_allocator_loses_loaded_bytes(kind, monkeypatch):
    """The gate ignored: relief compacts while a copy is in flight, and the
    copy lands on rows its pages left (or on pages now someone else's), or a
    backup reads rows its pages left."""
    _ungated(monkeypatch)
    ks.install()
    lost = [workload.run(kind, steps=60, page_size=ps, seed=s, hicache=True) for ps in (1, 4) for s in (1, 2)]
    assert any(not r.ok for r in lost), [r.pages_moved for r in lost]


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_a_planted_reservation_that_does_not_hold_moves_is_caught(kind, monkeypatch):
    """A reservation that holds nothing: with the SWA pages reserved and the
    load not yet queued, relief may move them; the check sees it."""
    ks.install()
    impl_arena = type(_stack(kind).token_to_kv_pool_allocator.composite.arena)
    monkeypatch.setattr(impl_arena, "moves_held", lambda self: self.gate_closed)
    _ungated(monkeypatch)  # the gate alone would cover the queued copy
    lost = [workload.run(kind, steps=60, page_size=ps, seed=s, hicache=True) for ps in (1, 4) for s in (1, 2)]
    assert any(not r.ok for r in lost), [r.pages_moved for r in lost]


def _check(capsys, *extra: str) -> tuple[int, str]:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    phases = ["--overlap-steps", "0", "--extra-buffer-steps", "0", "--retract-steps", "0", "--draft-steps", "0"]
    args = p.parse_args(["check", "--steps", "4", *phases, "--hicache-steps", "16", "--page-sizes", "4", *extra])
    rc = cli.run(args)
    return rc, capsys.readouterr().out


def test_sglang_check_has_a_hicache_phase(capsys, monkeypatch):
    """``kvarena sglang check``'s HiCache phase passes on every stack, and
    fails with the gate ignored."""
    rc, out = _check(capsys, "--no-install")
    assert rc == 0 and "HiCache phase" in out and "kvarena sglang check: ok" in out, out[-2000:]
    _ungated(monkeypatch)
    rc, out = _check(capsys, "--no-install", "--seed", "2", "--page-sizes", "1", "--hicache-steps", "40")
    assert rc == 1 and "FAIL hicache" in out, out[-2000:]
