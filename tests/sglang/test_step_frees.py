"""The drop-in on the paths SGLang's engine takes each step (issue 54).

- **Frees read nothing back.**  A finished request's rows go through
  SGLang's own ``free_kv_row_segments`` (``free_segments`` and
  ``free_full_segments``, inside a free group or not), the tree's drain
  frees a node's full side and then its window (``full_attn_allocator.
  free_segment``, ``free_swa_segment``), a mamba slot is freed: with every
  sync-forcing tensor call poisoned (``tests/impl/test_host_sync.py``,
  boolean masks included), on every stack and page size.
- **Kernels warmed before serving.**  ``prewarm_compaction`` launches every
  kernel variant the step can: a workload after it, forwards in flight,
  launches none it did not (Triton's interpreter on this CPU; the kernels
  specialize on no int and no alignment, so a variant is its constexprs
  and dtypes); SGLang's page copy and zeroing run on the sink.
- **Idle after the last forward.**  SGLang's call order, a fresh done
  event per forward and never ``None``: once the last forward's event has
  fired the next call settles it, no page pinned.
- **Writes translate ``loc.numel()`` ids** with ``out_width``, any shape.
"""

import pytest
import torch

from kvarena import sglang as ks
from kvarena.anchor.loader import import_sglang
from kvarena.impl import kernels
from kvarena.impl.arena import Arena
from kvarena.sglang import dropin, settings, stacks, workload
from tests.impl.test_host_sync import _poison

I64 = torch.int64
_common = import_sglang("sglang.srt.mem_cache.common")


def _stack(kind, ps, device="cpu"):
    """A stack with three requests prefilled (3 pages and a token, 2 pages, 2 pages) and, for mamba, a slot each."""
    ks.install()
    a = stacks.build(kind, page_size=ps, device=device).token_to_kv_pool_allocator
    lens = [3 * ps + 1, 2 * ps, 2 * ps]
    p, s = torch.zeros(3, dtype=I64), torch.tensor(lens)
    d = torch.device(device)
    out = a.alloc_extend(p.to(d), p, s.to(d), s, torch.full((3,), -1, device=d), sum(lens))
    rows = list(torch.split(out, lens))
    slots = a.mamba_allocator.alloc(3) if kind != "swa" else None
    return a, rows, slots


