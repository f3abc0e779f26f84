"""Seeded random walks that drive the spec and the anchor with the same calls.

``random_config(rng)`` draws a geometry in the anchor's domain (2 or 3
pools, page sizes 1 to 64, KV entries a multiple of 32 bytes or, at page
size 1, of any size, state pools of any size, lazy and eager ENDs, a third of them with an SWA pool that
borrows the full pool's ids).  ``random_op(rng, arena)`` draws a call from
the spec's current state (both sides hold the same state whenever a walk
goes on).  ``run_op`` applies one call to one side and returns its result
in a form the two sides share.
"""

from kvarena.spec import Arena, SubPool

from .adapter import anchor_domain

PAGE_SIZES = (1, 1, 2, 4, 8, 16, 32, 64)


def random_config(rng):
    """Constructor arguments of a layout both sides accept (retries until the spec does)."""
    while True:
        ps = rng.choice(PAGE_SIZES)
        three = rng.random() < 0.6
        borrow = rng.random() < 1 / 3
        up_state = not borrow and rng.random() < 0.4

        def kv(ps=ps):  # KV entries: multiples of 32 (MHA-shaped); with page size 1 also any size
            return 32 * rng.randint(1, 8) if ps > 1 or rng.random() < 0.7 else rng.randint(2, 256)

        pools = []
        if borrow:
            swa_grow = "float" if three else "up"
            if three:
                pools.append(
                    SubPool("state", rng.randint(2, 64 * kv()), 1, "up", "state")
                    if rng.random() < 0.5
                    else SubPool("up", kv(), ps, "up")
                )
            pools.append(SubPool("swa", kv(), ps, swa_grow))
            pools.append(SubPool("full", kv(), ps, "down"))
            borrow_map = {"swa": "full"}
        else:
            pools.append(
                SubPool("state", rng.randint(2, 16 * kv() * ps), 1, "up", "state")
                if up_state
                else SubPool("up", kv(), ps, "up")
            )
            if three:
                pools.append(SubPool("mid", kv(), ps, "float"))
            pools.append(SubPool("down", kv(), ps, "down"))
            borrow_map = None
        epp = max(p.entry_bytes * p.page_size for p in pools)
        total = (rng.randint(6, 48) * epp + rng.randint(0, epp - 1)) // 2 * 2  # the anchor needs it even
        ends = [p.name for p in pools if p.grow != "float"]
        lazy = sorted(n for n in ends if rng.random() < 0.5)
        config = {"total_bytes": total, "pools": pools, "lazy": lazy, "borrow": borrow_map}
        if anchor_domain(pools, borrow_map, total):
            continue
        try:
            build_spec(config)
        except ValueError:
            continue
        return config


def build_spec(config):
    return Arena(
        config["total_bytes"], config["pools"], lazy=set(config["lazy"]), policy="anchor", borrow=config["borrow"]
    )


def config_json(config):
    return {
        "total_bytes": config["total_bytes"],
        "pools": [
            {"name": p.name, "entry_bytes": p.entry_bytes, "page_size": p.page_size, "grow": p.grow, "kind": p.kind}
            for p in config["pools"]
        ],
        "lazy": list(config["lazy"]),
        "borrow": config["borrow"],
    }


def config_from_json(data):
    return {
        "total_bytes": data["total_bytes"],
        "pools": [SubPool(p["name"], p["entry_bytes"], p["page_size"], p["grow"], p["kind"]) for p in data["pools"]],
        "lazy": list(data["lazy"]),
        "borrow": data["borrow"],
    }


def _live(arena, name):
    return [v for v, p in enumerate(arena.bands[name].v2p) if v and p >= 0]


