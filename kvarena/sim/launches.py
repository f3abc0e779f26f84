"""The allocator's kernel launches: what the simulator's clock charges for
the allocator (``timing.Clock.launch_seconds`` each; ``--alloc-cost``).

``Counted`` wraps a setup and prices each call of the scheduler's (the
views, gates, allocations, frees and the ladder) at the kernel launches it
makes.  Two rules:

- ``gpu`` (the default): each setup as a GPU runs it, counted the way
  ``kvarena bench --only ops`` counts a decode step on every side
  (``kvarena.sglang.bench.LaunchCounter``: a torch operation that launches
  device work is one launch, a Triton kernel is one launch, views, empty
  allocations and work on the engine's host copies are none).

  - The unified setups run Triton on a GPU, the project's default there
    (``kvarena.impl.kernels.choose``).  Each call that has a Triton path is
    priced from ``TRITON_OPS``: the launches the composite's call makes
    on Triton (lazy ENDs, page size 1, the simulator's arena), counted by
    ``count_triton_ops`` on a small arena (under Triton's interpreter on
    the CPU, where each kernel is still one launch) and recounted by
    tests/sim/test_launches.py, so the table cannot drift from the code.
    Each entry is the most the call launched in that count, so an upper
    bound (a free that regrows no hole reserve, or finds no live SWA
    entry, launches one fewer), and none grows with the batch: a decode of
    any batch is one fused launch (``alloc_decode``: 1, the figure
    ``bench --only ops`` measures in its trusted Triton step, 4 launches
    with the window free and two translations).
  - The ladder (``relieve``) has no Triton kernel yet (its relocation moves
    are torch copies; issue 57's relocation kernel does not exist): it is
    counted in the run on torch by the same rule, moves included.  A
    release that an eviction makes inside it is priced from the table.
    An arena with an eager END (none of the simulator's setups: its frees
    compact) is counted in the run on torch by the same rule.
  - The static splits and vLLM's padded pool are host-side models of free
    lists.  Each of their calls is priced at the unified arena's Triton
    launches for the same call on the same model (``free_list_table``).
    SGLang's own static paged allocator launches at least as many on a GPU
    (a decode: a translation, a Triton allocation kernel per pool and the
    page map's write, ``mem_cache/allocator/swa.py`` and ``paged.py``,
    against the arena's one fused launch), so the allocator term never
    charges a static setup more than the arena for the same call; the
    arena alone pays for its relocation.  (The torch free-list twin's
    counts, ``free_list_ops``, 33 launches an extend and 24 a decode, would
    charge SGLang's static allocator several times what its Triton path
    launches and so favour the arena; they are ``torch``'s.)  vLLM's own
    block pool is host Python and sends its block table once a step;
    pricing it as the same per-call launches is the same cost model for
    every setup, stated.

- ``torch``: the CPU torch path, the rule before ``gpu``: every torch
  operation a unified call dispatches, counted in the run by a
  ``TorchDispatchMode`` (views and host work included, the arena's own
  ``kernels="torch"``), and the free-list setups at a torch free list's
  operations counted the same way.

(``cpu``, the third ``--alloc-cost``, is no count: the allocator's CPU time
measured in this process, ``engine._Timed``.)  ``rule`` states the one in
use in a sentence for the report.
"""

import functools

CALLS = ("available", "admits", "alloc_state", "extend", "decode", "free_window", "release", "relieve")
RULES = ("gpu", "torch")  # the alloc costs this module counts (engine.ALLOC_COSTS also has "cpu")

