"""The drop-in's step path reads nothing back from the device: with every
sync-forcing tensor method poisoned (``tests/impl/test_host_sync.py``),
``alloc``/``alloc_extend``/``alloc_decode`` with SGLang's host copies (and
the zeroing of the pages they hand out), ``free_swa_segment`` and every
translation run; ``tools/cuda_checks.sh`` runs the same calls under
``torch.cuda.set_sync_debug_mode("error")``."""

import pytest
import torch

from kvarena import sglang as ks
from kvarena.sglang import stacks
from tests.impl.test_host_sync import _poison

I64 = torch.int64


def warm(kind, ps):
    """A stack with two requests prefilled (9 and 5 tokens), far from full."""
    ks.install()
    a = stacks.build(kind, page_size=ps).token_to_kv_pool_allocator
    p, s = torch.tensor([0, 0]), torch.tensor([9, 5])
    first = a.alloc(16 * ps) if ps == 1 else a.alloc_extend(p, p, s, s, torch.tensor([-1, -1]), 14)
    return a, first


def step(a, kind, ps, first):
    """One engine step: extend, decode, window frees, translations."""
    if ps == 1:
        out = a.alloc(3)
    else:
        p, s = torch.tensor([0]), torch.tensor([6])
        ext = a.alloc_extend(p.clone(), p, s.clone(), s, torch.tensor([-1]), 6)
        seq = torch.tensor([10, 6])
        out = a.alloc_decode(seq.clone(), seq, torch.stack([first[8], first[13]]))
        assert ext is not None
    assert out is not None
    a.translate_kv_loc(out)
    a.translate_write_loc(out, out=torch.empty_like(out))
    a.translate_kv_loc(torch.stack([out, out]))  # 2-D
    if kind != "mamba":
        a.translate_loc_from_full_to_swa(out)
        a.free_swa_segment(first[:ps], start_pos=0)  # the first page left the window
    return out


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("ps", [1, 4])
def test_the_step_path_reads_nothing_back(monkeypatch, kind, ps):
    a, first = warm(kind, ps)
    _poison(monkeypatch)
    out = step(a, kind, ps, first)
    monkeypatch.undo()
    assert a.verify_byte_accounting() == []
    assert bool((a.translate_kv_loc(out) > 0).all())


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("ps", [1, 4])
def test_fresh_pages_are_zeroed_without_a_read(monkeypatch, kind, ps):
    """The zeroing of fresh pages (SGLang's ``zero_physical_pages``, once per
    KV pool and allocation) runs on the poisoned step path."""
    a, _ = warm(kind, ps)
    zeroed = []
    for name in a._zeroed:
        pool = a._pools[name]
        real = pool.zero_physical_pages
        monkeypatch.setattr(
            pool, "zero_physical_pages", lambda pages, real=real, name=name: (zeroed.append(name), real(pages))
        )
    raw = a.unified_buffer._raw
    raw[a.unified_buffer._reserved_floor :] = 0xFF  # stale bytes everywhere, live pages included
    _poison(monkeypatch)
    p, s = torch.tensor([0]), torch.tensor([2 * ps + 1])
    ext = a.alloc_extend(p.clone(), p, s.clone(), s, torch.tensor([-1]), 2 * ps + 1)
    monkeypatch.undo()
    assert zeroed == (["full"] if kind == "mamba" else ["full", "swa"])
    pages = torch.unique(torch.div(ext, ps, rounding_mode="floor"))
    arena = a.composite.arena
    for name in zeroed:
        assert not bool(arena.page_view(name)[arena.v2p_at(name, pages)].any()), name


def test_the_poison_catches_a_read(monkeypatch):
    """Planted: a decode that reads its batch size back."""
    a, first = warm("swa", 4)
    real = type(a).alloc_decode

    def reading(self, seq_lens, seq_lens_cpu, last_loc):
        int(seq_lens.sum())
        return real(self, seq_lens, seq_lens_cpu, last_loc)

    monkeypatch.setattr(type(a), "alloc_decode", reading)
    _poison(monkeypatch)
    with pytest.raises(AssertionError, match="host sync"):
        step(a, "swa", 4, first)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_the_step_path_under_cuda_sync_debug_error(kind):
    ks.install()
    a = stacks.build(kind, page_size=4, device="cuda").token_to_kv_pool_allocator
    p, s = torch.tensor([0, 0]), torch.tensor([9, 5])
    first = a.alloc_extend(p.cuda(), p, s.cuda(), s, torch.tensor([-1, -1], device="cuda"), 14)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        p, s = torch.tensor([0]), torch.tensor([6])
        a.alloc_extend(p.cuda(), p, s.cuda(), s, torch.tensor([-1], device="cuda"), 6)
        seq = torch.tensor([10, 6])
        out = a.alloc_decode(seq.cuda(), seq, torch.stack([first[8], first[13]]))
        a.translate_kv_loc(out)
        a.translate_write_loc(out, out=torch.empty_like(out))
        if kind != "mamba":
            a.translate_loc_from_full_to_swa(out)
            a.free_swa_segment(first[:4], start_pos=0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert a.verify_byte_accounting() == []
