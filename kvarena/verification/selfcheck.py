"""The spec's self-checks, run by ``kvarena verify`` and by the tests.

Two parts:

- **scenarios**: short, named stories through every operation, each run
  with every PEP 316 contract checked (``spec.contracts.checking``) and
  with exact expectations on the outcome;
- **a seeded random walk**: random geometries and random operations with
  ``verify()`` after every step.

Each check returns a ``Check(name, ok, detail, seconds)``.
"""

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kvarena.spec import Arena, SubPool
from kvarena.spec.contracts import checking


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


def _run(name, fn):
    t = time.perf_counter()
    try:
        detail = fn() or "ok"
        ok = True
    except Exception as e:  # a self-check reports every failure, whatever its type
        detail, ok = f"{type(e).__name__}: {e}", False
    return Check(name, ok, detail, time.perf_counter() - t)


def _expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


# --------------------------------------------------------------- geometry


def tri_pool(total=8192, lazy=False):
    """The headline case: mamba state up, SWA float, full KV down."""
    return Arena(
        total,
        [SubPool("mamba", 64, 1, "up", "state"), SubPool("swa", 8, 4, "float"), SubPool("full", 16, 4, "down")],
        lazy=lazy,
    )


def random_geometry(rng):
    """A random valid configuration: 2 to 5 pools, page sizes 1 to 64."""
    n_float = rng.randint(0, 3)
    grows = ["up", "down"] + ["float"] * n_float
    pools = []
    for i, grow in enumerate(grows):
        kind = "state" if rng.random() < 0.2 else "kv"
        page = 1 if kind == "state" else rng.choice([1, 2, 4, 8, 16, 32, 64])
        entry = rng.choice([1, 2, 3, 4, 6, 8, 12, 16])
        pools.append(SubPool(f"p{i}", entry, page, grow, kind))
    sink = max(p.epp for p in pools)
    total = min(sink * rng.randint(4 + 2 * len(pools), 64), 1 << 14) + rng.randint(0, sink)
    lazy = rng.choice([False, True, {"p0"}, {"p1"}])
    rng.shuffle(pools)  # the layout must not depend on input order (floats aside)
    return total, pools, lazy


# -------------------------------------------------------------- scenarios


def scenario_golden_gap():
    for wm_up, used_down in ((0, 0), (8, 0), (8, 4), (32, 16)):
        a = Arena(64 * 64, [SubPool("a", 64, 1, "up"), SubPool("b", 16, 4, "down")])
        if wm_up:
            a.alloc("a", wm_up)
        if used_down:
            a.alloc("b", used_down)
        g_a, g_b = a.geometry("a"), a.geometry("b")
        wm_a = g_a.min_page + wm_up
        wm_b = g_b.num_pages - 1 - used_down
        _expect(a.gap_bytes("a"), max(0, (wm_b + 1) * g_b.epp - wm_a * g_a.epp), f"gap at {wm_up, used_down}")
    return "4 points"


def scenario_float_parks_midregion():
    a = tri_pool()
    lo, hi = a.region("swa")
    ids = a.alloc("swa", 10)
    start = lo + (hi - lo - 10) // 2
    _expect(a.translate("swa", ids), list(range(start, start + 10)), "midpoint span")
    a.free("swa", ids)
    _expect(a.frontiers("swa"), (a.geometry("swa").num_pages * 32,) * 2, "parked frontiers")
    return f"span at {start}"


def scenario_holes_first():
    a = tri_pool()
    ids = a.alloc("swa", 8)
    a.free("swa", ids[2:4])
    before = a.translate("swa", ids[4:])
    holes = a.holes("swa")
    again = a.alloc("swa", 2)
    _expect(sorted(a.translate("swa", again)), holes, "holes reused")
    _expect(a.translate("swa", ids[4:]), before, "no page moved")
    _expect(a.holes("swa"), [], "holes consumed")
    return "zero moves"


