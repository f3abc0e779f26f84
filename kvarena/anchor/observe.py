"""One observation of each side in the same vocabulary, and the resync.

``observe_spec`` reads a ``kvarena.spec.Arena``; ``observe_anchor`` reads an
``AnchorArena``.  Both give, per pool: ``frontiers`` (bytes), ``pages``
(live virtual page id -> physical page), ``holes`` (sorted), ``free_ids``
(the FIFO, front first; a borrower has none), ``available_size``,
``schedulable_available_size``, ``gap_bytes`` (ENDs) and ``misplaced``
(live ids whose data is not at their translated page: the spec's content
model, the anchor's fake cache).

``adopt_anchor_state`` writes the anchor's state into the spec arena after
a difference that is classified as a design difference, so that the two
walk on from one state: the spec then checks, with ``verify()``, that the
anchor's state is one it accepts.
"""


def observe_spec(arena):
    out = {}
    for name in arena.chain:
        b = arena.bands[name]
        live = {v: p for v, p in enumerate(b.v2p) if v and p >= 0}
        out[name] = {
            "frontiers": list(b.frontiers),
            "pages": live,
            "holes": sorted(b.holes),
            "free_ids": list(b.free_ids),
            "available_size": arena.available_size(name),
            "schedulable_available_size": arena.schedulable_available_size(name),
            "misplaced": sorted(v for v, p in live.items() if b.content.get(p) != v),
        }
        if b.is_end:
            out[name]["gap_bytes"] = arena.gap_bytes(name)
    return out


def observe_anchor(aa):
    out = {}
    for name in aa.chain:
        out[name] = {
            "frontiers": list(aa.frontiers(name)),
            "pages": aa.pages(name),
            "holes": aa.holes(name),
            "free_ids": aa.free_ids(name),
            "available_size": aa.available_size(name),
            "schedulable_available_size": aa.schedulable_available_size(name),
            "misplaced": aa.misplaced(name),
        }
        if aa.alloc_of[name].grow_direction != "float":
            out[name]["gap_bytes"] = aa.gap_bytes(name)
    return out


def differences(obs_spec, obs_anchor):
    """``[(pool, field)]`` where the two observations differ."""
    return [(n, f) for n in obs_spec for f in obs_spec[n] if obs_spec[n][f] != obs_anchor[n].get(f)]


def adopt_anchor_state(arena, aa):
    """Make the spec arena's state the anchor's, page for page; ``verify()``."""
    for name in arena.chain:
        b, a = arena.bands[name], aa.alloc_of[name]
        g = b.geom
        if b.grow == "up":
            b.lo, b.hi = g.min_page, int(a.watermark_physical)
        elif b.grow == "down":
            b.lo, b.hi = int(a.watermark_physical) + 1, g.num_pages
        else:
            b.lo, b.hi = int(a.low_wm_page), int(a.high_wm_page)
        live = aa.pages(name)
        b.v2p = [-1] * len(b.v2p)
        b.p2v = [-1] * len(b.p2v)
        b.v2p[0] = b.p2v[0] = 0
        for v, p in live.items():
            b.v2p[v], b.p2v[p] = p, v
        b.content = {p: v for v, p in live.items()}
        b.live = len(live)
        b.holes = [int(h) for h in a._free_phys_pages.tolist()]  # the anchor's own order
        if not b.lender:
            b.free_ids = aa.free_ids(name)
    arena.verify()
