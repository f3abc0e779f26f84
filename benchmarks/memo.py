"""Memoised capacity reads against fresh recomputation, side by side.

    python benchmarks/memo.py [--reads 20000] [--floats 3]

A scheduler reads the capacity views O(queue) times per step while the arena
changes rarely in between.  This times, in one run, the same sequence of
reads of every view of every pool through the memo (``available_pages`` and
friends) and through ``fresh_view`` (the same formulas, memo bypassed), on an
impl arena with floats between the ENDs, and prints the ratio.  One
allocation every ``--batch`` reads invalidates the memo, as a step would.
"""

import argparse
import time

from kvarena.impl import Arena, SubPool
from kvarena.impl.arena import VIEWS


def arena(floats):
    pools = [SubPool("state", 4096, 1, "up", "state"), SubPool("full", 64, 16, "down")]
    pools += [SubPool(f"swa{i}", 32, 16, "float") for i in range(floats)]
    a = Arena(64 << 20, pools)
    for name in a.chain:
        a.alloc(name, 8)
    return a


def timed(a, reads, batch, read):
    names = a.chain
    t = time.perf_counter()
    for i in range(reads):
        if i % batch == 0:
            a.alloc(names[-1], 1)  # a step: every memo entry is now stale
        for name in names:
            for view in VIEWS:
                read(view, name)
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=20_000, help="read rounds (every view of every pool)")
    p.add_argument("--batch", type=int, default=64, help="read rounds per invalidating step")
    p.add_argument("--floats", type=int, default=3)
    args = p.parse_args()
    a, b = arena(args.floats), arena(args.floats)
    memo = timed(a, args.reads, args.batch, a._view)
    fresh = timed(b, args.reads, args.batch, b.fresh_view)
    for name in a.chain:  # same answers, or the ratio means nothing
        assert all(a._view(v, name) == b.fresh_view(v, name) for v in VIEWS)
    n = args.reads * len(a.chain) * len(VIEWS)
    print(f"{len(a.chain)} pools, {n:,} view reads, one step per {args.batch} read rounds")
    print(f"  memoised: {n / memo:12,.0f} reads/s")
    print(f"  fresh:    {n / fresh:12,.0f} reads/s")
    print(f"  memoised / fresh speed-up: {fresh / memo:.1f}x")


if __name__ == "__main__":
    main()