def _engine_step_frees(a, kind, ps, rows, slots):
    """What SGLang frees in a step, in its order (``release_kv_cache``'s rows
    in a free group, a finished request outside one, the tree's drain)."""
    swa = kind != "mamba"
    # request 0 finished, its first page out of the window already: the group splits it on the host
    a.free_group_begin()
    _common.free_kv_row_segments(a, [(rows[0], 0)], swa_evicted_seqlen=ps if swa else 0)
    a.free_group_end()
    # request 1 finished outside a group
    _common.free_kv_row_segments(a, [(rows[1], 0)], swa_evicted_seqlen=0)
    # the tree evicts a node: its full side, then its window, in one drain; then a view reads the counts
    if swa:
        a.full_attn_allocator.free_segment(rows[2], start_pos=0)
        a.free_swa_segment(rows[2], start_pos=0)
    else:
        a.free_segment(rows[2], start_pos=0)
    a.available_size()
    if slots is not None:
        for s in slots:
            a.mamba_allocator.free(s.reshape(1))


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("ps", [1, 4])
def test_the_engines_frees_read_nothing_back(monkeypatch, kind, ps):
    a, rows, slots = _stack(kind, ps)
    if kind != "mamba":
        a.free_swa_segment(rows[0][:ps], start_pos=0)  # the step before: request 0's first page left the window
    _poison(monkeypatch)
    _engine_step_frees(a, kind, ps, rows, slots)
    monkeypatch.undo()
    assert a.verify_byte_accounting() == []
    arena = a.composite.arena
    assert all(arena.live_pages(n) == 0 for n in a.CHAIN), {n: arena.live_pages(n) for n in a.CHAIN}
    assert a.skipped_frees == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_the_engines_frees_under_cuda_sync_debug_error(kind):
    a, rows, slots = _stack(kind, 4, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _engine_step_frees(a, kind, 4, rows, slots)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert a.verify_byte_accounting() == []


def test_the_poison_catches_a_read_on_a_free(monkeypatch):
    """Planted: the full-side free of the tree's drain reads which SWA entries are live (the old drain)."""
    a, rows, slots = _stack("swa", 4)
    real = dropin._Dropin._defer_full_free

    def reading(self, reps):
        pages = torch.div(reps, self.page_size, rounding_mode="floor")
        pages[self.composite.arena.v2p_at("swa", pages) > 0]
        real(self, reps)

    monkeypatch.setattr(dropin._Dropin, "_defer_full_free", reading)
    _poison(monkeypatch)
    with pytest.raises(AssertionError, match="host sync"):
        _engine_step_frees(a, "swa", 4, rows, slots)


@pytest.mark.parametrize("order", ["full side first", "window first"])
def test_the_trees_drain_frees_full_after_its_window(order):
    """SGLang's drain frees a node's full side and its window in either
    order; kvarena frees the window first (its borrow rule), the full side
    once the drain ends (the next call that is not a window free)."""
    a, rows, _ = _stack("swa", 4)
    arena = a._composite.arena
    live = arena.live_pages("full")
    if order == "full side first":
        a.full_attn_allocator.free_segment(rows[2], start_pos=0)
        assert a._full_after_swa and arena.live_pages("full") == live  # waits for the drain
        a.free_swa_segment(rows[2], start_pos=0)
    else:
        a.free_swa_segment(rows[2], start_pos=0)
        a.full_attn_allocator.free_segment(rows[2], start_pos=0)
    assert a.full_attn_allocator.allocated_count() == (live - 2) * 4  # a view: the drain is over
    assert not a._full_after_swa and a.verify_byte_accounting() == []


def test_a_breach_of_the_per_step_contract_is_reported_by_the_idle_check():
    """SGLang's tree frees a node's window with its full side; a full-side
    free whose window stays live breaks that, and a slot freed twice breaks
    the slot free's: trusted, nothing read on the step, and SGLang's idle
    check (``verify_byte_accounting``) names the pool."""
    a, rows, slots = _stack("mamba_swa", 4)
    a.full_attn_allocator.free_segment(rows[2], start_pos=0)
    a.available_size()  # the drain ends: the window was never freed
    found = a.verify_byte_accounting()
    assert found and "pool 'swa'" in found[0], found
    b, _, slots = _stack("mamba", 1)
    b.mamba_allocator.free(slots[:1])
    assert b.verify_byte_accounting() == []
    b.mamba_allocator.free(slots[:1])
    found = b.verify_byte_accounting()
    assert found and "pool 'state'" in found[0], found


# ------------------------------------------------------- idle after the last forward


class _GpuEvent:
    """A forward's done event on a GPU that has not finished it: a CPU event
    is done when recorded, so only this double can hold one unfinished."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def _serve(a, events, kind):
    """Three steps in SGLang's order: a decode page per step, the forward
    launched and reported with a fresh event, the last step's result then
    processed (its request finished, freed in a free group)."""
    row = None
    for ev in events:
        out = a.alloc(a.page_size)
        a.set_latest_forward_done_event(ev)
        a.set_inflight_forward(ev, out)
        a.free_group_begin()
        if row is not None:
            a.free_segment(row, start_pos=0)
        a.free_group_end()
        row = out
    return row


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_idle_after_the_last_forward_with_sglangs_call_order(kind):
    a, _, _ = _stack(kind, 4)
    events = []
    for _ in range(3):
        ev = torch.cpu.Event()
        ev.record()  # on the forward stream, after the forward: on a CPU, done at once
        events.append(ev)
    _serve(a, events, kind)
    a.flush_opportunistic()  # SGLang idle: no forward, no None event, its idle calls
    assert a.verify_byte_accounting() == []
    arena = a._composite.arena
    assert not arena.in_flight
    assert all(arena.pinned(n).numel() == 0 and arena.pending(n).numel() == 0 for n in a.CHAIN)


def test_a_forward_still_running_keeps_its_pins_until_its_event_fires():
    a, _, _ = _stack("swa", 4)
    events = [_GpuEvent() for _ in range(2)]
    _serve(a, events, "swa")
    a.available_size()
    arena = a._composite.arena
    assert arena.in_flight and arena.pinned("full").numel() > 0
    events[-1].done = True
    a.verify_byte_accounting()  # SGLang's idle check: the first call after the event fired
    assert not arena.in_flight and arena.pinned("full").numel() == 0


def test_planted_a_drop_in_that_never_reads_the_event_stays_in_flight(monkeypatch):
    monkeypatch.setattr(dropin._Dropin, "_settle_if_fired", lambda self: None)
    with pytest.raises(AssertionError):
        test_idle_after_the_last_forward_with_sglangs_call_order("swa")


def test_a_draft_step_writes_past_out_cache_loc_unpinned_unless_named():
    """Recorded (docs/findings.md, 12, `draft-writes-past-out-cache-loc`): the
    write set is what ``set_inflight_forward`` names.  SGLang names
    ``out_cache_loc``, and a speculative draft step also writes the slots
    ``alloc_for_spec_decode`` allocated past it: those pages stay movable
    while the forward runs, in SGLang's allocator and in kvarena's.  Named,
    they are pinned like any write."""
    a, rows, _ = _stack("swa", 4)
    out, ahead = rows[1][:4], rows[1][4:]  # the step's slots, and the draft's allocated ahead
    ev = _GpuEvent()
    a.set_latest_forward_done_event(ev)
    a.set_inflight_forward(ev, out)
    arena = a.composite.arena
    pinned = set(arena.pinned("full").tolist())
    assert set(a.full_attn_allocator.translate_kv_loc(out[:1]).div(4, rounding_mode="floor").tolist()) <= pinned
    assert not set(a.full_attn_allocator.translate_kv_loc(ahead[:1]).div(4, rounding_mode="floor").tolist()) & pinned
    ev2 = _GpuEvent()
    a.set_latest_forward_done_event(ev2)
    a.set_inflight_forward(ev2, torch.cat([out, ahead]))
    pinned = set(a.composite.arena.pinned("full").tolist())
    assert set(a.full_attn_allocator.translate_kv_loc(ahead[:1]).div(4, rounding_mode="floor").tolist()) <= pinned


# ------------------------------------------------------------ the write translation


@pytest.mark.parametrize("ps", [1, 4])
def test_translate_write_loc_writes_every_id_of_the_batch(ps):
    """SGLang's contract: ``out_width`` lanes, the batch's ``loc.numel()``
    ids first (a 2-D ``loc`` too), then the sink."""
    a, rows, _ = _stack("swa", ps)
    loc = torch.stack([rows[1][:2], rows[2][:2]])  # 2 x 2
    out = torch.full((8,), 7, dtype=I64)
    a.translate_write_loc(loc, out=out, out_width=6)
    assert out[:4].tolist() == a.translate_kv_loc(loc.reshape(-1)).tolist()
    assert out[4:6].tolist() == [0, 0] and out[6:].tolist() == [7, 7]
    with pytest.raises(ValueError, match="pool 'full'"):
        a.translate_write_loc(loc, out=out, out_width=3)


# ------------------------------------------------------------ kernels warmed


def _launch_keys(monkeypatch):
    """Every Triton launch from here on, as the compile it needs: kernel,
    tensor dtypes, constexprs (the kernels specialize on nothing else)."""
    seen = set()
    real = kernels.launch

    def spy(kernel, grid, *args, **consts):
        dtypes = tuple(str(x.dtype) for x in args if isinstance(x, torch.Tensor))
        seen.add((kernel.__name__, dtypes, tuple(sorted(consts.items()))))
        real(kernel, grid, *args, **consts)

    monkeypatch.setattr(kernels, "launch", spy)
    return seen


def test_the_kernels_specialize_on_constexprs_alone():
    """Each non-constexpr argument of each kernel is left unspecialized (an
    int's value, a tensor's alignment): a variant is its constexprs and
    dtypes, which the prewarm enumerates."""
    from triton.runtime.jit import JITFunction

    from kvarena.impl import triton_kernels as tk

    for k in (
        tk.bind_kernel,
        tk.decode_kernel,
        tk.extend_kernel,
        tk.free_kernel,
        tk.free_live_kernel,
        tk.translate_kernel,
        tk.move_kernel,
    ):
        flags = {f: v for f, v in (getattr(k, "kwargs", None) or vars(k)).items() if f.startswith("do_not")}
        params = JITFunction(k.fn, **flags).params  # Triton's own reading of them (interpreted or not)
        loose = [
            p.name for p in params if not (p.is_constexpr or p.do_not_specialize or p.do_not_specialize_on_alignment)
        ]
        assert loose == [], (k.fn.__name__, loose)


needs_triton = pytest.mark.skipif(
    kernels.unavailable(torch.device("cpu")) is not None, reason=str(kernels.unavailable(torch.device("cpu")))
)


@needs_triton
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_no_kernel_variant_first_launches_after_the_prewarm(monkeypatch, kind):
    monkeypatch.setenv(settings.KERNELS_ENV, "triton")
    ks.install()
    seen = _launch_keys(monkeypatch)
    a = stacks.build(kind, page_size=4).token_to_kv_pool_allocator
    copies = []
    for name, pool in a._pools.items():
        real = pool.move_physical_pages
        monkeypatch.setattr(
            pool, "move_physical_pages", lambda d, s, ps, real=real, n=name: (copies.append(n), real(d, s, ps))
        )
    a.prewarm_compaction()
    warm = set(seen)
    assert sorted(copies) == sorted(a._pools) and a.verify_byte_accounting() == []
    seen.clear()
    r = workload.run(kind, seed=1, steps=40, page_size=4, lazy=True, overlap=True)
    assert r.ok and r.forwards > 0 and sum(r.pages_moved.values()) > 0, r
    assert seen and seen <= warm, sorted(seen - warm)


@needs_triton
def test_planted_a_prewarm_that_forgets_the_borrower_misses_a_variant(monkeypatch):
    monkeypatch.setattr(Arena, "prewarm", lambda self: kernels.prewarm(self.device, [True]))
    with pytest.raises(AssertionError, match="free"):
        test_no_kernel_variant_first_launches_after_the_prewarm(monkeypatch, "swa")
