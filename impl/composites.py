"""The token-level composites on torch: ``HybridSWA``, ``MambaHybrid``, ``TriPool``.

docs/design.md §6; docs/anchor.md §1 to §3.  Same behaviour as
``kvarena.spec.composites`` token for token and page for page (the
differential tests hold the two equal), written independently over tensors:
this module never imports the spec's composites.

=============  =========================================  =====================
composite      chain (low bytes -> high)                  ids
=============  =========================================  =====================
``HybridSWA``  swa (up END) . full (down END)             swa borrows full's
``MambaHybrid`` state (up END, page_size 1) . full (down)  state slots: own ids
``TriPool``    state (up END) . swa (float) . full (down)  swa borrows full's
=============  =========================================  =====================

A **token id** is ``vpage*ps + offset`` in full's id space; swa borrows those
ids (``borrow={"swa": "full"}``).  A batch that needs ``n`` new pages takes
``n`` ids from full's FIFO and binds the *same* ids in swa, full first, in
one ``arena.bind_with_borrowers("full", n)``.  One gate decides beforehand,
from host counters, whether both binds succeed (the joint view below), so a
refusal never leaves one side allocated, and the bind checks nothing again.

**The arena seam.**  A composite calls only the arena's public methods:
the per-pool calls (``alloc``, ``free``, ``flush``, the views, ...), and for
its own needs ``counts`` (a band's host counts, a copy), ``id_end`` and
``v2p_at`` (table reads into new tensors), ``bind_with_borrowers`` and
``new_memo``.  Nothing it is handed writes the arena.

**Host syncs.**  The per-step path is ``alloc_decode`` + ``free_swa`` +
``translate``.  ``translate`` on a tensor is sync-free.  ``alloc_extend``,
``alloc_decode`` and ``free_swa`` each make exactly one documented host read
per call (``_host_read``, marked ``# SYNC:``): a handful of ints stacked into
one small tensor, holding the count the call needs on the host (the batch's
new-page count, which sizes the allocation; for ``alloc_extend`` also the
output length; for ``free_swa`` the number of live swa entries to free,
which sizes the hole list) and the count of invalid inputs, so validation
costs no extra round trip.  Only an error (which raises) reads more, to name
the bad input, and only a shortfall does more (the relief ladder's flushes
and slides are the arena's cold paths, which read the tables).  ``free``, ``free_state``, ``relieve`` and ``verify`` are
cold paths and read the host freely.

**The joint view** (``available_size``) is the largest ``P`` (pages) whose
coupled bind succeeds now without relief, from host ints only:

* ``MambaHybrid``: full's own view (``end_available`` against the state
  END's high frontier); binding tokens touches only full.
* ``HybridSWA``: a closed form over the two ENDs sharing one gap; see
  ``HybridSWA._joint_pages``.
* ``TriPool``: a binary search over a monotone O(1) predicate that mirrors
  both bands' gates (each band's ``available_pages``, what ``alloc`` would
  check); see ``TriPool._joint_pages``.

It is memoised on the arena's clock (every band's capacity fields tick it,
and a tick empties the memo), in the composite's own ``Memo`` (the arena's
``verify`` recomputes every entry of *its* memo by view name, and knows no
composite view); ``verify`` checks the composite memo against a fresh
computation.

**The trusted decode path.**  ``alloc_decode``, ``free_swa`` and
``translate`` take ``check=False`` for a scheduler that already guarantees
its input (the composite's ``Arena.alloc(check=False)``): the inputs are 1-D
int64 tensors on the arena's device and valid as each call states; the
state, the result and the one host read are the checked call's, without the
argument checks and the batch validation.  Both ``alloc_decode`` paths
share the rule for which requests open a page and how their slots are
laid out (``_opens_page``, ``_decode_slots``).  Bad input there is
undefined behaviour.  The checked path stays the default.
"""

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, NoReturn, SupportsIndex, cast

import torch

from kvarena.spec.evict import MAX_EVICT_ROUNDS, evicted
from kvarena.spec.geometry import AccountingError, SubPool

from . import capacity as cap
from . import kernels as launches
from .arena import Arena, Mover
from .band import I64, live_once

HOST_INTS = 64  # a decode batch up to this many requests: its host copy is reduced as Python ints

try:  # the decode step's host count (``_host_decode_pages``); Linux installs numpy for Triton's interpreter
    import numpy as _np
except ImportError:  # elsewhere torch counts
    _np = None  # type: ignore[assignment]

# What a batch argument may be: a tensor, or an ordered sequence of ints.
IntsLike = torch.Tensor | Sequence[int]

FULL, SWA, STATE = "full", "swa", "state"

__all__ = ["HybridSWA", "MambaHybrid", "TriPool", "swa_window_end"]


def _cdiv(a: int, b: int) -> int:
    return -((-a) // b)


def _host_read(t: torch.Tensor) -> list[int]:
    """The one documented host read of a call: a small 1-D int64 tensor to a list.

    SYNC: every hot-path call funnels its single device-to-host read through
    here (``tests/impl/test_host_sync.py`` counts the calls)."""
    return t.tolist()  # SYNC: the one documented read per call


# ------------------------------------------------------------- arguments


def _host_vec(x: IntsLike) -> torch.Tensor:
    """An engine's host copy as an int64 CPU tensor (never a device read:
    a copy must already be on the host)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError(f"a host copy must be a CPU tensor, got one on {x.device}")
        return x if x.dtype == I64 else x.to(I64)
    return torch.tensor(list(x), dtype=I64)


def _host_extend_size(
    prefix_cpu: IntsLike,
    seq_cpu: IntsLike,
    ps: int,
    lengths: tuple[int, int, int],
    extend_num_tokens: int | None,
    most: int,
) -> tuple[int, int]:
    """New pages and tokens of an extend, from the engine's host copies.

    The trusted path's bad input is still a ``ValueError``, in the spec's
    words, raised before anything changes: what the host copies show (their
    lengths against the device tensors' ``lengths``, a negative prefix, a
    negative extend, a length no arena could hold, ``extend_num_tokens``)
    is checked here on the host, with no device read."""
    p, s = _host_vec(prefix_cpu), _host_vec(seq_cpu)
    _host_lengths("alloc_extend", {"prefix_lens": (p, lengths[0]), "seq_lens": (s, lengths[1])})
    if len(set(lengths)) > 1 or bool(((p < 0) | (s < p) | (s > most)).any()):  # host tensors: no device read
        _explain_host_extend(p, s, lengths, extend_num_tokens, most)
    total = int((s - p).sum())  # every request in [0, most]: the sum cannot wrap
    if extend_num_tokens is not None and _int("alloc_extend: extend_num_tokens", extend_num_tokens) != total:
        raise ValueError(f"alloc_extend: extend_num_tokens {extend_num_tokens} != {total} tokens asked")
    return int((_cdiv_t(s, ps) - _cdiv_t(p, ps)).sum()), total


def _host_decode_pages(seq_cpu: IntsLike, ps: int, lengths: tuple[int, int], most: int) -> int:
    """Pages a decode step opens, from the engine's host copy of ``seq_lens``;
    its bad input (a length below 1 or no arena could hold, lengths that
    differ) a ``ValueError`` in the spec's words, from the host alone."""
    s = _host_vec(seq_cpu)
    _host_lengths("alloc_decode", {"seq_lens": (s, lengths[0])})
    # A host tensor (no device read), reduced where it is cheapest: a short batch as Python ints, a
    # longer one through numpy (half torch's dispatch cost on a host tensor), else torch.
    if s.numel() <= HOST_INTS:
        seq = s.tolist()
        lo, hi = min(seq, default=1), max(seq, default=1)
        opens = sum(1 for v in seq if v % ps == 1 % ps)
    elif _np is not None:
        a = s.numpy()
        lo, hi = int(a.min()), int(a.max())
        opens = int(_np.count_nonzero(a % ps == 1 % ps))
    else:
        bounds = torch.aminmax(s)
        lo, hi = int(bounds.min), int(bounds.max)
        opens = int((torch.remainder(s, ps) == 1 % ps).sum())
    if lengths[0] != lengths[1] or lo < 1 or hi > most:
        _explain_host_decode(s, lengths, most)
    return opens


def _host_lengths(what: str, copies: dict[str, tuple[torch.Tensor, int]]) -> None:
    """Each host copy holds as many entries as its device tensor (a shape)."""
    for name, (host, n) in copies.items():
        if host.numel() != n:
            raise ValueError(f"{what}: {name}_cpu has {host.numel()} entries, {name} {n}")


def _length_mismatch(what: str, lengths: tuple[int, int, int]) -> ValueError:
    p, s, loc = lengths
    return ValueError(f"{what}: length mismatch: {p} prefix_lens, {s} seq_lens, {loc} last_loc")


def _too_long(what: str, i: int, s: int, most: int) -> ValueError:
    return ValueError(f"{what}: request {i}: seq_len {s} is more than the {most} tokens this arena could ever hold")


def _explain_host_extend(
    p: torch.Tensor, s: torch.Tensor, lengths: tuple[int, int, int], extend_num_tokens: int | None, most: int
) -> NoReturn:
    """Error path only: the spec's first complaint about these host copies."""
    what = "alloc_extend"
    prefix, seq = p.tolist(), s.tolist()  # host tensors: no device read
    asked = sum(seq) - sum(prefix)
    if extend_num_tokens is not None and _int(f"{what}: extend_num_tokens", extend_num_tokens) != asked:
        raise ValueError(f"{what}: extend_num_tokens {extend_num_tokens} != {asked} tokens asked")
    if len(set(lengths)) > 1:
        raise _length_mismatch(what, lengths)
    for i, (a, b) in enumerate(zip(prefix, seq)):
        if a < 0:
            raise ValueError(f"{what}: request {i}: prefix_len {a} < 0")
        if b > most:
            raise _too_long(what, i, b, most)
        if b < a:
            raise ValueError(f"{what}: request {i}: seq_len {b} < prefix_len {a}")
    raise AssertionError("_explain_host_extend: no bad input found")


def _explain_host_decode(s: torch.Tensor, lengths: tuple[int, int], most: int) -> NoReturn:
    """Error path only: the spec's first complaint about this host copy."""
    what = "alloc_decode"
    seq = s.tolist()  # a host tensor: no device read
    for i, v in enumerate(seq):
        if v < 1:
            raise ValueError(f"{what}: request {i}: seq_len must be >= 1, got {v}")
    if lengths[0] != lengths[1]:
        raise _length_mismatch(what, (lengths[0], lengths[0], lengths[1]))
    for i, v in enumerate(seq):
        if v > most:
            raise _too_long(what, i, v, most)
    raise AssertionError("_explain_host_decode: no bad input found")


def _int(what: str, v: SupportsIndex) -> int:
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


def _count(what: str, v: SupportsIndex) -> int:
    v = _int(what, v)
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v}")
    return v


