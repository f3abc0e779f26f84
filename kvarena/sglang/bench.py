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
import functools
import inspect
import time
import weakref
from collections.abc import Callable

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
        # kvarena's prefill on torch, its steps on the side's kernels (the two leave the same state):
        # Triton's interpreter is slow at a thousand prefills
        composite = getattr(self.alloc, "composite", None)
        kernels = None if composite is None else composite.arena.kernels
        if composite is not None:
            composite.arena.kernels = "torch"
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
        if composite is not None:
            composite.arena.kernels = kernels
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
        seq = self.seq_cpu.to(self.dev, non_blocking=True, copy=True)  # the device's own tensor, on the CPU too
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
# The sides: kvarena's allocator on each kernel choice, and SGLang's own (kernels None).
SIDE_KERNELS = {"kvarena_torch": "torch", "kvarena_triton": "triton", "sglang": None}
SIDES = tuple(SIDE_KERNELS)
LABELS = {"kvarena_torch": "kvarena (torch)", "kvarena_triton": "kvarena (triton)", "sglang": "SGLang's allocator"}
# Dispatched operations that launch nothing on a device: views and other
# metadata, allocations without a fill, and the profiler's markers.
NO_LAUNCH = frozenset(
    {"view", "_unsafe_view", "slice", "select", "detach", "alias", "lift_fresh", "expand", "unsqueeze", "squeeze"}
    | {"as_strided", "t", "permute", "empty", "empty_strided", "empty_like"}
)


def launches(func) -> int:
    """1 if the dispatched torch operation ``func`` launches work on a device, else 0."""
    ns, _, rest = str(func).partition(".")
    return 0 if ns == "profiler" or rest.split(".")[0] in NO_LAUNCH else 1


class LaunchCounter:
    """Kernel launches, counted one way for every allocator (``kvarena
    bench``'s ops and sglang sections): inside a counted call (``call``,
    ``counted``), one per dispatched torch operation that launches device
    work (``launches``), and one per Triton kernel: each of kvarena's
    (``kvarena.impl.kernels.launch``, seen through ``kernels.wrapped``
    while ``triton()`` is open) and each host function registered with
    ``kernel`` (SGLang's launchers, whose CPU stand-ins run torch).  The
    torch operations a kernel dispatches inside itself (the interpreter's
    host copies, a stand-in's work) are the kernel's, not launches.  A call
    made inside a counted call is counted once, as part of it.

    An operation on host tensors alone, with host results, launches
    nothing.  On a GPU (``device``) the host tensors are the CPU's; on the
    CPU, where every tensor is, they are the engine's host copies (a
    counted call's tensor arguments named ``*_cpu``, as both allocators
    name them: ``seq_lens_cpu``, ``prefix_lens_cpu``) and what operations
    make of them alone."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        self.count = 0
        self._calls = 0  # counted calls running
        self._kernels = 0  # kernels running
        self._gpu = torch.device(device).type != "cpu"
        self._host: dict[int, weakref.ref] = {}  # id -> a host copy (ids are reused once it dies)
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                given = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                out = func(*args, **(kwargs or {}))
                made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                if given and all(map(counter.is_host, given)) and all(t.device.type == "cpu" for t in made):
                    counter.host(*made)
                elif counter._kernels == 0:
                    counter.count += launches(func)
                return out

        self._mode = Mode

    def host(self, *tensors: torch.Tensor) -> None:
        """Count ``tensors`` as host copies: operations on them alone launch nothing."""
        for t in tensors:
            self._host[id(t)] = weakref.ref(t)

    def is_host(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives on the host (see the class)."""
        if t.device.type != "cpu":
            return False
        if self._gpu:
            return True
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _host_arguments(self, fn, args, kwargs) -> None:
        try:
            bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        except (TypeError, ValueError):  # no signature to read: nothing is a host copy
            return
        named = dict(bound.arguments)
        for k, v in bound.arguments.items():  # a **kwargs parameter's own names
            if bound.signature.parameters[k].kind is inspect.Parameter.VAR_KEYWORD:
                named.update(v)
        self.host(*(v for k, v in named.items() if k.endswith("_cpu") and isinstance(v, torch.Tensor)))

    def call(self, fn, /, *args, **kwargs):
        """``fn(*args, **kwargs)``, its launches counted."""
        if self._calls:
            return fn(*args, **kwargs)
        self._host_arguments(fn, args, kwargs)
        self._calls += 1
        try:
            with self._mode():
                return fn(*args, **kwargs)
        finally:
            self._calls -= 1

    def counted(self, fn):
        """``fn`` with its launches counted at every call."""

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return self.call(fn, *args, **kwargs)

        return call

    def _launch(self, go, *args, **kwargs):
        if self._calls and not self._kernels:
            self.count += 1
        self._kernels += 1
        try:
            return go(*args, **kwargs)
        finally:
            self._kernels -= 1

    def kernel(self, run, size=None):
        """``run`` as one kernel launch (none when ``size(*args)`` is 0: a
        launcher that returns early on empty input launches nothing)."""

        @functools.wraps(run)
        def launch(*args, **kwargs):
            if size is not None and not size(*args, **kwargs):
                return run(*args, **kwargs)
            return self._launch(run, *args, **kwargs)

        return launch

    @contextlib.contextmanager
    def triton(self):
        """While open, each of kvarena's Triton launches is one launch."""
        from kvarena.impl import kernels

        with kernels.wrapped(lambda kernel, go: self._launch(go)):
            yield self


def _numel(t) -> int:
    return int(t.numel())


