"""``kvarena policies``: the anchor's relief policy against the chain planner,
side by side on the same random operation traces.

A trace is a seeded list of scheduler operations over one random geometry
(2 to 4 pools: up to two floats, mixed grids, lazy or eager ENDs):
allocate ``n`` pages in a pool, or free that pool's oldest live request.
Each trace runs twice, once per policy, on the spec (the reference).  An
allocation that does not fit calls ``relieve`` with an evictor that
retracts the newest live request anywhere (as a scheduler retracts the
newest request), then allocates if it now fits.

Measured per policy:

- ``shortfalls``: allocations that did not fit at once (``relieve`` calls);
- ``evictions``: evictor calls;
- ``false_oom``: shortfalls that evicted or failed although some placement
  of the floats met the demand with no eviction (judged after the ladder's
  flush, by ``planner.plan_chain``'s feasibility, which the proofs show is
  exact and ``tests/spec/test_planner.py`` checks against a brute-force search);
- ``pages_moved`` and ``moved_per_relief``: live pages that ``relieve``
  relocated (flushes, float repacks, ``make_room``; a page moved twice
  counts once), in total and per shortfall.

The two runs of a trace see the same operation list; they diverge only
where the policies do (an eviction retracts a request in one run and not
the other, so later frees may name different requests).
"""

import argparse
import copy
import json
import random
from typing import Any

from kvarena.spec import Arena, SubPool

OPS_PER_TRACE = 300


def random_geometry(rng):
    """``(total, pools, lazy)``: 2 to 4 pools on grids of 8 to 48 bytes a page."""
    n_floats = rng.choice([0, 1, 1, 2, 2])
    names = ["u"] + [f"f{i + 1}" for i in range(n_floats)] + ["d"]
    grows = ["up"] + ["float"] * n_floats + ["down"]
    pools = [SubPool(n, rng.choice([8, 12, 16, 24]), rng.choice([1, 2]), g) for n, g in zip(names, grows)]
    lazy = rng.choice([False, True, {"u"}, {"d"}])
    while True:
        total = rng.randrange(1500, 4000)
        try:
            Arena(total, pools, lazy=lazy)
            return total, pools, lazy
        except ValueError:
            continue


def random_trace(rng, names, steps=OPS_PER_TRACE):
    """``[("alloc", pool, n) | ("free", pool, None)]``, biased to allocate."""
    ops = []
    for _ in range(steps):
        name = rng.choice(names)
        if rng.random() < 0.6:
            ops.append(("alloc", name, rng.randint(1, 12)))
        else:
            ops.append(("free", name, None))
    return ops


def _relocated(before, a):
    """Pages whose live id now sits elsewhere: ``before`` is ``{pool: v2p}``."""
    n = 0
    for name, old in before.items():
        new = a.bands[name].v2p
        n += sum(1 for v, p in enumerate(old) if v and p >= 0 and new[v] >= 0 and new[v] != p)
    return n


def run_trace(policy, geometry, ops):
    """Replay ``ops`` under ``policy``; the counts of the module docstring."""
    total, pools, lazy = geometry
    a = Arena(total, pools, lazy=lazy, policy=policy)
    live = []  # (pool, ids) in allocation order
    stats = {"allocs": 0, "refused": 0, "shortfalls": 0, "evictions": 0, "false_oom": 0, "pages_moved": 0}

    def evict(shortfall):
        stats["evictions"] += 1
        if not live:
            return 0
        name, ids = live.pop()
        a.free(name, ids)
        return len(ids)

    for op, name, n in ops:
        if op == "free":
            mine = [i for i, (p, _) in enumerate(live) if p == name]
            if mine:
                a.free(*live.pop(mine[0]))
            continue
        stats["allocs"] += 1
        if n > a.available_pages(name):
            stats["shortfalls"] += 1
            placeable = _placeable(a, name, n)
            before_evictions, tables = stats["evictions"], {x: list(a.bands[x].v2p) for x in a.chain}
            a.relieve(name, n, evict)
            stats["pages_moved"] += _relocated(tables, a)
            if placeable and (stats["evictions"] > before_evictions or n > a.available_pages(name)):
                stats["false_oom"] += 1
        ids = a.alloc(name, n) if n <= a.available_pages(name) else None
        if ids is None:
            stats["refused"] += 1
        else:
            live.append((name, ids))
    a.verify()
    return stats


def _placeable(a, name, n):
    """Would some placement of the floats meet ``{name: n}`` once rung 1 has
    flushed?  (``plan_chain``'s feasibility: exact, see the module docstring.)"""
    trial = copy.deepcopy(a)
    trial.urgent_flush(name)
    return trial.plan({name: n}).feasible


def compare(traces: int = 40, steps: int = OPS_PER_TRACE, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Both policies on ``traces`` seeded traces; ``{policy: totals}``."""
    totals: dict[str, dict[str, Any]] = {
        p: {"allocs": 0, "refused": 0, "shortfalls": 0, "evictions": 0, "false_oom": 0, "pages_moved": 0}
        for p in ("anchor", "planner")
    }
    for t in range(traces):
        rng = random.Random(seed * 1_000_003 + t)
        geometry = random_geometry(rng)
        ops = random_trace(rng, [p.name for p in geometry[1]], steps)
        for policy, acc in totals.items():
            for k, v in run_trace(policy, geometry, ops).items():
                acc[k] += v
    for acc in totals.values():
        acc["moved_per_relief"] = round(acc["pages_moved"] / max(1, acc["shortfalls"]), 3)
    return totals


def table(totals):
    from rich.table import Table

    rows = [
        ("allocations", "allocs"),
        ("shortfalls (relieve calls)", "shortfalls"),
        ("evictions called", "evictions"),
        ("false OOM: evicted or failed with room present", "false_oom"),
        ("allocations refused", "refused"),
        ("pages relocated by relieve", "pages_moved"),
        ("pages moved per relief", "moved_per_relief"),
    ]
    t = Table(title="relief policies on the same traces (spec)")
    t.add_column("measure")
    t.add_column("anchor", justify="right")
    t.add_column("planner", justify="right")
    for label, key in rows:
        t.add_row(label, str(totals["anchor"][key]), str(totals["planner"][key]))
    return t


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", type=int, default=40, help="random traces (geometry + operations)")
    p.add_argument("--steps", type=int, default=OPS_PER_TRACE, help="operations per trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the totals as JSON")


def run(args: argparse.Namespace) -> int:
    """``kvarena policies``: the table of totals."""
    from rich.console import Console

    totals = compare(args.traces, args.steps, args.seed)
    Console().print(table(totals))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(totals, f, indent=1)
    return 0