def swa_window_end(seq_len: int, window: int, page_size: int) -> int:
    """Token position below which a request's SWA pages may be freed (docs/design.md §6).

    The anchor's rule (docs/anchor.md §2): ``floor_to_page(seq_len - window -
    page_size)``, clamped at 0.  Each step a scheduler calls
    ``free_swa(tokens[done:end], start_pos=done)`` with ``end =
    swa_window_end(...)`` whenever ``end > done``; both ends are page-aligned.

    Args:
        seq_len: the request's length in tokens, at least 0.
        window: the engine's window (the model's ``sliding_window - 1``), at least 0.
        page_size: tokens per page, at least 1.

    Returns:
        The position, a multiple of ``page_size``, at least 0.

    Raises:
        ValueError: an argument is not an int, ``seq_len`` or ``window`` is
            negative, or ``page_size`` is below 1.
    """
    seq_len = _count("swa_window_end: seq_len", seq_len)
    window = _count("swa_window_end: window", window)
    page_size = _int("swa_window_end: page_size", page_size)
    if page_size < 1:
        raise ValueError(f"swa_window_end: page_size must be >= 1, got {page_size}")
    edge = seq_len - window - page_size
    return edge // page_size * page_size if edge > 0 else 0


# ------------------------------------------------------------ the common part


def _tail_pages(prefix_len: int, seq_len: int, swa_tail_len: int, ps: int) -> int:
    """``capacity.swa_tail_pages`` of one request, its lengths checked in the
    spec's words (``tail_demand``)."""
    prefix_len, seq_len = _count("prefix_len", prefix_len), _count("seq_len", seq_len)
    tail = _count("swa_tail_len", swa_tail_len)
    if not (prefix_len <= seq_len and tail <= seq_len - prefix_len):
        raise ValueError(
            f"alloc_extend_swa_tail: swa_tail_len {tail} is not within the {seq_len - prefix_len} new tokens "
            f"(prefix_len {prefix_len}, seq_len {seq_len})"
        )
    return cap.swa_tail_pages(prefix_len, seq_len, tail, ps)


def _live_token(v2p: Sequence[int] | Mapping[int, int], t: int, ps: int, what: str, pages: int | None = None) -> None:
    """Raise, in the spec's words, unless token ``t`` lies in a live page of
    ``v2p`` (a host list, or the rows read as a mapping with the table's
    length ``pages``): the batch calls' error path and ``free``'s check."""
    page = t // ps
    pages = len(v2p) if pages is None else pages
    if t < 0:
        raise ValueError(f"{what} {t} names no token (-1 is the empty-prefix sentinel)")
    if page == 0:
        raise ValueError(f"{what} {t} lies in page 0, the sink, which is never allocated")
    if page >= pages:
        raise ValueError(f"{what} {t} is out of range: page {page} >= {pages} pages")
    if v2p[page] < 0:
        raise ValueError(f"{what} {t} is not allocated (page {page} is unknown or already freed)")