# The launches each call of the scheduler's makes on the Triton path, per
# composite (lazy ENDs, page size 1): ``count_triton_ops``'s figures, which
# tests/sim/test_launches.py recounts.  "release" is ``free`` of a request's
# tokens (its full pages and their live SWA entries), "release_state" is
# ``free_state`` of its slots; the views and gates are host counters.
TRITON_OPS = {
    "HybridSWA": {"available": 0, "admits": 0, "extend": 7, "decode": 1, "free_window": 2, "release": 5},
    "MambaHybrid": {
        "available": 0,
        "admits": 0,
        "alloc_state": 1,
        "extend": 7,
        "decode": 1,
        "release": 3,
        "release_state": 3,
    },
    "TriPool": {
        "available": 0,
        "admits": 0,
        "alloc_state": 1,
        "extend": 7,
        "decode": 1,
        "free_window": 2,
        "release": 5,
        "release_state": 3,
    },
}


def rule(alloc_cost, accelerator="h200"):
    """One sentence that states how the clock prices the allocator under
    ``alloc_cost`` (``engine.ALLOC_COSTS``), for the report."""
    from kvarena.sim import timing

    us = f"{timing.ACCELERATORS[accelerator].launch_seconds * 1e6:g} µs a launch (a stated assumption)"
    if alloc_cost == "gpu":
        t = TRITON_OPS["TriPool"]
        return (
            "The allocator is priced as a GPU runs it (--alloc-cost gpu), at the kernel launches "
            "`kvarena bench --only ops` counts: each unified call on its Triton path (a decode "
            f"{t['decode']}, a prefill chunk {t['extend']}, a window free {t['free_window']}, a request's "
            f"release {t['release']}, whatever the batch), the ladder's relocation moves at their torch "
            "operations counted in the run (no relocation kernel exists yet); the static splits and vLLM's "
            "pool at the same launches per call (SGLang's own static paged allocator launches at least as "
            f"many), so the allocator term cannot favour the arena; {us}."
        )
    if alloc_cost == "torch":
        return (
            "The allocator is priced on its CPU torch path (--alloc-cost torch): every torch operation "
            "each unified call dispatches, counted in the run, and the static splits and vLLM's pool at "
            f"a torch free list's operations per call, {us}."
        )
    if alloc_cost == "cpu":
        return (
            "The allocator is priced at its CPU time measured in this process (--alloc-cost cpu), which "
            "varies run to run and includes the moves the copy term already prices."
        )
    raise ValueError(f"launches.rule: alloc_cost must be gpu, torch or cpu, got {alloc_cost!r}")


def _one_launch(func):
    return 1


@functools.cache
def free_list_ops(count="torch"):
    """Launches a torch free list makes per call of the scheduler's:
    ``{call: launches}`` (a release is per pool it returns to).  ``count``:
    ``"torch"`` counts every dispatched torch operation (``--alloc-cost
    torch``), ``"gpu"`` by ``bench --only ops``' rule (``--alloc-cost gpu``:
    views and empty allocations are no launch, nor is work on the engine's
    host copy of the lengths)."""
    import torch

    from kvarena.sim.freelist import Ring, StaticFreeList

    if count == "gpu":
        from kvarena.sglang.bench import LaunchCounter

        counter = LaunchCounter("cpu")

        def ops(fn, *args, **kw):
            counter.count = 0
            counter.call(fn, *args, **kw)
            return counter.count

    else:
        from torch.utils._python_dispatch import TorchDispatchMode

        n = [0]

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                n[0] += 1
                return func(*args, **(kwargs or {}))

        def ops(fn, *args, **kw):
            n[0] = 0
            with Mode():
                fn(*args, **kw)
            return n[0]

    twin, ring = StaticFreeList(64, 64, 1, "cpu"), Ring(64, "cpu")
    one, four = torch.tensor([3]), torch.tensor([5, 5, 5, 5])
    extend = ops(twin.alloc_extend, torch.tensor([0]), one, torch.tensor([-1]))
    last = twin.alloc_extend(torch.tensor([0, 0, 0, 0]), four, torch.full((4,), -1))[4::5]
    decode = ops(twin.alloc_decode, four + 1, last, seq_lens_cpu=four + 1)
    window = ops(twin.free_swa, last, 0, num_live=4)
    taken = ring.take(4)
    put = ops(ring.put, taken)
    take = ops(ring.take, 1)
    return {
        "available": 0,  # host counters
        "admits": 0,
        "relieve": 0,  # eviction only: its releases are counted as releases
        "alloc_state": take,
        "extend": extend,
        "decode": decode,
        "free_window": window,
        "release": put,
    }


