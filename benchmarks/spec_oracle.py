"""How fast is the spec as an oracle?  Prints simple operations per second.

    python benchmarks/spec_oracle.py [--ops 50000]

A "simple operation" is one alloc or free of 1 to 4 pages, or a capacity
read, on a small tri-pool arena (a few hundred pages per pool), eager and
lazy.  The spec targets at least 10,000 such operations per second.
"""

import argparse
import random
import time

from kvarena.spec import Arena, SubPool


def arena(lazy):
    return Arena(16384, [SubPool("mamba", 64, 1, "up", "state"), SubPool("swa", 8, 4, "float"),
                         SubPool("full", 16, 4, "down")], lazy=lazy)


def run(ops, lazy, seed=0):
    rng = random.Random(seed)
    a = arena(lazy)
    live = {n: [] for n in a.chain}
    t = time.perf_counter()
    for _ in range(ops):
        name = rng.choice(a.chain)
        r = rng.random()
        if r < 0.45:
            got = a.alloc(name, rng.randint(1, 4))
            if got is None:
                a.free(name, live[name])
                live[name] = []
            else:
                live[name] += got
        elif r < 0.8 and live[name]:
            k = rng.randint(1, min(4, len(live[name])))
            a.free(name, live[name][-k:])
            del live[name][-k:]
        else:
            a.available_size(name)
    return ops / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", type=int, default=50_000)
    args = p.parse_args()
    for lazy in (False, True):
        rate = run(args.ops, lazy)
        mode = "lazy" if lazy else "eager"
        print(f"spec oracle, {mode:5s}: {rate:10,.0f} simple ops/s  ({'meets' if rate >= 10_000 else 'BELOW'} the 10,000 ops/s target)")


if __name__ == "__main__":
    main()