class _Composite:
    """What every composite shares: token allocation, free, views, relief (docs/design.md §6)."""

    CHAIN: ClassVar[tuple[str, ...]] = ()
    BORROW: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        total_bytes: int,
        pools: list[SubPool],
        page_size: int,
        lazy: bool,
        policy: str,
        device: str | torch.device,
        buffer: torch.Tensor | None = None,
        mover: Mover | None = None,
        kernels: str | None = None,
    ) -> None:
        self.arena = Arena(
            total_bytes,
            pools,
            lazy=lazy,
            policy=policy,
            borrow=dict(self.BORROW) or None,
            device=device,
            buffer=buffer,
            mover=mover,
            kernels=kernels,
        )
        self.page_size = page_size
        self.device = self.arena.device
        self._memo = self.arena.new_memo()  # the arena's clock: any band's change empties it
        self._joint_key = ("joint_pages", type(self).__name__)
        self._owner: torch.Tensor | None = None  # the checked decode's scratch (_owner_table)
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # its request rows (_request_rows)
        self._id_end = {name: self.arena.id_end(name) for name in self.CHAIN}  # fixed at boot: read per step
        g = self.arena.geometry(FULL)
        self._max_tokens = (g.num_pages - g.min_page) * page_size  # the longest request any arena state holds
        self.verify()

    def _has(self, name: str) -> bool:
        return name in self.CHAIN

    def _floats(self) -> list[str]:
        return list(self.CHAIN[1:-1])

    # ------------------------------------------------------ input tensors

    def _vec(self, what: str, x: IntsLike) -> torch.Tensor:
        """A 1-D int64 tensor on the arena's device (a tensor, or any ordered
        sequence of ints: list, tuple, range, array; not a string, set or mapping)."""
        if isinstance(x, torch.Tensor):
            if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
                raise ValueError(f"{what} must hold ints, got dtype {x.dtype}")
            return (x if x.dim() == 1 else x.reshape(-1)).to(self.device, I64)  # a 1-D tensor: no view dispatched
        if isinstance(x, (str, bytes, set, frozenset, dict)) or not hasattr(x, "__len__"):
            raise ValueError(f"{what} must be a tensor or a sequence of ints, got {type(x).__name__}")
        vals = [_int(f"{what}[{i}]", v) for i, v in enumerate(x)]
        if any(not -(2**63) <= v < 2**63 for v in vals):  # on the host: a device error is not bad input
            raise ValueError(f"{what}: value out of int64 range")
        return torch.tensor(vals, dtype=I64, device=self.device)

    # --------------------------------------------------- the joint view

    def _joint_pages(self, state_ext: int = 0) -> int:
        """The largest ``P`` whose coupled bind succeeds now, without relief,
        with the state END's frontier first advanced by ``state_ext`` pages."""
        raise NotImplementedError

    def _state_ext(self, state_slots: int) -> int:
        """Pages ``state_slots`` new slots extend the state END by: what its
        lazy holes do not cover."""
        return max(0, state_slots - self.arena.counts(STATE).holes)

    def joint_pages(self) -> int:
        """The joint view in pages, memoised on the arena's clock: a hit is
        one dict lookup (docs/design.md §5, §6).

        Returns:
            The largest ``P`` whose coupled bind succeeds now, without relief.
        """
        try:
            return self._memo.cache[self._joint_key]
        except KeyError:
            return self._memo.put(*self._joint_key, self._joint_pages(0))

    def available_size(self) -> int:
        """The joint view, in tokens (docs/design.md §6; anchor bug 7): the
        largest ``n`` for which ``alloc_extend([0], [n], [-1])`` succeeds now
        without relief.  It can be below the ``min`` of the per-component
        views: each of those assumes the shared gap is its own.

        Returns:
            The tokens, a multiple of ``page_size``.
        """
        return self.joint_pages() * self.page_size

    def full_available_size(self) -> int:
        """Full's own view in tokens: ``arena.available_size("full")`` (docs/design.md §5, §6).

        Returns:
            The tokens.
        """
        return self.arena.available_size(FULL)

    def fits(self, tokens: int = 0, state_slots: int = 0, swa_tokens: int | None = None) -> bool:
        """Would ``state_slots`` slots and then one request of ``tokens`` new
        tokens (empty prefix) both succeed now, without relief?  Host ints
        only, nothing changes.

        ``swa_tokens`` (the uneven demand, docs/design.md §11): full binds
        ``P_f = cdiv(tokens, ps)`` new pages and swa only the last ``P_s =
        cdiv(swa_tokens, ps)`` of those ids; None means ``tokens``.  It must
        be ``<= tokens``; a composite without swa takes only None, 0 or
        ``tokens`` (docs/design.md §6).

        Args:
            tokens: new tokens of the one request.
            state_slots: state slots first (a composite with a state pool).
            swa_tokens: of those tokens, how many swa binds; None for all.

        Returns:
            Whether both would succeed.

        Raises:
            ValueError: a count is not an int >= 0, ``state_slots`` without a
                state pool, or ``swa_tokens`` against the rule above (the spec's
                rule and words).
        """
        tokens, state_slots = self._demand_args("fits", tokens, state_slots)
        if swa_tokens is None:  # the coupled demand: no further call on the hot path
            return self._fits(tokens, state_slots)
        return self._fits(tokens, state_slots, self._swa_arg("fits", tokens, swa_tokens))

    def _fits(self, tokens: int, state_slots: int, swa_tokens: int | None = None) -> bool:
        need = _cdiv(tokens, self.page_size)
        if swa_tokens is None:  # the coupled demand: the memoised joint view
            if not state_slots:
                return need <= self.joint_pages()
            if state_slots > self.arena.available_pages(STATE):
                return False
            return need <= self._joint_pages(self._state_ext(state_slots))
        ext = 0
        if state_slots:
            if state_slots > self.arena.available_pages(STATE):
                return False
            ext = self._state_ext(state_slots)
        return self._uneven_fits(need, _cdiv(swa_tokens, self.page_size), ext)

    def _uneven_fits(self, full_pages: int, swa_pages: int, state_ext: int = 0) -> bool:
        """Does a bind of ``full_pages`` in full, then ``swa_pages`` of those
        ids in swa, pass every gate, with the state END's frontier first
        advanced by ``state_ext`` pages?  O(1), host ints.  Without swa (the
        base case): full's view alone."""
        return full_pages <= self._joint_pages(state_ext)

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

    def _kept_pages(self, tokens: int, swa_tokens: int | None, state_ext: int = 0) -> int:
        """The largest ``K <= P_f`` whose bind passes when both sides shed
        pages together (swa binding ``max(0, P_s - (P_f - K))``): the
        spec's ``_kept_pages``.  Coupled: ``min(P_f, joint view)``.  A
        binary search over the O(1) gate (down-closed in ``K``); cold path."""
        pf = _cdiv(tokens, self.page_size)
        if swa_tokens is None:
            return min(pf, self._joint_pages(state_ext) if state_ext else self.joint_pages())
        p_s = _cdiv(swa_tokens, self.page_size)
        lo, hi = 0, pf
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._uneven_fits(mid, max(0, p_s - (pf - mid)), state_ext):
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ------------------------------------------------------ the coupled bind

    def _take_pages(self, n: int, slots: launches.Slots | None = None, swa_n: int | None = None) -> torch.Tensor | None:
        """Gate and bind ``n`` new pages: an int64 id tensor, or None with no
        id allocated on any side (relief moves may have happened).  The
        joint gate is the one gate: it priced every band the bind touches,
        so the bind itself checks nothing again.  ``slots``: the call's
        slot work, fused into the bind's launch (Triton kernels).
        ``swa_n``: swa binds only the last ``swa_n`` ids (the uneven demand's
        gate, ``_uneven_fits``); None: all of them."""
        if n == 0 and slots is None:
            return torch.empty(0, dtype=I64, device=self.device)
        if swa_n is None:
            if n > self.joint_pages():
                self.relieve(tokens=n * self.page_size)
                if n > self.joint_pages():
                    return None
            return self.arena.bind_with_borrowers(FULL, n, slots)
        if not self._uneven_fits(n, swa_n):
            self.relieve(tokens=n * self.page_size, swa_tokens=swa_n * self.page_size)
            if not self._uneven_fits(n, swa_n):
                return None
        return self.arena.bind_with_borrowers(FULL, n, slots, tail=swa_n)

    def _fused(self) -> bool:
        return self.arena.kernels == "triton"

    def _bind_slots(self, n: int, slots: launches.Slots, swa_n: int | None = None) -> torch.Tensor | None:
        """The bind and its slot work in one launch (Triton kernels): the slots, or None."""
        return None if self._take_pages(n, slots, swa_n) is None else slots.slots

    # ----------------------------------------------------- allocation

    def _request_flags(self, prefix: torch.Tensor, seq: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """How many requests are invalid, as a 0-dim int64 tensor (sync-free): the
        checks of ``_explain``, vectorised; ``_explain`` names the first."""
        ps = self.page_size
        end = self._id_end[FULL]
        page = torch.div(loc, ps, rounding_mode="floor")
        ok_idx = (loc >= 0) & (page >= 1) & (page < end)
        row = self.arena.v2p_at(FULL, torch.where(ok_idx, page, end))
        live = ok_idx & (row >= 0)
        empty = prefix == 0
        aligned = torch.remainder(loc, ps) == torch.remainder(prefix - 1, ps)
        fits_ever = seq <= self._max_tokens  # before any sum can overflow
        good = (prefix >= 0) & (seq >= prefix) & fits_ever & torch.where(empty, loc == -1, live & aligned)
        bad = (~good).to(I64)
        # Two requests may not continue the same partly filled page.
        cont = (~empty) & (torch.remainder(prefix, ps) != 0) & (seq > prefix) & live
        idx = torch.arange(prefix.numel(), dtype=I64, device=self.device)
        key = torch.sort(torch.where(cont, page, -1 - idx)).values
        dup = (key[1:] == key[:-1]) & (key[1:] > 0)
        return bad.sum() + dup.to(I64).sum()

    def _explain(self, what: str, prefix: torch.Tensor, seq: torch.Tensor, loc: torch.Tensor) -> NoReturn:
        """Error path only: name the first bad request (host reads)."""
        ps = self.page_size
        if what == "alloc_decode":
            for i, s in enumerate(seq.tolist()):  # SYNC: error path only, about to raise
                if s < 1:
                    raise ValueError(f"{what}: request {i}: seq_len must be >= 1, got {s}")
        v2p = self.arena.v2p(FULL).tolist()  # SYNC: error path only, about to raise
        continued: dict[int, int] = {}
        rows = zip(prefix.tolist(), seq.tolist(), loc.tolist())  # SYNC: error path only, about to raise
        for i, (p, s, last) in enumerate(rows):
            if p < 0:
                raise ValueError(f"{what}: request {i}: prefix_len {p} < 0")
            if s < p:
                raise ValueError(f"{what}: request {i}: seq_len {s} < prefix_len {p}")
            if s > self._max_tokens:
                raise ValueError(
                    f"{what}: request {i}: seq_len {s} is more than the "
                    f"{self._max_tokens} tokens this arena could ever hold"
                )
            if p == 0:
                if last != -1:
                    raise ValueError(f"{what}: request {i}: empty prefix needs last_loc -1, got {last}")
                continue
            _live_token(v2p, last, ps, f"{what}: request {i}: last_loc")
            if last % ps != (p - 1) % ps:
                raise ValueError(
                    f"{what}: request {i}: last_loc {last} is at offset {last % ps} of its page, "
                    f"but position {p - 1} belongs at offset {(p - 1) % ps}"
                )
            if p % ps and s > p:
                if last // ps in continued:
                    raise ValueError(
                        f"{what}: requests {continued[last // ps]} and {i} both continue page {last // ps}"
                    )
                continued[last // ps] = i
        raise ValueError(f"{what}: invalid batch")

    def _same_length(self, what: str, prefix: torch.Tensor, seq: torch.Tensor, loc: torch.Tensor) -> None:
        if not prefix.numel() == seq.numel() == loc.numel():
            raise ValueError(
                f"{what}: length mismatch: {prefix.numel()} prefix_lens, {seq.numel()} seq_lens, {loc.numel()} last_loc"
            )

    def alloc_extend(
        self,
        prefix_lens: IntsLike,
        seq_lens: IntsLike,
        last_loc: IntsLike,
        check: bool = True,
        *,
        prefix_lens_cpu: IntsLike | None = None,
        seq_lens_cpu: IntsLike | None = None,
        extend_num_tokens: int | None = None,
    ) -> torch.Tensor | None:
        """Slots for positions ``[prefix_i, seq_i)`` of each request, flat and
        request-major (int64 tensor), or None.  docs/anchor.md §1 to the slot:
        request ``i`` takes ``ceil(seq/ps) - ceil(prefix/ps)`` new pages, in
        batch order from one coupled bind; its slots are (1) ``last_loc+1,
        ...`` continuing its partly filled page for ``min(seq,
        ceil(prefix/ps)*ps) - prefix`` tokens, then (2) whole new pages and
        (3) a partly filled tail page, slot ``page*ps + pos % ps``.
        A shortfall runs ``relieve(tokens=n*ps)`` (no eviction) and asks
        again; None then means no id was allocated on any side.

        The host copies (``prefix_lens_cpu``, ``seq_lens_cpu`` on the host,
        ``extend_num_tokens``) are what an engine already holds.  Checked,
        the call's one read also checks they agree with the device tensors.
        ``check=False`` is the trusted path (the arguments are ones the
        checked call accepts, as 1-D int64 tensors on the arena's device):
        with both host copies it reads nothing from the device, and checks
        what they show on the host (the spec's ``ValueError`` for lengths
        that differ, a negative prefix, ``seq < prefix``, a length no arena
        could hold, a wrong ``extend_num_tokens``; the rest, ``last_loc``,
        is trusted) (docs/design.md §6, §8).  One ``atomic()`` scope:
        relief, bind and slots (docs/design.md §9c).

        Args:
            prefix_lens: each request's cached prefix, in tokens.
            seq_lens: each request's length after the extend.
            last_loc: each request's slot at position ``prefix - 1``; ``-1``
                for an empty prefix.
            check: False for the trusted path.
            prefix_lens_cpu: the engine's host copy of ``prefix_lens``.
            seq_lens_cpu: the engine's host copy of ``seq_lens``.
            extend_num_tokens: the engine's count of tokens asked (``sum(seq - prefix)``).

        Returns:
            The slots, or None on a shortfall relief could not cover.

        Raises:
            ValueError: bad input (negative or mismatched lengths, ``seq <
                prefix``, a ``last_loc`` that is not the live slot of position
                ``prefix - 1``, two requests continuing one page) or host copies
                that disagree; nothing changed.
        """
        return self._extend(
            "alloc_extend", prefix_lens, seq_lens, last_loc, check, prefix_lens_cpu, seq_lens_cpu, extend_num_tokens
        )

    def _extend(
        self,
        what: str,
        prefix_lens: IntsLike,
        seq_lens: IntsLike,
        last_loc: IntsLike,
        check: bool,
        prefix_lens_cpu: IntsLike | None,
        seq_lens_cpu: IntsLike | None,
        extend_num_tokens: int | None,
        swa_tail_len: int | None = None,
    ) -> torch.Tensor | None:
        """``alloc_extend``'s body; with ``swa_tail_len`` (one request),
        ``alloc_extend_swa_tail``'s: swa binds only the new pages that hold
        the tail (``tail_demand``), and the request's two lengths join the
        call's one read."""
        tail = swa_tail_len is not None
        if not check:
            prefix, seq, loc = (cast(torch.Tensor, x) for x in (prefix_lens, seq_lens, last_loc))
            if tail and prefix.numel() != 1:
                raise ValueError(f"{what}: one request at a time, got {prefix.numel()} prefix_lens")
            host = prefix_lens_cpu is not None and seq_lens_cpu is not None
            if prefix_lens_cpu is not None and seq_lens_cpu is not None:  # checked on the host first
                lengths = (prefix.numel(), seq.numel(), loc.numel())  # shapes: no read
                n, total = _host_extend_size(
                    prefix_lens_cpu, seq_lens_cpu, self.page_size, lengths, extend_num_tokens, self._max_tokens
                )
            new = _cdiv_t(seq, self.page_size) - _cdiv_t(prefix, self.page_size)
            lens = seq - prefix
            if not host:
                # SYNC: the one documented read without host copies: pages to bind, tokens out (and the lengths).
                n, total, *one = _host_read(torch.stack([new.sum(), lens.sum(), *self._lengths(tail, prefix, seq)]))
            elif tail:
                one = [int(_host_vec(cast(IntsLike, c))[0]) for c in (prefix_lens_cpu, seq_lens_cpu)]
        else:
            prefix = self._vec(f"{what}: prefix_lens", prefix_lens)
            seq = self._vec(f"{what}: seq_lens", seq_lens)
            loc = self._vec(f"{what}: last_loc", last_loc)
            if tail and prefix.numel() != 1:
                raise ValueError(f"{what}: one request at a time, got {prefix.numel()} prefix_lens")
            self._same_length(what, prefix, seq, loc)
            new = _cdiv_t(seq, self.page_size) - _cdiv_t(prefix, self.page_size)  # new pages per request
            lens = seq - prefix
            bad = self._request_flags(prefix, seq, loc)
            copies = self._copy_flags(what, {"prefix_lens": (prefix, prefix_lens_cpu), "seq_lens": (seq, seq_lens_cpu)})
            # SYNC: the one documented read: pages to bind, tokens out, bad requests, disagreeing host copies.
            n, total, n_bad, n_off, *one = _host_read(
                torch.stack([new.sum(), lens.sum(), bad, copies, *self._lengths(tail, prefix, seq)])
            )
            if n_bad:
                self._explain(what, prefix, seq, loc)
            if n_off or (
                extend_num_tokens is not None and _int(f"{what}: extend_num_tokens", extend_num_tokens) != total
            ):
                self._explain_copies(what, {"prefix_lens": (prefix, prefix_lens_cpu), "seq_lens": (seq, seq_lens_cpu)})
                raise ValueError(f"{what}: extend_num_tokens {extend_num_tokens} != {total} tokens asked")
        swa_n = _tail_pages(one[0], one[1], cast(int, swa_tail_len), self.page_size) if tail else None
        with self.arena.atomic():  # relief, bind and slots: all or nothing
            if self._fused():
                return self._bind_slots(n, self._extend_slots(prefix, seq, loc, total), swa_n)
            ids = self._take_pages(n, swa_n=swa_n)
            return None if ids is None else self._slots(prefix, seq, loc, new, lens, ids, total)

    @staticmethod
    def _lengths(tail: bool, prefix: torch.Tensor, seq: torch.Tensor) -> list[torch.Tensor]:
        """The one request's two lengths, for a tail's read (none otherwise)."""
        return [prefix.sum(), seq.sum()] if tail else []

    def _extend_slots(self, prefix: torch.Tensor, seq: torch.Tensor, loc: torch.Tensor, total: int) -> launches.Slots:
        out = torch.empty(total, dtype=I64, device=self.device)
        return launches.ExtendSlots(prefix.contiguous(), seq.contiguous(), loc.contiguous(), self.page_size, out)

    def _decode_slots_fused(self, seq: torch.Tensor, loc: torch.Tensor) -> launches.Slots:
        out = torch.empty(seq.numel(), dtype=I64, device=self.device)
        return launches.DecodeSlots(seq.contiguous(), loc.contiguous(), self.page_size, out)

    def _copy_flags(self, what: str, pairs: dict[str, tuple[torch.Tensor, IntsLike | None]]) -> torch.Tensor:
        """How many entries of the given host copies disagree with their
        device tensors (a 0-dim int64 tensor, sync-free; a wrong length
        raises at once, the lengths being shapes)."""
        off = torch.zeros((), dtype=I64, device=self.device)
        for name, (dev, host) in pairs.items():
            if host is None:
                continue
            h = self._vec(f"{what}: {name}_cpu", host)
            if h.numel() != dev.numel():
                raise ValueError(f"{what}: {name}_cpu has {h.numel()} entries, {name} {dev.numel()}")
            off = off + (h != dev).sum()
        return off

    def _explain_copies(self, what: str, pairs: dict[str, tuple[torch.Tensor, IntsLike | None]]) -> None:
        """Error path only: name the first host copy that disagrees."""
        for name, (dev, host) in pairs.items():
            if host is None:
                continue
            h = self._vec(f"{what}: {name}_cpu", host).tolist()  # SYNC: error path only, about to raise
            if h != dev.tolist():
                raise ValueError(f"{what}: {name}_cpu {h} disagrees with {name} {dev.tolist()}")

    def _slots(
        self,
        prefix: torch.Tensor,
        seq: torch.Tensor,
        loc: torch.Tensor,
        new: torch.Tensor,
        lens: torch.Tensor,
        ids: torch.Tensor,
        total: int,
    ) -> torch.Tensor:
        """Request-major slots of a bound batch, vectorised (no loop)."""
        ps, dev = self.page_size, self.device
        nreq = prefix.numel()
        req = torch.repeat_interleave(torch.arange(nreq, dtype=I64, device=dev), lens, output_size=total)
        first = torch.cumsum(lens, 0) - lens  # output offset of each request
        base = torch.cumsum(new, 0) - new  # first new page of each request, in ``ids``
        cont = torch.minimum(seq, _cdiv_t(prefix, ps) * ps) - prefix  # part (1) lengths
        j = torch.arange(total, dtype=I64, device=dev) - first.index_select(0, req)
        pos = prefix.index_select(0, req) + j
        c = cont.index_select(0, req)
        in_cont = j < c
        k = ids.numel()
        q = base.index_select(0, req) + torch.div(j - c, ps, rounding_mode="floor")
        q = torch.where(in_cont, k, q)  # continuing tokens index a dummy row
        pages = torch.cat([ids, ids.new_zeros(1)]).index_select(0, q)
        return torch.where(in_cont, loc.index_select(0, req) + 1 + j, pages * ps + torch.remainder(pos, ps))

    def alloc_decode(
        self, seq_lens: IntsLike, last_loc: IntsLike, check: bool = True, *, seq_lens_cpu: IntsLike | None = None
    ) -> torch.Tensor | None:
        """One slot per request, for position ``seq_i - 1`` (int64 tensor), or
        None: a new page iff ``seq % ps == 1`` (ps = 1: always), else
        ``last_loc + 1``.  ``seq_lens`` >= 1.  Shortfalls as ``alloc_extend``.

        ``check=False``: the trusted decode path.  ``seq_lens`` and
        ``last_loc`` are 1-D int64 tensors on the arena's device, of one
        length, that the checked call would accept (``last_loc`` the live
        token at position ``seq - 2``, or ``-1`` when ``seq`` is 1; no two
        requests continue one page).  Same slots and state; with
        ``seq_lens_cpu`` (the engine's host copy) it reads nothing from the
        device, and a host copy that shows bad input (lengths that differ,
        ``seq < 1``, a length no arena could hold) is the spec's
        ``ValueError`` all the same; without it, one read.  Checked, the one
        read also checks the host copy agrees (docs/design.md §6, §8).

        Args:
            seq_lens: each request's length after this step, at least 1.
            last_loc: each request's slot at position ``seq - 2``; ``-1`` when ``seq`` is 1.
            check: False for the trusted decode path.
            seq_lens_cpu: the engine's host copy of ``seq_lens``.

        Returns:
            The slots, or None on a shortfall relief could not cover.

        Raises:
            ValueError: bad input (mismatched lengths, ``seq < 1``, a
                ``last_loc`` that is not the live slot of position ``seq - 2``,
                two requests continuing one page) or a host copy that
                disagrees; nothing changed.
        """
        if not check:
            return self._decode_trusted(cast(torch.Tensor, seq_lens), cast(torch.Tensor, last_loc), seq_lens_cpu)
        what = "alloc_decode"
        seq = self._vec(f"{what}: seq_lens", seq_lens)
        loc = self._vec(f"{what}: last_loc", last_loc)
        self._same_length(what, seq, seq, loc)
        opens = self._opens_page(seq)
        flags = [opens, *self._decode_flags(seq, loc, opens)]
        if seq_lens_cpu is not None:  # the requests whose host copy disagrees
            h = self._vec(f"{what}: seq_lens_cpu", seq_lens_cpu)
            if h.numel() != seq.numel():
                raise ValueError(f"{what}: seq_lens_cpu has {h.numel()} entries, seq_lens {seq.numel()}")
            flags.append(h != seq)
        # SYNC: the one documented read: pages to bind, requests passing each of the three
        # checks, requests sharing a page, disagreeing copies.
        n, n_held, n_aligned, n_in_range, n_dup, *n_disagree = _host_read(torch.stack(flags).sum(1))
        if min(n_held, n_aligned, n_in_range) != seq.numel() or n_dup or any(n_disagree):
            self._explain_copies(what, {"seq_lens": (seq, seq_lens_cpu)})
            self._explain(what, seq - 1, seq, loc)
        with self.arena.atomic():
            if self._fused():
                return self._bind_slots(n, self._decode_slots_fused(seq, loc))
            ids = self._take_pages(n)
            return None if ids is None else self._decode_slots(opens, ids, loc)

    def _decode_flags(
        self, seq: torch.Tensor, loc: torch.Tensor, opens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_request_flags`` for a decode batch (``prefix = seq - 1``), in
        fewer operations (bool tensors, sync-free): three checks that every
        good request passes (a live ``last_loc``, or ``-1`` when ``seq`` is 1;
        ``last_loc`` at position ``seq - 2``'s offset; ``seq`` in range), and
        which requests continue a page another request also continues.  Kept
        apart, the checks need no ``&``: the one read counts each."""
        ps, end = self.page_size, self._id_end[FULL]
        # -1 and ids below read the sink's row (0), ids past the end the sentinel's (-1): dead
        page = torch.clamp(torch.div(loc, ps, rounding_mode="floor"), 0, end)
        live = self.arena.v2p_at(FULL, page) > 0
        held = torch.where(seq == 1, loc == -1, live)
        # last_loc at position seq - 2; seq 1's -1 passes (-2 mod ps is ps - 2)
        aligned = torch.remainder(loc - seq, ps) == (ps - 2) % ps
        in_range = torch.clamp(seq, 1, self._max_tokens) == seq
        # Continuing requests write their index into their page's row of a
        # scratch table, the others into a spare row of their own: of two on
        # one page, one reads the other's index back.
        cont = torch.gt(live, opens)  # live and not opening a page: its page is in [1, end)
        idx, spare = self._request_rows(seq.numel())
        target = torch.where(cont, page, spare)
        owner = self._owner_table(seq.numel())
        owner.index_copy_(0, target, idx)
        return held, aligned, in_range, owner.index_select(0, target) != idx

    def _request_rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``arange(n)`` and each request's spare scratch row ``end + i``,
        kept while the batch size stays (read only)."""
        if self._rows is None or self._rows[0].numel() != n:
            idx = torch.arange(n, dtype=I64, device=self.device)
            self._rows = idx, idx + self._id_end[FULL]
        return self._rows

    def _owner_table(self, n: int) -> torch.Tensor:
        """Scratch rows, one per full id and one spare per request of a batch
        of ``n``: only rows written in the same call are read, so it is never
        cleared (made on first use, remade for a larger batch)."""
        rows = self._id_end[FULL] + n
        if self._owner is None or self._owner.numel() < rows:
            self._owner = torch.empty(rows, dtype=I64, device=self.device)
        return self._owner

    def _decode_trusted(
        self, seq: torch.Tensor, loc: torch.Tensor, seq_lens_cpu: IntsLike | None = None
    ) -> torch.Tensor | None:
        """``alloc_decode(check=False)``: the checked call's page rule and
        slots, without its validation."""
        if seq_lens_cpu is not None:
            n = _host_decode_pages(seq_lens_cpu, self.page_size, (seq.numel(), loc.numel()), self._max_tokens)
            opens = None
        else:
            opens = self._opens_page(seq)
            # SYNC: the one documented read without the host copy: pages to bind.
            (n,) = _host_read(opens.sum(0, keepdim=True))
        with self.arena.atomic():
            if self._fused():
                return self._bind_slots(n, self._decode_slots_fused(seq, loc))
            if opens is None:
                opens = self._opens_page(seq)
            ids = self._take_pages(n)
            return None if ids is None else self._decode_slots(opens, ids, loc)

    def _opens_page(self, seq: torch.Tensor) -> torch.Tensor:
        """Which requests open a page (a bool tensor, sync-free): position
        ``seq - 1`` is a page's first (ps 1: always)."""
        return torch.remainder(seq, self.page_size) == 1 % self.page_size

    def _decode_slots(self, opens: torch.Tensor, ids: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        """Each request's slot for position ``seq - 1``: the ``k``-th opener
        takes the first slot of ``ids[k - 1]``, the others ``last_loc + 1``."""
        if ids.numel() == 0:  # a shape: nobody opens a page
            return loc + 1
        # the k-th opener indexes ids[k - 1] of ids behind one more copy of ids[0], which a
        # request before the first opener indexes; where() drops it
        pages = torch.cat([ids[:1], ids]).index_select(0, torch.cumsum(opens, 0))
        return torch.where(opens, pages.mul_(self.page_size), loc + 1)

    # ------------------------------------------------------------ free

    def free(self, token_ids: IntsLike) -> None:
        """Free the pages of these tokens: their swa entries still live, then
        the full pages, both in ascending page order.  Every token must be
        live in full (``-1``, page 0, out of range, unknown, freed or
        repeated: ``ValueError``, nothing changed).  It validates on the
        host (documented reads); the engine's per-step free, which reads
        nothing, is ``free_segment(check=False)``.  Both frees are one
        ``atomic()`` scope (docs/design.md §6, §9c).

        Args:
            token_ids: tokens live in full.

        Raises:
            ValueError: a token is not an int, is repeated or is not live in full; nothing changed.
        """
        self._free_pages(self._pages_to_free(token_ids))
        return None

    def _pages_to_free(self, token_ids: IntsLike) -> list[int]:
        """``free``'s pages, ascending, once every token is checked (SYNC:
        validation, the checked path: the tokens and the rows they name)."""
        toks = self._vec("free: token_ids", token_ids).tolist()  # SYNC: validation (checked path)
        ps = self.page_size
        if len(set(toks)) != len(toks):
            raise ValueError(f"free: pool 'full': a token is repeated in {toks}")
        n = self.arena.id_end(FULL)
        named = sorted({t // ps for t in toks if t >= 0 and 0 < t // ps < n})
        rows = self.arena.v2p_at(FULL, torch.tensor(named, dtype=I64, device=self.device)).tolist()  # SYNC: validation
        v2p = dict(zip(named, rows))  # only the rows named: a free reads its pages, not the table
        for t in toks:
            _live_token(v2p, t, ps, "free: pool 'full': token", n)
        return sorted({t // ps for t in toks})

    def _swa_live(self, pages: list[int]) -> list[int]:
        """Those of ``pages`` whose swa entry is live (SYNC: the checked path)."""
        if not self._has(SWA) or not pages:
            return []
        swa = self.arena.v2p_at(SWA, torch.tensor(pages, dtype=I64, device=self.device)).tolist()  # SYNC: checked
        return [p for p, s in zip(pages, swa) if s > 0]

    def _free_pages(self, pages: list[int], live: list[int] | None = None) -> None:
        """Free checked pages: their live swa entries (``live``, else read)
        first, a borrowed id leaving its borrower before its lender, then
        full; one ``atomic()`` scope."""
        if not pages:
            return None
        ids = torch.tensor(pages, dtype=I64, device=self.device)
        with self.arena.atomic():  # both frees or neither
            if live is None and self._has(SWA):
                swa = self.arena.v2p_at(SWA, ids).tolist()  # SYNC: checked path
                live = [p for p, s in zip(pages, swa) if s > 0]
            if live:
                # in flight, checked: the arena counts the freed pins exactly (docs/design.md §12)
                self.arena.free(SWA, torch.tensor(live, dtype=I64, device=self.device), check=self.arena.in_flight)
            self.arena.free(FULL, ids, check=self.arena.in_flight)
        return None

    def free_segment(
        self, token_ids: IntsLike, start_pos: int, check: bool = True, *, num_live: int | None = None
    ) -> None:
        """The per-step free of a request's segment; as the spec's: ``free``
        of the page representatives ``token_ids[::ps]`` (``start_pos`` a
        non-negative multiple of ``ps``), swa entries still live first,
        then full, both ascending.  One ``atomic()`` scope.

        ``num_live`` is the engine's host copy of how many of the
        representatives' swa entries are live.  The checked path compares
        it in its validation (a disagreement is a ``ValueError``, nothing
        changed).  ``check=False``, the engine's step: ``token_ids`` is a
        1-D int64 tensor on the arena's device whose representatives are
        live in full, one per page, ``start_pos`` is not looked at, and
        ``num_live`` is taken as right: nothing is read back (the counts
        are shapes and ``num_live``; one sort orders the pages, and where
        only some swa entries are live ``free_live`` picks them).  Without
        ``num_live`` there, one documented read counts them
        (docs/design.md §6, §8).

        Args:
            token_ids: a request's tokens from ``start_pos`` on.
            start_pos: the position of ``token_ids[0]``.
            check: False for the engine's step.
            num_live: the live swa entries among the representatives, or None.

        Raises:
            ValueError: (checked) a bad ``start_pos``, a representative that
                ``free`` refuses or a wrong ``num_live``; (trusted) a
                ``num_live`` that is not an int in ``[0, representatives]``.
                Nothing has changed.
        """
        ps = self.page_size
        if check:
            _segment_start("free_segment", start_pos, ps)
            pages = self._pages_to_free(self._vec("free_segment: token_ids", token_ids)[::ps])
            live = self._swa_live(pages)
            if num_live is not None and _int("free_segment: num_live", num_live) != len(live):
                raise ValueError(
                    f"free_segment: pool 'swa': num_live {num_live} disagrees with the {len(live)} live pages"
                )
            self._free_pages(pages, live)
            return None
        reps = cast(torch.Tensor, token_ids)[::ps]
        k = reps.numel()  # a shape: no read
        if num_live is not None and not 0 <= _int("free_segment: num_live", num_live) <= k:
            raise ValueError(f"free_segment: pool 'swa': num_live {num_live} outside [0, {k}]")
        if num_live and not self._has(SWA):
            raise ValueError(f"free_segment: num_live {num_live}: {type(self).__name__} has no swa pool")
        if k == 0:
            return None
        ids = torch.sort(torch.div(reps, ps, rounding_mode="floor")).values
        with self.arena.atomic():  # both frees or neither
            if self._has(SWA):
                n = self._swa_live_count(reps) if num_live is None else num_live  # SYNC: without the host copy
                if n == k:
                    self.arena.free(SWA, ids, check=False)
                elif n:
                    self.arena.free_live(SWA, reps, ps, n)
            self.arena.free(FULL, ids, check=False)
        return None

    def _swa_live_count(self, reps: torch.Tensor) -> int:
        """How many distinct pages of these representatives have a live swa
        entry (0 without swa).  SYNC: one read, the checked path's or a
        trusted call's without the engine's host copy."""
        if not self._has(SWA):
            return 0
        end = self._id_end[SWA]
        page = torch.div(torch.clamp(reps, -1, end * self.page_size - 1), self.page_size, rounding_mode="floor")
        _, count = live_once(page, self.arena.v2p_at(SWA, torch.clamp(page, min=0)) > 0, end)
        (n,) = _host_read(count)
        return n

    # --------------------------------------------------------- relief

    def _absorb_members(self) -> None:
        for name in self._floats() + [self.CHAIN[0], self.CHAIN[-1]]:
            self.arena.flush(name, max_moves=0)

    def _compact_ends(self, demand: dict[str, int], fits: Callable[[], bool], replan: Callable[[], bool]) -> bool:
        """The ENDs' surplus holes (beyond their own demand) in chain order,
        each in doubling steps capped at the surplus, until it fits; then,
        with floats and the anchor policy (whose slide reads packed ENDs),
        the ENDs whole (the spec's ``_compact_ends``)."""
        for name in (self.CHAIN[0], self.CHAIN[-1]):
            k = 1
            while (surplus := self.arena.counts(name).holes - demand[name]) > 0:
                if not self.arena.flush(name, max_moves=min(k, surplus)):
                    break
                if fits() or replan():
                    return True
                k *= 2
        if self.arena.policy == "anchor" and self._floats():
            for name in (self.CHAIN[0], self.CHAIN[-1]):
                self.arena.flush(name)
        return False

    def _shortfall(self, tokens: int, state_slots: int, swa_tokens: int | None = None) -> int:
        """Tokens ``evict`` is asked for: the joint token shortfall, ``tokens
        - K*ps`` with ``K`` the demand's pages that fit when both sides shed
        pages together (``_kept_pages``; coupled: ``tokens -
        available_size()``), at least 0 (a composite with a state pool adds
        its slots', ``_WithState``)."""
        if swa_tokens is None:
            return max(0, tokens - self.available_size())
        return max(0, tokens - self._kept_pages(tokens, swa_tokens) * self.page_size)

    def relieve(
        self,
        tokens: int = 0,
        state_slots: int = 0,
        evict: Callable[[int], object] | None = None,
        swa_tokens: int | None = None,
    ) -> bool:
        """The shortfall ladder for a demand; True once it fits (docs/design.md §4, §6).

        Demand vector ``{full: ceil(tokens/ps), swa: ceil(swa_tokens/ps)
        (where present; None: as full), state: state_slots (where
        present)}``, judged by ``fits(tokens, state_slots, swa_tokens)``
        (the uneven demand: ``relieve(full, swa_tokens=swa)``, then
        allocate).  Unless it fits at once, the
        spec's rungs: absorb every member's frontier holes (no move),
        recheck; compact the ENDs' surplus holes (beyond their own demand)
        in chain order in doubling steps, rechecking after each, then, with
        floats and the anchor policy, flush the ENDs whole; the policy's
        slide (``"planner"``: ``plan_floats`` before the steps and after
        each; ``"anchor"``: ``open_short_side`` on each float in chain
        order, once the ENDs are packed, rechecking after each); then with
        ``evict`` up to 4
        rounds of ``evict(shortfall_tokens)``, each followed by those
        rungs, a falsy return ending the rounds.  The verdict is judged
        after the last step that ran.  Each attempt's rungs are one
        ``atomic()`` scope, the evictor running between them
        (``impl/journal.py``, docs/design.md §9c).

        Args:
            tokens: new tokens of one request (empty prefix).
            state_slots: state slots wanted (a composite with a state pool).
            evict: ``evict(shortfall_tokens)`` frees what it can and returns the
                count freed; None for no eviction.
            swa_tokens: of ``tokens``, how many swa binds; None for all.

        Returns:
            Whether the demand fits now.

        Raises:
            ValueError: a bad count (as ``fits``), an ``evict`` that is not
                callable, an evictor inside an open ``atomic()`` block, or an
                ``evict`` return that is not a count (docs/design.md §9c).
        """
        tokens, state_slots = self._demand_args("relieve", tokens, state_slots)
        swa = self._swa_arg("relieve", tokens, swa_tokens)
        if evict is not None and not callable(evict):
            raise ValueError(f"relieve: evict must be callable or None, got {evict!r}")
        if evict is not None and self.arena.in_atomic:
            raise ValueError("relieve: an evictor cannot run inside atomic() (its frees stay)")
        pages = _cdiv(tokens, self.page_size)
        demand = {FULL: pages}
        if self._has(SWA):
            demand[SWA] = pages if swa is None else _cdiv(swa, self.page_size)
        if self._has(STATE):
            demand[STATE] = state_slots
        planner = self.arena.policy == "planner"

        def fits() -> bool:
            return self._fits(tokens, state_slots, swa)

        def replan() -> bool:
            if not planner:
                return False
            self.arena.plan_floats(demand)
            return fits()

        def rungs() -> bool:
            self._absorb_members()
            if fits() or replan() or self._compact_ends(demand, fits, replan):
                return True
            if not planner:
                for f in self._floats():
                    self.arena.open_short_side(f, demand)
                    if fits():
                        return True
            return False

        # Written as attempts (not the spec's nested rungs): attempt 0 is the
        # ladder alone, each later one an eviction round opened by evict.
        attempts = 1 + (MAX_EVICT_ROUNDS if evict is not None else 0)
        for attempt in range(attempts):
            if attempt == 0:
                if fits():
                    return True
            elif evict is None or not evicted(
                evict(self._shortfall(tokens, state_slots, swa)), f"{type(self).__name__}.relieve"
            ):
                break
            with self.arena.atomic():  # one attempt's rungs: all or nothing; the evictor runs between
                if rungs():
                    return True
        return fits()  # after the last step, whatever evict returned

    # ------------------------------------------------------- translate

    def translate(self, token_ids: IntsLike, pool: str = "full", check: bool = True) -> torch.Tensor:
        """Physical slots ``v2p[t // ps] * ps + t % ps`` (int64 tensor).  A
        tombstoned page, page 0 and ``-1`` give slot 0 itself.  Sync-free on
        a tensor (out-of-range ids also give 0 there); a host sequence is
        range-checked (``ValueError``).

        ``check=False``: the trusted decode path; ``token_ids`` is a 1-D
        int64 tensor on the arena's device, each id in ``[-1, id end)`` of
        ``pool``, which must be one of the composite's pools (docs/design.md §6, §8).

        Args:
            token_ids: token ids (state slot ids for ``pool="state"``).
            pool: the pool whose table translates them.
            check: False for the trusted decode path.

        Returns:
            The physical slots, int64.

        Raises:
            ValueError: an unknown pool, or a host sequence holding an id out
                of range.
        """
        if not check:
            return self.arena.slots(pool, cast(torch.Tensor, token_ids), 1 if pool == STATE else self.page_size)
        if not isinstance(pool, str) or not self._has(pool):
            raise ValueError(f"translate: pool {pool!r}: {type(self).__name__} has pools {', '.join(self.CHAIN)}")
        ps = 1 if pool == STATE else self.page_size
        n_ids = self._id_end[pool]
        toks = self._vec("translate: token_ids", token_ids)
        if not isinstance(token_ids, torch.Tensor):  # a host sequence: range-checked on the host
            for t in token_ids:
                if t < -1 or t // ps >= n_ids:
                    raise ValueError(f"translate: pool {pool!r}: token {t} out of range [-1, {n_ids * ps})")
        return self.arena.slots(pool, toks, ps)

    # ------------------------------------------------ in-flight forwards

    def launch(self, token_ids: IntsLike, state_slots: IntsLike | None = None, check: bool = True) -> None:
        """A forward was launched that writes these tokens' slots (docs/design.md §12); as the spec's.

        It pins their pages in full and, where live, in swa; the state
        slots it updates are ``state_slots``, or every live slot when the
        engine does not say (None).  Until ``settle`` nothing it writes
        moves and nothing it reads is overwritten (``Arena.launch``).
        ``check=False`` is the engine's step: device work only, no host
        read (a token that is not live pins nothing).

        Args:
            token_ids: the batch's new token ids (``out_cache_loc``), a
                tensor or a sequence; ``-1`` and tokens of page 0 are padding.
            state_slots: the state slots it writes, or None for all;
                ignored where there is no state pool.
            check: False for the trusted step.

        Raises:
            ValueError: a token that is not an int, below ``-1``, out of
                range or not allocated in full; a slot that is not live.
                Nothing has changed.
        """
        toks = self._vec("launch: token_ids", token_ids)
        writes: dict[str, torch.Tensor | list[int] | None] = {}
        if not check:  # -1 and page 0 pin nothing, nor does a page not live in swa
            pages = torch.div(toks, self.page_size, rounding_mode="floor")
            writes = {name: pages for name in (FULL, SWA) if self._has(name)}
        else:
            host = self._launch_pages(toks)
            writes[FULL] = host
            if self._has(SWA):
                swa = self.arena.v2p(SWA).tolist()  # SYNC: launch validation
                writes[SWA] = [p for p in host if swa[p] > 0]
        if self._has(STATE):
            writes[STATE] = None if state_slots is None else self._vec("launch: state_slots", state_slots)
        self.arena.launch(writes, check=check)

    def _launch_pages(self, toks: torch.Tensor) -> list[int]:
        """The checked launch's full pages, ascending, in the spec's words:
        every token ``-1`` or live in full (SYNC: validation)."""
        ps, host = self.page_size, toks.tolist()  # SYNC: launch validation (checked path)
        for t in host:
            if t < -1:
                raise ValueError(f"launch: token {t} names no token (-1 is padding)")
        full = self.arena.v2p(FULL).tolist()  # SYNC: launch validation
        for t in host:
            if t >= ps:
                _live_token(full, t, ps, "launch: token")
        return sorted({t // ps for t in host if t >= ps})

    def settle(self) -> None:
        """The launched forward is done, or waited on (``Arena.settle``; docs/design.md §12); as the spec's."""
        self.arena.settle()

    def flush_opportunistic(self, max_moves: int | None = None) -> int:
        """Compact between steps without waiting for an in-flight forward:
        a non-urgent flush of each lazy END (``Arena.flush(urgent=False)``;
        docs/design.md §12); as the spec's.  Eager ENDs have no holes to
        compact.  One ``atomic()`` scope (docs/design.md §9c).

        Args:
            max_moves: the most pages each END may move; None for no cap.

        Returns:
            Pages moved, all ENDs together.

        Raises:
            ValueError: ``max_moves`` not an int >= 0.
        """
        if max_moves is not None:  # checked here too: a composite with no lazy END flushes nothing
            max_moves = _count("flush_opportunistic: max_moves", max_moves)
        ends = [n for n in (self.CHAIN[0], self.CHAIN[-1]) if self.arena.is_lazy(n)]
        with self.arena.atomic():
            return sum(self.arena.flush(n, max_moves=max_moves, urgent=False) for n in ends)

    # ---------------------------------------------------------- checks

    def verify(self) -> None:
        """``arena.verify()`` (which checks swa's live ids are live in full),
        the composite's roles, and its joint-view memo against a fresh
        computation (first, as the arena does, so a write around a
        ``CapField`` is reported as a stale memo; docs/design.md §5, §6).

        Raises:
            AccountingError: a rule is broken, naming the pool and the rule.
        """
        for view, _, value in self._memo.entries():
            fresh = self._joint_pages(0)
            if value != fresh:
                raise AccountingError(FULL, "stale memo", f"{view} memo {value}, fresh {fresh}")
        self.arena.verify()
        if tuple(self.arena.chain) != self.CHAIN:
            raise AccountingError(self.CHAIN[0], "composite roles", f"chain {self.arena.chain}, expected {self.CHAIN}")
        if self.arena.lenders != self.BORROW:
            raise AccountingError(SWA, "composite roles", f"borrow {self.arena.lenders}, expected {self.BORROW}")

    def snapshot(self) -> dict[str, object]:
        """The whole state, JSON-able (docs/design.md §6, §10).

        Returns:
            The composite's name, its page size and ``arena.snapshot()``.
        """
        return {"composite": type(self).__name__, "page_size": self.page_size, "arena": self.arena.snapshot()}


def _cdiv_t(x: torch.Tensor, d: int) -> torch.Tensor:
    return torch.div(x + (d - 1), d, rounding_mode="floor")


class _WithSWA(_Composite):
    """Calls of a composite with an SWA band (``HybridSWA``, ``TriPool``; docs/design.md §6)."""

    def free_swa(self, token_ids: IntsLike, start_pos: int, check: bool = True, *, num_live: int | None = None) -> None:
        """The per-step window free (docs/anchor.md §1, ``free_segment``).

        ``start_pos`` must be a non-negative multiple of ``ps`` (else
        ``ValueError``); the page representatives are ``token_ids[::ps]``.
        Only swa entries live with ``v2p > 0`` are freed, ascending and once
        each; ``-1``, page 0 and freed entries are skipped.  A representative
        below ``-1`` or past the id space is a ``ValueError`` (nothing
        changed).  Full keeps its pages.

        ``num_live``, the engine's host copy of how many pages that is,
        sizes the free without a read: with it the trusted path reads
        nothing back, and when it counts every representative (a segment
        whose pages are all live) one sort picks the pages.  The checked
        path compares it with the device in its one read (a disagreement
        is a ``ValueError``, nothing changed); when it counts every
        representative, that read only checks each page is live and
        distinct (a second read, on the error path only, counts them).

        Without ``num_live``, one documented host read (``_host_read``):
        how many entries to free (it sizes the hole list, a host-side count)
        and, checked, how many representatives are out of range.  The set
        itself is chosen on the device: sort the live pages first (dead ones
        keyed past the end), knock out repeats, sort again; the first
        ``count`` are the pages.

        ``check=False``: the trusted decode path; ``token_ids`` is a 1-D
        int64 tensor on the arena's device, ``start_pos`` is not looked at,
        and ``num_live`` is taken as right, its representatives then
        trusted to lie in ``[-1, id end)``.  Without ``num_live`` the one
        read also counts representatives out of range: the checked call's
        ``ValueError``, nothing changed.  The same pages are freed
        (docs/design.md §6, §8).

        Args:
            token_ids: a window's tokens, from ``start_pos`` on.
            start_pos: the position of ``token_ids[0]``.
            check: False for the trusted decode path.
            num_live: the number of distinct live swa pages among the
                representatives, as the engine knows it, or None.

        Raises:
            ValueError: ``start_pos`` is not a non-negative multiple of the
                page size, a representative is out of range, or ``num_live``
                is not the number of live pages; nothing changed.
        """
        ps = self.page_size
        end = self._id_end[SWA]
        count: int | None  # entries to free (None: not known yet)
        if not check:
            reps = cast(torch.Tensor, token_ids)[::ps]
            if num_live is not None:  # the pages chosen and freed on the device, nothing read
                self.arena.free_live(SWA, reps, ps, num_live)
                return None
            inside = torch.clamp(reps, -1, end * ps - 1)  # an out-of-range representative changes
            key, count_t = self._live_pages(torch.div(inside, ps, rounding_mode="floor"), end)
            bad = (inside != reps).sum(0, keepdim=True) > 0
            # SYNC: the one read without the host copy: entries to free, or -1 for a bad representative.
            (count,) = _host_read(torch.where(bad, -1, count_t))
            if count < 0:
                self._explain_reps(reps, end)
        else:
            _segment_start("free_swa", start_pos, ps)
            reps = self._vec("free_swa: token_ids", token_ids)[::ps]
            claimed = None if num_live is None else _int("free_swa: num_live", num_live)
            count = None
            if claimed == reps.numel():
                # every representative claims a live page of its own: check just that.  An
                # out-of-range one reads the sink's or the sentinel's row, dead, so it fails too.
                key = torch.sort(torch.div(reps, ps, rounding_mode="floor")).values
                live = self.arena.v2p_at(SWA, torch.clamp(key, 0, end)) > 0
                # distinct: each key below the next (rolled, the last meets the first, never below it)
                rising = torch.roll(key, -1) > key
                # SYNC: the one documented read: live pages (all expected) and rises (all but one).
                n_live, n_rising = _host_read(torch.stack([live, rising]).sum(1))
                count = claimed if (n_live, n_rising) == (claimed, claimed - 1) else None
            if count is None:  # no claim, another, or a claim that failed (its error explained here)
                inside = torch.clamp(reps, -1, end * ps - 1)  # an out-of-range representative changes
                page = torch.div(inside, ps, rounding_mode="floor")
                key, count_t = self._live_pages(page, end)
                # SYNC: the one documented read: entries to free, and bad representatives.
                count, n_bad = _host_read(torch.cat([count_t, (inside != reps).sum(0, keepdim=True)]))
                if n_bad:
                    self._explain_reps(reps, end)
                if claimed is not None and claimed != count:
                    raise ValueError(f"free_swa: pool 'swa': num_live {num_live} disagrees with the {count} live pages")
        if count:
            self.arena.free(SWA, key if count == key.numel() else key[:count], check=False)
        return None

    def _live_pages(self, page: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``_live_once`` of the pages in ``[-1, end)`` whose swa entries are
        live: page ``-1`` reads the sink's row (clamped to 0), and ``v2p >
        0`` skips the sink (row 0 holds 0) and freed entries."""
        live = self.arena.v2p_at(SWA, torch.clamp(page, min=0)) > 0
        return live_once(page, live, end)

    def _explain_reps(self, reps: torch.Tensor, end: int) -> NoReturn:
        """Error path only: name the first out-of-range representative."""
        ps = self.page_size
        first = next(t for t in reps.tolist() if t < -1 or t // ps >= end)
        raise ValueError(f"free_swa: pool 'swa': token {first} out of range [-1, {end * ps})")

    def tail_demand(self, prefix_len: int, seq_len: int, swa_tail_len: int) -> tuple[int, int]:
        """``alloc_extend_swa_tail``'s uneven demand for one request, as
        ``(tokens, swa_tokens)`` (docs/design.md §11, §13); as the spec's.
        Host ints.

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
        swa_pages = _tail_pages(prefix_len, seq_len, swa_tail_len, ps)
        return (_cdiv(seq_len, ps) - _cdiv(prefix_len, ps)) * ps, swa_pages * ps

    def fits_tail(self, prefix_len: int, seq_len: int, swa_tail_len: int) -> bool:
        """Would ``alloc_extend_swa_tail`` of this request succeed now,
        without relief?  ``fits`` of its ``tail_demand``; as the spec's
        (docs/design.md §13).

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

    def alloc_extend_swa_tail(
        self,
        prefix_lens: IntsLike,
        seq_lens: IntsLike,
        last_loc: IntsLike,
        check: bool = True,
        *,
        swa_tail_len: int,
        prefix_lens_cpu: IntsLike | None = None,
        seq_lens_cpu: IntsLike | None = None,
        extend_num_tokens: int | None = None,
    ) -> torch.Tensor | None:
        """A PD decode node's preallocation of one transferred request: full
        slots for every new position, and SWA entries only for the new pages
        that hold the last ``swa_tail_len`` tokens (docs/design.md §13); as
        the spec's.  ``alloc_extend``'s path, checks, host copies and one
        read, with the request's two lengths in that read when the host
        copies are not given; its gate is the uneven demand's.

        Args:
            prefix_lens: the request's tokens already allocated (one entry).
            seq_lens: its length after the call (one entry).
            last_loc: its slot of position ``prefix - 1``, or ``-1``.
            check: False for the trusted path (as ``alloc_extend``'s).
            swa_tail_len: the window's tail, ``0 <= tail <= seq - prefix``.
            prefix_lens_cpu: the engine's host copy of ``prefix_lens``.
            seq_lens_cpu: the engine's host copy of ``seq_lens``.
            extend_num_tokens: ``seq - prefix``, or None.

        Returns:
            The slots (int64), or None on a shortfall relief could not cover.

        Raises:
            ValueError: not exactly one request, a tail outside ``[0, seq -
                prefix]``, or anything ``alloc_extend`` refuses; nothing changed.
        """
        return self._extend(
            "alloc_extend_swa_tail",
            prefix_lens,
            seq_lens,
            last_loc,
            check,
            prefix_lens_cpu,
            seq_lens_cpu,
            extend_num_tokens,
            swa_tail_len,
        )

    def swa_available_size(self) -> int:
        """Swa's own view in tokens: ``arena.available_size("swa")`` (docs/design.md §5, §6).

        Returns:
            The tokens.
        """
        return self.arena.available_size(SWA)


class _WithState(_Composite):
    """Calls of a composite with a state pool (``MambaHybrid``, ``TriPool``; docs/design.md §6)."""

    state_bytes: int  # set by each composite
    _token_entry_bytes: int  # bytes of one token across the KV pools

    def alloc_state(self, n: int = 1) -> torch.Tensor | None:
        """``n`` state slots (int64 tensor, FIFO), or None.  On a shortfall
        ``relieve(state_slots=n)`` without eviction, then one more try: the
        other side gives ground before any eviction (anchor bug 6;
        docs/design.md §6).  One ``atomic()`` scope (docs/design.md §9c).

        Args:
            n: how many slots.

        Returns:
            The slot ids, or None.

        Raises:
            ValueError: ``n`` is not an int >= 0.
        """
        n = _count("alloc_state: n", n)
        with self.arena.atomic():
            ids = self.arena.alloc(STATE, n)
            if ids is None and self.relieve(state_slots=n):
                ids = self.arena.alloc(STATE, n)
            return ids

    def free_state(self, slots: IntsLike, check: bool = True) -> None:
        """Free state slots (docs/design.md §6).  ``check=False``, the
        engine's step (a finished request's slot): ``slots`` is an int64
        tensor on the arena's device of live slots, each once, and nothing
        is read back (``Arena.free(check=False)``).

        Args:
            slots: slot ids, each live once.
            check: False for the engine's step.

        Raises:
            ValueError: (checked) a slot is unknown, freed, repeated, 0 or
                out of range; nothing changed.
        """
        if not check:
            self.arena.free(STATE, cast(torch.Tensor, slots).reshape(-1), check=False)
            return None
        ids = self._vec("free_state: slots", slots)
        try:
            self.arena.free(STATE, ids)  # validates every slot first
        except ValueError as e:
            raise ValueError(f"free_state: {e}") from None

    def state_available_size(self) -> int:
        """The state pool's own view, in slots (docs/design.md §5, §6).

        Returns:
            The slots.
        """
        return self.arena.available_size(STATE)

    def state_slot_token_cost(self) -> int:
        """How many tokens one state slot displaces, for pricing admissions (docs/design.md §6).

        Returns:
            ``ceil(state_bytes / per-token entry bytes)`` (full plus swa where
            the composite has swa).
        """
        return _cdiv(self.state_bytes, self._token_entry_bytes)

    def _shortfall(self, tokens: int, state_slots: int, swa_tokens: int | None = None) -> int:
        """The joint token shortfall plus, for state slots short, ``slots *
        state_slot_token_cost()``; when that is 0 the tokens fit alone but
        not after the slots: what they then lack."""
        short = super()._shortfall(tokens, state_slots, swa_tokens)
        if state_slots:
            short += max(0, state_slots - self.state_available_size()) * self.state_slot_token_cost()
            if short == 0:
                kept = self._kept_pages(tokens, swa_tokens, self._state_ext(state_slots))
                short = tokens - kept * self.page_size
        return short


# -------------------------------------------------------------- composites


class HybridSWA(_WithSWA):
    """Full + SWA KV: swa (up END) . full (down END); swa borrows full's ids (docs/design.md §6).

    Args:
        total_bytes: the byte buffer's size.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        swa_entry_bytes: bytes of one SWA token, across its layers.
        page_size: tokens per KV page (the state pool's is 1).
        lazy: whether the END pools free lazily (leave holes, flushed on relief).
        policy: ``"anchor"`` (the seed's short-side slide) or ``"planner"`` (docs/design.md §4b).
        device: where the tables and the buffer live.
        buffer: an engine's byte buffer to use instead of a new one (``Arena``'s ``buffer``).
        mover: an engine's page copy that every relocation goes through (``Arena``'s ``mover``).
        kernels: ``"torch"`` or ``"triton"`` for the step's device work (``Arena``'s
            ``kernels``; docs/design.md §14); None for the device's default.

    Raises:
        ValueError: a bad configuration, naming the pool (raised by ``Arena``).
    """

    CHAIN = (SWA, FULL)
    BORROW: ClassVar[dict[str, str]] = {SWA: FULL}

    def __init__(
        self,
        total_bytes: int,
        full_entry_bytes: int,
        swa_entry_bytes: int,
        page_size: int = 1,
        lazy: bool = False,
        policy: str = "anchor",
        device: str | torch.device = "cpu",
        *,
        buffer: torch.Tensor | None = None,
        mover: Mover | None = None,
        kernels: str | None = None,
    ) -> None:
        pools = [SubPool(SWA, swa_entry_bytes, page_size, "up"), SubPool(FULL, full_entry_bytes, page_size, "down")]
        super().__init__(total_bytes, pools, page_size, lazy, policy, device, buffer, mover, kernels)
        self._epps = self.arena.geometry(FULL).epp, self.arena.geometry(SWA).epp  # fixed: read once

    def _joint_pages(self, state_ext: int = 0) -> int:
        """Closed form for two ENDs sharing one gap.

        A bind of ``P`` pages takes ``min(P, H)`` lazy holes on each side
        (``H_f``, ``H_s``; 0 when eager) and extends full down by ``m_f =
        max(0, P - H_f)`` and swa up by ``m_s = max(0, P - H_s)``; full goes
        first, and swa's gap is then what full left.  With ``G`` the gap
        between the two frontiers, both gates pass iff
        ``m_f*e_f + m_s*e_s <= G`` (swa's gate; it implies full's,
        ``m_f*e_f <= G``), ``m_f <= room_f`` and ``m_s <= room_s``.  Each
        constraint is monotone in ``P``, so the answer is the min of three
        maxima.  The cost ``f(P) = m_f*e_f + m_s*e_s`` is piecewise linear:
        0 up to ``a = min(H_f, H_s)``; slope ``e_x`` (the epp of the side
        with fewer holes, the only one extending) up to ``b = max(H_f,
        H_s)``; slope ``e_f + e_s`` after.  So the largest ``P`` with
        ``f(P) <= G`` is ``a + G // e_x`` when ``G < (b - a)*e_x``, else
        ``b + (G - (b - a)*e_x) // (e_f + e_s)``.  The room caps are
        ``H + room`` per side (for full, its free ids).  Computed by
        ``capacity.two_end_joint_pages`` (a = full, b = swa)."""
        return cap.two_end_joint_pages(*self._two_end_terms())

    def _uneven_fits(self, full_pages: int, swa_pages: int, state_ext: int = 0) -> bool:
        """The uneven bind's two gates in closed form (no search): with
        ``m_f = max(0, P_f - H_f)`` and ``m_s = max(0, P_s - H_s)``, both
        pass iff ``m_f <= room_f``, ``m_s <= room_s`` and ``m_f*e_f +
        m_s*e_s <= G`` (``capacity.two_end_uneven_fits``; proved as
        ``composite.hybrid.uneven_sound`` / ``uneven_tight``)."""
        return cap.two_end_uneven_fits(full_pages, swa_pages, *self._two_end_terms())

    def _two_end_terms(self) -> tuple[int, int, int, int, int, int, int]:
        """``(G, e_f, H_f, room_f, e_s, H_s, room_s)`` from host counters."""
        fu, sw = self.arena.counts(FULL), self.arena.counts(SWA)
        e_f, e_s = self._epps
        gap = max(0, fu.lo * e_f - sw.hi * e_s)
        return gap, e_f, fu.holes, fu.span_room, e_s, sw.holes, sw.span_room


class MambaHybrid(_WithState):
    """Mamba state + full KV: state (up END, page_size 1) . full (down END) (docs/design.md §6).

    Args:
        total_bytes: the byte buffer's size.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        state_bytes: bytes of one request's state slot.
        page_size: tokens per KV page (the state pool's is 1).
        lazy: whether the END pools free lazily (leave holes, flushed on relief).
        policy: ``"anchor"`` (the seed's short-side slide) or ``"planner"`` (docs/design.md §4b).
        device: where the tables and the buffer live.
        buffer: an engine's byte buffer to use instead of a new one (``Arena``'s ``buffer``).
        mover: an engine's page copy that every relocation goes through (``Arena``'s ``mover``).
        kernels: ``"torch"`` or ``"triton"`` for the step's device work (``Arena``'s
            ``kernels``; docs/design.md §14); None for the device's default.

    Raises:
        ValueError: a bad configuration, naming the pool (raised by ``Arena``).
    """

    CHAIN = (STATE, FULL)

    def __init__(
        self,
        total_bytes: int,
        full_entry_bytes: int,
        state_bytes: int,
        page_size: int = 1,
        lazy: bool = False,
        policy: str = "anchor",
        device: str | torch.device = "cpu",
        *,
        buffer: torch.Tensor | None = None,
        mover: Mover | None = None,
        kernels: str | None = None,
    ) -> None:
        pools = [SubPool(STATE, state_bytes, 1, "up", "state"), SubPool(FULL, full_entry_bytes, page_size, "down")]
        super().__init__(total_bytes, pools, page_size, lazy, policy, device, buffer, mover, kernels)
        self.state_bytes = state_bytes
        self._token_entry_bytes = full_entry_bytes

    def _joint_pages(self, state_ext: int = 0) -> int:
        """A token bind touches only full: full's own view, against the state
        END's high frontier advanced by ``state_ext`` pages."""
        fu, st = self.arena.counts(FULL), self.arena.counts(STATE)
        e_f = self.arena.geometry(FULL).epp
        gap = max(0, fu.lo * e_f - (st.hi + state_ext) * self.arena.geometry(STATE).epp)
        return cap.end_available(gap, e_f, fu.span_room, fu.holes)


class TriPool(_WithSWA, _WithState):
    """state (up END) . swa (float) . full (down END); swa borrows full's ids (docs/design.md §6).

    With the swa float empty it behaves exactly as the two-pool layout of the
    same sizes (the golden identity, docs/design.md §3).

    Args:
        total_bytes: the byte buffer's size.
        full_entry_bytes: bytes of one full-attention token, across its layers.
        swa_entry_bytes: bytes of one SWA token, across its layers.
        state_bytes: bytes of one request's state slot.
        page_size: tokens per KV page (the state pool's is 1).
        lazy: whether the END pools free lazily (leave holes, flushed on relief).
        policy: ``"anchor"`` (the seed's short-side slide) or ``"planner"`` (docs/design.md §4b).
        device: where the tables and the buffer live.
        buffer: an engine's byte buffer to use instead of a new one (``Arena``'s ``buffer``).
        mover: an engine's page copy that every relocation goes through (``Arena``'s ``mover``).
        kernels: ``"torch"`` or ``"triton"`` for the step's device work (``Arena``'s
            ``kernels``; docs/design.md §14); None for the device's default.

    Raises:
        ValueError: a bad configuration, naming the pool (raised by ``Arena``).
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
        lazy: bool = False,
        policy: str = "anchor",
        device: str | torch.device = "cpu",
        *,
        buffer: torch.Tensor | None = None,
        mover: Mover | None = None,
        kernels: str | None = None,
    ) -> None:
        pools = [
            SubPool(STATE, state_bytes, 1, "up", "state"),
            SubPool(SWA, swa_entry_bytes, page_size, "float"),
            SubPool(FULL, full_entry_bytes, page_size, "down"),
        ]
        super().__init__(total_bytes, pools, page_size, lazy, policy, device, buffer, mover, kernels)
        self.state_bytes = state_bytes
        self._token_entry_bytes = full_entry_bytes + swa_entry_bytes

    def _joint_pages(self, state_ext: int = 0) -> int:
        """Binary search over ``P`` in ``[0, full's view]`` on ``feasible(P)``,
        which mirrors the two bands' gates exactly (O(1), host ints):

        1. full's gate: ``P <= end_available(gap_f, ...)``, the gap between
           full and the first opaque band below it (swa if opaque, else the
           state END); the search range is exactly this.
        2. full takes ``min(P, H_f)`` holes and lowers its low frontier by
           ``m_f = max(0, P - H_f)`` pages; swa's gate is then
           ``P <= float_available(...)`` over its grid-aware region between
           the state END's high frontier and full's new low frontier (holes
           plus the larger free side, or the whole region when parked; capped
           by index room).

        Monotone (``feasible(P)`` implies ``feasible(P-1)``): gate 1 is a
        bound on ``P``; in gate 2, full's new frontier only falls as ``P``
        grows, the region's high edge ``floor(above/e)`` is non-decreasing in
        ``above``, so swa's available pages are non-increasing in ``P``
        while the demand ``P`` increases.  Relocation is not priced in
        (relief runs when demand exceeds this)."""
        avail_f, swa_avail = self._gates(state_ext)
        lo, hi = 0, avail_f
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if mid <= swa_avail(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _uneven_fits(self, full_pages: int, swa_pages: int, state_ext: int = 0) -> bool:
        """The uneven bind's gates, O(1): full's gate for ``P_f``, then swa's
        float gate for ``P_s`` over its region once full's frontier fell by
        ``max(0, P_f - H_f)`` pages (``_gates``; tied to the spec's bind by
        ``golden.tripool_empty_float.uneven*`` and the fidelity tests)."""
        avail_f, swa_avail = self._gates(state_ext)
        return full_pages <= avail_f and swa_pages <= swa_avail(full_pages)

    def _gates(self, state_ext: int) -> tuple[int, Callable[[int], int]]:
        """Full's gate (its available pages: the gap to the first opaque
        band below it, swa if opaque, else the state END advanced by
        ``state_ext``) and swa's available pages as a function of the pages
        ``p`` full binds first (its grid-aware region between the state
        END's high frontier and full's new low frontier)."""
        a = self.arena
        st, sw, fu = a.counts(STATE), a.counts(SWA), a.counts(FULL)
        g = a.geometry(SWA)
        e_st, e_s, e_f = a.geometry(STATE).epp, g.epp, a.geometry(FULL).epp
        state_high = (st.hi + state_ext) * e_st
        below_full = sw.hi * e_s if sw.opaque else state_high
        avail_f = cap.end_available(max(0, fu.lo * e_f - below_full), e_f, fu.span_room, fu.holes)
        h_f = fu.holes
        parked, room = not sw.opaque, sw.index_room

        def swa_avail(p: int) -> int:
            above = (fu.lo - max(0, p - h_f)) * e_f
            lo, hi = cap.float_region(state_high, above, e_s, g.min_page, g.num_pages)
            return cap.float_available(parked, lo, hi, sw.lo, sw.hi, sw.holes, room)

        return avail_f, swa_avail