def count_triton_ops(kind, batches=(1, 64)):
    """Count ``TRITON_OPS[kind]`` afresh: the most launches each call of the
    scheduler's makes on the composite ``kind``'s Triton path (lazy ENDs,
    page size 1, the calls ``backends.Unified`` makes, the engine's host
    copies as host tensors), by ``bench --only ops``' rule, at each batch of
    ``batches``.  Returns ``({call: most}, {call: fewest})``.  Triton must
    run here: on CUDA, or on the CPU under its interpreter (``kvarena.impl.
    kernels.interpret_without_cuda`` before Triton is imported)."""
    import torch

    from kvarena import impl
    from kvarena.impl.kernels import unavailable
    from kvarena.sglang.bench import LaunchCounter

    device = "cuda" if torch.cuda.is_available() and unavailable(torch.device("cuda")) is None else "cpu"
    if (why := unavailable(torch.device(device))) is not None:
        raise RuntimeError(f"launches.count_triton_ops: Triton cannot run here: {why}")
    e, need = 64, 4 * (max(batches) + 4) * 16
    total = need * e * 6 + (1 << 16)
    kw = {"lazy": True, "policy": "anchor", "device": device, "kernels": "triton"}
    if kind == "HybridSWA":
        c = impl.HybridSWA(total, e, e, 1, **kw)
    elif kind == "MambaHybrid":
        c = impl.MambaHybrid(total, e, 4 * e, 1, **kw)
    elif kind == "TriPool":
        c = impl.TriPool(total, e, e, 4 * e, 1, **kw)
    else:
        raise ValueError(f"launches.count_triton_ops: no composite {kind!r}; one of {', '.join(TRITON_OPS)}")
    counter = LaunchCounter(device)
    seen = {}  # call -> its counts

    def count(call, fn, *args, **kwargs):
        counter.count = 0
        with counter.triton():
            out = counter.call(fn, *args, **kwargs)
        seen.setdefault(call, []).append(counter.count)
        return out

    def dev(xs):
        return torch.tensor(xs, dtype=torch.int64, device=device)

    def host(xs):
        return torch.tensor(xs, dtype=torch.int64)

    has_swa, has_state = kind != "MambaHybrid", kind != "HybridSWA"
    for batch in batches:
        count("available", c.available_size)
        count("admits", c.fits, batch, batch if has_state else 0)
        slots = [int(count("alloc_state", c.alloc_state, 1)[0]) for _ in range(batch)] if has_state else []
        reqs = [[] for _ in range(batch)]  # each request's tokens
        for i, r in enumerate(reqs * 2):  # one prefill chunk a call, as the engine's: a first, then a next
            p, q = [len(r)], [len(r) + 3 + i % 5]
            ids = count(
                "extend",
                c.alloc_extend,
                dev(p),
                dev(q),
                dev([r[-1] if r else -1]),
                False,
                prefix_lens_cpu=host(p),
                seq_lens_cpu=host(q),
                extend_num_tokens=q[0] - p[0],
            )
            r.extend(ids.tolist())
        for _ in range(2):
            seqs = [len(r) + 1 for r in reqs]
            out = count("decode", c.alloc_decode, dev(seqs), dev([r[-1] for r in reqs]), False, seq_lens_cpu=host(seqs))
            for r, o in zip(reqs, out.tolist()):
                r.append(o)
        if has_swa:
            for k in range(2):  # the window passes each request's first pages (page size 1: every id is live)
                count("free_window", c.free_swa, dev([r[k] for r in reqs]), 0, False, num_live=batch)
        for r in reqs:
            count("release", c.free, dev(r))
        for s in slots:
            count("release_state", c.free_state, dev([s]))
    return {k: max(v) for k, v in seen.items()}, {k: min(v) for k, v in seen.items()}


