"""PD disaggregation on kvarena's drop-in, through SGLang's own code on the
CPU (issue 55; docs/design.md §13).

``kvarena.sglang.pd`` boots a prefill node and a decode node with SGLang's
``Scheduler.init_disaggregation``, runs the decode side through SGLang's
``DecodePreallocQueue`` and ``DecodeTransferQueue`` and the prefill side
through its bootstrap queue and ``_send_kv_chunk``, copies the bytes with a
loopback engine over the buffers the nodes' KV managers registered, and
checks every transferred byte where the decode node reads it.  The decode
node runs kvarena's allocator or SGLang's: SGLang's is the reference.
"""

import argparse

import pytest
import torch

from kvarena.sglang import allocators, cli, dropin, holds, pd, stacks

CASES = [(kind, ps) for kind in pd.KINDS for ps in (1, 4)]
SWA_CASES = [(kind, ps) for kind in ("swa", "mamba_swa") for ps in (1, 4)]


@pytest.mark.parametrize("kind, ps", CASES)
@pytest.mark.parametrize("decode", pd.ALLOCATORS)
def test_every_transferred_byte_arrives(kind, ps, decode):
    """Every request's KV (each layer, K and V; SWA for the window; the
    mamba slot) is where the decode node reads it, on kvarena's decode node
    and on SGLang's; the later requests are preallocated while SGLang's gate
    reads closed, and nothing bound moves then; both nodes audit clean."""
    r = pd.run(kind, ps, decode=decode)
    assert r.ok, (r.errors, r.audit, r.mismatches, r.moved_under_gate)
    assert r.requests == len(pd.PROMPTS) and r.bytes_checked > 20_000 and r.mismatches == 0
    assert r.gated_calls > r.flushes_under_gate >= 1  # preallocation calls ran under the closed gate
    assert r.moved_under_gate == 0 and r.audit == []


@pytest.mark.parametrize("kind, ps", SWA_CASES)
def test_swa_is_bound_for_the_tail_alone_as_sglang_binds_it(kind, ps):
    """After preallocation kvarena's decode node has SWA pages for exactly
    the positions SGLang's has: the window's tail from its page boundary
    (``alloc_extend_swa_tail``), or every position at page size 1 (``alloc``)."""
    ours, theirs = (pd.run(kind, ps, decode=decode) for decode in pd.ALLOCATORS)
    assert ours.ok and theirs.ok and ours.swa_bound == theirs.swa_bound
    window = pd.GEOMETRY.window
    for rid, n in zip(ours.swa_bound, pd.PROMPTS):
        tail_from = 0 if ps == 1 else max(0, n - window) // ps * ps
        assert ours.swa_bound[rid] == list(range(tail_from, n)), rid


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_a_tail_allocation_that_binds_every_page_is_caught(kind, monkeypatch):
    """Planted: ``alloc_extend_swa_tail`` binds SWA for every new page (a
    plain ``alloc_extend``), as SGLang's non-tail fallback does."""
    reference = pd.run(kind, 4, decode="sglang").swa_bound
    monkeypatch.setattr(
        holds.SWAHostTransfers, "alloc_extend_swa_tail", lambda self, *, swa_tail_len, **kw: self.alloc_extend(**kw)
    )
    assert pd.run(kind, 4, decode="kvarena", prefill="sglang").swa_bound != reference


