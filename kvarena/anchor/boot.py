"""Boot-time conformance: geometries across the whole domain the anchor accepts.

The walks (``walk.py``) start from layouts both sides accept.  This phase
draws the layouts themselves: two or three pools, page sizes 1 to 256, KV
entries of 32 to 512 bytes that need not divide each other, state entries
of any size, lazy and eager ENDs, an SWA pool borrowing full's ids, and
totals from nothing to a few MiB, most of them near the point where the
last pool's first page stops fitting.  Each layout is built on both sides,
and the outcome classified:

- both refuse, or both build to the same boot observation: agreement;
- kvarena refuses (``ValueError`` naming the pool) and the anchor builds:
  the anchor is asked whether each pool gets a page on its own, and
  whether all of them can hold one at once (every order of first
  allocations); the answer names a class in ``BOOT_CLASSES``;
- the anchor's constructor raises something other than its own refusal:
  a crash.

Anything else (kvarena refusing a layout on which the anchor serves every
pool at once, the two booting differently, the anchor refusing what
kvarena builds) has no class: it is a difference to explain, and fails the
campaign.  Each class keeps the smallest layout that shows it (a case
``replay_boot`` runs again).
"""

import itertools
import random
import time
from collections import Counter

from kvarena.spec import SubPool

from .adapter import AnchorArena, Unsupported, anchor_domain
from .campaign import differences
from .observe import observe_anchor, observe_spec
from .walk import build_spec, config_from_json, config_json

BOOT_CLASSES = {
    "boot-pool-never-gets-a-page": (
        "anchor-bug",
        "the anchor accepts a layout in which a pool cannot get a single page, even alone on a fresh arena: "
        "its constructor checks that each pool's grid has slots, not that a page of it lies above the sink and "
        "its neighbours' first pages; kvarena refuses the layout at construction, naming the pool",
    ),
    "boot-pools-never-all-hold-a-page": (
        "anchor-bug",
        "the anchor accepts a layout in which every pool gets a page alone, but in no order can all of them "
        "hold one at once (one pool's first page takes the only room another's could have): a hybrid model "
        "whose first request needs every kind never runs; kvarena refuses the layout at construction",
    ),
    "boot-constructor-crashes": (
        "anchor-bug",
        "the anchor's constructor raises a bare error (not its refusal of the layout) on a small layout; "
        "kvarena refuses it with a ValueError naming the pool",
    ),
}
OUTCOMES = ("both build alike", "both refuse") + tuple(BOOT_CLASSES)
PAGE_SIZES = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256)
MAX_TOTAL = 1 << 22  # both sides allocate the whole buffer (the anchor a real tensor)


def random_boot_config(rng):
    """Constructor arguments in the anchor's domain (``anchor_domain``),
    whether or not either side accepts them."""
    while True:
        ps = rng.choice(PAGE_SIZES)
        three = rng.random() < 0.5
        borrow = rng.random() < 1 / 3

        def kv(ps=ps):  # MHA-shaped (a multiple of 32 bytes); at page size 1 also any size
            return 32 * rng.randint(1, 16) if ps > 1 or rng.random() < 0.8 else rng.randint(2, 300)

        def state():
            return SubPool("state", rng.randint(2, 8000), 1, "up", "state")

        if borrow:
            pools = ([state() if rng.random() < 0.5 else SubPool("up", kv(), ps, "up")] if three else []) + [
                SubPool("swa", kv(), ps, "float" if three else "up"),
                SubPool("full", kv(), ps, "down"),
            ]
        else:
            pools = [state() if rng.random() < 0.4 else SubPool("up", kv(), ps, "up")]
            pools += [SubPool("mid", kv(), ps, "float")] if three else []
            pools.append(SubPool("down", kv(), ps, "down"))
        epp = max(p.entry_bytes * p.page_size for p in pools)
        first = sum(p.entry_bytes * p.page_size for p in pools)  # about where the last first page stops fitting
        r = rng.random()
        if r < 0.2:  # tiny: nothing to a few pages
            total = rng.randint(0, 4 * epp)
        elif r < 0.8:  # near the edge: the sink and one page of each, give or take a page
            total = epp + first + rng.randint(-epp, epp)
        else:  # large, log-uniform
            total = int(2 ** rng.uniform(10, 22))
        total = max(0, min(total, MAX_TOTAL)) // 2 * 2  # the anchor views its buffer as bf16 rows
        ends = [p.name for p in pools if p.grow != "float"]
        lazy = sorted(n for n in ends if rng.random() < 0.5)
        borrow_map = {"swa": "full"} if borrow else None
        if anchor_domain(pools, borrow_map, total) is None:
            return {"total_bytes": total, "pools": pools, "lazy": lazy, "borrow": borrow_map}


