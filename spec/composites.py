"""The token-level composites: ``HybridSWA``, ``MambaHybrid``, ``TriPool``.

docs/design.md §6.  Serving engines allocate tokens, not pages; a composite
wraps one ``Arena`` with fixed roles and speaks the paged-allocator
interface that engines already call (docs/anchor.md §1):

=============  =========================================  =====================
composite      chain (low bytes -> high)                  ids
=============  =========================================  =====================
``HybridSWA``  swa (up END) . full (down END)             swa borrows full's
``MambaHybrid`` state (up END, page_size 1) . full (down)  state slots: own ids
``TriPool``    state (up END) . swa (float) . full (down)  swa borrows full's
=============  =========================================  =====================

Vocabulary.  ``ps`` is the page size of the KV pools.  A **token id** is
``vpage*ps + offset`` in full's virtual id space; the SWA band borrows
those ids (``borrow={"swa": "full"}``), so one token id addresses both.  A
**state slot** is a virtual id of the state pool (page size 1).

Every call validates its whole input first: bad input is a ``ValueError``
that names the problem, raised before any state changes.  A shortfall is
never an exception: it returns ``None`` (allocations) or ``False``
(``relieve``, ``fits``).

The one coupled operation (``_bind``): a batch that needs ``n`` new pages
takes ``n`` virtual ids from full's FIFO (``arena.alloc("full", n)``), then
binds the *same* ids in swa (``arena.alloc("swa", n, ids=...)``), full
first.  Whether that succeeds is always decided first, on the arena's
numbers, by ``transitions.coupled_fits`` (full's gate, then swa's gate on
the state full's ``alloc`` leaves: the function the proofs run too), so a
refusal changes nothing at all: the anchor's static SWA allocator ran both
sides with no pre-check and leaked the side that succeeded (docs/anchor.md
§2); this one cannot.

Methods a composite does not have are absent, not stubs: ``HybridSWA`` has
no ``alloc_state``/``free_state``/``state_available_size``/
``state_slot_token_cost``, and ``MambaHybrid`` no ``free_swa``/
``swa_available_size``.  A ``pool=`` or ``state_slots=`` argument that
names what the composite lacks is a ``ValueError``.
"""

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, SupportsIndex

from . import arith, transitions
from .arena import Arena
from .chain import Chain, available
from .evict import MAX_EVICT_ROUNDS, Evictor, evicted
from .geometry import AccountingError, SubPool

FULL, SWA, STATE = "full", "swa", "state"

Request = tuple[int, int, int]  # one request of a batch: (prefix_len, seq_len, last_loc)


# ------------------------------------------------------------- arguments


def _int(what: str, v: SupportsIndex) -> int:
    """``v`` as an int; a bool or a non-integer is a ``ValueError``."""
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{what} must be an int, got {v!r}") from None


def _segment_start(what: str, start_pos: SupportsIndex, ps: int) -> None:
    """A segment's start position: a non-negative multiple of the page size (its representatives are ``[::ps]``)."""
    start = _int(f"{what}: start_pos", start_pos)
    if start < 0 or start % ps:
        raise ValueError(f"{what}: start_pos {start} must be a non-negative multiple of page_size {ps}")


def _ints(what: str, seq: Sequence[int]) -> list[int]:
    """Any ordered sequence of ints (a list, tuple, range, array), as a list;
    a string, set or mapping is not one."""
    if isinstance(seq, (str, bytes, set, frozenset, dict)) or not hasattr(seq, "__len__"):
        raise ValueError(f"{what} must be a sequence of ints, got {type(seq).__name__}")
    return [_int(f"{what}[{i}]", v) for i, v in enumerate(seq)]


def _same_host_copy(what: str, name: str, values: list[int], copy: Sequence[int] | None) -> None:
    """A host copy the caller passed must hold as many values, and the same."""
    if copy is None:
        return
    host = _ints(f"{what}: {name}_cpu", copy)
    if len(host) != len(values):  # the length first: an engine's trusted path sees only the shapes
        raise ValueError(f"{what}: {name}_cpu has {len(host)} entries, {name} {len(values)}")
    if host != values:
        raise ValueError(f"{what}: {name}_cpu {list(copy)} disagrees with {name} {values}")


def _count(what: str, v: SupportsIndex) -> int:
    v = _int(what, v)
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v}")
    return v


# ------------------------------------------------------- the window rule


