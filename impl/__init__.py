"""kvarena.impl: the production arena on torch (CPU and CUDA).

Behaves page for page like ``kvarena.spec.Arena``; see ``docs/impl.md``.

Modules: ``capacity`` (torch-free scalar arithmetic), ``memo`` (epoch
fields and the capacity memo), ``band`` (one pool's device tables),
``journal`` (the undo log that makes every changing call all or nothing),
``arena`` (chain walks, operations, relieve, verify, bytes), ``composites``
(the token-level HybridSWA, MambaHybrid, TriPool; docs/design.md §6; they
use only ``Arena``'s public methods), ``kernels`` (which kernels run the
step, and the launches of the Triton ones) and ``triton_kernels`` (the
step's fused Triton kernels; docs/design.md §14).

May import: ``kvarena.spec``.

Imports from ``kvarena.spec``: ``geometry`` (``AccountingError``, ``Geometry``,
``SubPool``, ``borrowing``, ``check_policy``, ``lazy_ends``, ``make_layout``),
``planner`` (``End``, ``Float``, ``move_order``, ``plan_chain``), ``evict``
(``MAX_EVICT_ROUNDS``, ``evicted``), ``arena`` (``GATES``).

The first is the boot-time layout, its validation and its types; the
second is the chain planner's decision, which ``Arena.plan_floats`` calls
on the arena's host counters every time it runs; the third is the eviction
callback's contract (its rounds, and the check of the count it returns);
the fourth names the move gate's sources (docs/design.md §13).
Nothing else: every other per-operation step is written here.
"""

from kvarena.spec.evict import MAX_EVICT_ROUNDS
from kvarena.spec.geometry import AccountingError, SubPool

from .arena import Arena, Mover
from .composites import HybridSWA, MambaHybrid, TriPool, swa_window_end

__all__ = [
    "MAX_EVICT_ROUNDS",
    "AccountingError",
    "Arena",
    "HybridSWA",
    "MambaHybrid",
    "Mover",
    "SubPool",
    "TriPool",
    "swa_window_end",
]
