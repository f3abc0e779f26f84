"""One decode step on SGLang's own SWA stack: kvarena's allocator against
SGLang's, side by side (``kvarena bench --only sglang``).

A step is what SGLang's scheduler and attention do to the allocator each
iteration: ``alloc_decode`` with the host copy of the lengths, one
``free_swa_segment`` for the pages that left every request's window, and
both translations of the new slots.  Request lengths are staggered so page
openings and window frees spread over the steps.  On CPU SGLang's two
Triton kernels run as its own naive torch versions (``stacks.cpu_kernels``).
"""

import contextlib
import time

import torch

from . import factories, stacks

I64 = torch.int64
PAGE_SIZE = 16


class DecodeLoop:
    """``batch`` requests of staggered lengths on a fresh stack, stepped."""

    def __init__(self, batch: int, start: int, steps: int, window: int, device: str) -> None:
        ps = PAGE_SIZE
        longest = start + ps + steps + 1
        tokens = batch * (-(-longest // ps) + 1) * ps + ps
        g = stacks.Geometry(tokens=tokens // ps, context_len=longest, window=window)
        self.alloc = stacks.build("swa", g, page_size=ps, lazy=True, device=device).token_to_kv_pool_allocator
        self.dev, self.window = torch.device(device), window
        lens = torch.tensor([start + i % ps for i in range(batch)], dtype=I64)
        zero = torch.zeros(batch, dtype=I64)
        first = self.alloc.alloc_extend(
            zero.to(self.dev),
            zero,
            lens.to(self.dev),
            lens,
            torch.full((batch,), -1, dtype=I64, device=self.dev),
            int(lens.sum()),
        )
        assert first is not None
        self.table = torch.zeros(batch, longest + ps, dtype=I64, device=self.dev)
        cols = torch.arange(self.table.shape[1], dtype=I64)
        mask = cols.unsqueeze(0) < lens.unsqueeze(1)
        self.table[mask.to(self.dev)] = first
        self.seq_cpu = lens.clone()
        self.last = self.table[torch.arange(batch, device=self.dev), (lens - 1).to(self.dev)]
        self.freed = torch.zeros(batch, dtype=I64)  # SWA freed below this position (host, a page multiple)
        self.rows = torch.arange(batch, device=self.dev)

    def step(self) -> None:
        ps = PAGE_SIZE
        self.seq_cpu += 1
        seq = self.seq_cpu.to(self.dev, non_blocking=True)
        out = self.alloc.alloc_decode(seq, self.seq_cpu, self.last)
        self.table[self.rows, seq - 1] = out
        self.last = out
        edge = torch.clamp((self.seq_cpu - self.window) // ps * ps, min=0)
        leaving = (edge > self.freed).nonzero().flatten()  # host tensors: the scheduler's own bookkeeping
        if leaving.numel():
            idx = leaving.to(self.dev)
            cols = self.freed[leaving].to(self.dev).unsqueeze(1) + torch.arange(ps, device=self.dev)
            self.alloc.free_swa_segment(self.table[idx.unsqueeze(1), cols].reshape(-1), start_pos=0)
            self.freed[leaving] += ps
        self.alloc.translate_kv_loc(out)
        self.alloc.translate_loc_from_full_to_swa(out)


STEP_CALLS = ("alloc_decode", "free_swa_segment", "translate_kv_loc", "translate_loc_from_full_to_swa")
# Dispatched operations that launch nothing on a device: views and other
# metadata, allocations without a fill, and the profiler's markers.
NO_LAUNCH = frozenset(
    {"view", "_unsafe_view", "slice", "select", "detach", "alias", "lift_fresh", "expand", "unsqueeze", "squeeze"}
    | {"as_strided", "t", "permute", "empty", "empty_strided", "empty_like"}
)


def _launches(func) -> int:
    """1 if the operation launches work on a device, else 0."""
    ns, _, rest = str(func).partition(".")
    return 0 if ns == "profiler" or rest.split(".")[0] in NO_LAUNCH else 1


def decode_step_launches(batch: int, ours: bool) -> list[int]:
    """Kernel launches of each decode step over a page's worth of steps
    (``PAGE_SIZE``, so a page opening and a window free fall in it), counted
    the same way on both allocators: one per torch operation the step's
    allocator calls (``STEP_CALLS``) dispatch that launches device work
    (``_launches``: not a view, an empty allocation or a profiler marker),
    and one per Triton kernel SGLang launches (``alloc_decode_kernel``; on
    the CPU its torch stand-in runs uncounted, as the kernel would be one
    launch).  The scheduler's own tensor work between the calls is not
    counted.  On the CPU a host copy's operations count as launches too,
    on both sides."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sub = stacks.import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
    count, depth = [0], [0]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if depth[0] == 0:
                count[0] += _launches(func)
            return func(*args, **(kwargs or {}))

    stacks.runtime_context()
    with _side(ours, "cpu"):
        kernels = {name: getattr(sub, name) for name in ("alloc_extend_kernel", "alloc_decode_kernel")}

        def one_launch(run):
            def launch(*args):
                count[0] += 1
                depth[0] += 1
                try:
                    return run(*args)
                finally:
                    depth[0] -= 1

            return launch

        for name, k in kernels.items():
            setattr(sub, name, stacks._OnHost(one_launch(k.run)) if isinstance(k, stacks._OnHost) else k)
        try:
            loop = DecodeLoop(batch, 64, 2 * PAGE_SIZE, 32, "cpu")
            loop.step()  # warm
            for call in STEP_CALLS:
                fn = getattr(loop.alloc, call)

                def counted(*args, fn=fn, **kwargs):
                    with Mode():
                        return fn(*args, **kwargs)

                setattr(loop.alloc, call, counted)
            per_step = []
            for _ in range(PAGE_SIZE):
                count[0] = 0
                loop.step()
                per_step.append(count[0])
        finally:
            for name, k in kernels.items():
                setattr(sub, name, k)
            factories.uninstall()
    return per_step


def _side(ours: bool, device: str):
    """kvarena's allocator in SGLang's factory, or SGLang's own."""
    if ours:
        factories.install()
        return contextlib.nullcontext()
    factories.uninstall()
    return stacks.cpu_kernels() if not str(device).startswith("cuda") else contextlib.nullcontext()


def decode_step(batch: int, steps: int, warmup: int, repeats: int, device: str, sync) -> dict[str, list[float]]:
    """Seconds a step, per side and repeat (alternating which side goes first)."""
    stacks.runtime_context()
    times: dict[str, list[float]] = {"kvarena": [], "sglang": []}
    try:
        for rep in range(repeats):
            for side in ("kvarena", "sglang") if rep % 2 == 0 else ("sglang", "kvarena"):
                with _side(side == "kvarena", device):
                    loop = DecodeLoop(batch, 64, warmup + steps, 32, device)
                    for _ in range(warmup):
                        loop.step()
                    sync(device)
                    t = time.perf_counter()
                    for _ in range(steps):
                        loop.step()
                    sync(device)
                    times[side].append((time.perf_counter() - t) / steps)
    finally:
        factories.uninstall()
    return times
