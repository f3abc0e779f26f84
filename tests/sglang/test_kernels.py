"""The drop-in on Triton kernels (``KVARENA_KERNELS=triton``; on the CPU
under Triton's interpreter, tests/conftest.py): the byte-checked workload on
SGLang's stacks, every live token's K and V read back intact through the
fused translations after every step; and how the drop-in picks its kernels
(``install(kernels=...)``, else ``KVARENA_KERNELS``, else the device's)."""

import collections

import pytest
import torch

from kvarena import sglang as ks
from kvarena.impl import kernels
from kvarena.sglang import settings, stacks, workload

pytestmark = pytest.mark.skipif(
    kernels.unavailable(torch.device("cpu")) is not None, reason=str(kernels.unavailable(torch.device("cpu")))
)


def launched(monkeypatch, kind, **kw):
    """``workload.run`` with ``KVARENA_KERNELS=triton``: its report, and the
    Triton kernels launched, by name."""
    monkeypatch.setenv(settings.KERNELS_ENV, "triton")
    ks.install()
    seen = collections.Counter()

    def count(kernel, go):
        seen[kernel.__name__] += 1
        go()

    with kernels.wrapped(count):
        r = workload.run(kind, seed=1, **kw)
    return r, seen


@pytest.mark.parametrize(
    "kind, ps, lazy, overlap",
    [
        ("swa", 1, True, False),
        ("swa", 4, True, False),
        ("swa", 4, False, False),
        ("mamba_swa", 4, True, False),
        # SGLang's default flags: overlap scheduling, a forward in flight while the next batch is prepared
        ("swa", 4, True, True),
        ("mamba_swa", 4, True, True),
    ],
)
def test_the_dropins_triton_path_keeps_every_byte(monkeypatch, kind, ps, lazy, overlap):
    r, seen = launched(monkeypatch, kind, steps=50, page_size=ps, lazy=lazy, overlap=overlap)
    assert r.ok, r.errors[:3]
    assert r.tokens_checked > 1000 and r.swa_pages_freed > 0 and r.refused > 0
    assert all(moved > 0 for moved in r.pages_moved.values()), r.pages_moved  # relief moved pages
    if overlap:  # forwards were in flight, and their late writes landed where their tokens live now
        assert r.forwards > 0 and r.inflight_writes > 0 and r.inflight_lost == 0, r
    assert {"extend_kernel", "translate_kernel"} <= set(seen), seen
    if ps > 1:
        assert seen["decode_kernel"] > 0
    if lazy:
        assert seen["free_kernel"] > 0  # an eager END's free compacts on torch


def test_the_byte_check_catches_a_wrong_fused_translation(monkeypatch):
    """Planted: the fused translation drops the offset within the page."""
    real = kernels.translate

    def off(tokens, out, v2p, n_ids, page_size):
        real(tokens, out, v2p, n_ids, page_size)
        out.floor_divide_(page_size).mul_(page_size)

    monkeypatch.setattr(kernels, "translate", off)
    r, _ = launched(monkeypatch, "swa", steps=10, page_size=4)
    assert not r.ok


def arena_kernels():
    return stacks.build("swa", page_size=4).token_to_kv_pool_allocator.composite.arena.kernels


def test_the_kernels_come_from_install_else_the_environment_else_the_device(monkeypatch):
    monkeypatch.delenv(settings.KERNELS_ENV, raising=False)
    ks.install()
    assert arena_kernels() == "torch"  # the CPU's default
    for value in ("triton", " Torch "):
        monkeypatch.setenv(settings.KERNELS_ENV, value)
        assert arena_kernels() == value.strip().lower()
    monkeypatch.setenv(settings.KERNELS_ENV, "triton")
    ks.install(kernels="torch")  # the bench's choice wins
    assert arena_kernels() == "torch"
    ks.install()
    monkeypatch.setenv(settings.KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match="KVARENA_KERNELS='cuda'"):
        arena_kernels()
    with pytest.raises(ValueError, match="kernels must be one of"):
        ks.install(kernels="fast")
