"""kvarena.spec: the executable specification of the unified arena.

Pure Python (ints, lists, dicts).  It is the reference reviewers read and
the oracle the torch implementation is tested against.

The reading order (the one place it is stated; the docs and the modules
refer here), about 3,000 lines in all:

- ``arith``       integer formulas, written once for ints and z3 terms;
- ``geometry``    sub-pools, page grids, the sink, the chain, every configuration error;
- ``chain``       the arena in numbers: spans and counts, walks, capacity views;
- ``transitions`` each operation's update of the counts (the proofs' source);
- ``forward``     an in-flight forward: the pages it writes (pinned) and reads (pending);
- ``bands``       one band: span, page tables, FIFO ids, holes, content model, guards, reservations;
- ``moves``       relocation plans: which live pages go where, and why they fit;
- ``policy``      the anchor's demand-vector decision for sliding a float;
- ``planner``     kvarena's chain planner: one placement of every float;
- ``evict``       the eviction callback's contract: rounds, the count it returns;
- ``arena``       the API: views and operations over chain and transitions, relieve, holds, verify;
- ``composites``  the token-level composites over one arena (docs/design.md §6);
- ``contracts``   the run-time checker of the ``pre:``/``post:``/``inv:`` docstring lines.

May import: nothing outside ``kvarena.spec``: the standard library only
(z3 only inside the ``arith`` shim, when the proofs hand it z3 terms).
"""

from .arena import GATES, Arena
from .composites import HybridSWA, MambaHybrid, TriPool, swa_window_end
from .evict import MAX_EVICT_ROUNDS
from .geometry import POLICIES, AccountingError, Geometry, Layout, SubPool, make_layout
from .policy import short_side_decision

__all__ = [
    "GATES",
    "MAX_EVICT_ROUNDS",
    "POLICIES",
    "AccountingError",
    "Arena",
    "Geometry",
    "HybridSWA",
    "Layout",
    "MambaHybrid",
    "SubPool",
    "TriPool",
    "make_layout",
    "short_side_decision",
    "swa_window_end",
]