@pytest.mark.parametrize("kind", pd.KINDS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_both_roles_boot_on_kvarena(kind, role):
    """SGLang's ``Scheduler.init_disaggregation`` boots either role on
    kvarena's allocator and installs its gate, which the allocator then
    reads live: the node's transfer state closes the arena's gate (the
    ``disagg`` source), and clearing it opens it."""
    node = pd.boot(role, kind, 4)
    alloc = node.alloc
    assert isinstance(alloc, allocators.ALLOCATORS)
    assert set(alloc._move_gates) == {"disagg_move_gate"} and not alloc.moves_blocked()
    if role == "decode":
        busy = node.sched.disagg_decode_transfer_queue.queue
        busy.append("a transfer in flight")
    else:
        busy = node.sched.disagg_prefill_pending_chunk_rids
        busy.add("a chunk sent")
    assert alloc.moves_blocked() and alloc.composite.arena.closed_gates == {holds.GATE_SOURCE["disagg_move_gate"]}
    busy.clear()
    assert not alloc.moves_blocked() and not alloc.composite.arena.closed_gates


@pytest.mark.parametrize("kind", pd.KINDS)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_an_eager_allocator_refuses_the_gate(kind, role):
    """SGLang's gate needs lazy compaction: booting a PD node on an eager
    allocator fails with a ``ValueError`` naming the pool."""
    with pytest.raises(ValueError, match=r"pool '\w+'.*lazy compaction"):
        pd.boot(role, kind, 4, lazy=False)


def _ignore_the_pd_gate(monkeypatch) -> None:
    """Planted: the drop-in reads every gate but PD's."""
    real = dropin._Dropin._sync_gate

    def sync(self):
        gates = self._move_gates
        self._move_gates = {k: v for k, v in gates.items() if k != "disagg_move_gate"}
        try:
            real(self)
        finally:
            self._move_gates = gates

    monkeypatch.setattr(dropin._Dropin, "_sync_gate", sync)


@pytest.mark.parametrize("ps", [1, 4])
def test_no_page_moves_while_the_gate_reads_closed(ps, monkeypatch):
    """A crowded decode node (holes behind live full pages, SWA room for the
    first request only): the next requests' SWA pages need relief, which
    SGLang's gate holds back until the transfers end, so they wait a round
    and nothing bound moves.  With PD's gate ignored (planted), relief moves
    bound pages under it, and the watch catches it."""
    r = pd.run("swa", ps, crowded=True)
    assert r.ok and r.requests == len(pd.PROMPTS), r.errors
    assert r.rounds > 1 and r.gated_calls > 0 and r.moved_under_gate == 0
    _ignore_the_pd_gate(monkeypatch)
    planted = pd.run("swa", ps, crowded=True)
    assert planted.moved_under_gate > 0 and not planted.ok, planted


def test_a_transfer_translation_that_gives_virtual_ids_is_caught(monkeypatch):
    """Planted: kvarena's decode node publishes virtual token ids as the
    transfer's destinations (``translate_kv_indices_for_transfer`` the
    identity); the bytes land on pages the decode node does not read."""
    monkeypatch.setattr(dropin._Dropin, "translate_kv_indices_for_transfer", lambda self, ids: ids.to(torch.int64))
    for kind, ps in CASES:
        r = pd.run(kind, ps, decode="kvarena", prefill="sglang")
        assert r.mismatches > 0, (kind, ps)


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_an_swa_transfer_translation_that_gives_virtual_ids_is_caught(kind, monkeypatch):
    """Planted: the SWA window's destinations published as virtual ids."""
    cls = getattr(
        allocators, "UnifiedSWATokenToKVPoolAllocator" if kind == "swa" else "UnifiedMambaSWATokenToKVPoolAllocator"
    )
    monkeypatch.setattr(cls, "translate_swa_indices_for_transfer", lambda self, ids: ids.to(torch.int64))
    r = pd.run(kind, 4, decode="kvarena", prefill="sglang")
    assert r.mismatches > 0


def test_sglang_admits_a_crowded_tri_node_after_its_idle_flush():
    """The reference for the next test, at page size 1: the decode queue's
    budget is SGLang's ``full_available_size()``, which on the tri stack
    counts no hole that only a compaction frees; SGLang's idle
    ``flush_opportunistic`` compacts, the budget grows, the request fits."""
    r = pd.run("mamba_swa", 1, decode="sglang", crowded=True)
    assert r.ok and r.requests == len(pd.PROMPTS) and r.rounds > 1, r.errors


def test_kvarena_admits_a_crowded_tri_node(monkeypatch):
    """kvarena's ``flush_opportunistic`` compacts its lazy ENDs at SGLang's
    sync points, so the budget grows as SGLang's does; planted, the old
    ``flush_opportunistic`` that returned 0 starves the request forever."""
    r = pd.run("mamba_swa", 1, decode="kvarena", crowded=True)
    assert r.ok and r.requests == len(pd.PROMPTS), r.errors
    monkeypatch.setattr(dropin._Dropin, "flush_opportunistic", lambda self: 0)
    starved = pd.run("mamba_swa", 1, decode="kvarena", crowded=True)
    assert starved.requests < len(pd.PROMPTS), starved


@pytest.mark.parametrize("ps", [2, 4])
def test_a_tri_pool_allocator_left_at_its_default_page_size_takes_the_pools(ps, monkeypatch):
    """The boot case: kvarena's tri allocator constructed over a paged pool
    without ``page_size`` takes the pool's, and serves ``alloc(available_size())``.
    Planted: the default left at 1 (SGLang's), which the grid check refuses."""
    b = stacks.build("mamba_swa", page_size=ps, lazy=True)
    sglang_alloc = b.token_to_kv_pool_allocator

    def construct():
        return allocators.UnifiedMambaSWATokenToKVPoolAllocator(
            unified_buffer=b.unified_memory_pool,
            kvcache=b.token_to_kv_pool,
            mamba_kvcache=b.req_to_token_pool.mamba_pool,
            device="cpu",
            full_max_total_num_tokens=sglang_alloc.size_full,
            swa_max_total_num_tokens=sglang_alloc.size_swa,
            lazy_compaction=True,
        )

    alloc = construct()
    assert alloc.page_size == ps == b.token_to_kv_pool.page_size
    n = alloc.available_size()
    got = alloc.alloc(n)
    assert n > 0 and got is not None and got.numel() == n
    assert alloc.verify_byte_accounting() == []
    monkeypatch.setattr(dropin, "_pool_page_size", lambda unified_buffer, kvcache: 1)
    with pytest.raises(ValueError, match="pool"):
        construct()


def _full_only(kind: str, ps: int, who: str):
    """``full_attn_allocator.alloc_extend`` of one request on ``who``'s
    allocator, then a tail continuing it: the ids, and which of the first
    extend's pages hold SWA."""
    import kvarena.sglang as ks

    one = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
    if who == "kvarena":
        ks.install()
    try:
        with stacks.cpu_kernels():
            a = stacks.build(kind, page_size=ps, lazy=True).token_to_kv_pool_allocator
        seq = 2 * ps + 1
        with stacks.cpu_kernels():
            out = a.full_attn_allocator.alloc_extend(
                one(0), one(0), one(seq), one(seq), one(-1), seq, num_new_pages=-(-seq // ps)
            )
            swa = a.swa_attn_allocator.virtual_to_physical
            bound = [int(swa[t // ps]) > 0 for t in out.tolist()[::ps]]
            more = a.alloc_extend_swa_tail(
                one(seq), one(seq), one(seq + 3 * ps), one(seq + 3 * ps), out[-1:], 3 * ps, ps
            )
        assert a.verify_byte_accounting() == []
        return out.tolist(), bound, more.tolist(), a
    finally:
        ks.uninstall()


@pytest.mark.parametrize("kind", ["swa", "mamba_swa"])
def test_the_full_view_extends_full_alone_as_sglangs(kind):
    """``full_attn_allocator.alloc_extend`` (SGLang's own PD preallocation
    tests set a prefix up with it): full's pages alone, the SWA side left
    unbound, then a tail continuing it, as on SGLang's allocator; a batch or
    a wrong ``num_new_pages`` is a ``ValueError`` naming the pool."""
    ids, bound, more, a = _full_only(kind, 4, "kvarena")
    assert (ids, bound, more) == _full_only(kind, 4, "sglang")[:3]
    assert not any(bound)
    two = torch.tensor([0, 0], dtype=torch.int64)
    with pytest.raises(ValueError, match="pool 'full': alloc_extend: one request"):
        a.full_attn_allocator.alloc_extend(two, two, two + 4, two + 4, two - 1, 8)
    one = torch.tensor([0], dtype=torch.int64)
    with pytest.raises(ValueError, match="pool 'full': alloc_extend: num_new_pages 5"):
        a.full_attn_allocator.alloc_extend(one, one, one + 4, one + 4, one - 1, 4, num_new_pages=5)
    with pytest.raises(ValueError, match="pool 'swa'"):
        a.swa_attn_allocator.alloc_extend(one, one, one + 4, one + 4, one - 1, 4)


def _check(capsys, *extra: str) -> tuple[int, str]:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    phases = ["--overlap-steps", "0", "--extra-buffer-steps", "0", "--retract-steps", "0", "--draft-steps", "0"]
    args = p.parse_args(["check", "--steps", "4", *phases, "--hicache-steps", "0", "--pd-requests", "4", *extra])
    rc = cli.run(args)
    return rc, capsys.readouterr().out


def test_sglang_check_has_a_pd_phase(capsys, monkeypatch):
    """``kvarena sglang check``'s PD phase passes on every stack, and fails
    when the decode node publishes virtual ids."""
    rc, out = _check(capsys, "--no-install", "--page-sizes", "4")
    assert rc == 0 and "PD phase" in out and "kvarena sglang check: ok" in out, out[-2000:]
    monkeypatch.setattr(dropin._Dropin, "translate_kv_indices_for_transfer", lambda self, ids: ids.to(torch.int64))
    rc, out = _check(capsys, "--no-install", "--page-sizes", "1")
    assert rc == 1 and "FAIL pd" in out, out[-2000:]
