"""The obligation registry, with every group loaded.

``REGISTRY`` maps each name to its ``Obligation`` (name, group, statement,
z3 time limit, builder of hypotheses and goal, expected result).  The
obligations themselves live by topic in ``layout``, ``golden``,
``invariants``, ``capacity``, ``policy``, ``planner``, ``composites``, ``views``,
``inflight``, ``hold`` and ``disagg``; the runner is ``core``.
"""

from . import (  # noqa: F401  (they register)
    capacity,
    composites,
    disagg,
    golden,
    hold,
    inflight,
    integrity,
    invariants,
    layout,
    planner,
    policy,
    views,
)
from .core import REGISTRY, Built, Obligation, run_obligation

__all__ = ["REGISTRY", "Built", "Obligation", "run", "run_obligation"]


def run(name):
    """Run one obligation by name; a result dict."""
    return run_obligation(REGISTRY[name])
