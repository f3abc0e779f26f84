"""The arena: bands on one chain, the operations, and the capacity views.

The model is docs/design.md §3, the operations docs/design.md §4 (the
planner's rung docs/design.md §4b), the views docs/design.md §5 and the
methods' names and units docs/design.md §10.

It comes after ``planner`` in the reading order (``kvarena.spec``'s
docstring); read it top to bottom: chain walks, capacity views, the
operations, the policy that slides floats, the shortfall ladder, and ``verify``.

Contracts are PEP 316 docstring lines (``pre:``, ``post:``, the class
``inv:``), the style ``crosshair check`` reads; ``contracts.checking()``
evaluates the same lines at run time.  Bad caller input raises
``ValueError`` before any state changes; an ``AssertionError`` is always a
bug in the arena.
"""

import itertools
import operator
from collections.abc import Iterable, Mapping
from typing import SupportsIndex, cast

from . import chain, forward, moves, planner, policy, transitions
from .bands import Band
from .evict import MAX_EVICT_ROUNDS, Evictor, evicted
from .geometry import AccountingError, Geometry, SubPool, borrowing, check_policy, lazy_ends, make_layout

SIDES = ("low", "high")
# Who closes the gate (docs/design.md §13): a host transfer (HiCache) and a
# KV transfer between the nodes of a disaggregated server (PD).  One hold,
# two sources: moves are held while either is closed.
GATES = ("host", "disagg")


def _index(i: SupportsIndex) -> int:
    """An id as an int; a bool is not an id."""
    if isinstance(i, bool):
        raise TypeError
    return operator.index(i)


def _new_pages(b: Band, new: chain.Counts) -> list[int]:
    """The pages a transition adds to band ``b``'s span, ascending: those of
    ``[new.lo, new.hi)`` outside ``[b.lo, b.hi)`` (all of them for a parked
    float)."""
    return list(range(new.lo, min(new.hi, b.lo))) + list(range(max(new.lo, b.hi), new.hi))