def swa_window_end(seq_len: int, window: int, page_size: int) -> int:
    """Token position below which a request's SWA pages may be freed.

    docs/anchor.md §2: a request's SWA pages below
    ``floor_to_page(seq_len - window - page_size)`` have left the window,
    clamped at 0.  ``window`` is the *engine's* window, the model's
    ``sliding_window - 1`` (gpt-oss: 127; Gemma 3: 1023).  The extra page
    keeps the page that the window's oldest token sits in.  A scheduler
    calls, each step, ``free_swa(tokens[done:end], start_pos=done)`` with
    ``end = swa_window_end(...)`` whenever ``end > done``; both ends are
    page-aligned, as ``free_swa`` requires (docs/design.md §6).

    Args:
        seq_len: the request's length in tokens.
        window: the engine's window in tokens.
        page_size: tokens per page, ``>= 1``.

    Returns:
        A multiple of ``page_size``: the tokens before it may leave SWA.

    Raises:
        ValueError: ``seq_len`` or ``window`` is not an int >= 0, or
            ``page_size`` is not an int >= 1.

    post: __return__ % page_size == 0
    post: 0 <= __return__ <= max(0, seq_len - window - page_size)
    post: __return__ == 0 or seq_len - window - page_size - __return__ < page_size
    raises: ValueError
    """
    seq_len = _count("swa_window_end: seq_len", seq_len)
    window = _count("swa_window_end: window", window)
    page_size = _int("swa_window_end: page_size", page_size)
    if page_size < 1:
        raise ValueError(f"swa_window_end: page_size must be >= 1, got {page_size}")
    edge = seq_len - window - page_size
    return max(0, edge // page_size * page_size)


# ------------------------------------------------------------ the common part


class _Composite:
    """What every composite shares: token allocation, free, views, relief (docs/design.md §6).

    Args:
        total_bytes: the buffer's size in bytes.
        pools: the sub-pools, named as ``CHAIN`` says.
        page_size: tokens per page of the KV pools.
        lazy: True or False for both ENDs, or the set of lazy END names.
        policy: who slides the floats, ``"anchor"`` or ``"planner"``.

    inv: self.verify() is None
    """

    CHAIN: ClassVar[tuple[str, ...]] = ()  # the pool names, low bytes first (set by each composite)
    BORROW: ClassVar[dict[str, str]] = {}  # borrower -> lender

    def __init__(
        self, total_bytes: int, pools: list[SubPool], page_size: int, lazy: bool | Iterable[str], policy: str
    ) -> None:
        self.arena = Arena(total_bytes, pools, lazy=lazy, policy=policy, borrow=dict(self.BORROW) or None)
        self.page_size = page_size
        self.verify()

    # ----------------------------------------------------------- facts

    def _has(self, name: str) -> bool:
        return name in self.CHAIN

    def _floats(self) -> list[str]:
        return list(self.CHAIN[1:-1])

    def _token_page(self, v2p: list[int], t: int, what: str) -> int:
        """The virtual page of token ``t``; it must be live in ``v2p``.

        ``-1``, a negative token, a token of page 0 (the sink), an id past
        the id space, and a token whose page is not allocated are errors.
        """
        if t < 0:
            raise ValueError(f"{what} {t} names no token (-1 is the empty-prefix sentinel)")
        page = t // self.page_size
        if page == 0:
            raise ValueError(f"{what} {t} lies in page 0, the sink, which is never allocated")
        if page >= len(v2p):
            raise ValueError(f"{what} {t} is out of range: page {page} >= {len(v2p)} pages")
        if v2p[page] < 0:
            raise ValueError(f"{what} {t} is not allocated (page {page} is unknown or already freed)")
        return page

    # ---------------------------------------------------- the coupled step

    def _bind(self, n: int, swa_n: int | None = None) -> list[int] | None:
        """Bind ``n`` new pages: ids from full's FIFO, then in swa (where
        present) the last ``swa_n`` of the same ids (None: all), full
        first.  Returns the ids, or None.

        Called only once ``_coupled`` said it fits: a half-done bind never
        happens.
        """
        ids = self.arena.alloc(FULL, n)
        if ids is None:
            return None
        tail = ids if swa_n is None else ids[n - swa_n :]
        if self._has(SWA) and tail and self.arena.alloc(SWA, len(tail), ids=tail) is None:
            return None
        return ids

    def _coupled(self, s: Chain, n: int, swa_n: int | None = None) -> bool:
        """Would the coupled bind of ``n`` pages succeed on an arena in
        state ``s``, swa binding the last ``swa_n`` of them (``0 <= swa_n
        <= n``; None: all)?  ``swa_n < n`` is the uneven demand (docs/design.md
        §11), whose SWA side needs only the tail of the new pages.
        ``transitions.coupled_fits``: the gate the proofs reason about."""
        chain = self.arena.chain
        follower = chain.index(SWA) if self._has(SWA) else None
        return transitions.coupled_fits(s, chain.index(FULL), follower, n, n if swa_n is None else swa_n)

    def _with_slots(self, s: Chain, state_slots: int) -> Chain | None:
        """``s`` once ``state_slots`` slots are allocated (None: they do not fit)."""
        if not state_slots:
            return s
        i = self.arena.chain.index(STATE)
        if state_slots > available(s, i):
            return None
        return s.with_band(i, transitions.alloc(s, i, state_slots))

    def _fits_on(self, s: Chain, tokens: int, state_slots: int, swa_tokens: int | None = None) -> bool:
        """On state ``s``: ``state_slots`` slots, then one request of
        ``tokens`` new tokens (empty prefix) whose swa side binds the last
        ``cdiv(swa_tokens, ps)`` of its pages (None: all), both without
        relief?"""
        after = self._with_slots(s, state_slots)
        swa_n = None if swa_tokens is None else arith.cdiv(swa_tokens, self.page_size)
        return after is not None and self._coupled(after, arith.cdiv(tokens, self.page_size), swa_n)

    def _joint_pages(self, s: Chain) -> int:
        """The largest ``P`` whose coupled bind succeeds on state ``s``.

        Binary search over ``P`` in ``[0, available_pages(full)]``.  The
        predicate is monotone (true for ``P`` implies true for ``P-1``):
        full's bind succeeds iff ``P <= available_pages(full)``; it takes
        holes first and then lowers full's low frontier by
        ``max(0, P - holes)`` pages, so the bytes left below full only
        shrink as ``P`` grows, and swa's gate (its gap as an up END, or its
        grid-aware region as a float, docs/design.md §3) is a non-increasing
        function of those bytes, asked for more pages.
        """
        lo, hi = 0, available(s, self.arena.chain.index(FULL))  # fits(lo); nothing above hi fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._coupled(s, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _take_pages(self, n: int, swa_n: int | None = None) -> list[int] | None:
        """The gate of one batch that needs ``n`` new pages, swa binding the
        last ``swa_n`` of them (None: all) (docs/design.md §6, §11).

        Decided by ``_coupled``; on a shortfall the relief ladder runs
        without eviction (flush, slide) for the same demand, and the gate
        is asked once more.  None means no id was allocated on any side
        (relief moves may have happened).
        """
        if n == 0:
            return []
        if not self._coupled(self.arena.state(), n, swa_n):
            ps = self.page_size
            self.relieve(tokens=n * ps, swa_tokens=None if swa_n is None else swa_n * ps)
            if not self._coupled(self.arena.state(), n, swa_n):
                return None
        ids = self._bind(n, swa_n)
        assert ids is not None, "coupled_fits said the coupled bind fits"
        return ids

    # ------------------------------------------------------ allocation

    def _requests(self, what: str, prefix: list[int], seq: list[int], last: list[int]) -> list[Request]:
        """Validate a batch; return ``[(prefix, seq, last_loc), ...]``.

        A ``seq_len`` longer than full's whole grid can hold is bad input,
        not a shortfall (no relief could ever meet it).  ``last_loc`` is
        ``-1`` exactly when the prefix is empty; otherwise
        it is the slot of position ``prefix - 1``: a token live in full
        whose offset in its page is ``(prefix - 1) % ps``.  Its page need
        not be live in swa (a window free may have released it); tokens
        continuing that page then have no swa entry.  Two requests may not
        continue the same partly filled page (they would be given the same
        slots).
        """
        ps = self.page_size
        if not len(prefix) == len(seq) == len(last):
            raise ValueError(
                f"{what}: length mismatch: {len(prefix)} prefix_lens, {len(seq)} seq_lens, {len(last)} last_loc"
            )
        full = self.arena.v2p(FULL)
        g = self.arena.geometry(FULL)
        most = (g.num_pages - g.min_page) * ps  # tokens full could ever hold
        continued: dict[int, int] = {}  # page -> the request continuing it
        for i, (p, s, loc) in enumerate(zip(prefix, seq, last)):
            if p < 0:
                raise ValueError(f"{what}: request {i}: prefix_len {p} < 0")
            if s > most:
                raise ValueError(
                    f"{what}: request {i}: seq_len {s} is more than the {most} tokens this arena could ever hold"
                )
            if s < p:
                raise ValueError(f"{what}: request {i}: seq_len {s} < prefix_len {p}")
            if p == 0:
                if loc != -1:
                    raise ValueError(f"{what}: request {i}: empty prefix needs last_loc -1, got {loc}")
                continue
            page = self._token_page(full, loc, f"{what}: request {i}: last_loc")
            if loc % ps != (p - 1) % ps:
                raise ValueError(
                    f"{what}: request {i}: last_loc {loc} is at offset {loc % ps} of its page, "
                    f"but position {p - 1} belongs at offset {(p - 1) % ps}"
                )
            if p % ps and s > p:
                if page in continued:
                    raise ValueError(f"{what}: requests {continued[page]} and {i} both continue page {page}")
                continued[page] = i
        return list(zip(prefix, seq, last))

    def _alloc(self, reqs: list[Request], swa_n: int | None = None) -> list[int] | None:
        """docs/anchor.md §1, to the slot.

        Request ``i`` needs ``ceil(seq/ps) - ceil(prefix/ps)`` new pages;
        the batch takes them in one coupled bind, and requests take them in
        batch order, each its share in the order the FIFO handed them out.
        Each request's slots, in position order, come in three parts:
        (1) ``last_loc+1, last_loc+2, ...`` continuing the partly filled
        page, for ``min(seq, ceil(prefix/ps)*ps) - prefix`` tokens; (2) its
        whole new pages; (3) a partly filled new page for the tail.  A slot
        on a new page is ``page*ps + position % ps``.  ``swa_n``: swa
        binds only the batch's last ``swa_n`` new pages (None: all).
        """
        ps = self.page_size
        counts = [arith.cdiv(s, ps) - arith.cdiv(p, ps) for p, s, _ in reqs]
        pages = self._take_pages(sum(counts), swa_n)
        if pages is None:
            return None
        out, k = [], 0
        for (p, s, loc), m in zip(reqs, counts):
            cont = min(s, arith.cdiv(p, ps) * ps) - p  # part (1)
            out += [loc + 1 + j for j in range(cont)]
            start = p + cont  # page-aligned whenever a new page follows
            out += [pages[k + (pos - start) // ps] * ps + pos % ps for pos in range(start, s)]  # (2), (3)
            k += m
        return out

    def alloc_extend(
        self,
        prefix_lens: Sequence[int],
        seq_lens: Sequence[int],
        last_loc: Sequence[int],
        *,
        prefix_lens_cpu: Sequence[int] | None = None,
        seq_lens_cpu: Sequence[int] | None = None,
        extend_num_tokens: int | None = None,
    ) -> list[int] | None:
        """Slots for positions ``[prefix_i, seq_i)`` of each request, flat and
        request-major, or None (docs/design.md §6; docs/anchor.md §1).

        See ``_alloc`` for the rule and ``_requests`` for what is checked.
        ``prefix_lens_cpu``, ``seq_lens_cpu`` and ``extend_num_tokens`` are
        the host copies an engine already holds (docs/anchor.md §1); the
        implementation sizes the call from them instead of reading the
        device.  Given, they must agree with the lists (``ValueError``).
        A shortfall runs ``relieve(tokens=n*ps)`` without eviction (``n``
        the batch's new pages) and asks again; None then means no id was
        allocated on any side, though the relief's flushes and slides may
        have moved pages (never a caller-visible id).

        Args:
            prefix_lens: each request's tokens already allocated.
            seq_lens: each request's length after the call, ``>= prefix``.
            last_loc: each request's slot of position ``prefix - 1``, or
                ``-1`` for an empty prefix.
            prefix_lens_cpu: the engine's host copy of ``prefix_lens``, or None.
            seq_lens_cpu: the engine's host copy of ``seq_lens``, or None.
            extend_num_tokens: the tokens asked in all,
                ``sum(seq_lens) - sum(prefix_lens)``, or None.

        Returns:
            Token ids for every new position, request-major and in position
                order; None on a shortfall, with no id allocated.

        Raises:
            ValueError: bad input, before any state changes: lengths that
                differ, a negative prefix, ``seq < prefix``, a ``seq_len``
                no arena state could hold, a ``last_loc`` that is not ``-1``
                for an empty prefix or not the live slot of position
                ``prefix - 1``, two requests continuing one page, or a host
                copy that disagrees.

        post: __return__ is None or len(__return__) == sum(seq_lens) - sum(prefix_lens)
        post: __return__ is None or len(set(__return__)) == len(__return__)
        post: __return__ is not None or self.arena.live_pages("full") == __old__.self.arena.live_pages("full")
        raises: ValueError
        """
        what = "alloc_extend"
        prefix = _ints(f"{what}: prefix_lens", prefix_lens)
        seq = _ints(f"{what}: seq_lens", seq_lens)
        _same_host_copy(what, "prefix_lens", prefix, prefix_lens_cpu)
        _same_host_copy(what, "seq_lens", seq, seq_lens_cpu)
        if extend_num_tokens is not None and _int(f"{what}: extend_num_tokens", extend_num_tokens) != sum(seq) - sum(
            prefix
        ):
            raise ValueError(f"{what}: extend_num_tokens {extend_num_tokens} != {sum(seq) - sum(prefix)} tokens asked")
        reqs = self._requests(what, prefix, seq, _ints(f"{what}: last_loc", last_loc))
        return self._alloc(reqs)

    def alloc_decode(
        self, seq_lens: Sequence[int], last_loc: Sequence[int], *, seq_lens_cpu: Sequence[int] | None = None
    ) -> list[int] | None:
        """One slot per request, for position ``seq_i - 1``, or None.

        This is ``alloc_extend`` with ``prefix = seq - 1``: a new page is
        taken iff position ``seq - 1`` starts a page, i.e. ``seq % ps == 1``
        (for ``ps = 1``: always); otherwise the slot is ``last_loc + 1``.
        ``seq_lens`` are >= 1.  Shortfalls as in ``alloc_extend``.
        ``seq_lens_cpu``: the engine's host copy, as in ``alloc_extend``
        (docs/design.md §6; docs/anchor.md §1).

        Args:
            seq_lens: each request's length after the call, ``>= 1``.
            last_loc: each request's slot of position ``seq - 2``, or ``-1``
                when ``seq == 1``.
            seq_lens_cpu: the engine's host copy of ``seq_lens``, or None.

        Returns:
            One token id per request, in batch order; None on a shortfall,
                with no id allocated.

        Raises:
            ValueError: bad input, before any state changes: a ``seq_len``
                below 1, and everything ``alloc_extend`` refuses.

        post: __return__ is None or len(__return__) == len(seq_lens)
        post: __return__ is not None or self.arena.live_pages("full") == __old__.self.arena.live_pages("full")
        raises: ValueError
        """
        what = "alloc_decode"
        seq = _ints(f"{what}: seq_lens", seq_lens)
        _same_host_copy(what, "seq_lens", seq, seq_lens_cpu)
        last = _ints(f"{what}: last_loc", last_loc)
        for i, s in enumerate(seq):
            if s < 1:
                raise ValueError(f"{what}: request {i}: seq_len must be >= 1, got {s}")
        return self._alloc(self._requests(what, [s - 1 for s in seq], seq, last))

    # ------------------------------------------------------------ free

    def free(self, token_ids: Sequence[int]) -> None:
        """Free the pages of these tokens (docs/design.md §6; docs/anchor.md §1).

        The pages are ``sorted(set(t // ps))``.  Every token must be live
        in full: ``-1``, a token of page 0, a token out of range, an
        unknown or already-freed token and a repeated token are each a
        ``ValueError``, with nothing changed.  The swa entries of those
        pages that are still live are freed first (a borrowed id must leave
        its borrower before its lender), then the full pages, both in
        ascending page order.

        Args:
            token_ids: tokens live in full; their pages are freed whole.

        Raises:
            ValueError: a token that is repeated, ``-1``, in page 0, out of
                range, unknown or already freed; nothing has changed.

        post: all(p == 0 for p in self.translate(token_ids))
        raises: ValueError
        """
        self._free_pages(self._pages_to_free(token_ids))

    def _pages_to_free(self, token_ids: Sequence[int]) -> list[int]:
        """``free``'s pages, ascending, once every token is checked."""
        toks = _ints("free: token_ids", token_ids)
        seen: set[int] = set()
        for t in toks:
            if t in seen:
                raise ValueError(f"free: token {t} is repeated")
            seen.add(t)
        full = self.arena.v2p(FULL)
        return sorted({self._token_page(full, t, "free: token") for t in toks})

    def _swa_live(self, pages: list[int]) -> list[int]:
        """Those of ``pages`` whose swa entry is live (none without swa)."""
        if not self._has(SWA):
            return []
        swa = self.arena.v2p(SWA)
        return [p for p in pages if swa[p] > 0]

    def _free_pages(self, pages: list[int]) -> None:
        """A borrowed id leaves its borrower before its lender: the live swa
        entries first, then the full pages."""
        if self._has(SWA):
            self.arena.free(SWA, self._swa_live(pages))
        self.arena.free(FULL, pages)

    def free_segment(self, token_ids: Sequence[int], start_pos: int, *, num_live: int | None = None) -> None:
        """The per-step free of a request's segment (docs/design.md §6;
        docs/anchor.md §1, ``free_segment``): a finished request's rows, a
        tree node's value.

        ``start_pos`` (the position of ``token_ids[0]`` in its request)
        must be a non-negative multiple of ``ps``; the page
        representatives are ``token_ids[::ps]``, one per page, and only
        they are read.  It is ``free`` of the representatives: each must
        be live in full, the swa entries still live go first, then the
        full pages, both ascending.

        ``num_live`` is the engine's host copy of how many of those swa
        entries are live (all of them for a segment whose window is live,
        0 for one the window has left; 0 or None where there is no swa).
        It must be right, else ``ValueError``; with it the
        implementation's trusted path reads nothing back (docs/design.md §8).

        Args:
            token_ids: a request's tokens from position ``start_pos`` on.
            start_pos: the position of ``token_ids[0]``, a multiple of ``ps``.
            num_live: the live swa entries among the representatives, as
                the engine knows it, or None.

        Raises:
            ValueError: ``start_pos`` not a non-negative multiple of ``ps``,
                a representative that ``free`` refuses, or a ``num_live``
                that is not that number; nothing has changed.

        post: all(p == 0 for p in self.translate(token_ids[:: self.page_size]))
        raises: ValueError
        """
        ps = self.page_size
        toks = _ints("free_segment: token_ids", token_ids)
        _segment_start("free_segment", start_pos, ps)
        pages = self._pages_to_free(toks[::ps])
        if num_live is not None:
            claimed, live = _int("free_segment: num_live", num_live), len(self._swa_live(pages))
            if claimed != live:
                raise ValueError(f"free_segment: pool 'swa': num_live {claimed} disagrees with the {live} live pages")
        self._free_pages(pages)

    # ------------------------------------------------------------ views

    def available_size(self) -> int:
        """The joint view, in tokens (docs/design.md §6; anchor bug 7).

        The largest ``n`` for which ``alloc_extend([0], [n], [-1])``
        succeeds now, without relief: ``P*ps`` for the largest ``P`` whose
        coupled bind passes its gates (``_joint_pages``, which says why
        the search is sound).  It can be smaller than the ``min`` of the
        per-component views: each of those assumes it has the shared bytes
        to itself.

        Returns:
            Tokens, a multiple of ``page_size``.

        post: __return__ % self.page_size == 0
        post: self.fits(__return__)
        post: not self.fits(__return__ + self.page_size)
        """
        return self._joint_pages(self.arena.state()) * self.page_size

    def full_available_size(self) -> int:
        """Tokens full alone could take now (``arena.available_size("full")``;
        docs/design.md §5 and §6).  Not the gate: see ``available_size``.

        Returns:
            Tokens.
        """
        return self.arena.available_size(FULL)

    def fits(self, tokens: int = 0, state_slots: int = 0, swa_tokens: int | None = None) -> bool:
        """Would ``state_slots`` state slots and then one request of
        ``tokens`` new tokens (empty prefix) both succeed now, without
        relief?  Decided on the arena's numbers (the slots' transition, then
        ``transitions.coupled_fits``): nothing changes.  This is ``relieve``'s
        verdict and the gate of every allocation.

        ``swa_tokens`` prices the SWA side on its own (docs/design.md §11,
        "Uneven demand": a prefill over a cached prefix needs fewer SWA
        pages than full ones).  None means ``tokens`` (the coupled demand).
        Otherwise full binds ``P_f = cdiv(tokens, ps)`` new pages and swa
        the last ``P_s = cdiv(swa_tokens, ps)`` of those ids, so
        ``swa_tokens <= tokens`` (SWA binds a subset of full's new pages),
        else ``ValueError``.  A composite without SWA takes only None, 0 or
        ``tokens`` (each means the same there); any other value is a
        ``ValueError`` naming it.  The same gate decides it
        (docs/design.md §6).

        Args:
            tokens: the new tokens of one request with an empty prefix.
            state_slots: state slots taken first; only where there is a state pool.
            swa_tokens: the tokens the SWA side needs, ``<= tokens``; None
                for the coupled demand.

        Returns:
            Whether both would succeed now.

        Raises:
            ValueError: a count that is not an int >= 0, ``state_slots``
                without a state pool, or a ``swa_tokens`` not accepted here.

        post: swa_tokens is None or self.fits(tokens, state_slots) <= __return__
        post: not __return__ or self.fits(tokens, state_slots, 0)
        raises: ValueError
        """
        tokens, state_slots = self._demand_args("fits", tokens, state_slots)
        swa = self._swa_arg("fits", tokens, swa_tokens)
        return self._fits_on(self.arena.state(), tokens, state_slots, swa)

    def _demand_args(self, what: str, tokens: int, state_slots: int) -> tuple[int, int]:
        tokens = _count(f"{what}: tokens", tokens)
        state_slots = _count(f"{what}: state_slots", state_slots)
        if state_slots and not self._has(STATE):
            raise ValueError(f"{what}: state_slots={state_slots}, but {type(self).__name__} has no state pool")
        return tokens, state_slots

    def _swa_arg(self, what: str, tokens: int, swa_tokens: int | None) -> int | None:
        """``swa_tokens`` checked against the validated ``tokens``: None for a
        coupled demand (None given, or no swa to price), else the count."""
        if swa_tokens is None:
            return None
        swa = _count(f"{what}: swa_tokens", swa_tokens)
        if not self._has(SWA):
            if swa not in (0, tokens):
                raise ValueError(
                    f"{what}: swa_tokens={swa} (tokens={tokens}), but {type(self).__name__} has no swa pool"
                )
            return None
        if swa > tokens:
            raise ValueError(f"{what}: swa_tokens={swa} > tokens={tokens}: swa binds a subset of full's new pages")
        return swa

    # ----------------------------------------------------------- relief

    def _absorb_members(self) -> None:
        """Rung 1: every member settles the holes at its own frontier, which
        moves no data (``flush(max_moves=0)``): floats first, then the ENDs
        in chain order."""
        for name in self._floats() + [self.CHAIN[0], self.CHAIN[-1]]:
            self.arena.flush(name, max_moves=0)

    def _compact_ends(self, demand: dict[str, int], fits: Callable[[], bool], replan: Callable[[], bool]) -> bool:
        """Rung 2: compact the ENDs' surplus, in chain order, each in
        doubling steps (``flush(max_moves=k)``, k = 1, 2, 4, ..., capped at
        the surplus), until ``fits()``; ``replan()`` runs after each step
        (the planner's rung, which moves nothing when no placement fits).
        True once it fits.

        An END's **surplus** is its holes beyond its own demand
        (``demand[name]`` pages).  Only the surplus is worth moving: an END
        reuses its holes before it extends, so below its demand every page
        its frontier gives back is a page its own extension takes again
        (``relief.surplus_only``: an END with holes at most its demand
        extends exactly as far as the packed END).  An END with no surplus
        is not touched; on ``HybridSWA`` a short SWA band is helped by
        compacting full, never by compacting itself.

        Why steps: a whole flush hands every hole of an END to its
        neighbours, and a composite's members differ in grain (a state
        slot can be hundreds of KV pages), so one slot short would move
        them all.  Doubling stops within twice the moves the END needed to
        reach the fit, in a number of flushes logarithmic in its holes.

        What the rung leaves when it does not fit: every END with holes at
        most its demand, which extends as the packed END does; so the
        planner's decision, and the fit itself, are those of a whole flush.
        The anchor's slide (``open_short_side``) reads the ENDs' holes and
        gaps themselves, not only how far they extend, so with floats and
        the ``"anchor"`` policy the rung then flushes the ENDs whole, with
        no recheck (by ``relief.surplus_only`` that cannot fit the demand
        by itself), and ends with every END packed: the pages a whole
        flush leaves occupied (which page holds which id may differ)."""
        for name in (self.CHAIN[0], self.CHAIN[-1]):
            k = 1
            # each step moves: rung 1 absorbed the frontier's holes, so every hole lies below a survivor
            while (surplus := len(self.arena.holes(name)) - demand[name]) > 0 and self.arena.flush(
                name, max_moves=min(k, surplus)
            ):
                if fits() or replan():
                    return True
                k *= 2
        if self.arena.policy == "anchor" and self._floats():
            for name in (self.CHAIN[0], self.CHAIN[-1]):
                self.arena.flush(name)
        return False

    def _kept_pages(self, s: Chain, tokens: int, swa_tokens: int | None) -> int:
        """How many of the demand's full pages fit on state ``s`` when both
        sides shed pages together: the largest ``K <= P_f`` whose bind of
        ``K`` pages, swa binding ``max(0, P_s - (P_f - K))`` of them, passes.

        Evicting a page frees it in full and (where live) in swa, so this
        is the demand a shortfall in whole pages leaves standing.  For a
        coupled demand (``swa_tokens`` None) it is ``min(P_f, joint
        view)``.  The predicate is down-closed in ``K`` (both sides' demands
        only shrink), so a binary search finds it."""
        ps = self.page_size
        pf = arith.cdiv(tokens, ps)
        if swa_tokens is None:
            return min(pf, self._joint_pages(s))
        ps_n = arith.cdiv(swa_tokens, ps)
        lo, hi = 0, pf  # K = 0 always fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._coupled(s, mid, max(0, ps_n - (pf - mid))):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _shortfall(self, tokens: int, state_slots: int, swa_tokens: int | None = None) -> int:
        """What ``evict`` is asked for, in tokens.

        ``max(0, tokens - K*ps)``, ``K`` the demand's full pages that fit
        now when both sides shed pages together (``_kept_pages``; for a
        coupled demand ``min(P_f, available_size() // ps)``, so this is
        ``max(0, tokens - available_size())``), plus, for state slots short,
        ``short_slots * state_slot_token_cost()``.  When that is 0 but the
        demand still does not fit (tokens and slots each fit alone, not
        together: they share the gap), it is what the tokens lack once the
        slots are taken: ``tokens - K*ps`` on that state, which is then at
        least 1.
        """
        ps = self.page_size
        s = self.arena.state()
        short = max(0, tokens - self._kept_pages(s, tokens, swa_tokens) * ps)
        if state_slots:
            assert isinstance(self, _WithState), "_demand_args admits state_slots only with a state pool"
            short += max(0, state_slots - self.state_available_size()) * self.state_slot_token_cost()
        if short == 0 and state_slots:
            after = self._with_slots(s, state_slots)
            assert after is not None, "short == 0: the slots fit"
            short = tokens - self._kept_pages(after, tokens, swa_tokens) * ps
        return short

    def relieve(
        self, tokens: int = 0, state_slots: int = 0, evict: Evictor | None = None, swa_tokens: int | None = None
    ) -> bool:
        """The shortfall ladder for a demand; True once it fits.

        docs/design.md §4 (relieve) and 6.  The demand vector is
        ``{full: ceil(tokens/ps), swa: ceil(swa_tokens/ps) (where present;
        None: the same as full), state: state_slots (where present)}``;
        "fits" is ``self.fits(tokens, state_slots, swa_tokens)``, which
        also says which ``swa_tokens`` are accepted (an uneven demand,
        docs/design.md §11: an engine calls ``relieve(full, swa_tokens=swa)``
        and then allocates).  Unless it fits at once:

        1. **absorb**: every member settles the holes at its frontier
           (``_absorb_members``, no data moves), recheck;
        2. **compact by steps**: the ENDs' surplus holes (beyond their own
           demand), in chain order, in doubling steps (``_compact_ends``),
           rechecking after each; with floats and the ``"anchor"`` policy,
           then the ENDs whole;
        3. **slide**, by the arena's policy: ``"planner"``, one
           ``arena.plan_floats(demand)``, which also runs before rung 2 and
           after each of its steps (it moves nothing when no placement
           fits, so it can run early); ``"anchor"``, for each float in
           chain order, ``arena.open_short_side(float, demand)``,
           rechecking after each (it can move in vain, so it runs once,
           after the ENDs are packed);
        4. with ``evict``, up to ``MAX_EVICT_ROUNDS`` (4) rounds of
           ``evict(shortfall_tokens)`` (see ``_shortfall``), each followed
           by rungs 1 to 3; a return of 0 ends the rounds.

        The verdict is judged after the last step that ran.  Never raises
        on a shortfall; ``evict``'s contract is ``spec.evict``'s.  A
        demand that fits at once runs nothing (no flush).  Rungs 1 and 2,
        when they do not fit first, leave every END extending as far as a
        whole flush leaves it (packed, for the anchor's slide), so the
        verdict is the one a flush-everything ladder gives (flushing never
        lowers what a placement can fit); only the bytes moved on the way
        differ (docs/results/bench.md "Churn before that: why tri missed").
        With the ``"anchor"`` policy one run is not
        all the ladder can do (docs/findings.md, policy findings 1 and 6): a second
        identical call can succeed where the first failed
        (``tests/api/test_composites.py`` pins a case).

        Args:
            tokens: the new tokens of one request with an empty prefix.
            state_slots: state slots needed too; only where there is a state pool.
            evict: called as ``evict(shortfall_tokens)`` when the rungs do not
                suffice; returns how many tokens it freed.  None: no eviction.
            swa_tokens: the tokens the SWA side needs, ``<= tokens``; None
                for the coupled demand.

        Returns:
            ``fits(tokens, state_slots, swa_tokens)`` after the last step that ran.

        Raises:
            ValueError: bad arguments, as ``fits`` refuses them; ``evict``
                not callable; or a return of ``evict`` that is not an
                int >= 0 (docs/design.md §9c).  An exception raised by
                ``evict`` propagates, the arena consistent.

        post: __return__ == self.fits(tokens, state_slots, swa_tokens)
        raises: ValueError
        """
        tokens, state_slots = self._demand_args("relieve", tokens, state_slots)
        swa = self._swa_arg("relieve", tokens, swa_tokens)
        if evict is not None and not callable(evict):
            raise ValueError(f"relieve: evict must be callable or None, got {evict!r}")
        pages = arith.cdiv(tokens, self.page_size)
        demand = {FULL: pages}
        if self._has(SWA):
            demand[SWA] = pages if swa is None else arith.cdiv(swa, self.page_size)
        if self._has(STATE):
            demand[STATE] = state_slots

        def fits() -> bool:
            return self._fits_on(self.arena.state(), tokens, state_slots, swa)

        def replan() -> bool:
            if self.arena.policy != "planner":
                return False
            self.arena.plan_floats(demand)
            return fits()

        def rungs() -> bool:
            self._absorb_members()
            if fits() or replan() or self._compact_ends(demand, fits, replan):
                return True
            if self.arena.policy == "planner":
                return False  # planned after the last step that moved
            for f in self._floats():
                self.arena.open_short_side(f, demand)
                if fits():
                    return True
            return False

        if fits() or rungs():
            return True
        if evict is not None:
            for _ in range(MAX_EVICT_ROUNDS):
                if not evicted(evict(self._shortfall(tokens, state_slots, swa)), f"{type(self).__name__}.relieve"):
                    break
                if rungs():
                    return True
        return fits()  # after the last step that ran, whatever evict returned

    # -------------------------------------------------------- translate

    def translate(self, token_ids: Sequence[int], pool: str = "full") -> list[int]:
        """Physical slots: ``v2p[t // ps] * ps + t % ps`` (docs/design.md §6).

        ``pool`` is ``"full"``, ``"swa"`` (token ids; where present) or
        ``"state"`` (state slots, page size 1; where present).  A token
        whose page is a tombstone, a token of page 0 (the sink), and ``-1``
        all translate to slot 0 itself, never to an offset inside page 0.
        Below ``-1`` or past the id space is a ``ValueError``.

        Args:
            token_ids: token ids (state slots for ``pool="state"``), or ``-1``.
            pool: ``"full"``, ``"swa"`` or ``"state"``.

        Returns:
            One physical slot per token, in order.

        Raises:
            ValueError: a pool the composite lacks, a token that is not an
                int, or one below ``-1`` or past the id space.

        post: len(__return__) == len(token_ids)
        raises: ValueError
        """
        if not isinstance(pool, str) or not self._has(pool):
            raise ValueError(f"translate: pool {pool!r}: {type(self).__name__} has pools {', '.join(self.CHAIN)}")
        toks = _ints("translate: token_ids", token_ids)
        ps = 1 if pool == STATE else self.page_size
        n_ids = len(self.arena.v2p(pool))
        for t in toks:
            if t < -1 or t // ps >= n_ids:
                raise ValueError(f"translate: pool {pool!r}: token {t} out of range [-1, {n_ids * ps})")
        pages = self.arena.translate(pool, [t // ps if t >= 0 else -1 for t in toks])
        return [p * ps + t % ps if p > 0 else 0 for t, p in zip(toks, pages)]

    # ------------------------------------------------ in-flight forwards

    def launch(self, token_ids: Sequence[int], state_slots: Sequence[int] | None = None) -> None:
        """A forward was launched that writes these tokens' slots (docs/design.md §12).

        It pins their pages in full and, where live, in swa; the state
        slots it updates are ``state_slots``, or every live slot when the
        engine does not say (None: SGLang passes none for the mamba pool).
        Until ``settle`` nothing it writes moves and nothing it reads is
        overwritten (``Arena.launch``).

        Args:
            token_ids: the batch's new token ids (``out_cache_loc``);
                ``-1`` and tokens of page 0 are padding and skipped.
            state_slots: the state slots it writes, or None for all;
                ignored where there is no state pool.

        Raises:
            ValueError: a token that is not an int, below ``-1``, out of
                range or not allocated in full; a slot that is not live.
                Nothing has changed.

        post: self.arena.in_flight
        raises: ValueError
        """
        toks = _ints("launch: token_ids", token_ids)
        full = self.arena.v2p(FULL)
        for t in toks:
            if t < -1:
                raise ValueError(f"launch: token {t} names no token (-1 is padding)")
        pages = sorted({self._token_page(full, t, "launch: token") for t in toks if t >= self.page_size})
        writes: dict[str, list[int] | None] = {FULL: pages}
        if self._has(SWA):
            swa = self.arena.v2p(SWA)
            writes[SWA] = [p for p in pages if swa[p] > 0]
        if self._has(STATE):
            writes[STATE] = None if state_slots is None else _ints("launch: state_slots", state_slots)
        self.arena.launch(writes)

    def settle(self) -> None:
        """The launched forward is done, or waited on (``Arena.settle``; docs/design.md §12).

        post: not self.arena.in_flight
        """
        self.arena.settle()

    def flush_opportunistic(self, max_moves: int | None = None) -> int:
        """Compact between steps without waiting for an in-flight forward:
        a non-urgent flush of each lazy END (``Arena.flush(urgent=False)``;
        docs/design.md §12).  Eager ENDs have no holes to compact.

        Args:
            max_moves: the most pages each END may move; None for no cap.

        Returns:
            Pages moved, all ENDs together.

        Raises:
            ValueError: ``max_moves`` not an int >= 0.

        post: __return__ >= 0
        raises: ValueError
        """
        if max_moves is not None:  # checked here too: a composite with no lazy END flushes nothing
            max_moves = _count("flush_opportunistic: max_moves", max_moves)
        ends = [n for n in (self.CHAIN[0], self.CHAIN[-1]) if self.arena.is_lazy(n)]
        return sum(self.arena.flush(n, max_moves=max_moves, urgent=False) for n in ends)

    # ----------------------------------------------------------- checks

    def verify(self) -> None:
        """docs/design.md §5 and §6: ``arena.verify()`` (which already checks
        that every live swa id is live in full, docs/design.md §3), plus the
        composite's roles: the chain and the borrowing are the ones this
        composite was built with.  Nothing else is composite state: every
        token and slot lives in the arena's tables.

        Raises:
            AccountingError: an arena rule is broken, or the roles are not
                this composite's; it names the pool and the rule.

        post: __return__ is None
        raises: AccountingError
        """
        self.arena.verify()
        if tuple(self.arena.chain) != self.CHAIN:
            raise AccountingError(self.CHAIN[0], "composite roles", f"chain {self.arena.chain}, expected {self.CHAIN}")
        if self.arena.lenders != self.BORROW:
            raise AccountingError(SWA, "composite roles", f"borrow {self.arena.lenders}, expected {self.BORROW}")

    def snapshot(self) -> dict[str, object]:
        """The whole state as JSON-able data, the arena's snapshot included
        (docs/design.md §10).

        Returns:
            ``{"composite": class name, "page_size": ps, "arena": arena snapshot}``.
        """
        return {"composite": type(self).__name__, "page_size": self.page_size, "arena": self.arena.snapshot()}


class _WithSWA(_Composite):
    """The calls of a composite with an SWA band (``HybridSWA``, ``TriPool``; docs/design.md §6)."""

    def free_swa(self, token_ids: Sequence[int], start_pos: int, *, num_live: int | None = None) -> None:
        """The per-step window free (docs/design.md §6; docs/anchor.md §1,
        ``free_segment``).

        ``start_pos`` (the position of ``token_ids[0]`` in its request)
        must be a multiple of ``ps``, else ``ValueError``; the page
        representatives are ``token_ids[::ps]``, and only they are read: a
        representative below ``-1`` or past the id space is a
        ``ValueError``.  Only swa entries that are live (``v2p > 0``,
        strictly) are freed, in ascending page order; ``-1``, page 0 and
        entries already freed are skipped silently.  Full keeps its pages.

        ``num_live`` is the engine's host copy of how many pages that is
        (a segment whose pages are all live: one per representative).  It
        must be right, else ``ValueError``; with it the implementation's
        trusted path reads nothing back from the device (docs/design.md §8).

        Args:
            token_ids: the tokens leaving the window, from position ``start_pos`` on.
            start_pos: the position of ``token_ids[0]``, a multiple of ``ps``.
            num_live: the number of distinct live swa pages among the
                representatives, as the engine knows it, or None.

        Raises:
            ValueError: ``start_pos`` not a non-negative multiple of ``ps``,
                a token that is not an int, a representative below ``-1``
                or past the id space, or a ``num_live`` that is not that
                number; nothing has changed.

        post: self.arena.live_pages("full") == __old__.self.arena.live_pages("full")
        raises: ValueError
        """
        ps = self.page_size
        toks = _ints("free_swa: token_ids", token_ids)
        _segment_start("free_swa", start_pos, ps)
        swa = self.arena.v2p(SWA)
        reps = toks[::ps]
        for t in reps:
            if t < -1 or t // ps >= len(swa):
                raise ValueError(f"free_swa: pool 'swa': token {t} out of range [-1, {len(swa) * ps})")
        pages = sorted({t // ps for t in reps if t >= ps and swa[t // ps] > 0})
        if num_live is not None and _int("free_swa: num_live", num_live) != len(pages):
            raise ValueError(f"free_swa: pool 'swa': num_live {num_live} disagrees with the {len(pages)} live pages")
        self.arena.free(SWA, pages)

    def tail_demand(self, prefix_len: int, seq_len: int, swa_tail_len: int) -> tuple[int, int]:
        """The demand of ``alloc_extend_swa_tail`` for one request, as
        ``(tokens, swa_tokens)``, the uneven demand ``fits`` and ``relieve``
        price (docs/design.md §11): full's new pages and the new pages
        holding the tail (``arith.swa_tail_pages``), in tokens.

        Args:
            prefix_len: the tokens already allocated.
            seq_len: the request's length after the extend.
            swa_tail_len: the window's tail, ``0 <= tail <= seq - prefix``.

        Returns:
            ``(tokens, swa_tokens)``, whole pages each.

        Raises:
            ValueError: lengths outside ``0 <= prefix <= seq`` and ``0 <=
                tail <= seq - prefix``.
        """
        ps = self.page_size
        prefix_len, seq_len = _count("prefix_len", prefix_len), _count("seq_len", seq_len)
        tail = _count("swa_tail_len", swa_tail_len)
        if not (prefix_len <= seq_len and tail <= seq_len - prefix_len):
            raise ValueError(
                f"alloc_extend_swa_tail: swa_tail_len {tail} is not within the {seq_len - prefix_len} new tokens "
                f"(prefix_len {prefix_len}, seq_len {seq_len})"
            )
        new = arith.cdiv(seq_len, ps) - arith.cdiv(prefix_len, ps)
        return new * ps, arith.swa_tail_pages(prefix_len, seq_len, tail, ps) * ps

    def fits_tail(self, prefix_len: int, seq_len: int, swa_tail_len: int) -> bool:
        """Would ``alloc_extend_swa_tail`` of this request succeed now,
        without relief?  ``fits`` of its ``tail_demand``: the one gate the
        call itself asks (docs/design.md §13).

        Args:
            prefix_len: the tokens already allocated.
            seq_len: the request's length after the extend.
            swa_tail_len: the window's tail.

        Returns:
            Whether it fits now.

        Raises:
            ValueError: as ``tail_demand``.
        """
        tokens, swa_tokens = self.tail_demand(prefix_len, seq_len, swa_tail_len)
        return self.fits(tokens, swa_tokens=swa_tokens)

    def _swa_took(self, old: "_WithSWA", prefix_len: int, seq_len: int, swa_tail_len: int) -> bool:
        """Contract helper: swa holds ``swa_tail_pages`` more live pages than ``old``."""
        grew = self.arena.live_pages(SWA) - old.arena.live_pages(SWA)
        return grew == arith.swa_tail_pages(prefix_len, seq_len, swa_tail_len, self.page_size)

    def alloc_extend_swa_tail(
        self,
        prefix_lens: Sequence[int],
        seq_lens: Sequence[int],
        last_loc: Sequence[int],
        *,
        swa_tail_len: int,
        prefix_lens_cpu: Sequence[int] | None = None,
        seq_lens_cpu: Sequence[int] | None = None,
        extend_num_tokens: int | None = None,
    ) -> list[int] | None:
        """A PD decode node's preallocation for one transferred request:
        full slots for every new position, and SWA entries only for the new
        pages that hold the last ``swa_tail_len`` tokens (docs/design.md
        §13, "PD disaggregation"; SGLang's ``alloc_extend_swa_tail``).

        The slots are ``alloc_extend``'s for the one request.  Full binds
        its ``P_f`` new pages; swa binds the last ``P_s =
        arith.swa_tail_pages(...)`` of those ids, and the others are left
        unbound: they read as the sink and a free skips them, the state a
        window free leaves.  A partly filled prefix page continued here is
        no new page and costs nothing.  The gate is the uneven demand's
        (``tail_demand``): ``fits(*tail_demand)`` now means this call
        succeeds without relief, and a shortfall runs ``relieve`` for that
        demand (no eviction) and asks again, as ``alloc_extend`` does.

        Args:
            prefix_lens: the request's tokens already allocated (one entry).
            seq_lens: its length after the call (one entry).
            last_loc: its slot of position ``prefix - 1``, or ``-1``.
            swa_tail_len: the window's tail, ``0 <= tail <= seq - prefix``.
            prefix_lens_cpu: the engine's host copy of ``prefix_lens``, or None.
            seq_lens_cpu: the engine's host copy of ``seq_lens``, or None.
            extend_num_tokens: ``seq - prefix``, or None.

        Returns:
            Token ids for every new position, in position order; None on a
                shortfall, with no id allocated on either side.

        Raises:
            ValueError: not exactly one request, a tail outside ``[0, seq -
                prefix]``, or anything ``alloc_extend`` refuses; nothing has
                changed.

        post: __return__ is None or len(__return__) == seq_lens[0] - prefix_lens[0]
        post: __return__ is not None or not __old__.self.fits_tail(prefix_lens[0], seq_lens[0], swa_tail_len)
        post: __return__ is None or self._swa_took(__old__.self, prefix_lens[0], seq_lens[0], swa_tail_len)
        post: __return__ is not None or self.arena.live_pages("swa") == __old__.self.arena.live_pages("swa")
        raises: ValueError
        """
        what = "alloc_extend_swa_tail"
        prefix = _ints(f"{what}: prefix_lens", prefix_lens)
        seq = _ints(f"{what}: seq_lens", seq_lens)
        if len(prefix) != 1:
            raise ValueError(f"{what}: one request at a time, got {len(prefix)} prefix_lens")
        _same_host_copy(what, "prefix_lens", prefix, prefix_lens_cpu)
        _same_host_copy(what, "seq_lens", seq, seq_lens_cpu)
        reqs = self._requests(what, prefix, seq, _ints(f"{what}: last_loc", last_loc))
        if (
            extend_num_tokens is not None
            and _int(f"{what}: extend_num_tokens", extend_num_tokens) != seq[0] - prefix[0]
        ):
            raise ValueError(f"{what}: extend_num_tokens {extend_num_tokens} != {seq[0] - prefix[0]} tokens asked")
        _, swa_tokens = self.tail_demand(prefix[0], seq[0], swa_tail_len)
        return self._alloc(reqs, swa_tokens // self.page_size)

    def swa_available_size(self) -> int:
        """Tokens swa alone could take now (``arena.available_size("swa")``;
        docs/design.md §5 and §6).  Binding them also needs full ids and
        full's bytes: the gate is ``available_size``.

        Returns:
            Tokens.
        """
        return self.arena.available_size(SWA)


class _WithState(_Composite):
    """The calls of a composite with a state pool (``MambaHybrid``, ``TriPool``; docs/design.md §6)."""

    state_bytes: int  # one slot's bytes
    _token_entry_bytes: int  # the KV bytes one token takes, every token pool together

    def alloc_state(self, n: int = 1) -> list[int] | None:
        """``n`` state slots (state-pool virtual ids, FIFO), or None
        (docs/design.md §6 and §9, bug 6; docs/anchor.md §2: slots from the
        first page above the sink, and None rather than an assertion).

        On a shortfall, ``relieve(state_slots=n)`` without eviction, then
        one more try: the other side gives ground (flush, slide) before any
        eviction is considered (anchor bug 6).  None means no slot was
        taken; relief moves may have happened.

        Args:
            n: slots wanted, ``>= 0``.

        Returns:
            The slot ids, or None on a shortfall, with no slot taken.

        Raises:
            ValueError: ``n`` is not an int >= 0.

        post: __return__ is None or len(__return__) == n
        raises: ValueError
        """
        n = _count("alloc_state: n", n)
        ids = self.arena.alloc(STATE, n)
        if ids is None and self.relieve(state_slots=n):
            ids = self.arena.alloc(STATE, n)
        return ids

    def free_state(self, slots: Sequence[int]) -> None:
        """Free state slots (docs/design.md §6); an unknown, freed, repeated,
        sink (0) or out-of-range slot is a ``ValueError``, with nothing
        changed.  The state END frees as any END does (docs/design.md §4:
        an eager one compacts, a lazy one leaves holes).

        Args:
            slots: live state slots.

        Raises:
            ValueError: a slot that is not an int, unknown, freed, repeated,
                the sink or out of range; nothing has changed.

        post: all(p == 0 for p in self.translate(slots, "state"))
        raises: ValueError
        """
        slots = _ints("free_state: slots", slots)
        try:
            self.arena.free(STATE, slots)  # validates every slot before it changes anything
        except ValueError as e:
            raise ValueError(f"free_state: {e}") from None

    def state_available_size(self) -> int:
        """Slots the state pool could take now, without relief
        (``arena.available_size("state")``; docs/design.md §6).

        Returns:
            Slots.
        """
        return self.arena.available_size(STATE)

    def state_slot_token_cost(self) -> int:
        """Tokens one state slot displaces (docs/design.md §6; docs/anchor.md §3):
        ``ceil(state_bytes / per-token bytes of the KV a token takes)``.

        Returns:
            Tokens, ``ceil(state_bytes / (full_entry + swa_entry))`` for
                ``TriPool`` and ``ceil(state_bytes / full_entry)`` for ``MambaHybrid``.
        """
        return arith.cdiv(self.state_bytes, self._token_entry_bytes)


# -------------------------------------------------------------- composites


class HybridSWA(_WithSWA, _Composite):
    """Full + SWA KV: swa (up END) . full (down END), swa borrows full's ids.

    The two-pool SWA composite of docs/design.md §6; its signature is
    docs/design.md §10.

    Args:
        total_bytes: the buffer's size in bytes.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        swa_entry_bytes: bytes of one SWA token, across its layers.
        page_size: tokens per page of the KV pools.
        lazy: True or False for both ENDs, or the set of END names that free
            lazily (docs/design.md §4).
        policy: who slides the floats, ``"anchor"`` or ``"planner"``
            (docs/design.md §4b).

    Raises:
        ValueError: a bad configuration, as ``Arena`` refuses it, naming the pool.

    inv: self.verify() is None
    """

    CHAIN = (SWA, FULL)
    BORROW: ClassVar[dict[str, str]] = {SWA: FULL}

    def __init__(
        self,
        total_bytes: int,
        full_entry_bytes: int,
        swa_entry_bytes: int,
        page_size: int = 1,
        lazy: bool | Iterable[str] = False,
        policy: str = "anchor",
    ) -> None:
        pools = [SubPool(SWA, swa_entry_bytes, page_size, "up"), SubPool(FULL, full_entry_bytes, page_size, "down")]
        super().__init__(total_bytes, pools, page_size, lazy, policy)


class MambaHybrid(_WithState, _Composite):
    """Mamba state + full KV: state (up END, page_size 1) . full (down END).

    The two-pool state composite of docs/design.md §6; its signature is
    docs/design.md §10.  State slots are the state pool's own ids.

    Args:
        total_bytes: the buffer's size in bytes.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        state_bytes: bytes of one request's state slot.
        page_size: tokens per page of the KV pools.
        lazy: True or False for both ENDs, or the set of END names that free
            lazily (docs/design.md §4).
        policy: who slides the floats, ``"anchor"`` or ``"planner"``
            (docs/design.md §4b).

    Raises:
        ValueError: a bad configuration, as ``Arena`` refuses it, naming the pool.

    inv: self.verify() is None
    """

    CHAIN = (STATE, FULL)

    def __init__(
        self,
        total_bytes: int,
        full_entry_bytes: int,
        state_bytes: int,
        page_size: int = 1,
        lazy: bool | Iterable[str] = False,
        policy: str = "anchor",
    ) -> None:
        pools = [SubPool(STATE, state_bytes, 1, "up", "state"), SubPool(FULL, full_entry_bytes, page_size, "down")]
        super().__init__(total_bytes, pools, page_size, lazy, policy)
        self.state_bytes = state_bytes
        self._token_entry_bytes = full_entry_bytes


class TriPool(_WithSWA, _WithState, _Composite):
    """The seed's headline case: state (up END) . swa (float) . full (down END),
    swa borrows full's ids.  With its float empty it behaves exactly as the
    ``MambaHybrid`` of the same sizes (the golden identity).

    The three-pool composite of docs/design.md §6; its signature is
    docs/design.md §10.

    Args:
        total_bytes: the buffer's size in bytes.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        swa_entry_bytes: bytes of one SWA token, across its layers.
        state_bytes: bytes of one request's state slot.
        page_size: tokens per page of the KV pools.
        lazy: True or False for both ENDs, or the set of END names that free
            lazily (docs/design.md §4).
        policy: who slides the floats, ``"anchor"`` or ``"planner"``
            (docs/design.md §4b).

    Raises:
        ValueError: a bad configuration, as ``Arena`` refuses it, naming the pool.

    inv: self.verify() is None
    """

    CHAIN = (STATE, SWA, FULL)
    BORROW: ClassVar[dict[str, str]] = {SWA: FULL}

    def __init__(
        self,
        total_bytes: int,
        full_entry_bytes: int,
        swa_entry_bytes: int,
        state_bytes: int,
        page_size: int = 1,
        lazy: bool | Iterable[str] = False,
        policy: str = "anchor",
    ) -> None:
        pools = [
            SubPool(STATE, state_bytes, 1, "up", "state"),
            SubPool(SWA, swa_entry_bytes, page_size, "float"),
            SubPool(FULL, full_entry_bytes, page_size, "down"),
        ]
        super().__init__(total_bytes, pools, page_size, lazy, policy)
        self.state_bytes = state_bytes
        self._token_entry_bytes = full_entry_bytes + swa_entry_bytes