def free_list_table(preset):
    """A free-list setup's launches per call on a GPU (``gpu``): the unified
    arena's Triton path's for the same model (``TRITON_OPS``; a model with
    full attention alone takes HybridSWA's, an upper bound).  SGLang's own
    static paged allocator launches at least as many: a decode is a
    translation, a Triton allocation kernel per pool and the page map's
    write (``mem_cache/allocator/swa.py``, ``paged.py``), where the arena
    launches one.  So the allocator term charges a static setup no more
    than the arena for the same call, and the arena's relocation (counted
    in the run) on top: it cannot favour the arena."""
    kinds = preset.kinds
    if kinds == ("full",):
        return TRITON_OPS["HybridSWA"]
    return TRITON_OPS[preset.composite]


def _launch_rule(alloc_cost):
    """How an operation counted in the run weighs: 1 each (``torch``), or
    ``bench --only ops``' rule (``gpu``: views and empty allocations are no launch)."""
    if alloc_cost == "gpu":
        from kvarena.sglang.bench import launches

        return launches
    return _one_launch


class Counted:
    """A setup whose calls count their kernel launches under ``alloc_cost``
    (``RULES``; ``take_launches`` reads and clears them)."""

    def __init__(self, backend, alloc_cost="gpu"):
        if alloc_cost not in RULES:
            raise ValueError(f"launches.Counted: alloc_cost must be one of {', '.join(RULES)}, got {alloc_cost!r}")
        self._b = backend
        self._launches = 0
        self._depth = 0  # a relief's evictor calls release inside relieve: count the outer call only
        self._paused = 0  # a priced call inside a counted one: its operations are its price's
        self._free_list = getattr(backend, "static", True) or not hasattr(backend, "arena")
        self._per_pool = self._free_list and alloc_cost != "gpu"
        self._price = None
        if self._free_list:
            # gpu: a free list priced per call as the unified arena's Triton path (``free_list_table``)
            self._price = free_list_table(backend.sizes.preset) if alloc_cost == "gpu" else free_list_ops(alloc_cost)
            return
        if alloc_cost == "gpu":
            arena = backend.arena
            if all(arena.is_lazy(n) for n in arena.chain if arena.pool(n).grow != "float"):  # lazy ENDs
                self._price = TRITON_OPS.get(type(backend.c).__name__)
        from torch.utils._python_dispatch import TorchDispatchMode

        counter, weigh = self, _launch_rule(alloc_cost)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not counter._paused:
                    counter._launches += weigh(func)
                return func(*args, **(kwargs or {}))

        self._mode = Mode

    def take_launches(self):
        n, self._launches = self._launches, 0
        return n

    def _priced(self, name, args):
        """The launches ``name(*args)`` is priced at, or None: counted in the run."""
        p = self._price
        if self._free_list and name not in p and name != "release":
            return 0  # no table entry: a host counter, or relief by eviction (its releases are priced as releases)
        if p is None or (name not in p and name != "release"):
            return None
        if name == "free_window":
            return p[name] if args[0] else 0
        if name != "release":
            return p[name]
        ids, slots = args
        if self._per_pool:  # a torch free list's release is per pool it returns to
            return p["release"] * ((1 + self._b.has_swa if ids else 0) + (1 if slots else 0))
        return (p["release"] if ids else 0) + (p.get("release_state", 0) if slots else 0)

    def __getattr__(self, name):
        attr = getattr(self._b, name)
        if name not in CALLS:
            return attr

        def call(*args, **kw):
            price = self._priced(name, args)
            if price is not None:
                self._launches += price
                if self._free_list:
                    return attr(*args, **kw)
                self._paused += 1
                try:
                    return attr(*args, **kw)
                finally:
                    self._paused -= 1
            if self._depth:
                return attr(*args, **kw)
            self._depth += 1
            try:
                with self._mode():
                    return attr(*args, **kw)
            finally:
                self._depth -= 1

        return call