class Arena:
    """Every kind of per-request state in one byte buffer (docs/design.md §3; the API is docs/design.md §10).

    Each pool gets a band of the buffer, in chain order from byte 0: the up
    END, the floats in the order given, the down END.  The boundaries move
    as the load moves; callers hold virtual ids, which never change.

    Args:
        total_bytes: the buffer's size in bytes.
        pools: the sub-pools: exactly one ``up`` END, one ``down`` END, and
            any number of floats.
        lazy: True or False for both ENDs, or the set of END names that
            free lazily (docs/design.md §4).
        policy: who slides the floats: ``"anchor"`` (the seed's demand-vector
            policy, docs/design.md §4) or ``"planner"`` (docs/design.md §4b).
        borrow: ``{borrower: lender}``: pools that use another pool's
            virtual ids, e.g. ``{"swa": "full"}``; None for none.

    Raises:
        ValueError: a bad configuration (``make_layout``, ``lazy_ends``,
            ``check_policy``, ``borrowing``), naming the pool where one is
            at fault.

    inv: self.verify() is None
    """

    def __init__(
        self,
        total_bytes: int,
        pools: list[SubPool],
        lazy: bool | Iterable[str] = False,
        policy: str = "anchor",
        borrow: dict[str, str] | None = None,
    ) -> None:
        layout = make_layout(total_bytes, pools)
        lazy_set = lazy_ends(layout, lazy)
        check_policy(policy)
        lenders = borrowing(layout, borrow)
        self.layout = layout
        self.total_bytes = total_bytes
        self.chain = layout.chain
        self.sink_bytes = layout.sink_bytes
        self.policy = policy
        self.lenders = lenders  # borrower -> lender
        self.bands: dict[str, Band] = {}
        for n in layout.chain:
            lender = lenders.get(n)
            lender_geom = None if lender is None else layout.geometry[lender]
            self.bands[n] = Band(layout.pools[n], layout.geometry[n], n in lazy_set, lender, lender_geom)
        self._index = {n: i for i, n in enumerate(layout.chain)}
        self._shapes = tuple(
            chain.Shape(b.grow, b.geom.epp, b.geom.num_pages, b.geom.min_page, b.lazy) for b in self.bands.values()
        )
        self.in_flight = False  # a forward launched and not yet settled (docs/design.md §12)
        self.closed_gates: frozenset[str] = frozenset()  # the GATES closed now (docs/design.md §13)
        self.verify()

    def state(self) -> chain.Chain:
        """The arena in numbers (``chain.Chain``): what every view and every
        transition reads.  Built afresh on each call, so never stale.

        It is the state the proofs reason about (docs/design.md §7): frontiers
        and counts, without the page tables (docs/design.md §3).

        Returns:
            Every band's span, live pages and holes, with every pool's grid.
        """
        return chain.Chain(
            self.total_bytes, self.sink_bytes, self._shapes, tuple(self.bands[n].counts for n in self.chain)
        )

    def _at(self, name: str) -> tuple[chain.Chain, int]:
        """``(state, index)`` for a named pool; ``ValueError`` if unknown."""
        self._band(name)
        return self.state(), self._index[name]

    # ------------------------------------------------------------ access

    def _band(self, name: str) -> Band:
        if not isinstance(name, str) or name not in self.bands:
            raise ValueError(f"pool {name!r}: unknown pool (arena has {', '.join(self.chain)})")
        return self.bands[name]

    def _float(self, name: str) -> Band:
        b = self._band(name)
        if b.is_end:
            raise ValueError(f"pool {name!r}: only a float band can slide; this is the {b.grow} END")
        return b

    def geometry(self, name: str) -> Geometry:
        """A pool's page grid: ``epp``, ``num_pages``, ``min_page`` (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            The grid fixed at boot.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).geom

    def pool(self, name: str) -> SubPool:
        """The sub-pool a band was built from (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            The ``SubPool``.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).pool

    def is_lazy(self, name: str) -> bool:
        """Whether a pool frees lazily, leaving holes (docs/design.md §4, lazy END pools).

        Args:
            name: the pool.

        Returns:
            True for a lazy END; False for an eager END and for every float.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).lazy

    def live_pages(self, name: str) -> int:
        """How many pages are allocated (live); ``Band.occupied_pages`` lists them (docs/design.md §3).

        Args:
            name: the pool.

        Returns:
            The live pages' count; the span holds them and the holes.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).live

    def lender(self, name: str) -> str | None:
        """The pool whose ids ``name`` borrows, or None (docs/design.md §3, borrowing).

        Args:
            name: the pool.

        Returns:
            The lender's name, or None for a pool that mints its own ids.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).lender

    def borrowers(self, name: str) -> list[str]:
        """The pools that borrow ``name``'s ids, in chain order (docs/design.md §3, borrowing).

        Args:
            name: the pool, as a lender.

        Returns:
            The borrowers' names; empty when nobody borrows.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        self._band(name)
        return [n for n in self.chain if self.bands[n].lender == name]

    def v2p(self, name: str) -> list[int]:
        """A copy of the pool's virtual-to-physical table (docs/design.md §3, page tables).

        A borrower's table covers its lender's id range.

        Args:
            name: the pool.

        Returns:
            ``v2p[id]``: the id's physical page, ``-1`` when unbound; entry 0 is the sink.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return list(self._band(name).v2p)

    def p2v(self, name: str) -> list[int]:
        """A copy of the pool's physical-to-virtual table (docs/design.md §3, page tables).

        Args:
            name: the pool.

        Returns:
            ``p2v[page]``: the id bound to the page, ``-1`` when unused; entry 0 is the sink.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return list(self._band(name).p2v)

    def content(self, name: str) -> dict[int, int]:
        """The content model: physical page -> virtual id whose bytes it holds.

        The spec's stand-in for the bytes (docs/design.md §7): binding writes
        a page, a move copies it, and ``verify`` checks every live id's bytes
        are where ``v2p`` says (docs/design.md §3, relocation).

        Args:
            name: the pool.

        Returns:
            A copy, ``{page: id}``; a freed page keeps its stale entry.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return dict(self._band(name).content)

    # ------------------------------------------------------- chain walks
    #
    # Every view is a function of ``state()`` in ``chain``, the code the
    # proofs run on z3 terms.

    def above(self, name: str) -> int:
        """Low frontier of the first opaque band above, or ``total_bytes``.

        The chain walk ``above(P)`` of docs/design.md §3: transparent floats
        are skipped.

        Args:
            name: the pool.

        Returns:
            A byte offset.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: 0 <= __return__ <= self.total_bytes
        """
        return chain.above(*self._at(name))

    def below(self, name: str) -> int:
        """High frontier of the first opaque band below, or 0.

        The chain walk ``below(P)`` of docs/design.md §3: transparent floats
        are skipped.

        Args:
            name: the pool.

        Returns:
            A byte offset.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: 0 <= __return__ <= self.total_bytes
        """
        return chain.below(*self._at(name))

    def _neighbour(self, name: str, upward: bool) -> Band | None:
        """The first opaque band above (``upward``) or below, or None."""
        j = chain.neighbour(*self._at(name), upward)
        return None if j is None else self.bands[self.chain[j]]

    def frontiers(self, name: str) -> tuple[int, int]:
        """A band's low and high frontiers, in bytes (docs/design.md §3, bands and frontiers).

        A parked float reports ``(num_pages*epp, num_pages*epp)`` (docs/design.md §4).

        Args:
            name: the pool.

        Returns:
            ``(low, high)``: the band's span on its own grid, in bytes.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return self._band(name).frontiers

    def region(self, name: str) -> tuple[int, int]:
        """A pool's pages ``[lo, hi)`` between its opaque neighbours.

        The float region of docs/design.md §3, on the pool's own grid:
        ``lo = max(ceil(below/epp), min_page)``, ``hi = min(floor(above/epp),
        num_pages)``, so no page overlaps a neighbour's off-grid frontier.
        For an END, whose outer side is the buffer's end, it is the most the
        END could span with its inner neighbour where it stands.

        Args:
            name: the pool (a float, or an END).

        Returns:
            ``(lo, hi)`` in pages of the pool's grid.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return chain.region(*self._at(name))

    def gap_bytes(self, name: str) -> int:
        """Free bytes an END can grow into; for a float, free bytes on both sides.

        The gap of docs/design.md §3: ``max(0, above - high)`` for the up
        END, ``max(0, low - below)`` for the down END.  A transparent float
        counts its whole region.

        Args:
            name: the pool.

        Returns:
            Bytes, never negative.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: __return__ >= 0
        raises: ValueError
        """
        s, i = self._at(name)
        return chain.gap(s, i) if chain.is_end(s, i) else chain.float_gap_bytes(s, i)

    def band_bytes(self, name: str, side: str) -> int:
        """Free bytes between a float and its opaque neighbour on ``side``.

        The ``band[side]`` of docs/design.md §4 (demand vector, step 3),
        what ``make_room`` aims at.  A transparent float sees its whole
        region in bytes.

        Args:
            name: the pool, a float.
            side: ``"low"`` or ``"high"``.

        Returns:
            Bytes, never negative.

        Raises:
            ValueError: ``name`` is not a float of this arena, or ``side`` is
                neither ``"low"`` nor ``"high"``.

        post: __return__ >= 0
        raises: ValueError
        """
        self._float(name)
        if side not in SIDES:
            raise ValueError(f"pool {name!r}: side must be 'low' or 'high', got {side!r}")
        s, i = self._at(name)
        return chain.band_bytes(s, i, side == "low")

    def holes(self, name: str) -> list[int]:
        """A band's holes: free pages inside its span (docs/design.md §4).

        A lazy END's holes are backlog a flush settles; a float's are
        capacity it reuses first; an eager END has none.

        Args:
            name: the pool.

        Returns:
            Physical pages, sorted (the band keeps them oldest first).

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return sorted(self._band(name).holes)

    # ---------------------------------------------------- capacity views

    def available_pages(self, name: str) -> int:
        """Pages ``alloc`` hands out now, with no relocation: the gate.

        docs/design.md §5: for an END, ``min(gap // epp, index room) +
        holes`` (holes in lazy mode only); for a float, its whole region
        while transparent, else its larger side plus its holes, bounded by
        index room.

        Args:
            name: the pool.

        Returns:
            Pages; ``alloc(name, n)`` succeeds exactly when ``n`` is at most this.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: 0 <= __return__ <= self.geometry(name).num_pages - self.geometry(name).min_page - self.live_pages(name)
        raises: ValueError
        """
        return chain.available(*self._at(name))

    def available_size(self, name: str) -> int:
        """Tokens (slots) ``alloc`` hands out now (docs/design.md §5).

        Args:
            name: the pool.

        Returns:
            ``available_pages(name) * page_size``.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: __return__ == self.available_pages(name) * self.pool(name).page_size
        raises: ValueError
        """
        return self.available_pages(name) * self._band(name).pool.page_size

    def schedulable_available_size(self, name: str) -> int:
        """Tokens available once the growth-side neighbour flushes.

        A lazy END neighbour's holes become gap after a flush, so they are
        credited (in bytes) to this END's gap.  A float has no growth side:
        its schedulable view is its available view (docs/design.md §5).
        While moves are held (``moves_held``) a flush moves nothing, so no
        hole is credited: the view is the available one (docs/design.md §13).

        Args:
            name: the pool.

        Returns:
            Tokens; never fewer than ``available_size(name)``.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: __return__ >= self.available_size(name)
        raises: ValueError
        """
        s, i = self._at(name)
        credits = chain.is_end(s, i) and not self.moves_held()  # a held flush only absorbs
        pages = chain.schedulable(s, i) if credits else chain.available(s, i)
        return pages * self._band(name).pool.page_size

    def conserved_available_size(self, name: str) -> int:
        """Capacity minus allocated tokens: the leak invariant's view (docs/design.md §5).

        Args:
            name: the pool.

        Returns:
            ``(num_pages - min_page - live) * page_size`` tokens.

        Raises:
            ValueError: ``name`` is not a pool of this arena.

        post: __return__ >= self.available_size(name)
        raises: ValueError
        """
        b = self._band(name)
        return b.index_room * b.pool.page_size

    # -------------------------------------------------- argument checks

    def _count(self, name: str, n: SupportsIndex, what: str = "n") -> int:
        try:
            if isinstance(n, bool):
                raise TypeError
            n = operator.index(n)
        except TypeError:
            raise ValueError(f"pool {name!r}: {what} must be an int, got {n!r}") from None
        if n < 0:
            raise ValueError(f"pool {name!r}: {what} must be >= 0, got {n}")
        return n

    def _ids(self, b: Band, ids: Iterable[int], bound: bool) -> list[int]:
        """Validate ids against pool ``b``; ``bound`` says they must be allocated.

        A borrower binds only ids live in its lender; a lender frees only ids
        no borrower still holds (docs/design.md §3, borrowing).
        """
        try:
            ids = [_index(i) for i in ids]
        except TypeError:
            raise ValueError(f"pool {b.name!r}: ids must be ints") from None
        id_lo, id_hi = b.id_range
        if len(set(ids)) != len(ids):
            raise ValueError(f"pool {b.name!r}: repeated id in {ids}")
        lender = self.bands[b.lender] if b.lender else None
        borrowers = [self.bands[n] for n in self.borrowers(b.name)] if bound else []
        for v in ids:
            if v == 0:
                raise ValueError(f"pool {b.name!r}: id 0 is the sink and is never allocated")
            if not id_lo <= v < id_hi:
                raise ValueError(f"pool {b.name!r}: id {v} out of range [{id_lo}, {id_hi})")
            if (b.v2p[v] >= 0) != bound:
                state = "not allocated" if bound else "already allocated"
                raise ValueError(f"pool {b.name!r}: id {v} is {state}")
            if lender and not bound and lender.v2p[v] < 0:
                raise ValueError(f"pool {b.name!r}: id {v} is not live in its lender {lender.name!r}")
            for o in borrowers:
                if o.v2p[v] >= 0:
                    raise ValueError(
                        f"pool {b.name!r}: id {v} is still bound in its borrower {o.name!r}; free it there first"
                    )
        return ids

    # -------------------------------------------------------- operations

    def alloc(self, name: str, n: int, ids: Iterable[int] | None = None) -> list[int] | None:
        """Allocate ``n`` pages; return their virtual ids, or None if short.

        ``ids`` binds ids chosen by the caller: a borrower must give them
        (ids live in its lender), any other pool may pick from its own free
        ids.  Holes come first, oldest first (lazy ENDs and floats),
        then the frontier extends: the up END binds ascending pages at its
        watermark, the down END the ascending range just below its low
        frontier, a float toward its larger gap (high wins ties), and a
        parked float at the middle of its region.  Ids pair with pages in
        order (docs/design.md §4).  With a forward in flight the holes it
        takes are the unguarded ones, oldest first, and it settles first
        when it would need a guarded one (``transitions.alloc_settles``;
        docs/design.md §12).

        Args:
            name: the pool.
            n: pages wanted, ``>= 0``; 0 returns ``[]``.
            ids: the virtual ids to bind, one per page, each free here (for
                a borrower: live in its lender); None takes them from the
                pool's FIFO.

        Returns:
            The virtual ids, paired in order with the pages bound; None,
                with nothing changed, when ``n > available_pages(name)``.

        Raises:
            ValueError: an unknown pool; ``n`` not an int or negative; bad
                ``ids`` (not ints, repeated, the sink, out of range, already
                allocated, not live in the lender) or not ``n`` of them; a
                borrower called without ``ids``.  Nothing has changed.

        post: (__return__ is None) == (n > __old__.self.available_pages(name))
        post: __return__ is None or len(__return__) == n
        post: __return__ is None or self.live_pages(name) == __old__.self.live_pages(name) + n
        post: __return__ is not None or self._whole() == __old__.self._whole()
        raises: ValueError
        """
        b = self._band(name)
        n = self._count(name, n)
        if ids is not None:
            ids = self._ids(b, ids, bound=False)
            if len(ids) != n:
                raise ValueError(f"pool {name!r}: {len(ids)} ids given for n={n}")
        elif b.lender and n:
            raise ValueError(f"pool {name!r}: borrows its ids from {b.lender!r}; pass ids=")
        if n == 0:
            return []
        if n > self.available_pages(name):
            return None
        pages = self._hand_out(b, n)
        ids = b.take_ids(n, ids)
        b.bind(ids, pages)
        return ids

    def _hand_out(self, b: Band, n: int) -> list[int]:
        """Take ``n <= available_pages`` pages of band ``b`` as ``alloc`` does
        (holes first, then the frontier; docs/design.md §4 and §12) and
        install the band's new counts; the caller binds or reserves them."""
        s, i = self._at(b.name)
        new = transitions.alloc(s, i, n)
        if self.in_flight and transitions.alloc_settles(s, i, n, len(b.guarded_holes())):
            self.settle()  # it must hand out a hole the forward still writes or reads
        k = s.bands[i].holes - new.holes  # holes reused: the unguarded ones, oldest first
        taken = [h for h in b.holes if not b.is_guarded(h)][:k]
        pages = taken + _new_pages(b, new)
        assert len(pages) == n, f"pool {b.name!r}: the transition bound {len(pages)} pages for n={n}"
        assert forward.bind_clear(b.pinned, b.pending, pages), f"pool {b.name!r}: a guarded page handed out"
        kept = set(taken)
        b.install(new, [h for h in b.holes if h not in kept])
        return pages

    def free(self, name: str, ids: Iterable[int]) -> None:
        """Free pages by virtual id; ``ValueError`` on any bad id, nothing changed.

        An eager END compacts at once: its frontier retreats by the number
        freed, and the survivors in the vacated band move into the holes
        (ascending, paired in order).  A lazy END and a float record holes.
        A float left with no live page parks.  A lender id still bound in a
        borrower is a ``ValueError`` (docs/design.md §4).  With a forward in
        flight an eager END settles first (it moves), and so does a float
        that parks with a guarded hole (docs/design.md §12).

        Args:
            name: the pool.
            ids: live virtual ids of the pool.

        Raises:
            ValueError: an unknown pool, or a bad id: not an int, repeated,
                the sink, out of range, not allocated, or still bound in a
                borrower.  Nothing has changed.

        post: self.live_pages(name) == __old__.self.live_pages(name) - len(list(ids))
        post: all(p == 0 for p in self.translate(name, ids))
        raises: ValueError
        """
        b = self._band(name)
        ids = self._ids(b, ids, bound=True)
        if not ids:
            return None
        s, i = self._at(name)
        assert transitions.free_ok(s, i, len(ids))  # the precondition the proofs assume
        new = transitions.free(s, i, len(ids))
        eager = b.is_end and not b.lazy
        assert not (eager and self.moves_held()), "a hold needs lazy ENDs (_require_lazy)"
        parks = not b.is_end and not new.live  # a float with no live page parks
        # an eager END compacts (moves); a parking float drops its holes
        self._settle_if(eager or (parks and any(b.is_guarded(p) for p in b.holes + [b.v2p[v] for v in ids])))
        pages = b.unbind(ids)
        forward.release(b.pinned, pages)  # a pinned page stays written, and a hole, until settle
        if eager:  # survivors in the vacated pages fill the freed ones
            b.move(*moves.eager_free_plan(b.grow, (new.lo, new.hi), pages, lambda p: b.p2v[p] >= 0))
            b.install(new, [])
        else:
            b.install(new, [] if parks else b.holes + pages)
        return None

    def flush(self, name: str, max_moves: int | None = None, urgent: bool = True) -> int:
        """Settle a band's backlog; return pages moved.

        A lazy END absorbs the holes at its frontier, then moves the
        survivors nearest the frontier into the holes furthest from it
        (at most ``max_moves`` of them), then absorbs again.  A float only
        absorbs its boundary holes and never moves data (docs/design.md §4).

        With a forward in flight (docs/design.md §12) an urgent flush
        settles first when it would move a page or the band holds a guarded
        hole; a non-urgent one (``urgent=False``) never waits: its walk
        stops at the first pinned survivor from the frontier, skips guarded
        holes, leaves every page it vacates pending, and absorbs no guarded
        hole (``moves.guarded_flush_plan``).  With nothing in flight the
        two are the same.  While moves are held (``moves_held``,
        docs/design.md §13) it only absorbs, as ``max_moves=0``.

        Args:
            name: the pool.
            max_moves: the most pages a lazy END may move; None for no cap.
                ``max_moves=0`` only absorbs.
            urgent: whether it may settle an in-flight forward (the
                shortfall ladder's flush) or must not wait (a flush between
                steps).

        Returns:
            Pages moved; 0 for a float and an eager END.

        Raises:
            ValueError: an unknown pool, or ``max_moves`` not an int >= 0.

        post: __return__ >= 0
        post: max_moves is None or __return__ <= max_moves
        post: self.live_pages(name) == __old__.self.live_pages(name)
        post: max_moves is not None or self.in_flight or self.moves_held() or self._packed(name)
        post: not self.moves_held() or self._placement() == __old__.self._placement()
        raises: ValueError
        """
        b = self._band(name)
        if max_moves is not None:
            max_moves = self._count(name, max_moves, "max_moves")
        if self.moves_held():
            max_moves = 0  # a host transfer holds the pages where they are: absorb only
        s, i = self._at(name)
        guarded = self.in_flight and bool(b.guarded_holes())
        if not b.is_end:  # absorb the boundary holes
            if b.opaque:
                if guarded and not urgent:
                    return 0  # a guarded hole may lie at the boundary: wait for settle
                self._settle_if(guarded)
                lo, hi = b.live_span()
                assert transitions.refit_ok(s, i, lo, hi)
                b.install(transitions.refit(s, i, lo, hi), [h for h in b.holes if lo <= h < hi])
            return 0
        g = b.geom
        edge = g.min_page + b.live if b.grow == "up" else g.num_pages - b.live  # the packed band's edge
        live = b.occupied_pages()
        if urgent:
            dst, src = moves.flush_plan(b.grow, live, b.holes, edge, max_moves)
            self._settle_if(bool(src) or guarded)
        else:
            pinned = [p for p in live if b.pinned[p] >= 0]
            guards = [h for h in b.holes if b.is_guarded(h)]
            dst, src = moves.guarded_flush_plan(b.grow, live, b.holes, edge, max_moves, pinned, guards)
        if self.in_flight:  # the forward still reads what the move leaves behind
            assert forward.move_clear(b.pinned, b.pending, dst, src), f"pool {name!r}: a move races the forward"
            forward.vacate(b.pending, b.content, src)
        moved = b.move(dst, src)
        keep = [p for p in range(g.min_page, g.num_pages) if b.p2v[p] >= 0 or b.is_guarded(p) or p in b.reserved]
        if b.grow == "up":
            frontier = keep[-1] + 1 if keep else g.min_page
        else:
            frontier = keep[0] if keep else g.num_pages
        assert transitions.flush_end_ok(s, i, frontier)
        new = transitions.flush_end(s, i, frontier)
        used = set(dst)
        vacated = sorted(p for p in src if b.is_guarded(p))  # pending: holes at the back of the queue
        b.install(new, [h for h in b.holes if h not in used and new.lo <= h < new.hi] + vacated)
        return moved

    def _packed(self, name: str) -> bool:
        """No hole a lazy END's whole flush would absorb or fill: a float
        keeps inner holes, an eager END has none (``flush``'s contract)."""
        return not self.is_lazy(name) or not self.holes(name)

    def make_room(self, name: str, side: str, min_bytes: int) -> int:
        """Slide float ``name`` until the band on ``side`` has ``min_bytes``.

        ``min_bytes`` is a target for the whole free band between the float
        and its neighbour on that side, not an increment.  Returns pages
        moved; 0 (nothing changed) when the side already has it, when the
        float is transparent, or when even a full leapfrog cannot reach it.

        It clears the fewest edge pages that reach the target
        (``arith.make_room_need``) as ``moves.make_room_plan`` lays out:
        a leapfrog when that is every live page, else only the live pages
        among the cleared ones move (docs/design.md §4, make_room).  With a
        forward in flight it settles first when it moves a page or the band
        holds a guarded hole (docs/design.md §12).  While moves are held
        (docs/design.md §13) a slide that would move a page does nothing.

        Args:
            name: the pool, a float.
            side: ``"low"`` or ``"high"``: the free band to widen.
            min_bytes: the bytes that band should reach.

        Returns:
            Pages moved, at most ``min(live, need)``; 0 when nothing moved.

        Raises:
            ValueError: ``name`` is not a float of this arena, ``side`` is
                neither ``"low"`` nor ``"high"``, or ``min_bytes`` is not an
                int >= 0.

        post: 0 <= __return__ <= self.live_pages(name)
        post: self.band_bytes(name, side) >= min_bytes or self._whole() == __old__.self._whole()
        post: not self.moves_held() or self._placement() == __old__.self._placement()
        raises: ValueError
        """
        b = self._float(name)
        if side not in SIDES:
            raise ValueError(f"pool {name!r}: side must be 'low' or 'high', got {side!r}")
        min_bytes = self._count(name, min_bytes, "min_bytes")
        s, i = self._at(name)
        low = side == "low"
        if not chain.make_room_acts(s, i, low, min_bytes):
            return 0
        _, _, edge_pages = chain.make_room_terms(s, i, low, min_bytes)
        live = b.occupied_pages()
        leaps = transitions.make_room_leaps(s, i, low, min_bytes)
        if leaps:  # spared: live pages already inside the packed target
            target = transitions.make_room(s, i, low, min_bytes, 0, 0)
            spared = sum(1 for p in live if target.lo <= p < target.hi)
        else:  # spared: holes among the cleared edge pages
            cleared = range(b.lo, b.lo + edge_pages) if low else range(b.hi - edge_pages, b.hi)
            spared = sum(1 for h in b.holes if h in cleared)
        assert transitions.make_room_moved_ok(s, i, low, min_bytes, spared)
        dst, src = moves.make_room_plan(side, live, b.holes, (b.lo, b.hi), chain.region(s, i), edge_pages)
        if src and self.moves_held():
            return 0  # a host transfer holds the pages where they are
        self._settle_if(bool(src) or bool(b.guarded_holes()))  # the urgent path: it may move and reshape
        moved = b.move(dst, src)
        assert moved == transitions.make_room_moved(s, i, low, min_bytes, spared)  # the cost the proofs bound
        lo, hi = b.live_span()
        assert leaps or transitions.make_room_ok(s, i, low, min_bytes, lo, hi)
        new = transitions.make_room(s, i, low, min_bytes, lo, hi)
        assert (new.lo, new.hi) == (lo, hi), f"pool {name!r}: pages at [{lo}, {hi}), transition says {new}"
        b.install(new, [h for h in b.holes if lo <= h < hi and b.p2v[h] < 0])
        return moved

    def _refit(self, name: str) -> None:
        """Shrink float ``name``'s span to its live pages after a caller moved
        them itself (``Band.move``), as the conformance classifier's replays
        of the anchor's own placements do; every free page left inside the
        span is a hole (the old ones first).  Returns None."""
        b = self._float(name)
        s, i = self._at(name)
        lo, hi = b.live_span()
        holes = [h for h in b.holes if lo <= h < hi and b.p2v[h] < 0]
        kept = set(holes)
        kept |= set(b.reserved)
        holes += [p for p in range(lo, hi) if b.p2v[p] < 0 and p not in kept]  # pages a move vacated
        b.install(transitions.refit(s, i, lo, hi), holes)

    def compact_holes(self, name: str, retreat_side: str) -> int:
        """Pack a float's live pages toward the edge opposite ``retreat_side``.

        Order is kept; pages already in place stay (docs/design.md §4,
        compact_holes).  A transparent float moves nothing.  With a forward
        in flight it settles first when it moves a page or the band holds a
        guarded hole (docs/design.md §12).  While moves are held
        (docs/design.md §13) a pack that would move a page does nothing.

        Args:
            name: the pool, a float.
            retreat_side: ``"low"`` or ``"high"``: the side the float
                retreats from; its live pages pack against the other edge.

        Returns:
            Pages moved.

        Raises:
            ValueError: ``name`` is not a float of this arena, or
                ``retreat_side`` is neither ``"low"`` nor ``"high"``.

        post: 0 <= __return__ <= self.live_pages(name)
        post: self.moves_held() or not self.holes(name)
        post: not self.moves_held() or self._placement() == __old__.self._placement()
        raises: ValueError
        """
        b = self._float(name)
        if retreat_side not in SIDES:
            raise ValueError(f"pool {name!r}: retreat_side must be 'low' or 'high', got {retreat_side!r}")
        if not b.opaque:
            return 0
        s, i = self._at(name)
        new = transitions.compact(s, i, retreat_side == "low")
        dst, src = moves.compact_plan(b.occupied_pages(), (b.lo, b.hi), retreat_side)
        if src and self.moves_held():
            return 0  # a host transfer holds the pages where they are
        self._settle_if(bool(src) or bool(b.guarded_holes()))  # the urgent path: it may move and drops holes
        moved = b.move(dst, src)
        assert b.live_span() == (new.lo, new.hi)
        b.install(new, [])
        return moved

    def translate(self, name: str, ids: Iterable[int]) -> list[int]:
        """Physical pages for virtual ids; a tombstone (unbound, or -1) maps to 0.

        docs/design.md §4, translate: page 0 is the sink, so a padded row or
        a freed id reads and writes there, never out of range.

        Args:
            name: the pool.
            ids: virtual ids, or ``-1``.

        Returns:
            One physical page per id, in order.

        Raises:
            ValueError: an unknown pool, an id that is not an int, or one
                below ``-1`` or past the pool's id range.

        post: len(__return__) == len(list(ids))
        post: all(0 <= p < self.geometry(name).num_pages for p in __return__)
        raises: ValueError
        """
        b = self._band(name)
        try:
            ids = [_index(i) for i in ids]
        except TypeError:
            raise ValueError(f"pool {name!r}: ids must be ints") from None
        for v in ids:
            if not -1 <= v < len(b.v2p):
                raise ValueError(f"pool {name!r}: id {v} out of range [-1, {len(b.v2p)})")
        return [max(b.v2p[v], 0) if v >= 0 else 0 for v in ids]

    # ------------------------------------------------ in-flight forwards

    def launch(self, writes: Mapping[str, Iterable[int] | None]) -> None:
        """A forward was launched: pin the pages it writes (docs/design.md §12).

        Until ``settle``, no move reads a pinned page and no move or
        hand-out writes a pinned page or a page a move vacated (pending);
        the operations settle first, or (the non-urgent flush) leave them
        alone.  A launch while one is in flight adds its pins: one settle
        waits for both (forwards run in order).

        Args:
            writes: ``{pool: virtual ids the forward writes}``; ``-1`` and
                the sink (0) are skipped (a padded row writes the sink);
                None for a pool means every page it holds (the engine does
                not say which).  Pools not named are not written.

        Raises:
            ValueError: an unknown pool, or an id that is not an int, out of
                range, or not allocated in that pool.  Nothing has changed.

        post: self.in_flight
        raises: ValueError
        """
        pinned: dict[str, list[int]] = {}
        for name, ids in writes.items():
            b = self._band(name)
            if ids is None:
                pinned[name] = [v for v in range(1, len(b.v2p)) if b.v2p[v] > 0]
                continue
            try:
                ids = [_index(v) for v in ids]
            except TypeError:
                raise ValueError(f"pool {name!r}: launch: ids must be ints") from None
            for v in ids:
                if not -1 <= v < len(b.v2p):
                    raise ValueError(f"pool {name!r}: launch: id {v} out of range [-1, {len(b.v2p)})")
                if v > 0 and b.v2p[v] < 0:
                    raise ValueError(f"pool {name!r}: launch: id {v} is not allocated")
            pinned[name] = [v for v in ids if v > 0]
        for name, ids in pinned.items():
            b = self.bands[name]
            forward.pin(b.v2p, b.pinned, ids)
        self.in_flight = True

    def settle(self) -> None:
        """The in-flight forward is done, or waited on: lift every pin and
        pending mark (docs/design.md §12).  Pending pages stay holes, now
        free to reuse; no count changes, so no view does.  Nothing in
        flight: nothing to do.

        post: not self.in_flight
        post: all(self.available_pages(n) == __old__.self.available_pages(n) for n in self.chain)
        """
        for b in self.bands.values():
            b.lift_guards()
        self.in_flight = False

    def _settle_if(self, needed: bool) -> None:
        """The urgent path's rule: settle first when the step needs it (docs/design.md §12)."""
        if self.in_flight and needed:
            self.settle()

    def pinned(self, name: str) -> list[int]:
        """Pages an in-flight forward writes (docs/design.md §12).

        Args:
            name: the pool.

        Returns:
            The pinned physical pages, ascending; ``[]`` when nothing is in flight.

        Raises:
            ValueError: an unknown pool.
        """
        b = self._band(name)
        return [p for p, v in enumerate(b.pinned) if v >= 0]

    def pending(self, name: str) -> list[int]:
        """Holes a move vacated while a forward is in flight, which it may
        still read (docs/design.md §12).

        Args:
            name: the pool.

        Returns:
            The pending physical pages, ascending; ``[]`` when nothing is in flight.

        Raises:
            ValueError: an unknown pool.
        """
        b = self._band(name)
        return [p for p, v in enumerate(b.pending) if v >= 0]

    # ------------------------------------ host transfers: gates and reservations

    @property
    def gate_closed(self) -> bool:
        """Whether any source holds the gate closed (``closed_gates``; docs/design.md §13)."""
        return bool(self.closed_gates)

    def moves_held(self) -> bool:
        """Whether every move is held (docs/design.md §13): a gate is
        closed (a host transfer or a PD transfer is in flight) or a band
        holds a reserved page (its load is queued on that physical page).

        While held, no live page changes its physical page: a flush only
        absorbs, a slide or pack that would move a page does nothing, and
        allocation takes holes and frontiers only.

        Returns:
            True while moves are held.
        """
        return self.gate_closed or any(b.reserved for b in self.bands.values())

    def _require_lazy(self, what: str) -> None:
        """A hold needs lazy ENDs: an eager END compacts on every free."""
        for b in self.bands.values():
            if b.is_end and not b.lazy:
                raise ValueError(
                    f"pool {b.name!r}: {what} holds moves, but this END is eager and compacts on every free; "
                    "build the arena with lazy ENDs"
                )

    @staticmethod
    def _gate(source: str) -> str:
        if source not in GATES:
            raise ValueError(f"gate source {source!r}: expected one of {GATES}")
        return source

    def close_gate(self, source: str = "host") -> None:
        """A transfer of ``source`` is in flight: hold every move until every
        source has opened (docs/design.md §13).  The engine's transfer reads
        or writes pages by the physical ids it resolved when it queued, so
        none may move.  No count changes; only the views that credit a move
        change (an END's schedulable view).

        Args:
            source: who closes it, one of ``GATES``: ``"host"`` (HiCache's
                host transfers) or ``"disagg"`` (PD's KV transfers).

        Raises:
            ValueError: an unknown source, or an END of this arena is eager
                (named): its frees move pages.  Nothing has changed.

        post: self.gate_closed and self.moves_held()
        post: self.closed_gates == __old__.self.closed_gates | {source}
        raises: ValueError
        """
        source = self._gate(source)
        self._require_lazy("close_gate")
        self.closed_gates = self.closed_gates | {source}

    def open_gate(self, source: str = "host") -> None:
        """Every transfer of ``source`` is done.  Moves may run again once
        no other source holds the gate and no reservation holds them
        (docs/design.md §13).

        Args:
            source: one of ``GATES``.

        Raises:
            ValueError: an unknown source.  Nothing has changed.

        post: self.closed_gates == __old__.self.closed_gates - {source}
        raises: ValueError
        """
        self.closed_gates = self.closed_gates - {self._gate(source)}

    def reserve(self, name: str, n: int) -> list[int] | None:
        """Reserve ``n`` pages for a host transfer's load; return the physical
        pages, or None if short (docs/design.md §13).

        The pages are taken as ``alloc`` takes them (holes first, then the
        frontier) and count as live in every view, but no id owns them: the
        engine loads bytes into them by physical id, then hands them to ids
        (``bind_reserved``) or gives them back (``cancel``).  While a band
        holds one, moves are held (``moves_held``).  No relief runs: the
        caller relieves first (``relieve``), as for ``alloc``.

        Args:
            name: the pool.
            n: pages wanted, ``>= 0``; 0 returns ``[]``.

        Returns:
            The reserved physical pages, in the order ``alloc`` would bind
                them; None, with nothing changed, when ``n >
                available_pages(name)``.

        Raises:
            ValueError: an unknown pool, ``n`` not an int >= 0, or an eager
                END in the arena (``close_gate``).  Nothing has changed.

        post: (__return__ is None) == (n > __old__.self.available_pages(name))
        post: __return__ is None or self.live_pages(name) == __old__.self.live_pages(name) + n
        post: __return__ is None or self._bound() == __old__.self._bound()
        post: __return__ is None or self.reserved(name) == __old__.self.reserved(name) + __return__
        post: __return__ is not None or self._whole() == __old__.self._whole()
        raises: ValueError
        """
        b = self._band(name)
        n = self._count(name, n)
        self._require_lazy(f"reserve({name!r})")
        if n == 0:
            return []
        if n > self.available_pages(name):
            return None
        pages = self._hand_out(b, n)
        b.reserved.extend(pages)
        return pages

    def _reserved_pages(self, b: Band, pages: Iterable[int], what: str) -> list[int]:
        try:
            pages = [_index(p) for p in pages]
        except TypeError:
            raise ValueError(f"pool {b.name!r}: {what}: pages must be ints") from None
        if len(set(pages)) != len(pages):
            raise ValueError(f"pool {b.name!r}: {what}: repeated page in {pages}")
        held = set(b.reserved)
        stray = [p for p in pages if p not in held]
        if stray:
            raise ValueError(f"pool {b.name!r}: {what}: pages {stray} are not reserved")
        return pages

    def bind_reserved(self, name: str, ids: Iterable[int], pages: Iterable[int]) -> None:
        """Give reserved pages to ids: ``ids[k]`` owns ``pages[k]``
        (docs/design.md §13).  The bytes a load put there become the ids'
        (a borrower's ids must be live in its lender).  No count changes.

        Args:
            name: the pool.
            ids: virtual ids, each free here, one per page.
            pages: reserved physical pages of the pool.

        Raises:
            ValueError: an unknown pool; a page not reserved here, or
                repeated; a bad id (as ``alloc``'s ``ids``); or not one id
                per page.  Nothing has changed.

        post: self.live_pages(name) == __old__.self.live_pages(name)
        post: self.translate(name, ids) == list(pages)
        raises: ValueError
        """
        b = self._band(name)
        pages = self._reserved_pages(b, pages, "bind_reserved")
        ids = self._ids(b, ids, bound=False)
        if len(ids) != len(pages):
            raise ValueError(f"pool {name!r}: bind_reserved: {len(ids)} ids for {len(pages)} pages")
        b.bind(b.take_ids(len(ids), ids), pages)
        done = set(pages)
        b.reserved = [p for p in b.reserved if p not in done]

    def cancel(self, name: str, pages: Iterable[int]) -> None:
        """Give reserved pages back: they become holes, as freed pages of
        their band do (docs/design.md §13).

        Args:
            name: the pool.
            pages: reserved physical pages of the pool.

        Raises:
            ValueError: an unknown pool, or a page not reserved here, or
                repeated.  Nothing has changed.

        post: self.live_pages(name) == __old__.self.live_pages(name) - len(list(pages))
        post: self._bound() == __old__.self._bound()
        post: self.reserved(name) == [p for p in __old__.self.reserved(name) if p not in list(pages)]
        raises: ValueError
        """
        b = self._band(name)
        pages = self._reserved_pages(b, pages, "cancel")
        if not pages:
            return
        s, i = self._at(name)
        assert b.lazy or not b.is_end, "a reservation needs a lazy END (_require_lazy)"
        assert transitions.free_ok(s, i, len(pages))
        new = transitions.free(s, i, len(pages))
        parks = not b.is_end and not new.live  # a float with no live page parks: its holes go
        self._settle_if(parks and bool(b.guarded_holes()))
        done = set(pages)
        b.reserved = [p for p in b.reserved if p not in done]
        b.install(new, [] if parks else b.holes + pages)

    def reserved(self, name: str) -> list[int]:
        """Pages reserved for a host transfer's load and not yet bound or
        cancelled (docs/design.md §13).

        Args:
            name: the pool.

        Returns:
            The reserved physical pages, in the order they were reserved.

        Raises:
            ValueError: an unknown pool.
        """
        return list(self._band(name).reserved)

    def _bound(self) -> dict[str, dict[int, int]]:
        """Each pool's ``{id: page}`` for its bound ids: what no operation
        but an alloc, a free or a bind changes while moves are held
        (docs/design.md §13)."""
        return {n: {v: p for v, p in enumerate(b.v2p) if v and p >= 0} for n, b in self.bands.items()}

    def _placement(self) -> dict[str, dict[int, int]]:
        """Each pool's ``{id: page}`` for its bound ids, and its reserved
        pages: what a hold keeps (docs/design.md §13)."""
        bound = self._bound()
        return {n: bound[n] | {-1 - k: p for k, p in enumerate(b.reserved)} for n, b in self.bands.items()}

    # ------------------------------------------------------------ policy

    def open_short_side(self, name: str, demand: Mapping[str, int]) -> int:
        """Slide float ``name`` for a demand vector ``{pool: pages}``; pages moved.

        docs/design.md §4, demand vector: skips a transparent float, an empty
        demand, and a demand some pool cannot meet for lack of virtual ids
        (step 1: bytes cannot fix that); gathers ``sides``, ``band`` and
        ``Fb`` (steps 2, 3, 5) and the slack (step 6); the decision itself
        (steps 4 and 7) is ``policy.short_side_decision``.

        Args:
            name: the pool, a float.
            demand: pages each pool needs, ``{pool: pages}``; pools not
                named need none.

        Returns:
            Pages moved by the ``make_room`` it calls; 0 when it does nothing.

        Raises:
            ValueError: ``name`` is not a float, or ``demand`` names an
                unknown pool or a count that is not an int >= 0.

        post: 0 <= __return__ <= self.live_pages(name)
        raises: ValueError
        """
        self._float(name)
        s, i = self._at(name)
        d = self._demand(demand)
        if chain.demand_skipped(s, i, d):
            return 0
        act, side_is_low, target = policy.short_side_decision(**chain.short_side_inputs(s, i, d))
        if not act:
            return 0
        return self.make_room(name, "low" if side_is_low else "high", target)

    def _demand(self, demand: Mapping[str, int]) -> list[int]:
        """A demand vector ``{pool: pages}`` as a count per pool, chain order."""
        for n in demand:
            self._band(n)  # unknown pool: ValueError
        demand = {n: self._count(n, d, "demand") for n, d in demand.items()}
        return [demand.get(n, 0) for n in self.chain]

    def plan_floats(self, demand: Mapping[str, int]) -> int:
        """The planner's rung (docs/design.md §4b): place every float at once so
        that the demand vector ``{pool: pages}`` fits; pages moved.

        Asks ``planner.plan_chain`` (its inputs: ``chain.planner_inputs``),
        then repacks the floats it names in ``planner.move_order``
        (``moves.pack_plan``); the bands end as ``transitions.planned`` says.
        Nothing moves when no placement fits, nor when the demand already
        fits where the floats are.  With a forward in flight it settles
        first before a float it repacks moves a page or drops a guarded
        hole (docs/design.md §12).  While moves are held (docs/design.md
        §13) a plan that would move a page does nothing at all.

        Args:
            demand: pages each pool needs, ``{pool: pages}``; pools not
                named need none.

        Returns:
            Pages moved, at most the live pages of the floats that move.

        Raises:
            ValueError: ``demand`` names an unknown pool or a count that is
                not an int >= 0.

        post: __return__ >= 0
        post: self.moves_held() or not __old__.self.plan(demand).feasible or self._fits(demand)
        post: __old__.self.plan(demand).feasible or self._whole() == __old__.self._whole()
        post: not self.moves_held() or self._placement() == __old__.self._placement()
        raises: ValueError
        """
        s, d = self.state(), self._demand(demand)
        up, floats, down = chain.planner_inputs(s, d)
        plan = planner.plan_chain(up, floats, down)
        repacks = []
        for k in planner.move_order(floats, plan):
            b = self.bands[self.chain[k + 1]]
            new = transitions.repack(s, k + 1, plan.starts[k])
            live = b.occupied_pages()  # a float's pages: the repacks of the others do not touch them
            repacks.append((k + 1, b, new, live, moves.pack_plan(live, new.lo)))
        if self.moves_held() and any(src for *_, (_, src) in repacks):
            return 0  # a host transfer holds the pages where they are: the plan is whole or nothing
        moved = 0
        for i, b, new, live, (dst, src) in repacks:
            spared = sum(1 for p in live if new.lo <= p < new.hi)
            self._check_clear(b, new.lo)
            self._settle_if(bool(src) or bool(b.guarded_holes()))  # the urgent path: it may move and drops holes
            step = b.move(dst, src)
            assert step == transitions.repack_moved(s, i, spared)
            assert b.live_span() == (new.lo, new.hi)
            b.install(new, [])
            moved += step
        assert self.state() == transitions.planned(s, plan)
        return moved

    def _fits(self, demand: Mapping[str, int]) -> bool:
        """Whether every pool's demand fits now, with no relocation (``plan_floats``'s contract)."""
        return all(self.available_pages(n) >= d for n, d in demand.items())

    def plan(self, demand: Mapping[str, int]) -> planner.Plan:
        """The planner's decision for a demand vector, without acting on it (docs/design.md §4b).

        Args:
            demand: pages each pool needs, ``{pool: pages}``; pools not
                named need none.

        Returns:
            The plan: whether a placement of the floats meets the demand,
                and where each float would start.

        Raises:
            ValueError: ``demand`` names an unknown pool or a count that is
                not an int >= 0.
        """
        return planner.plan_chain(*chain.planner_inputs(self.state(), self._demand(demand)))

    def _check_clear(self, b: Band, start: int) -> None:
        """A repack of ``b`` to ``start`` must not write over another band
        that has not moved (``planner.move_order`` ensures it)."""
        low, high = start * b.geom.epp, (start + b.live) * b.geom.epp
        for o in self.bands.values():
            if o is not b and o.opaque:
                o_low, o_high = o.frontiers
                assert high <= o_low or o_high <= low, f"repack of {b.name!r} overlaps {o.name!r}"

    def flush_targets(self, name: str) -> list[str]:
        """Who an urgent flush visits for a shortfall in ``name``.

        An END's target is its growth-side neighbour (the first opaque band
        that way); a float's are its neighbours below and above
        (docs/design.md §4, relieve, rung 1).

        Args:
            name: the pool that is short.

        Returns:
            Pool names: one for an END; none, one or two for a float.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        b = self._band(name)
        if b.is_end:
            nb = self._neighbour(name, b.grow == "up")
            assert nb is not None, f"pool {name!r}: the other END is always opaque"
            return [nb.name]
        return [nb.name for nb in (self._neighbour(name, False), self._neighbour(name, True)) if nb]

    # ----------------------------------------------- the shortfall ladder

    def urgent_flush(self, name: str) -> int:
        """Rung 1: flush every flush target of ``name``; pages moved (docs/design.md §4, relieve).

        Args:
            name: the pool that is short.

        Returns:
            Pages moved by the flushes, together.

        Raises:
            ValueError: ``name`` is not a pool of this arena.
        """
        return sum(self.flush(t) for t in self.flush_targets(name))

    def slide_floats(self, name: str, need_pages: int) -> bool:
        """Rung 2, by policy.  ``"planner"``: one ``plan_floats({name:
        need_pages})``.  ``"anchor"``: offer the demand to each float in chain
        order (``open_short_side``), True as soon as a slide makes it fit.

        docs/design.md §4 (relieve, rung 2; the anchor's policy) and
        docs/design.md §4b (the planner).

        Args:
            name: the pool that is short.
            need_pages: the pages it needs.

        Returns:
            Whether ``need_pages`` now fits in ``name``.

        Raises:
            ValueError: an unknown pool, or ``need_pages`` not an int >= 0.
        """
        if self.policy == "planner":
            self.plan_floats({name: need_pages})
            return need_pages <= self.available_pages(name)
        for f in self.chain[1:-1]:
            self.open_short_side(f, {name: need_pages})
            if need_pages <= self.available_pages(name):
                return True
        return False

    def relieve(self, name: str, need_pages: int, evict: Evictor | None = None) -> bool:
        """The shortfall ladder; True once ``need_pages`` fits in ``name``.

        docs/design.md §4, relieve.  Until the need fits:

        1. ``urgent_flush``, recheck;
        2. ``slide_floats`` (rechecks after each float);
        3. with ``evict``, up to 4 rounds of ``evict(shortfall_pages)``,
           each followed by rungs 1 and 2; a return of 0 ends the rounds.

        The verdict is judged after the last step that ran: a callback that
        frees pages but returns 0 still gets the fit it made.  Never raises
        on a shortfall.  What ``evict`` may do and return, and what a bad
        return raises, is ``spec.evict``'s contract.

        Args:
            name: the pool that is short.
            need_pages: the pages it needs, in all (not an increment).
            evict: called as ``evict(shortfall_pages)`` when the rungs do
                not suffice; returns how many pages it freed.  None: no
                eviction.

        Returns:
            Whether ``need_pages`` fits in ``name`` after the last step that ran.

        Raises:
            ValueError: an unknown pool, ``need_pages`` not an int >= 0,
                ``evict`` not callable, or a return of ``evict`` that is not
                an int >= 0 (docs/design.md §9c).  An exception raised by
                ``evict`` propagates, the arena consistent.

        post: __return__ == (need_pages <= self.available_pages(name))
        raises: ValueError
        """
        self._band(name)
        need_pages = self._count(name, need_pages, "need_pages")
        if evict is not None and not callable(evict):
            raise ValueError(f"pool {name!r}: relieve: evict must be callable or None, got {evict!r}")

        def fits() -> bool:
            return need_pages <= self.available_pages(name)

        def rungs() -> bool:
            self.urgent_flush(name)
            return fits() or self.slide_floats(name, need_pages)

        if fits() or rungs():
            return True
        if evict is not None:
            for _ in range(MAX_EVICT_ROUNDS):
                if not evicted(evict(need_pages - self.available_pages(name)), f"pool {name!r}: relieve"):
                    break
                if rungs():
                    return True
        return fits()  # after the last step that ran, whatever evict returned

    # ------------------------------------------------------------ checks

    def verify(self) -> None:
        """Check every accounting rule; raise ``AccountingError`` naming the pool.

        docs/design.md §5, verify: each band's own rules (``Band.check``:
        bounds, the sink, ``v2p``/``p2v`` inverse, the content model, holes,
        free ids), borrowed ids live in the lender, opaque bands disjoint
        along the chain, and conservation.

        Raises:
            AccountingError: a rule is broken; it names the pool and the rule.

        post: __return__ is None
        raises: AccountingError
        """
        for b in self.bands.values():
            b.check()
            if (self.gate_closed or b.reserved) and any(o.is_end and not o.lazy for o in self.bands.values()):
                raise AccountingError(b.name, "hold needs lazy ENDs", "moves held in an arena with an eager END")
            if not self.in_flight and (self.pinned(b.name) or self.pending(b.name)):
                raise AccountingError(
                    b.name, "guards without a forward", "pins or pending pages with nothing in flight"
                )
        for b in self.bands.values():
            if b.lender:
                lender = self.bands[b.lender]
                stray = [v for v, p in enumerate(b.v2p) if v and p >= 0 and lender.v2p[v] < 0]
                if stray:
                    raise AccountingError(
                        b.name, "borrowed ids live in the lender", f"ids {stray} are not live in {lender.name!r}"
                    )
        # The ENDs' own checks keep the first band clear of the sink and the
        # last inside the buffer; what is left is neighbours overlapping.
        opaque = [n for n in self.chain if self.bands[n].opaque]
        for below, name in itertools.pairwise(opaque):
            low, high = self.bands[name].frontiers[0], self.bands[below].frontiers[1]
            if low < high:
                raise AccountingError(
                    name, "opaque bands overlap", f"low frontier {low} < {below} high frontier {high}"
                )
        self._conservation(opaque)

    def _conservation(self, opaque: list[str]) -> None:
        """docs/design.md §5: the sink, every opaque band's pages *counted*
        (live + holes, not read off its frontiers), and the free bytes
        before, between and after the bands, each clamped at 0, add up to the
        buffer (``chain.counted_bytes``, the sum the proofs reason about).
        A frontier that drifts from its band's count fails here, and only
        here (``tests/spec/test_verify.py`` plants one).

        The sum sees a band whose span holds more pages than it counts.  The
        other direction cannot hide in it: a span with fewer pages than its
        live pages and holes leaves one of them outside the span, which
        ``Band.check`` reports, so two drifts that cancel in the sum (proof
        finding 6) are still caught."""
        covered = chain.counted_bytes(self.state())
        if covered != self.total_bytes:
            drift = [n for n in opaque if self.bands[n].span != self.bands[n].live + len(self.bands[n].holes)]
            b = self.bands[(drift or opaque[-1:])[0]]
            raise AccountingError(
                b.name,
                "conservation",
                f"accounted {covered} of {self.total_bytes} bytes; span {b.span} pages, "
                f"live {b.live} + holes {len(b.holes)}",
            )

    def _whole(self) -> dict[str, object]:
        """``snapshot()`` with the content model (each pool's ``[page, id]``
        pairs, ascending): what a postcondition saying "nothing changed"
        compares, so a call that rewrites a page's bytes and nothing else
        breaks it too.  ``snapshot()`` leaves the content out because the
        implementation's bytes are compared apart (docs/design.md §7)."""
        whole = self.snapshot()
        pools = cast(dict[str, dict[str, object]], whole["pools"])
        for name, pool in pools.items():
            pool["content"] = sorted(map(list, self.bands[name].content.items()))
        return whole

    def snapshot(self) -> dict[str, object]:
        """The whole state as JSON-able data (docs/design.md §10).

        The postconditions compare it before and after a call to say that
        nothing changed, and the differential tests compare the spec's with
        the implementation's (docs/design.md §7).  It leaves out the content
        model (``content``), whose twin is the implementation's bytes; the
        postconditions compare ``_whole()``, which adds it.

        Returns:
            The buffer's size, the sink, the policy, the chain, whether a
                forward is in flight, and for each pool its sub-pool, grid,
                laziness, lender, span, frontiers, live count, page tables,
                free ids, holes, pinned and pending pages (``[page, id]``
                pairs, docs/design.md §12), reserved pages and whether the
                gate is closed (docs/design.md §13).

        post: __return__["total_bytes"] == self.total_bytes
        """
        pools = {}
        for name in self.chain:
            b = self.bands[name]
            g = b.geom
            pools[name] = {
                "pool": {
                    "entry_bytes": b.pool.entry_bytes,
                    "page_size": b.pool.page_size,
                    "grow": b.grow,
                    "kind": b.pool.kind,
                },
                "geometry": {"epp": g.epp, "num_pages": g.num_pages, "min_page": g.min_page},
                "lazy": b.lazy,
                "lender": b.lender,
                "span": [b.lo, b.hi],
                "frontiers": list(b.frontiers),
                "live": b.live,
                "v2p": list(b.v2p),
                "p2v": list(b.p2v),
                "free_ids": list(b.free_ids),
                "holes": list(b.holes),
                "pinned": [[p, v] for p, v in enumerate(b.pinned) if v >= 0],
                "pending": [[p, v] for p, v in enumerate(b.pending) if v >= 0],
                "reserved": list(b.reserved),
            }
        return {
            "total_bytes": self.total_bytes,
            "sink_bytes": self.sink_bytes,
            "policy": self.policy,
            "chain": list(self.chain),
            "in_flight": self.in_flight,
            "closed_gates": sorted(self.closed_gates),
            "pools": pools,
        }
