"""The cases ``kvarena vectors generate`` writes: scenarios and seeded walks.

Each scenario is a function of a ``Recorder`` (``kvarena.verification.vectors``) and a
policy: it builds a pre state, calls ``r.start()``, runs the operations
under test, and returns the case's description and extra tags.  Every
scenario is written once per policy that both the spec and the
implementation accept, so the planner's cases appear as soon as it lands.

Tags say what a case covers: ``call:<name>`` (added from the steps),
``allocator:<kind>``, ``policy:<name>``, ``anchor-bug:<n>`` for the anchor's
bugs of docs/design.md §9, ``bad-input``, ``fault`` (a step faulted on the
implementation) and ``lent`` (an engine's buffer).  ``REQUIRED_TAGS`` lists what the
shipped set must cover; ``tests/verification/test_vectors.py`` checks it.
"""

import random
from collections.abc import Callable
from typing import Any

from kvarena import impl, spec
from kvarena.spec import geometry
from kvarena.verification.vectors import ARENA_CALLS, COMPOSITE_CALLS, Recorder

SCENARIOS: list[tuple[str, str, Callable[..., Any]]] = []  # (name, allocator, scenario)
ANCHOR_BUGS = tuple(range(1, 11))


def scenario(name, allocator):
    def wrap(fn):
        SCENARIOS.append((name, allocator, fn))
        return fn

    return wrap


def policies():
    """Every relief policy both the spec and the implementation accept."""
    out = []
    for p in geometry.POLICIES:
        try:
            spec.HybridSWA(4096, 8, 8, policy=p)
            impl.HybridSWA(4096, 8, 8, policy=p)
        except ValueError:
            continue
        out.append(p)
    return out


def pool(name, entry, page, grow, kind="kv"):
    return {"name": name, "entry_bytes": entry, "page_size": page, "grow": grow, "kind": kind}


def arena_cfg(total, pools, policy, lazy=False, borrow=None):
    return {"total_bytes": total, "pools": pools, "lazy": lazy, "policy": policy, "borrow": borrow}


def tri_arena(policy, lazy=False, borrow=None, total=8192):
    """The headline case: mamba state up, SWA float, full KV down."""
    return arena_cfg(
        total,
        [pool("mamba", 64, 1, "up", "state"), pool("swa", 8, 4, "float"), pool("full", 16, 4, "down")],
        policy,
        lazy,
        borrow,
    )


def live(r, name):
    return [v for v, p in enumerate(r.target.arena.v2p(name)) if v > 0 and p >= 0]


# ------------------------------------------------------------------ arena