def _anchor(config):
    return AnchorArena(config["total_bytes"], config["pools"], set(config["lazy"]), config["borrow"])


def _first_page(aa, name):
    """One page for ``name`` on the anchor (a borrower binds a page its lender took first)."""
    lender = aa.borrow.get(name)
    if lender is None:
        return aa.alloc(name, 1) is not None
    ids = aa.alloc(lender, 1)
    return ids is not None and aa.alloc(name, 1, ids=ids) is not None


def anchor_first_pages(config):
    """``(alone, together)`` on fresh anchors: which pools get a page on
    their own, and whether some order of first allocations gives every
    pool a page at once."""
    names = [p.name for p in config["pools"]]
    alone = {n: _first_page(_anchor(config), n) for n in names}
    together = False
    for order in itertools.permutations(names):
        aa = _anchor(config)
        if all(_first_page(aa, n) for n in order):
            together = True
            break
    return alone, together


def _error(e):
    return f"{type(e).__name__}: {e}"[:300]


def boot_verdict(config):
    """``(classes, detail)`` for one layout: ``None`` when both sides agree
    (``detail["outcome"]`` says how), ``[]`` for an unexplained difference."""
    try:
        spec, spec_error = build_spec(config), None
    except ValueError as e:
        spec, spec_error = None, _error(e)
    try:
        anchor, anchor_error, crashed = _anchor(config), None, False
    except Unsupported as e:
        anchor, anchor_error, crashed = None, _error(e), False
    except Exception as e:  # anything but the anchor's refusal is a crash
        anchor, anchor_error, crashed = None, _error(e), True
    detail = {"spec": spec_error or "builds", "anchor": anchor_error or "builds"}
    if crashed:
        return (["boot-constructor-crashes"] if spec is None else []), detail
    if spec is None and anchor is None:
        return None, dict(detail, outcome="both refuse")
    if spec is None:
        alone, together = anchor_first_pages(config)
        detail.update(alone=alone, together=together)
        if not all(alone.values()):
            return ["boot-pool-never-gets-a-page"], detail
        return (["boot-pools-never-all-hold-a-page"] if not together else []), detail
    if anchor is None:
        return [], detail
    obs_s, obs_a = observe_spec(spec), observe_anchor(anchor)
    if obs_s != obs_a:
        detail["fields"] = sorted({f"{n}.{k}" for n in obs_s for k in obs_s[n] if obs_s[n][k] != obs_a[n].get(k)})
        return [], detail
    return None, dict(detail, outcome="both build alike")


def replay_boot(case):
    """A boot case's classes and detail, today."""
    return boot_verdict(config_from_json(case["config"]))


def run_boot(geometries=300, seed=0):
    """The boot phase of ``kvarena conform``; returns its report."""
    rng = random.Random(f"boot-{seed}")
    t0 = time.perf_counter()
    outcomes, shapes, by_class = Counter(), Counter(), Counter()
    by_op = {c: Counter() for c in BOOT_CLASSES}  # one operation here: the constructor
    cases, unclassified = {}, []
    for _ in range(geometries):
        config = random_boot_config(rng)
        shapes[f"{len(config['pools'])} pools, page size {config['pools'][-1].page_size}"] += 1
        classes, detail = boot_verdict(config)
        if classes is None:
            outcomes[detail["outcome"]] += 1
            continue
        case = {"config": config_json(config), "detail": detail}
        if not classes:
            outcomes["unclassified"] += 1
            unclassified.append(case)
            continue
        for c in classes:
            outcomes[c] += 1
            by_class[c] += 1
            by_op[c]["boot"] += 1
            if c not in cases or config["total_bytes"] < cases[c]["config"]["total_bytes"]:
                cases[c] = dict(case, **{"class": c})
    by_kind = Counter()
    for c, n in by_class.items():
        by_kind[BOOT_CLASSES[c][0]] += n
    return {
        "anchor": "sglang 0.5.23",
        "seed": seed,
        "geometries": geometries,
        "seconds": round(time.perf_counter() - t0, 1),
        "outcomes": dict(outcomes),
        "shapes": dict(shapes),
        "differences": differences(by_class, by_op, unclassified, by_kind, BOOT_CLASSES.__getitem__),
        "cases": cases,
        "unclassified_cases": unclassified[:5],
    }
