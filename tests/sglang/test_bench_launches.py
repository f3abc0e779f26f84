"""Launches a decode step, counted the same way on kvarena's allocator (on
torch and on Triton, the latter under Triton's interpreter) and SGLang's own
(``kvarena.sglang.bench.decode_step_launches``): each rule of the count
shown on a planted change."""

import contextlib

import pytest
import torch

from kvarena.impl import kernels
from kvarena.sglang import bench, dropin, stacks


def test_every_side_is_counted_and_a_step_varies_over_a_page():
    counts = {side: bench.decode_step_launches(1, side) for side in bench.SIDES}
    assert all(len(n) == bench.PAGE_SIZE for n in counts.values())
    assert all(min(n) > 0 for n in counts.values())
    assert all(max(n) > min(n) for n in counts.values())  # a page opening and a window free in the page


@pytest.mark.parametrize("batch", [1, 64])
def test_kvarenas_triton_step_launches_no_more_than_sglangs(batch):
    """Issue 44's target at SGLang's level: the drop-in's step on Triton
    makes no more launches than SGLang's allocator, step by step's worst."""
    ours, theirs = (bench.decode_step_launches(batch, side) for side in ("kvarena_triton", "sglang"))
    assert max(ours) <= max(theirs), (ours, theirs)


def test_a_planted_operation_in_a_step_call_is_counted(monkeypatch):
    base = bench.decode_step_launches(64, "kvarena_torch")
    real = dropin._Dropin.translate_kv_loc

    def two_more(self, loc, *, out=None):
        torch.zeros_like(loc).add_(1)  # two device operations, once a step
        return real(self, loc, out=out)

    monkeypatch.setattr(dropin._Dropin, "translate_kv_loc", two_more)
    assert bench.decode_step_launches(64, "kvarena_torch") == [n + 2 for n in base]


def test_a_planted_triton_launch_is_counted(monkeypatch):
    """Every launch of kvarena's translation kernel made twice (the same
    slots again): two more launches a step, so the Triton side is counted
    through ``kernels.launch``, not by the torch work the interpreter does."""
    base = bench.decode_step_launches(64, "kvarena_triton")
    real = kernels.launch

    def twice(kernel, grid, *args, **consts):
        real(kernel, grid, *args, **consts)
        if kernel is kernels._triton().translate_kernel:
            real(kernel, grid, *args, **consts)

    monkeypatch.setattr(kernels, "launch", twice)
    assert bench.decode_step_launches(64, "kvarena_triton") == [n + 2 for n in base]


def test_sglangs_kernel_is_one_launch_whatever_its_cpu_stand_in_does(monkeypatch):
    """On the CPU SGLang's Triton kernel runs as a torch stand-in: one launch,
    however many torch operations the stand-in dispatches."""
    base = bench.decode_step_launches(64, "sglang")
    real = stacks.cpu_kernels

    def busier():
        sub = stacks.import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
        with real():
            kernel = sub.alloc_decode_kernel

            def slow(*args):
                torch.ones(4).mul_(2).add_(1)  # more work inside the kernel
                return kernel[None](*args)

            sub.alloc_decode_kernel = stacks._OnHost(slow)
            yield

    monkeypatch.setattr(stacks, "cpu_kernels", contextlib.contextmanager(busier))
    assert bench.decode_step_launches(64, "sglang") == base


def test_sglangs_launchers_are_one_launch_each_on_the_cpu(monkeypatch):
    """SGLang's launchers (``translate_token_ids`` and the rest) run a torch
    reference on the CPU and one Triton kernel on CUDA: counted as one.
    Unwrapped (planted), the two translations count their references."""
    base = bench.decode_step_launches(64, "sglang")
    monkeypatch.setitem(bench.SGLANG_KERNELS, "sglang.srt.mem_cache.allocator.unified_sub_pool", {})
    unwrapped = bench.decode_step_launches(64, "sglang")
    assert all(u > b + 2 for u, b in zip(unwrapped, base))


def test_views_and_profiler_markers_launch_nothing():
    assert bench.launches(torch.ops.aten.view.default) == 0
    assert bench.launches(torch.ops.aten.slice.Tensor) == 0
    assert bench.launches(torch.ops.aten.empty.memory_format) == 0
    assert bench.launches(torch.ops.aten.index_select.default) == 1
    assert bench.launches(torch.ops.aten.add.Tensor) == 1


def test_work_on_host_copies_alone_launches_nothing():
    """A counted call's ``*_cpu`` tensors are the engine's host copies: what
    is computed from them alone stays on the host; an operation that also
    takes a device tensor launches.  On a GPU every CPU tensor is a host one."""
    c = bench.LaunchCounter()

    def step(seq, seq_lens_cpu):
        n = (seq_lens_cpu % 4 == 1).sum()  # three operations on the host copy
        int(n)  # a host read of a host tensor
        return seq + n  # on the device

    c.call(step, torch.arange(4), torch.arange(4))
    assert c.count == 1
    c.count = 0
    c.call(step, torch.arange(4), seq_lens_cpu=torch.arange(4))  # by keyword too
    assert c.count == 1
    c.count = 0
    c.call(lambda seq, lens: (lens % 4 == 1).sum() + seq, torch.arange(4), torch.arange(4))  # no host copy named
    assert c.count == 4
    gpu = bench.LaunchCounter("cuda")  # counting only: no device is touched
    gpu.call(lambda x: x + 1, torch.arange(4))
    assert gpu.count == 0  # a CPU tensor's work, seen from a GPU machine


def test_a_kernel_launch_inside_another_counts_once():
    c = bench.LaunchCounter()
    inner = c.kernel(lambda x: x.add(1))
    outer = c.kernel(lambda x: inner(x).mul(2))
    c.call(outer, torch.arange(3))
    assert c.count == 1
    empty = c.kernel(lambda x: x.add(1), size=lambda x: x.numel())
    c.count = 0
    c.call(empty, torch.empty(0))
    assert c.count == 1  # no kernel on empty input: the launcher's own operation is counted
