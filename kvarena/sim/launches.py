"""The allocator's kernel launches: what the simulator's clock charges for
the allocator by default (``timing.Clock.launch_seconds`` each).

On a GPU every torch operation is one kernel launch from the host.
``Counted`` wraps a setup and counts, per call of the scheduler's (the
views, gates, allocations, frees and the ladder), the torch operations the
call dispatches:

- the unified setups run on torch (``kvarena.impl``): their operations are
  counted in the run, by a ``TorchDispatchMode`` around each call, ladder
  moves included;
- the static splits and vLLM's padded pool are host-side models of free
  lists: each of their calls is priced at what a torch free list dispatches
  for the same call (``free_list_ops``, counted once on the benchmark's
  static twin, ``bench.StaticFreeList``, an SWA and full pair with its page
  map, so an upper bound for a model without SWA).  vLLM's own block pool
  is host Python and sends its block table once a step; pricing it as a
  free list on the device is the same cost model for every setup, stated.
"""

import functools

CALLS = ("available", "admits", "alloc_state", "extend", "decode", "free_window", "release", "relieve")


@functools.cache
def free_list_ops():
    """Torch operations a torch free list dispatches per call of the
    scheduler's: ``{call: ops}`` (a release is per pool it returns to)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from kvarena.sim.bench import StaticFreeList, _Ring

    count = [0]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[0] += 1
            return func(*args, **(kwargs or {}))

    def ops(fn, *args, **kw):
        count[0] = 0
        with Mode():
            fn(*args, **kw)
        return count[0]

    twin, ring = StaticFreeList(64, 64, 1, "cpu"), _Ring(64, "cpu")
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


class Counted:
    """A setup whose calls count their kernel launches into ``launches``
    (``take_launches`` reads and clears it)."""

    def __init__(self, backend):
        self._b = backend
        self._launches = 0
        self._depth = 0  # a relief's evictor calls release inside relieve: count the outer call only
        if getattr(backend, "static", True) or not hasattr(backend, "arena"):
            table = free_list_ops()
            self._price = table
        else:
            self._price = None
            from torch.utils._python_dispatch import TorchDispatchMode

            counter = self

            class Mode(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    counter._launches += 1
                    return func(*args, **(kwargs or {}))

            self._mode = Mode

    def take_launches(self):
        n, self._launches = self._launches, 0
        return n

    def __getattr__(self, name):
        attr = getattr(self._b, name)
        if name not in CALLS:
            return attr
        if self._price is not None:

            def priced(*args, **kw):
                if name == "release":
                    ids, slots = args
                    pools = (1 + self._b.has_swa if ids else 0) + (1 if slots else 0)
                    self._launches += self._price["release"] * pools
                elif name != "free_window" or args[0]:
                    self._launches += self._price[name]
                return attr(*args, **kw)

            return priced

        def counted(*args, **kw):
            if self._depth:
                return attr(*args, **kw)
            self._depth += 1
            try:
                with self._mode():
                    return attr(*args, **kw)
            finally:
                self._depth -= 1

        return counted
