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