def random_op(rng, arena):
    """One call as ``(op, args)``, drawn from the spec arena's state."""
    chain = arena.chain
    floats = [n for n in chain if not arena.bands[n].is_end]
    name = rng.choice(chain)
    b = arena.bands[name]
    r = rng.random()
    if r < 0.34:
        if b.lender:
            pool = [v for v in _live(arena, b.lender) if b.v2p[v] < 0]
            n = min(len(pool), rng.choice([1, 1, 2, 3, 5, arena.available_pages(name) + 1]))
            return "alloc", {"name": name, "n": n, "ids": rng.sample(pool, n)}
        avail = arena.available_pages(name)
        n = rng.choice([1, 1, 2, 3, max(1, avail // 2), avail, avail + 1, avail + 3])
        return "alloc", {"name": name, "n": n}
    if r < 0.60:
        live = _live(arena, name)
        for o in arena.borrowers(name):
            live = [v for v in live if arena.bands[o].v2p[v] < 0]
        if not live:
            return ("flush", {"name": name, "max_moves": None}) if b.lender else ("alloc", {"name": name, "n": 1})
        ids = rng.sample(live, rng.randint(1, min(len(live), 6)))
        return "free", {"name": name, "ids": ids, "segment": rng.random() < 0.5}
    if r < 0.70:
        return "flush", {"name": name, "max_moves": rng.choice([None, None, 1, 2, 3])}
    if r < 0.80 and floats:
        f = rng.choice(floats)
        side = rng.choice(["low", "high"])
        epp = arena.bands[f].geom.epp
        have = arena.band_bytes(f, side) if arena.bands[f].opaque else 0
        return "make_room", {
            "name": f,
            "side": side,
            "min_bytes": max(0, have + rng.randint(-1, 6) * epp - rng.randint(0, epp - 1)),
        }
    if r < 0.84 and floats:
        return "compact_holes", {"name": rng.choice(floats), "retreat_side": rng.choice(["low", "high"])}
    if r < 0.90 and floats:
        demand = {rng.choice(chain): rng.randint(1, 8)}
        if rng.random() < 0.4:
            demand[rng.choice(chain)] = rng.randint(0, 8)
        return "open_short_side", {"name": rng.choice(floats), "demand": demand}
    if r < 0.95 and not b.lender:
        return "relieve", {"name": name, "need_pages": arena.available_pages(name) + rng.randint(0, 4)}
    dead = [v for v in range(1, len(b.v2p)) if b.v2p[v] < 0]
    ids = rng.sample(_live(arena, name), min(3, len(_live(arena, name)))) + rng.sample(dead, min(2, len(dead)))
    return "translate", {"name": name, "ids": ids + [-1]}


def run_op(side, op, args):
    """Apply ``op`` to a spec ``Arena`` or an ``AnchorArena``; the shared result.

    The spec's counterpart of the anchor's ``alloc`` is ``alloc``, then on
    ``None`` ``relieve`` and ``alloc`` again (the anchor's alloc runs its
    ladder itself; see ``AnchorArena.alloc``).  ``free`` returns nothing
    comparable (the spec returns None; the states are compared instead).
    """
    is_spec = isinstance(side, Arena)
    name = args["name"]
    if op == "alloc":
        ids = args.get("ids")
        out = side.alloc(name, args["n"], ids=ids)
        if out is None and is_spec and not side.bands[name].lender and side.relieve(name, args["n"]):
            out = side.alloc(name, args["n"])
        return None if out is None else list(out)
    if op == "free":
        if is_spec:
            side.free(name, args["ids"])
        else:
            side.free(name, args["ids"], segment=args["segment"])
        return None
    if op == "flush":
        return side.flush(name, args["max_moves"])
    if op == "make_room":
        return side.make_room(name, args["side"], args["min_bytes"])
    if op == "compact_holes":
        return side.compact_holes(name, args["retreat_side"])
    if op == "open_short_side":
        return side.open_short_side(name, args["demand"])
    if op == "relieve":
        return bool(side.relieve(name, args["need_pages"]))
    if op == "translate":
        return list(side.translate(name, args["ids"]))
    raise ValueError(f"unknown op {op!r}")
