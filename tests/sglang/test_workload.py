"""The byte-checked workload on SGLang's three stacks: kvarena's allocator
(installed into SGLang's factories) and SGLang's own, side by side.  Every
live token's K and V in every layer, and every live state slot, read back
intact after every step; kvarena's relief relocates pages in every band."""

import pytest
import torch

from kvarena import sglang as ks
from kvarena.sglang import allocators, stacks, workload

CASES = [(kind, ps, lazy) for kind in stacks.KINDS for ps in (1, 4) for lazy in (True, False)]


@pytest.mark.parametrize("kind, ps, lazy", CASES)
def test_kvarena_keeps_every_byte_and_relocates_in_every_band(kind, ps, lazy):
    ks.install()
    r = workload.run(kind, steps=80, page_size=ps, lazy=lazy, seed=1)
    assert r.ok, r.errors[:3]
    assert r.refused > 0 and r.shared_tokens > 0  # the buffer ran full, and prefixes were shared
    assert r.tokens_checked > 1000
    assert (r.slots_checked > 0) == (kind != "swa")
    assert (r.swa_pages_freed > 0) == (kind != "mamba")
    assert all(moved > 0 for moved in r.pages_moved.values()), r.pages_moved  # relief moved pages in every band


@pytest.mark.parametrize("kind, ps", [(kind, ps) for kind in stacks.KINDS for ps in (1, 4)])
def test_sglang_runs_the_same_workload(kind, ps):
    """The workload is SGLang's contract: SGLang's own allocator passes it too."""
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=60, page_size=ps, lazy=True, seed=1)
    assert r.ok, r.errors[:3]
    assert r.pages_moved == {}  # SGLang's allocator: no kvarena counters


EXTRA_CASES = [(kind, ps, lazy) for kind in ("mamba", "mamba_swa") for ps in (1, 4) for lazy in (True, False)]


@pytest.mark.parametrize("kind, ps, lazy", EXTRA_CASES)
def test_the_mamba_stacks_with_the_extra_buffer(kind, ps, lazy):
    """SGLang's mamba extra buffer (its "auto" strategy's choice for
    Qwen3-Next): each request also holds its tracking slots; every byte and
    every slot still reads back, relief relocating in every band (issue 40)."""
    ks.install()
    w = workload.Workload(kind, stacks.Geometry(), ps, lazy, seed=1, extra_buffer=True)
    for _ in range(60):
        w.step()
    assert w.report.ok, w.report.errors[:3]
    assert w.report.refused > 0 and w.report.tokens_checked > 1000
    held = [r for r in w.live.values() if r.slot is not None]
    assert held and w.tracking == 1 and all(len(r.track) == 1 for r in held)  # the tracking slots are held
    assert all(moved > 0 for moved in w.alloc.pages_moved.values()), w.alloc.pages_moved


@pytest.mark.parametrize("kind", ("mamba", "mamba_swa"))
def test_sglang_runs_the_workload_with_the_extra_buffer(kind):
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=60, page_size=4, lazy=True, seed=1, extra_buffer=True)
    assert r.ok, r.errors[:3]


def test_the_byte_check_catches_a_lost_move(monkeypatch):
    """Planted: the mover updates kvarena's tables but copies no byte."""
    monkeypatch.setattr(allocators._Dropin, "_move_pages", lambda self, name, dst, src: None)
    ks.install()
    r = workload.run("mamba_swa", steps=80, page_size=1, lazy=False, seed=1)
    assert not r.ok and "corrupted" in r.errors[0]


def test_the_byte_check_catches_a_wrong_translation(monkeypatch):
    """Planted: SWA translations drop the offset within the page (every token
    of a page lands on its first slot)."""
    real = allocators.BandView.translate_kv_loc

    def off(self, loc, *, out=None):
        res = real(self, loc, out=out)
        return res // self.page_size * self.page_size if self._name == "swa" else res

    monkeypatch.setattr(allocators.BandView, "translate_kv_loc", off)
    ks.install()
    r = workload.run("swa", steps=10, page_size=4, seed=1)
    assert not r.ok


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("installed", [True, False])
def test_the_workload_on_cuda(kind, installed):
    """On a GPU: kvarena's allocator, and SGLang's with its own Triton kernels."""
    if installed:
        ks.install()
    r = workload.run(kind, steps=60, page_size=4, lazy=True, seed=1, device="cuda")
    assert r.ok, r.errors[:3]