def scenario_make_room_costs():
    a = tri_pool()
    a.alloc("swa", 10)
    lo_f, _ = a.frontiers("swa")
    band = a.band_bytes("swa", "low")
    moved = a.make_room("swa", "low", band + 3 * 32)  # three pages of room below
    _expect(moved, 3, "boundary moves need pages")
    _expect(a.frontiers("swa")[0], lo_f + 3 * 32, "low frontier rose by 3 pages")
    lo, _ = a.region("swa")
    moved = a.make_room("swa", "high", a.band_bytes("swa", "high") + 11 * 32)  # need 11 > live 10
    _expect(moved, 10, "leapfrog moves exactly the live pages")
    _expect(a.frontiers("swa"), (lo * 32, (lo + 10) * 32), "packed against the low edge")
    return "boundary 3, leapfrog 10"


def scenario_gate_exact():
    for page in (1, 2, 4, 16, 64):
        a = Arena(
            1 << 15,
            [SubPool("u", 12, 1, "up", "state"), SubPool("f", 3, page, "float"), SubPool("d", 5, page, "down")],
            lazy=True,
        )
        a.alloc("u", 7)
        a.alloc("d", 3)
        for name in a.chain:
            n = a.available_pages(name)
            snap = a.snapshot()
            _expect(a.alloc(name, n + 1), None, f"{name} alloc(available+1), page {page}")
            _expect(a.snapshot(), snap, "a refused alloc changes nothing")
            _expect(len(a.alloc(name, n)), n, f"{name} alloc(available), page {page}")
    return "page sizes 1..64"


def scenario_lazy_flush():
    a = tri_pool(lazy=True)
    ids = a.alloc("full", 12)
    a.free("full", ids[::2])
    _expect(a.live_pages("full"), 6, "lazy free keeps survivors")
    _expect(len(a.holes("full")), 6, "lazy free leaves holes")
    moved = a.flush("full", max_moves=1)
    _expect(moved, 1, "capped flush")
    a.flush("full")
    _expect(a.holes("full"), [], "flush settles every hole")
    return "capped and full"


def scenario_relieve_slides_float():
    a = tri_pool()
    a.alloc("swa", 4)
    need = a.available_pages("mamba") + 3
    ok = a.relieve("mamba", need)
    _expect(ok, True, "relieve opens the short side")
    _expect(a.available_pages("mamba") >= need, True, "mamba fits after relief")
    return "float slid away from mamba"