@scenario("arena/alloc-ends-exact-fit", "arena")
def _alloc_ends(r):
    r("alloc", name="mamba", n=3)
    r.start()
    n = r("available_pages", name="mamba")
    r("available_size", name="mamba")
    r("alloc", name="mamba", n=n + 1)  # refused, nothing changes
    r("alloc", name="mamba", n=n // 2)
    n = r("available_pages", name="full")
    r("alloc", name="full", n=n + 1)
    r("alloc", name="full", n=n)
    r("alloc", name="full", n=1)
    r("available_size", name="mamba")
    r("alloc", name="full", n=0)
    r("alloc", name="full", n=-1)
    r("alloc", name="nope", n=1)
    return "END pools: alloc(available + 1) is refused with nothing changed, alloc(available) fits, n=0 and bad n", ()


@scenario("arena/float-parks-and-reuses-holes", "arena")
def _float_holes(r):
    r.start()
    ids = r("alloc", name="swa", n=8)
    r("frontiers", name="swa")
    r("free", name="swa", ids=ids[2:4])
    r("holes", name="swa")
    r("alloc", name="swa", n=2)  # the holes, oldest first, nothing moves
    r("free", name="swa", ids=[v for v in ids if v not in ids[2:4]])
    r("frontiers", name="swa")
    return "a parked float places mid-region, reuses its holes first with zero moves, parks again when empty", ()


@scenario("arena/eager-free-compacts", "arena")
def _eager_free(r):
    up = r("alloc", name="mamba", n=6)
    down = r("alloc", name="full", n=6)
    r.start()
    r("free", name="mamba", ids=[up[1], up[3]])
    r("free", name="full", ids=[down[0], down[4]])
    r("translate", name="full", ids=down)
    r("gap_bytes", name="mamba")
    return "an eager END compacts on free: survivors move into the holes, the frontier retreats", ("anchor-bug:4",)


@scenario("arena/lazy-free-and-flush", "arena")
def _lazy_flush(r):
    ids = r("alloc", name="full", n=12)
    r.start()
    r("free", name="full", ids=ids[::2])
    r("holes", name="full")
    r("schedulable_available_size", name="swa")
    r("flush", name="full", max_moves=1)
    r("flush", name="full", max_moves=None)
    r("holes", name="full")
    r("flush", name="swa", max_moves=None)
    return "lazy frees leave holes; a capped flush moves at most its cap, a full flush settles every hole", (
        "anchor-bug:4",
        "anchor-bug:8",
    )


@scenario("arena/lazy-batches-lose-no-page", "arena")
def _lazy_batches(r):
    ids = r("alloc", name="full", n=r("available_pages", name="full"))
    r.start()
    for batch in (ids[0:5], ids[9:12], ids[20:31], ids[5:9]):  # frees deferred in several batches
        r("free", name="full", ids=batch)
    r("available_pages", name="full")
    r("flush", name="full", max_moves=None)
    r("alloc", name="full", n=r("available_pages", name="full"))
    return (
        "several batches of lazy frees, then a flush: every freed page comes back (anchor bug 8: deferred frees "
        "that shared one fence overwrote each other)",
        ("anchor-bug:8",),
    )


@scenario("arena/free-bad-ids", "arena")
def _free_bad(r):
    ids = r("alloc", name="full", n=3)
    r("alloc", name="swa", n=2)
    r.start()
    for bad in ([ids[0], ids[0]], [0], [-1], [10_000], [ids[0], -1], [ids[2] + 1]):
        r("free", name="full", ids=bad)
    r("free", name="nope", ids=[1])
    r("alloc", name="full", n=1, ids=[-1])
    r("translate", name="full", ids=[-1, ids[1], 0])
    r("translate", name="full", ids=[-2])
    return "bad ids are a ValueError with nothing changed: repeated, the sink, -1, out of range, unbound", (
        "anchor-bug:9",
        "anchor-bug:10",
    )


@scenario("arena/make-room-boundary-and-leapfrog", "arena")
def _make_room(r):
    r("alloc", name="swa", n=10)
    r.start()
    lo, hi = r.target.arena.frontiers("swa")
    below = r.target.arena.below("swa")
    r("make_room", name="swa", side="low", min_bytes=(lo - below) + 3 * 32)
    r("make_room", name="swa", side="low", min_bytes=0)  # already has it
    above = r.target.arena.above("swa")
    _, hi = r.target.arena.frontiers("swa")
    r("make_room", name="swa", side="high", min_bytes=(above - hi) + 11 * 32)  # need 11 > 10 live: leapfrog
    r("make_room", name="swa", side="high", min_bytes=10**9)  # cannot be met: nothing changes
    r("make_room", name="swa", side="up", min_bytes=1)
    r("make_room", name="full", side="low", min_bytes=1)
    return "make_room moves only the live edge pages it needs, leapfrogs when need >= live, refuses the infeasible", (
        "anchor-bug:4",
        "anchor-bug:3",
    )


@scenario("arena/compact-holes", "arena")
def _compact(r):
    ids = r("alloc", name="swa", n=9)
    r("free", name="swa", ids=ids[1:8:2])
    r.start()
    r("compact_holes", name="swa", retreat_side="high")
    more = r("alloc", name="swa", n=3)
    r("free", name="swa", ids=more[:2])
    r("compact_holes", name="swa", retreat_side="low")
    r("compact_holes", name="swa", retreat_side="middle")
    return "compact_holes packs a float's live pages toward the far edge, keeping their order", ("anchor-bug:4",)


@scenario("arena/open-short-side", "arena")
def _open_short(r):
    r("alloc", name="swa", n=6)
    r("alloc", name="mamba", n=r("available_pages", name="mamba"))
    r.start()
    r("open_short_side", name="swa", demand={"mamba": 2})  # one side short: slide
    r("available_pages", name="mamba")
    r("alloc", name="full", n=r("available_pages", name="full"))
    r("open_short_side", name="swa", demand={"mamba": 40, "full": 40})  # both short (or no index room)
    r("open_short_side", name="swa", demand={})
    r("open_short_side", name="swa", demand={"swa": 3})
    return "the demand-vector policy: slide for one short side, refuse when both are short", ()


@scenario("arena/plan-floats", "arena")
def _plan_floats(r):
    r("alloc", name="f1", n=5)
    r("alloc", name="f2", n=5)
    r("alloc", name="up", n=r("available_pages", name="up") - 2)
    r.start()
    r("plan_floats", demand={"up": 6})  # the floats pack upward together
    r("available_pages", name="up")
    r("plan_floats", demand={"up": 1})  # already fits: nothing moves
    r("plan_floats", demand={"up": 10**4})  # infeasible: nothing moves
    r("plan_floats", demand={"f1": 8, "down": 4})
    r("plan_floats", demand={})
    return (
        "the chain planner's rung (docs/design.md §4b) on two floats: a feasible demand is met, "
        "one that fits moves nothing, an infeasible one moves nothing",
        (),
    )


@scenario("arena/relieve-ladder", "arena")
def _relieve(r):
    r("alloc", name="swa", n=4)
    full = r("alloc", name="full", n=r("available_pages", name="full"))
    r("alloc", name="mamba", n=r("available_pages", name="mamba"))
    r.start()
    r("relieve", name="mamba", need_pages=r("available_pages", name="mamba") + 2)  # slide, no eviction
    r(
        "relieve",
        name="mamba",
        need_pages=40,
        evict=[
            {"ops": [("free", {"name": "full", "ids": full[:30]})], "returns": 30},
            {"ops": [("free", {"name": "full", "ids": full[30:60]})], "returns": 0},
        ],
    )  # freed, returned 0
    r("relieve", name="mamba", need_pages=10**4, evict=[])  # no index room: False after one round
    r("relieve", name="swa", need_pages=1)
    return (
        "relieve: flush, slide, then evict rounds; a round returning 0 ends them and the verdict is read "
        "after the last step",
        ("anchor-bug:6",),
    )


@scenario("arena/relieve-evictor-frees-but-returns-0", "arena")
def _relieve_zero(r):
    full = r("alloc", name="full", n=r("available_pages", name="full"))
    r("alloc", name="mamba", n=r("available_pages", name="mamba"))
    r.start()
    r(
        "relieve",
        name="mamba",
        need_pages=5,
        evict=[{"ops": [("free", {"name": "full", "ids": full[:40]})], "returns": 0}],
    )
    r("available_pages", name="mamba")
    return (
        "an evictor that frees pages but returns 0 ends the rounds, and relieve reports the fit it made "
        "(the core-hardening review's first bug)",
        (),
    )


@scenario("arena/open-short-side-both-short", "arena")
def _both_short(r):
    r("alloc", name="swa", n=4)
    r("alloc", name="mamba", n=r("available_pages", name="mamba") - 2)
    r("alloc", name="full", n=r("available_pages", name="full") - 2)
    r.start()
    for name in ("mamba", "swa", "full"):
        r("gap_bytes", name=name)
    r("open_short_side", name="swa", demand={"mamba": 3, "full": 3})  # both short: nothing moves
    r("open_short_side", name="swa", demand={"mamba": 3})  # one short: it slides
    return "both sides short: relocation is zero-sum, so the policy moves nothing and leaves it to eviction", ()


@scenario("arena/borrowed-ids", "arena")
def _borrow(r):
    ids = r("alloc", name="full", n=6)
    r.start()
    r("alloc", name="swa", n=4, ids=ids[:4])
    r("alloc", name="swa", n=1)  # a borrower mints no id
    r("alloc", name="swa", n=1, ids=[ids[0]])  # already bound
    r("free", name="full", ids=[ids[1]])  # still bound in the borrower: refused
    r("free", name="swa", ids=ids[:2])
    r("free", name="full", ids=ids[:2])
    r("translate", name="swa", ids=ids)
    return "a borrower binds its lender's live ids; a lender cannot free an id its borrower holds", ()


@scenario("arena/in-flight-pins-and-pending", "arena")
def _in_flight(r):
    full = r("alloc", name="full", n=8)
    swa = r("alloc", name="swa", n=4)
    r.start()
    r("launch", writes={"full": [full[5], full[7], -1], "swa": [swa[1]]})  # the forward writes these
    r("launch", writes={"full": [10_000]})  # refused: nothing changes, the first forward stays in flight
    r("launch", writes={"nope": [1]})
    r("free", name="full", ids=full[:6])  # full[5] is pinned: its page pends until settle
    r("holes", name="full")
    r("alloc", name="full", n=2)  # unguarded holes first; the pending page waits
    r("free", name="swa", ids=[swa[0], swa[1]])
    r("alloc", name="swa", n=1)
    r("flush", name="full", max_moves=None)  # urgent: settles first, then compacts
    r("holes", name="full")
    r("launch", writes={"full": None})  # every live page of full
    r("settle")
    r("settle")  # nothing in flight: nothing to do
    r("alloc", name="full", n=r("available_pages", name="full") - 1)
    r("launch", writes={"full": [full[7]], "swa": None})  # the post state is in flight: its pins show
    r("free", name="full", ids=[full[6], full[7]])
    return (
        "an in-flight forward: its pages are pinned, a freed pinned page pends until settle, an alloc takes the "
        "unguarded holes first, an urgent flush settles first; bad launches change nothing",
        (),
    )


@scenario("arena/hold-gate-and-loads", "arena")
def _hold(r):
    full = r("alloc", name="full", n=8)
    r("free", name="full", ids=full[1:4])  # lazy: three holes below live pages, which a flush would move
    mamba = r("alloc", name="mamba", n=6)
    r("free", name="mamba", ids=mamba[1:3])  # the other END's holes: full's unheld view credits them
    r("free", name="swa", ids=r("alloc", name="swa", n=4))  # the float parks: the ENDs face each other
    r.start()
    r("close_gate")  # a host transfer starts (docs/design.md §13)
    r("flush", name="full", max_moves=None)  # held: it absorbs, and moves nothing
    pages = r("reserve", name="full", n=2)  # a load's pages, taken as alloc takes them
    r("reserve", name="full", n=-1)  # bad input: nothing changes
    owners = r.target.free_ids("full")[-2:]  # the ids the loads will belong to
    r("bind_reserved", name="full", ids=owners[:1], pages=pages[:1])
    r("cancel", name="full", pages=pages[1:])  # the other load is rolled back
    r("open_gate")
    r("flush", name="full", max_moves=None)  # the hold is over: the flush compacts
    r("close_gate")
    r("reserve", name="full", n=1)  # the post state is held, with a page reserved
    return (
        "HiCache's holds: while the gate is closed or a load holds reserved pages nothing moves; a load binds "
        "its page to an id or is cancelled; bad input changes nothing",
        (),
    )


@scenario("arena/fault-in-flight", "arena")
def _fault(r):
    full = r("alloc", name="full", n=6)
    r("free", name="full", ids=full[1:3])
    r.start()
    r("launch", writes={"full": full[3:5]})  # a forward writes two pages late
    r.fault("flush", 0, name="full", max_moves=None)  # its first operation fails: nothing changes
    r.fault("free", 0, name="full", ids=full[3:4])
    r("free", name="full", ids=full[3:4])  # a written page pends
    r("flush", name="full", max_moves=None)  # urgent: the forward's write lands, then the flush compacts
    return "a call that fails on its first operation changes nothing, with a forward in flight", ()


@scenario("arena/views", "arena")
def _views(r):
    r("alloc", name="mamba", n=5)
    ids = r("alloc", name="full", n=8)
    r("free", name="full", ids=ids[2:6])
    r.start()
    for name in ("mamba", "swa", "full"):
        r("available_pages", name=name)
        r("available_size", name=name)
        r("schedulable_available_size", name=name)
        r("gap_bytes", name=name)
        r("frontiers", name=name)
        r("holes", name=name)
    return "every capacity view, with lazy holes credited where a flush would turn them into gap", ()


# ------------------------------------------------------- anchor bugs (arena)


@scenario("anchor-bugs/1-first-float-alloc-after-boot", "arena")
def _bug1(r):
    r.start()
    n = r("available_pages", name="w")
    r("alloc", name="w", n=n)
    r("alloc", name="w", n=1)
    return (
        "float growth priced on the float's grid: alloc(available) after boot fits, with no overlap "
        "(the anchor priced it in raw bytes and the first call failed)",
        ("anchor-bug:1",),
    )


@scenario("anchor-bugs/5-down-end-off-grid-neighbour", "arena")
def _bug5(r):
    r("alloc", name="state", n=8)  # high frontier 264: off the down END's 64-byte grid
    r.start()
    n = r("available_pages", name="full")
    r("alloc", name="full", n=n)
    r("alloc", name="full", n=1)
    r("frontiers", name="full")
    return (
        "the down END's check rounds an off-grid neighbour frontier up, never down "
        "(the anchor floored it and admitted an overlapping page)",
        ("anchor-bug:5",),
    )


@scenario("anchor-bugs/6-state-starved-behind-a-float", "arena")
def _bug6(r):
    r("alloc", name="swa", n=40)
    r("alloc", name="mamba", n=r("available_pages", name="mamba"))
    r.start()
    r("gap_bytes", name="mamba")
    r("relieve", name="mamba", need_pages=1, evict=[])  # must not evict: the float slides
    r("alloc", name="mamba", n=1)
    return "a state allocation whose gap is under one slot takes ground from the float before any eviction", (
        "anchor-bug:6",
    )


@scenario("anchor-bugs/7-per-pool-views-are-not-joint", "arena")
def _bug7(r):
    r("alloc", name="swa", n=6)
    r("alloc", name="full", n=6)
    r.start()
    r("available_pages", name="swa")
    r("available_pages", name="full")
    r("alloc", name="swa", n=4)
    r("available_pages", name="full")
    r("alloc", name="full", n=4)
    r("alloc", name="full", n=3)
    return "two ENDs share one gap: each view says 7, but 4 + 4 do not fit together", ("anchor-bug:7",)


@scenario("anchor-bugs/9-10-sentinel-and-sink-never-freed", "arena")
def _bug9_10(r):
    got = {n: r("alloc", name=n, n=4) for n in ("u", "f", "d")}
    r.start()
    for n, ids in got.items():
        r("free", name=n, ids=[-1])
        r("free", name=n, ids=[ids[0], -1])
        r("free", name=n, ids=[0])
        r("free", name=n, ids=ids[:2] + [0])
        r("alloc", name=n, n=1, ids=[-1])
        r("translate", name=n, ids=[-1, 0, ids[1]])
        r("free", name=n, ids=ids)
        r("free", name=n, ids=[ids[0]])  # double free
        r("translate", name=n, ids=[0, ids[0]])
    return "-1 and the sink (id 0) never reach a free list, and a freed id is not freed twice", (
        "anchor-bug:9",
        "anchor-bug:10",
    )


ARENA_CONFIGS = {
    "arena/alloc-ends-exact-fit": lambda p: tri_arena(p),
    "arena/float-parks-and-reuses-holes": lambda p: tri_arena(p),
    "arena/eager-free-compacts": lambda p: tri_arena(p),
    "arena/lazy-free-and-flush": lambda p: tri_arena(p, lazy=True),
    "arena/lazy-batches-lose-no-page": lambda p: tri_arena(p, lazy=["full"]),
    "arena/free-bad-ids": lambda p: tri_arena(p, lazy=True),
    "arena/make-room-boundary-and-leapfrog": lambda p: tri_arena(p),
    "arena/compact-holes": lambda p: tri_arena(p),
    "arena/open-short-side": lambda p: tri_arena(p),
    "arena/plan-floats": lambda p: arena_cfg(
        4096,
        [pool("up", 16, 1, "up"), pool("f1", 16, 1, "float"), pool("f2", 8, 2, "float"), pool("down", 16, 1, "down")],
        p,
    ),
    "arena/relieve-ladder": lambda p: tri_arena(p),
    "arena/hold-gate-and-loads": lambda p: tri_arena(p, lazy=True),
    "arena/hold-two-sources": lambda p: tri_arena(p, lazy=True),
    "arena/fault-in-flight": lambda p: tri_arena(p, lazy=True),
    "arena/relieve-evictor-frees-but-returns-0": lambda p: tri_arena(p),
    "arena/open-short-side-both-short": lambda p: tri_arena(p),
    "arena/borrowed-ids": lambda p: arena_cfg(
        8192,
        [pool("mamba", 64, 1, "up", "state"), pool("swa", 8, 4, "float"), pool("full", 16, 4, "down")],
        p,
        borrow={"swa": "full"},
    ),
    "arena/views": lambda p: tri_arena(p, lazy=["full"]),
    "arena/in-flight-pins-and-pending": lambda p: tri_arena(p, lazy=True),
    "anchor-bugs/1-first-float-alloc-after-boot": lambda p: arena_cfg(
        5000, [pool("s", 24, 1, "up", "state"), pool("w", 16, 2, "float"), pool("full", 9, 4, "down")], p
    ),
    "anchor-bugs/5-down-end-off-grid-neighbour": lambda p: arena_cfg(
        10000, [pool("state", 24, 1, "up", "state"), pool("full", 16, 4, "down")], p
    ),
    "anchor-bugs/6-state-starved-behind-a-float": lambda p: arena_cfg(
        16000, [pool("mamba", 96, 1, "up", "state"), pool("swa", 8, 2, "float"), pool("full", 16, 4, "down")], p
    ),
    "anchor-bugs/7-per-pool-views-are-not-joint": lambda p: arena_cfg(
        320, [pool("swa", 16, 1, "up"), pool("full", 16, 1, "down")], p
    ),
    "anchor-bugs/9-10-sentinel-and-sink-never-freed": lambda p: arena_cfg(
        4096, [pool("u", 16, 1, "up"), pool("f", 16, 1, "float"), pool("d", 16, 1, "down")], p, lazy=True
    ),
}


# ------------------------------------------------------------- composites

E = 8  # bytes per token of every KV pool in the composite cases


def composite_cfg(kind, ps, policy, pages=40, lazy=False):
    """Every grid ``pages`` pages of ``E*ps`` bytes; a state slot is one such page."""
    cfg = {"total_bytes": E * ps * pages, "full_entry_bytes": E, "page_size": ps, "lazy": lazy, "policy": policy}
    if kind in ("HybridSWA", "TriPool"):
        cfg["swa_entry_bytes"] = E
    if kind in ("MambaHybrid", "TriPool"):
        cfg["state_bytes"] = E * ps
    return cfg


def _has(r, call):
    return hasattr(r.target.obj, call)


def _serve(r, ps):
    """Admit two requests, extend and decode across page boundaries."""
    slot = r("alloc_state", n=1) if _has(r, "alloc_state") else None
    a = r("alloc_extend", prefix_lens=[0], seq_lens=[2 * ps + 1], last_loc=[-1])
    b = r("alloc_extend", prefix_lens=[0], seq_lens=[ps], last_loc=[-1])
    return slot, a, b


def composite_walkthrough(r, ps):
    slot, a, b = _serve(r, ps)
    r.start()
    more = r(
        "alloc_extend", prefix_lens=[len(a), len(b)], seq_lens=[len(a) + ps + 2, len(b) + 1], last_loc=[a[-1], b[-1]]
    )  # continue a partial page, open new ones; request-major
    a, b = a + more[: ps + 2], b + more[ps + 2 :]
    for _ in range(ps + 1):  # decode across a page boundary
        new = r("alloc_decode", seq_lens=[len(a) + 1, len(b) + 1], last_loc=[a[-1], b[-1]])
        a, b = a + [new[0]], b + [new[1]]
    for v in (
        "available_size",
        "full_available_size",
        "swa_available_size",
        "state_available_size",
        "state_slot_token_cost",
    ):
        if _has(r, v):
            r(v)
    r("translate", token_ids=a[:3] + [-1], pool="full")
    if _has(r, "free_swa"):
        r("free_swa", token_ids=a[:ps], start_pos=0, num_live=1)  # the window slid past a's first page (host count)
        r("free_swa", token_ids=a[:ps], start_pos=0)  # already freed: skipped, page 0 untouched
        r("free_swa", token_ids=[-1] * ps, start_pos=0)  # -1 never reaches a free list
        r("free_swa", token_ids=list(range(ps)), start_pos=0)  # page 0, the sink: skipped
        r("translate", token_ids=a[:3] + [-1], pool="swa")
    if _has(r, "alloc_state"):
        r("translate", token_ids=[slot[0], -1], pool="state")
        r("free_state", slots=slot)
        r("alloc_state", n=2)
    r("free", token_ids=b)
    r("available_size")
    return (
        "a serving walk: extend (partial page, new pages, request-major), decode across a page, views, "
        "translate, the window free, state slots, free",
        ("anchor-bug:2", "anchor-bug:9", "anchor-bug:10"),
    )


def composite_bad_input(r, ps):
    slot, a, b = _serve(r, ps)
    r.start()
    r("alloc_extend", prefix_lens=[0], seq_lens=[1, 2], last_loc=[-1])  # mismatched lengths
    r("alloc_extend", prefix_lens=[3], seq_lens=[2], last_loc=[-1])  # seq < prefix
    r("alloc_extend", prefix_lens=[0], seq_lens=[10**9], last_loc=[-1])  # longer than the arena
    r("alloc_decode", seq_lens=[-1], last_loc=[-1])
    r("free", token_ids=[a[0], a[0] + 10**6])
    r("free", token_ids=b)
    r("free", token_ids=b)  # already freed
    r("free", token_ids=[-1])
    r("translate", token_ids=[-2], pool="full")
    r("relieve", tokens=-1)
    if _has(r, "free_swa"):
        r("free_swa", token_ids=a[:ps], start_pos=1 if ps > 1 else -1)
        r("free_swa", token_ids=a[:ps], start_pos=0, num_live=2)  # a wrong host count: one page is live
    if _has(r, "alloc_state"):
        r("free_state", slots=[0])
        r("free_state", slots=slot + slot)
        r("alloc_state", n=-1)
    return "bad input to every composite call is a ValueError with nothing changed", (
        "anchor-bug:9",
        "anchor-bug:10",
        "anchor-bug:3",
    )


def composite_shortfall(r, ps):
    toks = r("alloc_extend", prefix_lens=[0], seq_lens=[r("available_size")], last_loc=[-1])
    r.start()
    r("alloc_decode", seq_lens=[len(toks) + 1], last_loc=[toks[-1]])  # refused, leaks nothing on either side
    r("available_size")
    r("relieve", tokens=ps)
    half = toks[: (len(toks) // (2 * ps)) * ps]
    r("relieve", tokens=3 * ps, evict=[{"ops": [("free", {"token_ids": half})], "returns": len(half)}])
    r("alloc_extend", prefix_lens=[0], seq_lens=[3 * ps], last_loc=[-1])
    return "a refused coupled allocation leaks nothing; relieve with an evictor's rounds", ()


def composite_in_flight(r, ps):
    slot, a, b = _serve(r, ps)
    r.start()
    nxt = r("alloc_decode", seq_lens=[len(a) + 1], last_loc=[a[-1]])  # the batch: a
    r("launch", token_ids=nxt + [-1], state_slots=slot)  # its forward; -1 is padding
    r("launch", token_ids=[-2])  # refused
    c = r("alloc_extend", prefix_lens=[0], seq_lens=[ps + 1], last_loc=[-1])  # the next batch, while it runs
    r("free", token_ids=b)  # b ends: a hole below c
    r("flush_opportunistic", max_moves=None)  # c moves down; a's pinned pages stay
    r("flush_opportunistic", max_moves=-1)
    r("free", token_ids=a + nxt)  # a ends while its forward runs: its written page pends
    r("alloc_extend", prefix_lens=[0], seq_lens=[ps], last_loc=[-1])  # takes an unguarded hole
    r("available_size")
    r("settle")
    r("flush_opportunistic", max_moves=1)
    r("launch", token_ids=c[-1:])  # the post state is in flight: the observation holds its pins
    r("free", token_ids=c)
    return (
        "overlap scheduling: a forward in flight pins the pages it writes, a finished request's written page "
        "pends, the non-urgent flush moves only what the forward leaves alone, settle lifts both; bad launches "
        "and a bad cap change nothing",
        (),
    )


COMPOSITE_SCENARIOS = {
    "walkthrough": composite_walkthrough,
    "in-flight": composite_in_flight,
    "bad-input": composite_bad_input,
    "shortfall": composite_shortfall,
}


def _bug7_views_then_four_and_three(r, ps):
    """The recorded part of bug 7: each view, then 4 pages of one request (refused) and 3 (they fit)."""
    r.start()
    r("full_available_size")
    r("swa_available_size")
    r("available_size")
    for pages in (4, 3):
        r("alloc_extend", prefix_lens=[0], seq_lens=[pages * ps], last_loc=[-1])


@scenario("composites/bug7-views-four-joint-three", "HybridSWA")
def _bug7_hybrid(r, ps=16):
    toks = r("alloc_extend", prefix_lens=[0], seq_lens=[4 * ps], last_loc=[-1])
    r("free", token_ids=[toks[0], toks[ps]])  # a lazy hole in each END
    _bug7_views_then_four_and_three(r, ps)
    return "per-component views say 4 and 4 pages while 3 fit jointly: the joint view is the gate", ("anchor-bug:7",)


@scenario("composites/bug7-tri-views-four-joint-three", "TriPool")
def _bug7_tri(r, ps=16):
    r("alloc_extend", prefix_lens=[0], seq_lens=[2 * ps], last_loc=[-1])
    r("alloc_state", n=1)
    _bug7_views_then_four_and_three(r, ps)
    return "TriPool: component views 4 and 4 pages, joint 3", ("anchor-bug:7",)


@scenario("composites/bug6-state-starvation-slides-the-float", "TriPool")
def _bug6_tri(r, ps=16):
    r("alloc_extend", prefix_lens=[0], seq_lens=[2 * ps], last_loc=[-1])
    r("alloc_state", n=1)
    r("alloc_state", n=3)  # the low gap is gone: under one slot left
    r.start()
    r("state_available_size")
    r("relieve", state_slots=1, evict=[])  # must fit without calling the evictor
    r("alloc_state", n=1)
    return "a starved state slot is relieved by sliding the SWA float, before any eviction", ("anchor-bug:6",)


@scenario("composites/bug6-state-starvation-flushes", "MambaHybrid")
def _bug6_mamba(r, ps=16):
    r("alloc_extend", prefix_lens=[0], seq_lens=[2 * ps], last_loc=[-1])
    r("alloc_extend", prefix_lens=[0], seq_lens=[3 * ps], last_loc=[-1])
    newest = r("alloc_extend", prefix_lens=[0], seq_lens=[ps], last_loc=[-1])
    r("alloc_state", n=r("state_available_size"))
    r("free", token_ids=newest)  # a lazy hole at full's frontier
    r.start()
    r("state_available_size")
    r("relieve", state_slots=1, evict=[])
    r("alloc_state", n=1)
    return "a starved state slot is relieved by flushing the full END's lazy hole, before any eviction", (
        "anchor-bug:6",
        "anchor-bug:8",
    )


@scenario("composites/bug2-three-kinds-free-swa-on-the-window", "TriPool")
def _bug2(r, ps=4):
    toks = r("alloc_extend", prefix_lens=[0], seq_lens=[6 * ps], last_loc=[-1])
    r.start()
    end = spec.swa_window_end(len(toks), 2 * ps - 1, ps)
    r("free_swa", token_ids=toks[:end], start_pos=0)
    r("swa_available_size")
    r("full_available_size")
    r("translate", token_ids=toks, pool="swa")
    r("translate", token_ids=toks, pool="full")
    return (
        "a three-kind model frees its SWA KV as the window slides and keeps full KV "
        "(the anchor routed three-kind models to the two-pool path and kept SWA for the whole lifetime)",
        ("anchor-bug:2",),
    )


@scenario("composites/relief-compacts-in-steps", "MambaHybrid")
def _relief_steps(r, ps=1):
    slots = r("alloc_state", n=10)
    r("free_state", slots=[slots[i] for i in (0, 2, 4, 6, 9)])  # holes at 1, 3, 5, 7 and the frontier
    r("alloc_extend", prefix_lens=[0], seq_lens=[r("available_size")], last_loc=[-1])
    r.start()
    r("relieve", tokens=3)  # absorb the frontier hole, then a step of 1 move and one of 2
    r("available_size")
    r("relieve", tokens=6)  # refused: every state hole is surplus (no slot asked), so the END ends packed
    r("available_size")
    return "the composite ladder compacts an END in doubling steps and stops at the fit", ()


@scenario("composites/relief-short-swa-end", "HybridSWA")
def _relief_short_end(r, ps=1):
    a = r("alloc_extend", prefix_lens=[0], seq_lens=[4], last_loc=[-1])
    b = r("alloc_extend", prefix_lens=[0], seq_lens=[4], last_loc=[-1])
    r("alloc_extend", prefix_lens=[0], seq_lens=[4], last_loc=[-1])
    r("free_swa", token_ids=a, start_pos=0)
    r("alloc_extend", prefix_lens=[0], seq_lens=[4], last_loc=[-1])
    r("alloc_extend", prefix_lens=[0], seq_lens=[r("available_size")], last_loc=[-1])
    r("free", token_ids=a)  # full: four deep holes; swa: none of a's
    r("free_swa", token_ids=b[:1], start_pos=0)  # swa: one deep hole
    r.start()
    r("relieve", tokens=4)  # refused, nothing moved: neither END holds more holes than its demand
    r("relieve", tokens=3)  # swa is short: one page of full's surplus moves, no swa page
    r("available_size")
    return (
        "the composite ladder compacts only an END's surplus holes: a short SWA END is helped by "
        "compacting full, not itself",
        (),
    )


@scenario("composites/gate-holds-every-page", "TriPool")
def _composite_gate(r, ps=4):
    a = r("alloc_extend", prefix_lens=[0], seq_lens=[3 * ps], last_loc=[-1])
    r("alloc_extend", prefix_lens=[0], seq_lens=[2 * ps], last_loc=[-1])
    r("free", token_ids=a)  # holes below a live request: compaction would move it
    r.start()
    r("close_gate")  # the composite's arena: HiCache's move gate (docs/design.md §13)
    r("flush_opportunistic", max_moves=None)  # held: nothing moves
    r("relieve", tokens=r("available_size") + ps)  # relief under the gate moves nothing either
    r("open_gate")
    r("flush_opportunistic", max_moves=None)
    r("close_gate")  # the post state is held
    return "the move gate on a composite: while it is closed no page moves, relief included", ()


def _pd_prealloc(r, ps=4):
    """PD's decode-side preallocation under PD's gate (docs/design.md §13)."""
    a = r("alloc_extend", prefix_lens=[0], seq_lens=[ps + 1], last_loc=[-1])  # a partly filled page
    b = r("alloc_extend", prefix_lens=[0], seq_lens=[3 * ps], last_loc=[-1])
    r("free", token_ids=b)  # holes below a live request: compaction would move it
    r.start()
    r("close_gate", source="disagg")  # PD's transfers in flight: nothing may move
    r("fits_tail", prefix_len=0, seq_len=5 * ps + 2, swa_tail_len=ps + 3)
    t = r("alloc_extend_swa_tail", prefix_lens=[0], seq_lens=[5 * ps + 2], last_loc=[-1], swa_tail_len=ps + 3)
    # continuing the partly filled page: the tail's pages only, the continued page costs nothing
    r("alloc_extend_swa_tail", prefix_lens=[ps + 1], seq_lens=[4 * ps], last_loc=[a[-1]], swa_tail_len=2)
    r("alloc_extend_swa_tail", prefix_lens=[0], seq_lens=[2 * ps], last_loc=[-1], swa_tail_len=2 * ps + 1)  # bad
    r("alloc_extend_swa_tail", prefix_lens=[0], seq_lens=[r("full_available_size") + ps], last_loc=[-1], swa_tail_len=1)
    r("free", token_ids=t)  # full's pages and the tail's swa pages; the rest had none
    r("open_gate", source="disagg")
    r("close_gate", source="disagg")  # the post state is held
    return (
        "a PD decode node's preallocation: full for every new token, SWA only for the pages holding the "
        "window's tail, under PD's move gate; a short tail fits where the coupled extend would not",
        (),
    )


scenario("composites/pd-prealloc-binds-the-tail", "HybridSWA")(_pd_prealloc)
scenario("composites/tri-pd-prealloc-binds-the-tail", "TriPool")(_pd_prealloc)


@scenario("arena/hold-two-sources", "arena")
def _hold_two_sources(r):
    full = r("alloc", name="full", n=8)
    r("free", name="full", ids=full[1:4])  # holes below live pages, which a flush would move
    r.start()
    r("close_gate", source="host")  # HiCache's transfer
    r("close_gate", source="disagg")  # and PD's: one hold, two sources
    r("open_gate", source="host")
    r("flush", name="full", max_moves=None)  # PD still holds: it absorbs, and moves nothing
    r("close_gate", source="pd")  # bad input: no such source
    r("open_gate", source="disagg")
    r("flush", name="full", max_moves=None)  # the hold is over: the flush compacts
    r("close_gate", source="disagg")
    return "two sources close the one gate: it holds until both have opened", ()


@scenario("composites/fault-after-the-forward-lands", "TriPool")
def _composite_fault(r, ps=1):
    reqs = [r("alloc_extend", prefix_lens=[0], seq_lens=[n], last_loc=[-1]) for n in (3, 2, 1)]
    r("free", token_ids=reqs[1])  # a hole below the last request: its free compacts
    r.start()
    r("launch", token_ids=reqs[2], state_slots=None)  # a forward writes the last request's token late
    r.fault("free", 0, token_ids=reqs[2])  # fails at once: nothing changes, the forward still in flight
    r("free", token_ids=reqs[2])  # full's eager END waits for the forward (its write lands), then compacts
    return (
        "issue 52's state on a lent buffer: a faulted free changes nothing while a forward writes its token; "
        "the free then waits for the forward, whose write the content model takes",
        (),
    )


COMPOSITE_CONFIGS = {
    "composites/bug7-views-four-joint-three": lambda p: composite_cfg("HybridSWA", 16, p, pages=11, lazy=True),
    "composites/bug7-tri-views-four-joint-three": lambda p: composite_cfg("TriPool", 16, p, pages=13),
    "composites/bug6-state-starvation-slides-the-float": lambda p: composite_cfg("TriPool", 16, p, pages=13),
    "composites/bug6-state-starvation-flushes": lambda p: composite_cfg("MambaHybrid", 16, p, pages=12, lazy=["full"]),
    "composites/bug2-three-kinds-free-swa-on-the-window": lambda p: composite_cfg("TriPool", 4, p, pages=40),
    "composites/relief-compacts-in-steps": lambda p: composite_cfg("MambaHybrid", 1, p, pages=40, lazy=True),
    "composites/relief-short-swa-end": lambda p: composite_cfg("HybridSWA", 1, p, pages=40, lazy=True),
    "composites/gate-holds-every-page": lambda p: composite_cfg("TriPool", 4, p, pages=40, lazy=True),
    "composites/fault-after-the-forward-lands": lambda p: composite_cfg("TriPool", 1, p, pages=40),
    "composites/pd-prealloc-binds-the-tail": lambda p: composite_cfg("HybridSWA", 4, p, pages=40, lazy=True),
    "composites/tri-pd-prealloc-binds-the-tail": lambda p: composite_cfg("TriPool", 4, p, pages=40, lazy=True),
}
LENT = {"composites/fault-after-the-forward-lands"}  # cases whose implementation runs on an engine's buffer


# ----------------------------------------------------------- seeded walks


def random_arena_cfg(rng, policy):
    n_float = rng.randint(0, 2)
    grows = ["up", "down"] + ["float"] * n_float
    pools = []
    for i, grow in enumerate(grows):
        state = rng.random() < 0.2
        page = 1 if state else rng.choice([1, 2, 4, 8])
        pools.append(pool(f"p{i}", rng.choice([1, 2, 3, 4, 6, 8, 12]), page, grow, "state" if state else "kv"))
    sink = max(p["entry_bytes"] * p["page_size"] for p in pools)
    lazy = rng.choice([False, True, ["p0"], ["p1"]])
    for _ in range(50):
        total = sink * rng.randint(6 + 2 * len(pools), 40) + rng.randint(0, sink)
        try:
            spec.make_layout(
                total,
                [
                    spec.SubPool(**{k: p[k] for k in ("name", "entry_bytes", "page_size", "grow", "kind")})
                    for p in pools
                ],
            )
            break
        except ValueError:
            continue
    rng.shuffle(pools)
    return arena_cfg(total, pools, policy, lazy)


def arena_walk(r, rng, steps):
    """Random operations, the ones a scheduler and a ladder make."""
    a = r.target.arena
    chain = list(a.chain)
    floats = chain[1:-1]
    r.start()
    for _ in range(steps):
        name = rng.choice(chain)
        op = rng.random()
        ids = live(r, name)
        if op < 0.35:
            avail = a.available_pages(name)
            r("alloc", name=name, n=rng.choice([0, 1, avail, avail + 1, rng.randint(0, avail + 2)]))
        elif op < 0.55 and ids:
            r("free", name=name, ids=rng.sample(ids, rng.randint(1, len(ids))))
        elif op < 0.62:
            r("flush", name=name, max_moves=rng.choice([None, 0, 1, 3]))
        elif op < 0.72 and floats:
            f = rng.choice(floats)
            side = rng.choice(["low", "high"])
            band = a.band_bytes(f, side)
            r("make_room", name=f, side=side, min_bytes=band + rng.randint(0, 6) * a.geometry(f).epp)
        elif op < 0.77 and floats:
            r("compact_holes", name=rng.choice(floats), retreat_side=rng.choice(["low", "high"]))
        elif op < 0.82 and floats:
            r(
                "open_short_side",
                name=rng.choice(floats),
                demand={n: a.available_pages(n) + rng.randint(0, 3) for n in rng.sample(chain, 2)},
            )
        elif op < 0.95:
            evict = None
            victims = [(n, v) for n in chain for v in live(r, n)]
            if victims and rng.random() < 0.5:
                n, _ = rng.choice(victims)
                out = live(r, n)[: max(1, len(live(r, n)) // 2)]
                evict = [{"ops": [("free", {"name": n, "ids": out})], "returns": len(out)}]
            r("relieve", name=name, need_pages=a.available_pages(name) + rng.randint(0, 4), evict=evict)
        else:
            r("translate", name=name, ids=(ids[:3] + [-1]) if ids else [-1])


def composite_walk(r, rng, steps):
    """A small scheduler: admit, extend, decode, slide the window, finish;
    it reads the views a scheduler reads before every step."""
    c = r.target.obj
    ps = c.page_size
    reqs = []  # [tokens, slot, freed]
    views = [
        v for v in ("available_size", "full_available_size", "swa_available_size", "state_available_size") if _has(r, v)
    ]
    r.start()
    for _ in range(steps):
        for v in views:
            r(v)
        op = rng.random()
        if op < 0.3 or not reqs:
            slot = r("alloc_state", n=1) if _has(r, "alloc_state") else None
            if _has(r, "alloc_state") and slot is None:
                continue
            toks = r("alloc_extend", prefix_lens=[0], seq_lens=[rng.randint(1, 3 * ps + 1)], last_loc=[-1])
            if toks is None:
                if slot:
                    r("free_state", slots=slot)
                continue
            reqs.append([toks, slot, 0])
        elif op < 0.45:
            q = rng.choice(reqs)
            k = rng.randint(1, 2 * ps + 1)
            new = r("alloc_extend", prefix_lens=[len(q[0])], seq_lens=[len(q[0]) + k], last_loc=[q[0][-1]])
            q[0] += new or []
        elif op < 0.7:
            batch = rng.sample(reqs, min(len(reqs), rng.randint(1, 3)))
            new = r("alloc_decode", seq_lens=[len(q[0]) + 1 for q in batch], last_loc=[q[0][-1] for q in batch])
            for q, t in zip(batch, new or []):
                q[0].append(t)
        elif op < 0.8 and _has(r, "free_swa"):
            for q in reqs:
                end = spec.swa_window_end(len(q[0]), ps, ps)
                if end > q[2]:
                    r("free_swa", token_ids=q[0][q[2] : end], start_pos=q[2])
                    q[2] = end
        elif op < 0.9:
            q = reqs.pop(rng.randrange(len(reqs)))
            r("free", token_ids=q[0])
            if q[1]:
                r("free_state", slots=q[1])
        else:
            evict = None
            if reqs and rng.random() < 0.5:
                q = reqs.pop()
                ops = [("free", {"token_ids": q[0]})] + ([("free_state", {"slots": q[1]})] if q[1] else [])
                evict = [{"ops": ops, "returns": len(q[0])}]
            r(
                "relieve",
                tokens=r("available_size") + rng.randint(0, 3 * ps),
                **({"state_slots": rng.randint(0, 1)} if _has(r, "alloc_state") else {}),
                evict=evict,
            )
            if evict and not r.ops[-1].get("evict"):
                reqs.append(q)  # the evictor never ran: the request is still there


WALKS = {"arena": 6, "HybridSWA": 3, "MambaHybrid": 3, "TriPool": 4}
WALK_STEPS = 30


# ----------------------------------------------------------------- build


def generate(policy_list: list[str] | None = None) -> list[dict[str, Any]]:
    """Every case, for every policy both packages accept."""
    cases = []
    for policy in policy_list or policies():
        for name, allocator, fn in SCENARIOS:
            if allocator == "arena":
                r = Recorder("arena", ARENA_CONFIGS[name](policy))
            else:
                r = Recorder(allocator, COMPOSITE_CONFIGS[name](policy), lent=name in LENT)
            desc, tags = fn(r)
            cases.append(r.case(f"{name}/{policy}", desc, tags))
        for kind in ("HybridSWA", "MambaHybrid", "TriPool"):
            for ps in (1, 16):
                for lazy in (False, True):
                    for sname, fn in COMPOSITE_SCENARIOS.items():
                        r = Recorder(kind, composite_cfg(kind, ps, policy, pages=48, lazy=lazy))
                        desc, tags = fn(r, ps)
                        lz = "lazy" if lazy else "eager"
                        cases.append(r.case(f"composites/{kind.lower()}-{sname}-ps{ps}-{lz}/{policy}", desc, tags))
        for allocator, n in WALKS.items():
            for seed in range(n):
                rng = random.Random(f"{allocator}/{seed}")
                if allocator == "arena":
                    r = Recorder("arena", random_arena_cfg(rng, policy))
                    arena_walk(r, rng, WALK_STEPS)
                else:
                    ps = rng.choice([1, 2, 4, 16])
                    r = Recorder(
                        allocator,
                        composite_cfg(allocator, ps, policy, pages=rng.randint(12, 30), lazy=rng.choice([False, True])),
                    )
                    composite_walk(r, rng, WALK_STEPS)
                cases.append(
                    r.case(
                        f"walks/{allocator.lower()}-{seed}/{policy}",
                        f"seeded random walk {seed} ({WALK_STEPS} steps)",
                        ("walk",),
                    )
                )
    return cases


def required_tags(policy_list=None):
    """What the shipped set must cover: every call, both policies, every anchor bug."""
    tags = {f"call:{c}" for c in ARENA_CALLS} | {f"call:{c}" for c in COMPOSITE_CALLS}
    tags |= {f"policy:{p}" for p in (policy_list or policies())}
    tags |= {f"anchor-bug:{n}" for n in ANCHOR_BUGS}
    tags |= {f"allocator:{a}" for a in ("arena", "HybridSWA", "MambaHybrid", "TriPool")}
    tags |= {"fault", "lent"}
    return tags
