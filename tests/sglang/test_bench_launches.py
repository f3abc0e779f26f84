"""Launches a decode step, counted the same way on kvarena's allocator and
SGLang's own (``kvarena.sglang.bench.decode_step_launches``): each rule of the
count shown on a planted change."""

import torch

from kvarena.sglang import allocators, bench, stacks


def test_both_allocators_are_counted_and_a_step_varies_over_a_page():
    ours, theirs = bench.decode_step_launches(1, True), bench.decode_step_launches(1, False)
    assert len(ours) == len(theirs) == bench.PAGE_SIZE
    assert min(ours) > 0 and min(theirs) > 0
    assert max(ours) > min(ours) and max(theirs) > min(theirs)  # a page opening and a window free in the page


def test_a_planted_operation_in_a_step_call_is_counted(monkeypatch):
    base = bench.decode_step_launches(64, True)
    real = allocators._Dropin.translate_kv_loc

    def two_more(self, loc, *, out=None):
        torch.zeros_like(loc).add_(1)  # two device operations, once a step
        return real(self, loc, out=out)

    monkeypatch.setattr(allocators._Dropin, "translate_kv_loc", two_more)
    assert bench.decode_step_launches(64, True) == [n + 2 for n in base]


def test_sglangs_kernel_is_one_launch_whatever_its_cpu_stand_in_does(monkeypatch):
    """On the CPU SGLang's Triton kernel runs as a torch stand-in: one launch,
    however many torch operations the stand-in dispatches."""
    base = bench.decode_step_launches(64, False)
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

    monkeypatch.setattr(stacks, "cpu_kernels", __import__("contextlib").contextmanager(busier))
    assert bench.decode_step_launches(64, False) == base


def test_views_and_profiler_markers_launch_nothing():
    assert bench._launches(torch.ops.aten.view.default) == 0
    assert bench._launches(torch.ops.aten.slice.Tensor) == 0
    assert bench._launches(torch.ops.aten.empty.memory_format) == 0
    assert bench._launches(torch.ops.aten.index_select.default) == 1
    assert bench._launches(torch.ops.aten.add.Tensor) == 1