def scenario_relieve_evicts():
    a = tri_pool()
    full = a.alloc("full", a.available_pages("full"))
    calls = []

    def evict(short):
        calls.append(short)
        victims = full[: len(full) // 2]
        del full[: len(full) // 2]
        a.free("full", victims)
        return len(victims)

    ok = a.relieve("mamba", 20, evict)
    _expect(ok, True, "eviction frees room")
    _expect(len(calls) >= 1, True, "evict was called")
    return f"{len(calls)} eviction round(s)"


def scenario_relieve_judges_after_the_last_step():
    a = tri_pool()
    full = a.alloc("full", a.available_pages("full"))

    def evict(short):  # frees what is asked, but reports nothing
        a.free("full", full[: short * 4])
        return 0

    _expect(
        a.relieve("mamba", a.available_pages("mamba") + 2, evict),
        True,
        "the fit an evictor made counts even when it returns 0",
    )
    return "verdict after the last step"


def scenario_planner_one_run():
    """docs/findings.md, policy finding 6 (two floats): the anchor needs two ladder runs, the
    planner one, moving only the floats that block."""

    def two_floats(policy):
        grows = {"u": "up", "f1": "float", "f2": "float", "d": "down"}
        a = Arena(160, [SubPool(name, 16, 1, grow) for name, grow in grows.items()], policy=policy)
        a.alloc("f2", 1)
        a.alloc("f1", 1)
        return a

    _expect(two_floats("anchor").relieve("u", 4), False, "the anchor's first run fails")
    a = two_floats("planner")
    _expect(a.relieve("u", 4), True, "the planner's first run succeeds")
    _expect(a.available_pages("u") >= 4, True, "u fits after the plan")
    _expect(a.plan_floats({"u": 9}), 0, "an infeasible demand moves nothing")
    return "planner: one run, nothing moved in vain"


def scenario_borrowing():
    a = Arena(
        8192,
        [SubPool("mamba", 64, 1, "up", "state"), SubPool("swa", 8, 4, "float"), SubPool("full", 16, 4, "down")],
        borrow={"swa": "full"},
    )
    ids = a.alloc("full", 4)
    _expect(a.alloc("swa", 4, ids=ids), ids, "the borrower binds the lender's ids")
    a.free("swa", ids[:2])
    for call in (lambda: a.alloc("swa", 1), lambda: a.free("full", [ids[2]])):
        try:
            call()
        except ValueError:
            pass
        else:
            raise AssertionError("a borrower minted an id, or a lender freed a borrowed one")
    a.free("full", ids[:2])
    return "bind, refuse, free borrower first"


def scenario_bad_input():
    a = tri_pool()
    ids = a.alloc("full", 3)
    snap = a.snapshot()
    for call in (
        lambda: a.free("full", [ids[0], ids[0]]),
        lambda: a.free("full", [0]),
        lambda: a.alloc("full", -1),
        lambda: a.free("nope", [1]),
        lambda: a.make_room("full", "low", 1),
        lambda: a.free("full", [10_000]),
    ):
        try:
            call()
        except ValueError as e:
            if "pool" not in str(e):
                raise AssertionError(f"error does not name the pool: {e}") from None
        else:
            raise AssertionError("bad input accepted")
        _expect(a.snapshot(), snap, "bad input changes nothing")
    return "6 cases"


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("scenario_")}


def run_scenarios() -> list[Check]:
    """Every scenario, with every contract checked."""
    out = []
    with checking():
        for name, fn in SCENARIOS.items():
            out.append(_run(f"scenario {name}", fn))
    return out


# ------------------------------------------------------------ random walk


def random_walk(seed, steps=300, contracts=False):
    """Random operations on a random geometry, ``verify()`` after each step."""
    rng = random.Random(seed)
    total, pools, lazy = random_geometry(rng)
    # both relief policies, alternating by seed; borrowing has its own scenario and the differential machine
    a = Arena(total, pools, lazy=lazy, policy=("anchor", "planner")[seed % 2])
    live = {n: [] for n in a.chain}
    floats = list(a.chain[1:-1])

    def evict(short):
        victims = [(n, v) for n in a.chain for v in live[n]]
        if not victims:
            return 0
        n, _ = rng.choice(victims)
        k = max(1, len(live[n]) // 2)
        a.free(n, live[n][:k])
        del live[n][:k]
        return k

    for _ in range(steps):
        name = rng.choice(a.chain)
        op = rng.random()
        if op < 0.35:
            avail = a.available_pages(name)
            n = rng.choice([0, 1, avail, avail + 1, rng.randint(0, avail + 2)])
            got = a.alloc(name, n)
            if (got is None) != (n > avail):
                raise AssertionError(f"gate: alloc({name}, {n}) with available {avail} -> {got}")
            live[name] += got or []
        elif op < 0.6 and live[name]:
            ids = rng.sample(live[name], rng.randint(1, len(live[name])))
            a.free(name, ids)
            live[name] = [v for v in live[name] if v not in set(ids)]
        elif op < 0.7:
            a.flush(name, rng.choice([None, 0, 1, 4]))
        elif op < 0.8 and floats:
            a.make_room(rng.choice(floats), rng.choice(["low", "high"]), rng.randint(0, total // 2))
        elif op < 0.85 and floats:
            a.compact_holes(rng.choice(floats), rng.choice(["low", "high"]))
        elif op < 1.0:
            a.relieve(name, rng.randint(0, 8), evict if rng.random() < 0.5 else None)
        a.verify()
        for n in a.chain:
            content, v2p = a.content(n), a.v2p(n)
            for v in live[n]:
                if content.get(v2p[v]) != v:
                    raise AssertionError(f"pool {n!r}: id {v}'s bytes are not at page {v2p[v]}")
    return f"{steps} steps, {len(a.chain)} pools"


def run_walks(seeds: Iterable[int] = range(20), steps: int = 300) -> list[Check]:
    return [_run(f"random walk seed {s}", lambda s=s: random_walk(s, steps)) for s in seeds]
