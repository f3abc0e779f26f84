"""Fault injection: make the k-th torch operation of a call raise.

``FaultAt(k)`` is a ``TorchDispatchMode``: inside it every torch operation
(each kernel, view, factory and copy that reaches the dispatcher) and
every Triton launch (``kvarena.impl.kernels.wrapped``) is counted, and
the ``k``-th (from 0) raises ``InjectedFault`` instead of running, once;
the operations after it run.  That is the fault model of
``impl/journal.py``: one operation fails, before it runs, and the undo
after it works.  ``FaultAt(None)`` only counts.

``count_ops`` counts a call's operations and ``fault_at`` runs it with one
of them failing (``unfaulted`` exempts a harness's own work inside it);
``tests/impl/test_faults.py`` and ``tests/sglang/test_faults.py``
sweep every ``k`` of every moving call, and the differential machines'
``faulted`` rules draw one.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from kvarena.impl import kernels


class InjectedFault(RuntimeError):
    """The fault ``FaultAt`` raises."""


_EXEMPT = [0]  # > 0 while a harness runs its own operations inside a faulted call


@contextlib.contextmanager
def unfaulted() -> Iterator[None]:
    """While open, torch operations run uncounted and never fail: a
    harness's own work called back from inside a faulted call (the
    differential machines' simulated forward, completing at a settle)."""
    _EXEMPT[0] += 1
    try:
        yield
    finally:
        _EXEMPT[0] -= 1


class FaultAt(TorchDispatchMode):
    """Count torch operations; the ``k``-th raises ``InjectedFault``."""

    def __init__(self, k: int | None = None) -> None:
        super().__init__()
        self.k = k
        self.ops = 0
        self.fired = False

    def __enter__(self) -> "FaultAt":
        # A Triton launch is one operation too: it fails before it runs, or
        # runs whole (the interpreter's own torch work inside it is not ours).
        self._launches = kernels.wrapped(self._at_launch)
        self._launches.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._launches.__exit__(*exc)

    def _at_launch(self, kernel: Any, go: Callable[[], None]) -> None:
        if not _EXEMPT[0]:
            n = self.ops
            self.ops += 1
            if n == self.k:
                self.fired = True
                raise InjectedFault(f"injected fault at operation {n} (Triton kernel {kernel})")
        with unfaulted():
            go()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _EXEMPT[0]:
            return func(*args, **(kwargs or {}))
        n = self.ops
        self.ops += 1
        if n == self.k:
            self.fired = True
            raise InjectedFault(f"injected fault at operation {n} ({func})")
        return func(*args, **(kwargs or {}))


def record_fault(spec_obj: Any, call: str, at: int, kernels: str, *args: Any) -> None:
    """A machine's faulted ``call`` came out of the implementation: tell the
    recorder wrapping its spec object, if one does (``kvarena fuzz``'s traced
    machines: the step goes into the failure's vector), else nothing."""
    record = getattr(spec_obj, "record_fault", None)
    if record is not None:
        record(call, at, kernels, *args)


def count_ops(call: Callable[[], object]) -> tuple[object, int]:
    """``call()``'s result and how many torch operations it ran."""
    with FaultAt() as mode:
        out = call()
    return out, mode.ops


def fault_at(k: int, call: Callable[[], object]) -> tuple[bool, object]:
    """Run ``call()`` with its ``k``-th operation failing: ``(True, None)``
    if the fault came out of it, else ``(False, result)`` (``k`` was past
    its last operation, or the call caught the fault and went on)."""
    with FaultAt(k) as mode:
        try:
            out = call()
        except InjectedFault:
            if not mode.fired:
                raise
            return True, None
    return False, out
