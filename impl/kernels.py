"""Which kernels run the step, and the launches of the Triton ones (docs/design.md §14).

An arena runs its step calls (``alloc``, ``bind_with_borrowers``, ``free``,
``free_live``, ``translate`` and the composites' ``alloc_decode``,
``alloc_extend``, ``free_swa``, ``translate`` over them) either as torch
operations (``"torch"``: the reference, and the fallback) or as one fused
Triton kernel a call (``"triton"``; ``impl/triton_kernels.py``).  Both
leave the same state, results and bytes; the differential machines and
``tests/impl/test_kernels.py`` hold them equal, and equal to the spec.

Triton is the default on CUDA, torch elsewhere.  On the CPU, Triton runs
only under its interpreter: ``TRITON_INTERPRET=1`` in the environment
before anything imports ``triton`` (the test suite sets it;
``kvarena verify`` and ``kvarena bench`` set it on a machine without
CUDA).  ``unavailable(device)`` says why Triton cannot run, or None.

Every launch goes through ``launch``, so a counter (``kvarena bench``)
sees each kernel as one launch, whatever the interpreter does inside it,
and a fault injector fails it as one operation (``wrapped``).
"""

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch

from .band import FREED

KERNELS = ("torch", "triton")
ENV = "KVARENA_KERNELS"  # "torch" or "triton": the default where an arena is built without a choice
BLOCK = 128  # lanes a program: requests (decode), pages (bind, free), tokens (extend, translate)
SORT_WIDTH = 4096  # free_live sorts in one block: more tokens than this go through torch's sort
MOVE_CHUNK = 1024  # words a relocation program copies: 8 KiB of int64 words, many programs a page


@functools.cache
def _triton() -> Any:
    """The kernels module, or the reason Triton cannot run here (a str)."""
    try:
        from . import triton_kernels
    except ImportError as e:  # not installed: Triton's wheels are Linux-only
        return f"Triton is not installed ({e}); it installs on Linux"
    return triton_kernels


def interpreting() -> bool:
    """Whether Triton's kernels run under its interpreter, on CPU tensors (docs/design.md §14).

    Returns:
        True when ``TRITON_INTERPRET=1`` was set before ``triton`` was imported.
    """
    tk = _triton()
    return not isinstance(tk, str) and type(tk.bind_kernel).__name__ == "InterpretedFunction"


def unavailable(device: torch.device) -> str | None:
    """Why ``kernels="triton"`` cannot run on ``device`` (docs/design.md §14).

    Args:
        device: where the arena's tables live.

    Returns:
        The reason, or None when Triton runs there.
    """
    tk = _triton()
    if isinstance(tk, str):
        return tk
    if device.type == "cuda":
        return None if not interpreting() else "Triton's interpreter is on (TRITON_INTERPRET=1): it runs CPU tensors"
    if device.type == "cpu":
        if interpreting():
            return None
        return "on the CPU Triton runs only under its interpreter: set TRITON_INTERPRET=1 before triton is imported"
    return f"Triton runs on cuda (or the CPU under its interpreter), not {device.type}"


def from_env(value: str | None) -> str | None:
    """The kernels the environment variable ``KVARENA_KERNELS`` asks for (docs/design.md §14).

    Args:
        value: its value, or None when it is unset.

    Returns:
        ``"torch"`` or ``"triton"`` (any case, spaces around it ignored), or
        None when it is unset or empty (the device's default).

    Raises:
        ValueError: another value, naming the variable.
    """
    if value is None or not value.strip():
        return None
    v = value.strip().lower()
    if v not in KERNELS:
        raise ValueError(f"{ENV}={value!r}: use {' or '.join(KERNELS)}; unset for the device's default")
    return v