# SGLang's launchers of its own Triton kernels, by the module that calls them:
# on CUDA each is one kernel (its CUDA path allocates ``torch.empty`` outputs
# and converts nothing already int64); on the CPU each runs a torch reference.
# name -> the size that makes it launch (0: it returns before the kernel).
SGLANG_KERNELS: dict[str, dict[str, Callable[..., int]]] = {
    "sglang.srt.mem_cache.allocator.unified_sub_pool": {
        "alloc_bind_inplace": lambda v, *a, **k: _numel(v),
        "bind_inplace": lambda v, *a, **k: _numel(v),
        "free_unbind_inplace": lambda v, *a, **k: _numel(v),
        "translate_token_ids": lambda **k: k["out_width"] if k.get("out_width") is not None else _numel(k["loc"]),
    },
    "sglang.srt.mem_cache.unified_memory_pool": {"zero_pages": lambda raw, pages, *a, **k: _numel(pages)},
}
SGLANG_GRID_KERNELS = ("alloc_extend_kernel", "alloc_decode_kernel")  # unified_sub_pool's, launched kernel[grid]


class _Grid:
    """A ``kernel[grid](*args)`` launch counted as one (``LaunchCounter.kernel``)."""

    def __init__(self, kernel, counter: LaunchCounter) -> None:
        self.kernel, self.counter = kernel, counter

    def __getitem__(self, grid):
        return self.counter.kernel(self.kernel[grid])


@contextlib.contextmanager
def _sglang_kernels_counted(counter: LaunchCounter):
    """While open, each of SGLang's Triton launches is one launch of
    ``counter``'s, whatever runs it (on the CPU: torch stand-ins for its two
    grid kernels, ``stacks.cpu_kernels``, and torch references in its
    launchers, ``SGLANG_KERNELS``)."""
    saved = []
    for module_name, sizes in SGLANG_KERNELS.items():
        module = stacks.import_sglang(module_name)
        for name, size in sizes.items():
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, counter.kernel(getattr(module, name), size))
    sub = stacks.import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
    for name in SGLANG_GRID_KERNELS:
        saved.append((sub, name, getattr(sub, name)))
        setattr(sub, name, _Grid(getattr(sub, name), counter))
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def decode_step_launches(batch: int, side: str, device: str = "cpu") -> list[int]:
    """Kernel launches of each decode step over a page's worth of steps
    (``PAGE_SIZE``, so a page opening and a window free fall in it) on
    ``side`` (one of ``SIDES``) on ``device``, counted the same way on every
    side (``LaunchCounter``): one per torch operation the step's allocator
    calls (``STEP_CALLS``) dispatch that launches device work (not a view,
    an empty allocation, a profiler marker, or work on host tensors alone:
    the engine's host copies), one per Triton kernel of kvarena's, and one
    per Triton kernel SGLang launches (on the CPU its stand-ins and torch
    references run uncounted, as the kernel would be one launch).  The
    scheduler's own tensor work between the calls is not counted.
    kvarena's Triton side runs under Triton's interpreter on the CPU
    (``unavailable`` says when it cannot run)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if (why := unavailable(side, device)) is not None:
        raise ValueError(f"{LABELS[side]} on {device}: {why}")
    counter = LaunchCounter(device)
    stacks.runtime_context()
    try:
        with _side(side, device), _sglang_kernels_counted(counter), counter.triton():
            loop = DecodeLoop(batch, 64, 2 * PAGE_SIZE, 32, device)
            loop.step()  # warm
            for call in STEP_CALLS:
                setattr(loop.alloc, call, counter.counted(getattr(loop.alloc, call)))
            per_step = []
            for _ in range(PAGE_SIZE):
                counter.count = 0
                loop.step()
                per_step.append(counter.count)
    finally:
        factories.uninstall()
    return per_step


def _side(side: str, device: str):
    """kvarena's allocator in SGLang's factory, on the side's kernels, or SGLang's own."""
    kernels = SIDE_KERNELS[side]
    if kernels is not None:
        factories.install(kernels=kernels)
        return contextlib.nullcontext()
    factories.uninstall()
    return stacks.cpu_kernels() if not str(device).startswith("cuda") else contextlib.nullcontext()


def unavailable(side: str, device: str) -> str | None:
    """Why ``side`` cannot run on ``device`` (kvarena's Triton side where
    Triton cannot run), or None."""
    kernels = SIDE_KERNELS[side]
    if kernels != "triton":
        return None
    from kvarena.impl.kernels import unavailable as why

    return why(torch.device(device))


class _Timer:
    """Seconds a block of steps takes: CUDA events on the stream on a CUDA
    device (the device's time from the first step's launch to the last
    step's end, the host's launch gaps included), else the host's clock
    around ``sync``."""

    def __init__(self, device: str, sync) -> None:
        self.cuda, self.device, self.sync = str(device).startswith("cuda"), device, sync

    def start(self) -> None:
        self.sync(self.device)
        if self.cuda:
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t0.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record()
            t1.synchronize()
            return self._t0.elapsed_time(t1) / 1e3
        self.sync(self.device)
        return time.perf_counter() - self._t


def decode_step(
    batch: int, steps: int, warmup: int, repeats: int, device: str, sync, sides: tuple[str, ...] = SIDES
) -> dict[str, list[float]]:
    """Seconds a step, per side of ``sides`` and repeat (the sides' order
    rotating from repeat to repeat); on a CUDA device timed with CUDA events
    (``_Timer``)."""
    stacks.runtime_context()
    timer = _Timer(device, sync)
    times: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for rep in range(repeats):
            k = rep % len(sides)
            for side in sides[k:] + sides[:k]:
                with _side(side, device):
                    loop = DecodeLoop(batch, 64, warmup + steps, 32, device)
                    for _ in range(warmup):
                        loop.step()
                    timer.start()
                    for _ in range(steps):
                        loop.step()
                    times[side].append(timer.stop() / steps)
    finally:
        factories.uninstall()
    return times
