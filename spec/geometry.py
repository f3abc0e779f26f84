"""Sub-pools, their page grids, the sink, and the canonical chain (docs/design.md §3).

Everything here is decided once, at boot.  The implementation imports this
module as is: layout is arithmetic, not an operation to test twice.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from . import arith

GROW = ("up", "down", "float")
POLICIES = ("anchor", "planner")  # who slides the floats (docs/design.md §4 and §4b)
KINDS = ("kv", "state")


class AccountingError(AssertionError):
    """``verify()`` found a broken rule (docs/design.md §5).

    The message names the pool and the rule.

    Args:
        pool: the pool whose rule broke.
        rule: the rule, in a few words (``"bounds"``, ``"conservation"``, ...).
        detail: what was found, for the message; empty for none.
    """

    def __init__(self, pool: str, rule: str, detail: str = "") -> None:
        self.pool, self.rule = pool, rule
        super().__init__(f"pool {pool!r}: {rule}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class SubPool:
    """One kind of per-request state (docs/design.md §3; its signature is docs/design.md §10).

    ``entry_bytes`` is one slot counted across all layers; ``page_size`` is
    slots per page (1 for state pools).  A slot may have more than one
    tenant: a speculative draft's K/V fused into the target's entries are
    more parts of the same slot (its bytes count in ``entry_bytes``), so one
    allocation, one free and one move serve both (docs/design.md §11).

    Attributes:
        name: the pool's name, unique in its arena.
        entry_bytes: bytes of one slot, across all layers.
        page_size: slots per page; 1 for a state pool.
        grow: ``"up"`` or ``"down"`` (an END) or ``"float"``.
        kind: ``"kv"`` or ``"state"``.

    Raises:
        ValueError: a field is out of its domain (an empty name, a size that
            is not a positive int, an unknown ``grow`` or ``kind``, a state
            pool with ``page_size != 1``); the message names the pool.
    """

    name: str
    entry_bytes: int
    page_size: int = 1
    grow: str = "up"
    kind: str = "kv"

    def __post_init__(self) -> None:
        def bad(why: str) -> NoReturn:
            raise ValueError(f"pool {self.name!r}: {why}")

        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"pool {self.name!r}: name must be a non-empty string")
        for field in ("entry_bytes", "page_size"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                bad(f"{field} must be a positive int, got {v!r}")
        if self.grow not in GROW:
            bad(f"grow must be one of {GROW}, got {self.grow!r}")
        if self.kind not in KINDS:
            bad(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "state" and self.page_size != 1:
            bad(f"a state pool has page_size 1, got {self.page_size}")

    @property
    def epp(self) -> int:
        """Bytes per page: one page envelope, ``entry_bytes * page_size`` (docs/design.md §3)."""
        return self.entry_bytes * self.page_size


@dataclass(frozen=True)
class Geometry:
    """One pool's page grid over the whole buffer (docs/design.md §3).

    Page ``p`` covers bytes ``[p*epp, (p+1)*epp)``.

    Attributes:
        epp: bytes per page.
        num_pages: pages of the grid that fit in the buffer.
        min_page: the first page above the sink; no lower page is handed out.
    """

    epp: int
    num_pages: int
    min_page: int


@dataclass(frozen=True)
class Layout:
    """The boot-time layout: chain order, sink, and every pool's grid (docs/design.md §3).

    Attributes:
        total_bytes: the buffer's size.
        pools: every sub-pool, by name.
        chain: the pool names, low bytes first: up END, floats, down END.
        sink_bytes: the padding sink ``[0, sink_bytes)``, the largest page envelope.
        geometry: every pool's grid, by name.
    """

    total_bytes: int
    pools: dict[str, SubPool]  # by name
    chain: tuple[str, ...]  # names, low bytes first: (up, *floats, down)
    sink_bytes: int
    geometry: dict[str, Geometry]  # by name


def make_layout(total_bytes: int, pools: Iterable[SubPool]) -> Layout:
    """Validate a configuration and lay it out (docs/design.md §3).

    The float order is the order given; nothing else about the input order
    matters.  Every pool must be able to hold a page while every other pool
    holds one, counted on each pool's own grid, not in raw bytes.

    Args:
        total_bytes: the buffer's size in bytes.
        pools: the sub-pools; exactly one ``up`` and one ``down``, any floats.

    Returns:
        The layout: the canonical chain, the sink and every pool's grid.

    Raises:
        ValueError: a bad configuration, naming the offending pool: a
            non-positive size, something not a ``SubPool``, a duplicate name,
            a second or a missing END, a grid with no page above the sink, or
            a pool that could never get a page.

    post: __return__.sink_bytes == max(g.epp for g in __return__.geometry.values())
    post: all(g.min_page * g.epp >= __return__.sink_bytes for g in __return__.geometry.values())
    post: all(g.min_page < g.num_pages for g in __return__.geometry.values())
    post: all(g.num_pages * g.epp <= total_bytes for g in __return__.geometry.values())
    post: __return__.pools[__return__.chain[0]].grow == "up"
    post: __return__.pools[__return__.chain[-1]].grow == "down"
    raises: ValueError
    """
    pools = list(pools)
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes <= 0:
        raise ValueError(f"arena: total_bytes must be a positive int, got {total_bytes!r}")
    for p in pools:
        if not isinstance(p, SubPool):
            raise ValueError(f"arena: expected SubPool, got {p!r}")
    seen: set[str] = set()
    for p in pools:
        if p.name in seen:
            raise ValueError(f"pool {p.name!r}: duplicate name")
        seen.add(p.name)
    ups = [p for p in pools if p.grow == "up"]
    downs = [p for p in pools if p.grow == "down"]
    floats = [p for p in pools if p.grow == "float"]
    for ends, side in ((ups, "up"), (downs, "down")):
        if len(ends) > 1:
            raise ValueError(f"pool {ends[1].name!r}: a second {side!r} pool; an arena has exactly one")
        if not ends:
            names = ", ".join(repr(p.name) for p in pools) or "none"
            raise ValueError(f"arena (pools {names}): no {side!r} pool; an arena has exactly one")

    chain = (ups[0].name, *(f.name for f in floats), downs[0].name)
    sink, grids = arith.layout_grids(total_bytes, [p.entry_bytes for p in pools], [p.page_size for p in pools])
    geometry: dict[str, Geometry] = {}
    for p, (epp, n_pages, lowest) in zip(pools, grids):
        g = Geometry(epp=epp, num_pages=n_pages, min_page=lowest)
        if g.num_pages <= g.min_page:
            raise ValueError(
                f"pool {p.name!r}: buffer of {total_bytes} bytes leaves no page above "
                f"the {sink}-byte sink (grid of {g.num_pages} pages, first usable {g.min_page})"
            )
        geometry[p.name] = g
    # Every pool must be able to hold a page while every other pool holds
    # one: packed on each pool's own grid, not counted in raw bytes.
    grids = [(geometry[n].epp, geometry[n].num_pages, geometry[n].min_page) for n in chain]
    high = 0
    for name, (page, fits), (epp, _, _) in zip(chain, arith.first_pages(grids), grids):
        if not fits:
            raise ValueError(
                f"pool {name!r}: never gets a page: with one page of every pool below it the "
                f"buffer is used up to byte {high}, and its {epp}-byte grid has no page above that "
                f"within {total_bytes} bytes"
            )
        high = (page + 1) * epp
    return Layout(total_bytes, {p.name: p for p in pools}, chain, sink, geometry)


def check_policy(policy: object) -> None:
    """``policy`` must name a relief policy (docs/design.md §4).

    Args:
        policy: ``"anchor"`` or ``"planner"`` (docs/design.md §4b).

    Raises:
        ValueError: ``policy`` is anything else.
    """
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"arena: policy must be one of {POLICIES}, got {policy!r}")


def lazy_ends(layout: Layout, lazy: object) -> set[str]:
    """The set of lazy END pools from ``lazy``: a bool, or a set of END names (docs/design.md §3).

    A float is never lazy: its holes are capacity, not backlog
    (docs/design.md §4).

    Args:
        layout: the arena's layout, for its ENDs and pool names.
        lazy: True (both ENDs), False (none), or a collection of END names.

    Returns:
        The names of the lazy ENDs.

    Raises:
        ValueError: ``lazy`` is anything else (None, 0, 1, a string), or
            names an unknown pool or a float.
    """
    ends = {layout.chain[0], layout.chain[-1]}
    if isinstance(lazy, bool):
        return set(ends) if lazy else set()
    if isinstance(lazy, str):
        raise ValueError(f"pool {lazy!r}: lazy is a bool or a set of END-pool names, not a string")
    if not isinstance(lazy, (set, frozenset, list, tuple)):
        raise ValueError(f"arena: lazy is a bool or a set of END-pool names, got {lazy!r}")
    for n in lazy:
        if not isinstance(n, str) or n not in layout.pools:
            raise ValueError(f"pool {n!r}: lazy names an unknown pool")
        if n not in ends:
            raise ValueError(f"pool {n!r}: only END pools can be lazy; a float is never lazy")
    return set(lazy)


def borrowing(layout: Layout, borrow: object) -> dict[str, str]:
    """``{borrower: lender}`` from ``borrow`` (docs/design.md §3, borrowing).

    Both must be pools of the arena and distinct; a lender does not itself
    borrow, and both share a page size, so one token id addresses both.

    Args:
        layout: the arena's layout, for its pool names and page sizes.
        borrow: ``{borrower: lender}``, or None for no borrowing.

    Returns:
        A copy of ``borrow``; empty for None.

    Raises:
        ValueError: ``borrow`` is not a dict, names an unknown pool, pairs a
            pool with itself, makes a lender borrow, or pairs two page sizes.
    """
    if borrow is None:
        return {}
    if not isinstance(borrow, dict):
        raise ValueError(f"arena: borrow is a dict {{borrower: lender}}, got {borrow!r}")
    for borrower, lender in borrow.items():
        for n in (borrower, lender):
            if not isinstance(n, str) or n not in layout.pools:
                raise ValueError(f"pool {n!r}: borrow names an unknown pool")
        if borrower == lender:
            raise ValueError(f"pool {borrower!r}: a pool cannot borrow its own ids")
        if lender in borrow:
            raise ValueError(f"pool {lender!r}: lends ids to {borrower!r} and borrows its own; a lender mints its ids")
        ps_b, ps_l = layout.pools[borrower].page_size, layout.pools[lender].page_size
        if ps_b != ps_l:
            raise ValueError(
                f"pool {borrower!r}: borrows ids from {lender!r} but has page_size {ps_b}, "
                f"not {ps_l}: one token id must address both"
            )
    return dict(borrow)