def choose(kernels: str | None, device: torch.device) -> str:
    """The kernels an arena on ``device`` runs (docs/design.md §14).

    Args:
        kernels: ``"torch"``, ``"triton"``, or None for the default: what
            ``KVARENA_KERNELS`` says, else Triton on CUDA where it runs, else torch.
        device: where the arena's tables live.

    Returns:
        The choice, checked.

    Raises:
        ValueError: an unknown choice (or ``KVARENA_KERNELS`` value), or
            ``"triton"`` where it cannot run, saying why.
    """
    if kernels is None:
        kernels = from_env(os.environ.get(ENV))
        if kernels is None:
            return "triton" if device.type == "cuda" and unavailable(device) is None else "torch"
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels == "triton" and (why := unavailable(device)) is not None:
        raise ValueError(f"kernels='triton' on {device}: {why}")
    return kernels


def interpret_without_cuda() -> None:
    """A process entry point's (``kvarena verify``, ``kvarena bench``) way to
    run Triton on the CPU: turn its interpreter on when no CUDA device is
    visible, before anything imports ``triton``.  An explicit setting is
    kept (docs/design.md §14)."""
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


Wrapper = Callable[[Any, Callable[[], None]], None]
_WRAPPERS: list[Wrapper] = []


@contextlib.contextmanager
def wrapped(wrapper: Wrapper) -> Iterator[None]:
    """While open, every launch runs as ``wrapper(kernel, go)``, where
    ``go()`` launches it: how a counter sees a kernel as one launch, and a
    fault injector fails one before it runs (``kvarena.verification.faults``;
    docs/design.md §14).

    Args:
        wrapper: called with the kernel and the launch, instead of the launch.

    Yields:
        Nothing: the block runs wrapped.
    """
    _WRAPPERS.append(wrapper)
    try:
        yield
    finally:
        _WRAPPERS.remove(wrapper)


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **consts: Any) -> None:
    """One kernel launch: the one place a Triton kernel is launched (``wrapped``; docs/design.md §14).

    Args:
        kernel: the ``@triton.jit`` kernel.
        grid: its programs.
        *args: its arguments.
        **consts: its ``tl.constexpr`` arguments.
    """

    def go() -> None:
        kernel[grid](*args, **consts)

    for w in reversed(_WRAPPERS):
        go = functools.partial(w, kernel, go)
    go()


def _blocks(n: int) -> tuple[int]:
    return (max(1, -(-n // BLOCK)),)


class Side(NamedTuple):
    """One band's part of a bind: its tables, where its pages come from (the
    first ``len(first)`` from ``first``, then ``ext, ext + 1, ...``), and
    the output its pages go to (docs/design.md §14)."""

    v2p: torch.Tensor
    p2v: torch.Tensor
    first: torch.Tensor
    ext: int
    pages: torch.Tensor


class Ring(NamedTuple):
    """Where a bind's ids come from, or a free's go: ``buf[(head + k) % cap]`` (docs/design.md §3, §14)."""

    buf: torch.Tensor
    head: int
    cap: int


class DecodeSlots(NamedTuple):
    """``alloc_decode``'s token work, fused into its bind: the output ``slots`` (docs/design.md §6, §14)."""

    seq: torch.Tensor
    loc: torch.Tensor
    page_size: int
    slots: torch.Tensor


class ExtendSlots(NamedTuple):
    """``alloc_extend``'s token work, fused into its bind: the output ``slots`` (docs/design.md §6, §14)."""

    prefix: torch.Tensor
    seq: torch.Tensor
    loc: torch.Tensor
    page_size: int
    slots: torch.Tensor


Slots = DecodeSlots | ExtendSlots


def _side_args(s: Side) -> tuple[Any, ...]:
    # an empty tensor may have no address: the table stands in (never read, masked)
    return s.v2p, s.p2v, s.first if s.first.numel() else s.v2p, s.first.numel(), s.ext, s.pages


def bind(n: int, ring: Ring, ids: torch.Tensor, lender: Side, borrower: Side | None, slots: Slots | None) -> None:
    """The device writes of a bind of ``n`` pages, and the slots' token work
    when given: one launch (docs/design.md §14).

    Args:
        n: pages to bind (0 with ``slots``: the slots alone).
        ring: where the ids come from.
        ids: out: the ids bound (the ring itself when the ids are given).
        lender: the band whose ids they are.
        borrower: a band binding the same ids, or None.
        slots: the composite's slot work, or None.
    """
    tk = _triton()
    a = _side_args(lender)
    b = _side_args(borrower) if borrower is not None else a
    q = (ring.buf, ring.head, max(ring.cap, 1))
    flags = {"BORROW": borrower is not None, "BLOCK": BLOCK}
    args: tuple[Any, ...]
    if slots is None:
        launch(tk.bind_kernel, _blocks(n), n, *q, ids, *a, *b, **flags)
    elif isinstance(slots, DecodeSlots):
        batch = slots.seq.numel()
        args = (slots.seq, slots.loc, slots.slots, batch, slots.page_size)
        launch(tk.decode_kernel, _blocks(batch), *args, *q, ids, *a, *b, **flags)
    elif slots.seq.numel():  # one program a request: none, no launch (and no page, n is 0)
        args = (slots.prefix, slots.seq, slots.loc, slots.slots, slots.page_size)
        launch(tk.extend_kernel, (slots.seq.numel(),), *args, *q, ids, *a, *b, **flags)


class Drop(NamedTuple):
    """Where a free's outputs go: the freed pages (for the journal), the
    ring slots the ids queue into (None: a borrower keeps no ring), the
    hole reserve's free run the pages go to (None: no holes, an eager END
    compacts instead), the guard table (None: nothing in flight) and its
    old rows (for the journal) (docs/design.md §14)."""

    pages: torch.Tensor
    ring: Ring | None
    holes: torch.Tensor | None
    guard: torch.Tensor | None
    old_guard: torch.Tensor | None


def _drop_args(v2p: torch.Tensor, p2v: torch.Tensor, d: Drop) -> tuple[tuple[Any, ...], dict[str, Any]]:
    ring = d.ring or Ring(v2p, 0, 1)
    args: tuple[Any, ...] = (v2p, p2v, d.pages, ring.buf, ring.head, max(ring.cap, 1))
    args += (v2p if d.holes is None else d.holes, v2p if d.guard is None else d.guard)
    args += (v2p if d.old_guard is None else d.old_guard,)
    flags = {"QUEUE": d.ring is not None, "HOLES": d.holes is not None, "GUARD": d.guard is not None, "FREED": FREED}
    return args, flags


def free(ids: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor, drop: Drop) -> torch.Tensor:
    """The device writes of a free of ``ids``, in their order: one launch (docs/design.md §14).

    Args:
        ids: distinct live ids, contiguous.
        v2p: the band's id -> page table.
        p2v: the band's page -> id table.
        drop: where the outputs go.

    Returns:
        ``ids``.
    """
    args, flags = _drop_args(v2p, p2v, drop)
    launch(_triton().free_kernel, _blocks(ids.numel()), ids, ids.numel(), *args, **flags, BLOCK=BLOCK)
    return ids


def free_live(
    tokens: torch.Tensor, page_size: int, end: int, count: int, v2p: torch.Tensor, p2v: torch.Tensor, drop: Drop
) -> torch.Tensor:
    """The device writes of ``Arena.free_live``: the ``count`` distinct live
    ids among ``tokens // page_size`` (1-D, any stride, at most
    ``SORT_WIDTH``), ascending, freed; one launch (docs/design.md §14).

    Args:
        tokens: the tokens.
        page_size: tokens a page.
        end: one past the last id.
        count: how many distinct live ids they name.
        v2p: the band's id -> page table.
        p2v: the band's page -> id table.
        drop: where the outputs go.

    Returns:
        The ids freed (the sort's scratch, cut to ``count``).
    """
    n = tokens.numel()
    width = max(16, 1 << max(0, n - 1).bit_length())
    ids = torch.empty(width, dtype=torch.int64, device=v2p.device)
    args, flags = _drop_args(v2p, p2v, drop)
    head = (tokens, tokens.stride(0) if n else 1, n, page_size, end, count, ids)
    launch(_triton().free_live_kernel, (1,), *head, *args, **flags, WIDTH=width)
    return ids[:count]


def translate(tokens: torch.Tensor, out: torch.Tensor, v2p: torch.Tensor, n_ids: int, page_size: int) -> None:
    """Slots (pages, for ``page_size`` 1) of ``tokens`` into ``out``: one launch (docs/design.md §14).

    Args:
        tokens: token ids, 1-D and contiguous.
        out: where the slots go (may be ``tokens``).
        v2p: the table.
        n_ids: its sentinel row (one past the last id).
        page_size: tokens a page.
    """
    n = tokens.numel()
    launch(_triton().translate_kernel, _blocks(n), tokens, out, n, v2p, n_ids, page_size, BLOCK=BLOCK)


def move(
    rows: torch.Tensor, dst: torch.Tensor, src: torch.Tensor, v2p: torch.Tensor, p2v: torch.Tensor
) -> torch.Tensor:
    """Relocate pages ``src[i] -> dst[i]`` of ``rows``, bytes and tables: one
    launch (docs/design.md §14, "Relocation").

    Args:
        rows: the pool's pages as rows of words (``Arena._page_rows``), contiguous.
        dst: free destination pages, contiguous, at least one.
        src: live source pages, as many, contiguous, none a destination.
        v2p: the band's id -> page table.
        p2v: the band's page -> id table.

    Returns:
        Each pair's id, as ``p2v[src]`` held before the move.
    """
    k, words = src.numel(), rows.shape[1]
    ids = torch.empty_like(src)
    grid = (k, -(-words // MOVE_CHUNK))
    launch(_triton().move_kernel, grid, rows, words, dst, src, v2p, p2v, ids, CHUNK=MOVE_CHUNK)
    return ids


def prewarm(device: torch.device, queues: Iterable[bool], words: Iterable[torch.dtype] = ()) -> int:
    """Compile and run every variant of the step's kernels that serving can
    launch, each once on no work, before serving (SGLang's
    ``prewarm_compaction``; docs/design.md §14).  A first compile while
    serving stalls the scheduler, and a first launch can take device memory
    outside every pool, which an urgent relocation under a full pool then
    lacks.  The kernels specialize on no int and no alignment
    (``impl/triton_kernels.py``), so a variant is a choice of constexprs:
    a bind with and without a borrower (plain, decode, extend); a free and a
    window's free, into a ring or not (``queues``: a lender's band keeps
    one, a borrower's none), with and without a forward in flight, the
    window's at every sort width; the translation; a relocation's copy in
    each word type (``words``).  Every count is 0: no lane reads or writes
    a table; the copy moves one word of a scratch row onto itself, in
    scratch tables.

    Args:
        device: where the arena's tables live.
        queues: for each band that frees, whether it keeps a free-id ring.
        words: the word types of the pools a slide copies (``Arena._page_rows``).

    Returns:
        The launches made.
    """
    tk, made = _triton(), 0

    def counted(kernel: Any, go: Callable[[], None]) -> None:
        nonlocal made
        made += 1
        go()

    z = torch.zeros(SORT_WIDTH, dtype=torch.int64, device=device)  # scratch: no lane of these launches writes it
    none, ring = z[:0], Ring(z, 0, 1)
    side = Side(z, z, none, 0, z)
    with wrapped(counted):
        for borrower in (None, side):
            bind(0, ring, z, side, borrower, None)
            bind(0, ring, z, side, borrower, DecodeSlots(none, none, 1, z))
            one = z[:1]  # one request of no new token: its program binds nothing
            bind(0, ring, z, side, borrower, ExtendSlots(one, one, one, 1, z))
        for queue in sorted(set(queues)):
            for guard in (None, z):
                drop = Drop(z, ring if queue else None, z, guard, guard)
                free(none, z, z, drop)
                width = 16
                while width <= SORT_WIDTH:
                    free_live(z[:width], 1, 1, 0, z, z, drop)
                    width *= 2
        launch(tk.translate_kernel, _blocks(0), none, none, 0, z, 1, 1, BLOCK=BLOCK)
        for word in sorted(set(words), key=str):
            pair = torch.zeros(1, dtype=torch.int64, device=device)  # page 0 onto itself; its id row 0
            move(torch.zeros((1, 1), dtype=word, device=device), pair, pair, pair.clone(), pair.clone())
    return made
