"""The step's fused Triton kernels (docs/design.md §14).  Imported only by
``impl/kernels.py``, which chooses, checks and launches them.

Each kernel does one call's device work in one launch: the host has
already decided everything that sizes it (how many pages a bind takes,
from which holes and from which frontier page on, where the free-id ring's
head and tail are, how many pages a free drops) and moved its own
counters; the kernel writes the tables and the call's outputs.

A **bind** hands out its ``k``-th page from the band's first ``n_first``
holes (``first[k]``), then from the extension (``ext + k - n_first``), and
its ``k``-th id from the ring (``q[(head + k) % cap]``); a borrower binds
the same id to its own ``k``-th page.  Every kernel writes the ids and
pages it bound, or freed, into output tensors: the arena's undo journal
needs them (``impl/journal.py``).

All index arithmetic is int64.  No int argument is specialized on
(``do_not_specialize``): a count or a frontier takes any value from step to
step, and each specialization would be another compile.  Nor is a tensor's
alignment (``do_not_specialize_on_alignment``): a caller's slice of a row
or of the hole reserve starts anywhere.  So a kernel compiles once per
constexpr choice and dtype, which ``kernels.prewarm`` makes before serving
(docs/design.md §14).  ``//`` and ``%`` are C's here (they round
toward zero), so every operand they see is kept non-negative.
"""

import triton
import triton.language as tl

# Every tensor argument, by kernel family: none is specialized on its alignment.
_TABLES = ["v2p_a", "p2v_a", "first_a", "pages_a", "v2p_b", "p2v_b", "first_b", "pages_b"]
_DROP = ["v2p", "p2v", "pages_out", "q", "holes_out", "guard", "old_out"]


@triton.jit
def _bind_band(k, m, vid, v2p, p2v, first, n_first, ext, pages_out):
    """Bind id ``vid`` to the band's ``k``-th page of this bind."""
    from_hole = k < n_first
    hole = tl.load(first + k, mask=m & from_hole, other=0)
    page = tl.where(from_hole, hole, ext + (k - n_first))
    tl.store(v2p + vid, page, mask=m)
    tl.store(p2v + page, vid, mask=m)
    tl.store(pages_out + k, page, mask=m)


@triton.jit
def _bind(
    k, m, q, q_head, q_cap, ids_out,
    v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
    v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b,
    BORROW: tl.constexpr,
):  # fmt: skip
    """The ``k``-th page of a bind, in the lender and (``BORROW``) its borrower; its id."""
    vid = tl.load(q + (q_head + k) % q_cap, mask=m, other=0)
    tl.store(ids_out + k, vid, mask=m)
    _bind_band(k, m, vid, v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a)
    if BORROW:
        _bind_band(k, m, vid, v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b)
    return vid


@triton.jit(
    do_not_specialize=["n", "q_head", "q_cap", "n_first_a", "ext_a", "n_first_b", "ext_b"],
    do_not_specialize_on_alignment=["q", "ids_out", *_TABLES],
)
def bind_kernel(
    n, q, q_head, q_cap, ids_out,
    v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
    v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b,
    BORROW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """A plain bind of ``n`` pages (``Arena.alloc``, ``bind_with_borrowers``) (docs/design.md §14).

    Args:
        n (int): how many pages (ids, tokens).
        q (tensor): the free-id ring (or the ids given).
        q_head (int): the ring index of the bind's first id.
        q_cap (int): the ring's size.
        ids_out (tensor): out: the ids bound (``free_live``: its sort's scratch, the ids freed first).
        v2p_a (tensor): the lender's id -> page table.
        p2v_a (tensor): the lender's page -> id table.
        first_a (tensor): the lender's holes taken first.
        n_first_a (int): how many.
        ext_a (int): the lender's first extension page.
        pages_a (tensor): out: the lender's pages, by index.
        v2p_b (tensor): the borrower's id -> page table.
        p2v_b (tensor): the borrower's page -> id table.
        first_b (tensor): the borrower's holes taken first.
        n_first_b (int): how many.
        ext_b (int): the borrower's first extension page.
        pages_b (tensor): out: the borrower's pages, by index.
        BORROW (tl.constexpr): whether a borrower binds the same ids.
        BLOCK (tl.constexpr): lanes a program.
    """
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    _bind(
        k, k < n, q, q_head, q_cap, ids_out,
        v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
        v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b, BORROW,
    )  # fmt: skip


@triton.jit(
    do_not_specialize=["batch", "ps", "q_head", "q_cap", "n_first_a", "ext_a", "n_first_b", "ext_b"],
    do_not_specialize_on_alignment=["seq", "loc", "slots_out", "q", "ids_out", *_TABLES],
)
def decode_kernel(
    seq, loc, slots_out, batch, ps,
    q, q_head, q_cap, ids_out,
    v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
    v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b,
    BORROW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``alloc_decode``'s bind and slots: the ``k``-th request that opens a
    page (``seq % ps == 1 % ps``) binds the bind's ``k``-th page and takes
    its first slot; the others take ``last_loc + 1`` (docs/design.md §14).

    Args:
        seq (tensor): each request's length after the call.
        loc (tensor): each request's last slot before the call (``-1``: none).
        slots_out (tensor): out: the slots.
        batch (int): requests.
        ps (int): tokens a page.
        q (tensor): the free-id ring (or the ids given).
        q_head (int): the ring index of the bind's first id.
        q_cap (int): the ring's size.
        ids_out (tensor): out: the ids bound (``free_live``: its sort's scratch, the ids freed first).
        v2p_a (tensor): the lender's id -> page table.
        p2v_a (tensor): the lender's page -> id table.
        first_a (tensor): the lender's holes taken first.
        n_first_a (int): how many.
        ext_a (int): the lender's first extension page.
        pages_a (tensor): out: the lender's pages, by index.
        v2p_b (tensor): the borrower's id -> page table.
        p2v_b (tensor): the borrower's page -> id table.
        first_b (tensor): the borrower's holes taken first.
        n_first_b (int): how many.
        ext_b (int): the borrower's first extension page.
        pages_b (tensor): out: the borrower's pages, by index.
        BORROW (tl.constexpr): whether a borrower binds the same ids.
        BLOCK (tl.constexpr): lanes a program.
    """
    pid = tl.program_id(0)
    lane = tl.arange(0, BLOCK).to(tl.int64)
    opener = 1 % ps
    before = tl.sum(tl.zeros([BLOCK], tl.int64), 0)  # openers in the blocks before this one
    for j in range(pid):
        s = tl.load(seq + j * BLOCK + lane)  # a whole block: every earlier block is full
        before += tl.sum((s % ps == opener).to(tl.int64), 0)
    i = pid.to(tl.int64) * BLOCK + lane
    m = i < batch
    s = tl.load(seq + i, mask=m, other=0)
    last = tl.load(loc + i, mask=m, other=0)
    opens = m & (s % ps == opener)
    k = before + tl.cumsum(opens.to(tl.int64), 0) - 1
    vid = _bind(
        k, opens, q, q_head, q_cap, ids_out,
        v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
        v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b, BORROW,
    )  # fmt: skip
    tl.store(slots_out + i, tl.where(opens, vid * ps, last + 1), mask=m)


@triton.jit(
    do_not_specialize=["ps", "q_head", "q_cap", "n_first_a", "ext_a", "n_first_b", "ext_b"],
    do_not_specialize_on_alignment=["prefix", "seq", "loc", "slots_out", "q", "ids_out", *_TABLES],
)
def extend_kernel(
    prefix, seq, loc, slots_out, ps,
    q, q_head, q_cap, ids_out,
    v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
    v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b,
    BORROW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``alloc_extend``'s bind and slots, one program a request: it binds its
    own new pages (the bind's ``base, base + 1, ...``) and writes its slots
    at its output offset, both sums over the requests before it (docs/design.md §14).

    Args:
        prefix (tensor): each request's cached prefix.
        seq (tensor): each request's length after the call.
        loc (tensor): each request's last slot before the call (``-1``: none).
        slots_out (tensor): out: the slots.
        ps (int): tokens a page.
        q (tensor): the free-id ring (or the ids given).
        q_head (int): the ring index of the bind's first id.
        q_cap (int): the ring's size.
        ids_out (tensor): out: the ids bound (``free_live``: its sort's scratch, the ids freed first).
        v2p_a (tensor): the lender's id -> page table.
        p2v_a (tensor): the lender's page -> id table.
        first_a (tensor): the lender's holes taken first.
        n_first_a (int): how many.
        ext_a (int): the lender's first extension page.
        pages_a (tensor): out: the lender's pages, by index.
        v2p_b (tensor): the borrower's id -> page table.
        p2v_b (tensor): the borrower's page -> id table.
        first_b (tensor): the borrower's holes taken first.
        n_first_b (int): how many.
        ext_b (int): the borrower's first extension page.
        pages_b (tensor): out: the borrower's pages, by index.
        BORROW (tl.constexpr): whether a borrower binds the same ids.
        BLOCK (tl.constexpr): lanes a program.
    """
    r = tl.program_id(0)
    lane = tl.arange(0, BLOCK).to(tl.int64)
    out_at = tl.sum(tl.zeros([BLOCK], tl.int64), 0)  # tokens of the requests before
    base = tl.sum(tl.zeros([BLOCK], tl.int64), 0)  # new pages of the requests before
    for blk in range(tl.cdiv(r, BLOCK)):
        other = blk * BLOCK + lane
        earlier = other < r
        ep = tl.load(prefix + other, mask=earlier, other=0)
        es = tl.load(seq + other, mask=earlier, other=0)
        out_at += tl.sum(es - ep, 0)
        base += tl.sum((es + ps - 1) // ps - (ep + ps - 1) // ps, 0)
    p = tl.load(prefix + r)
    s = tl.load(seq + r)
    last = tl.load(loc + r)
    new = (s + ps - 1) // ps - (p + ps - 1) // ps
    cont = tl.minimum(s, (p + ps - 1) // ps * ps) - p  # tokens that continue the last page
    for c in range(tl.cdiv(new, BLOCK)):
        j = c * BLOCK + lane
        _bind(
            base + j, j < new, q, q_head, q_cap, ids_out,
            v2p_a, p2v_a, first_a, n_first_a, ext_a, pages_a,
            v2p_b, p2v_b, first_b, n_first_b, ext_b, pages_b, BORROW,
        )  # fmt: skip
    for c in range(tl.cdiv(s - p, BLOCK)):
        j = c * BLOCK + lane
        mm = j < s - p
        fresh = mm & (j >= cont)
        k = base + tl.where(fresh, j - cont, 0) // ps
        vid = tl.load(q + (q_head + k) % q_cap, mask=fresh, other=0)
        slot = tl.where(j < cont, last + 1 + j, vid * ps + (p + j) % ps)
        tl.store(slots_out + out_at + j, slot, mask=mm)


@triton.jit
def _free_id(
    vid, m, k, v2p, p2v, pages_out, q, q_tail, q_cap, holes_out, guard, old_out,
    QUEUE: tl.constexpr, HOLES: tl.constexpr, GUARD: tl.constexpr, FREED: tl.constexpr,
):  # fmt: skip
    """Free id ``vid``, the free's ``k``-th: unbind it, queue it, hole its page."""
    page = tl.load(v2p + vid, mask=m, other=0)
    tl.store(pages_out + k, page, mask=m)
    tl.store(v2p + vid, vid * 0 - 1, mask=m)
    tl.store(p2v + page, page * 0 - 1, mask=m)
    if QUEUE:
        tl.store(q + (q_tail + k) % q_cap, vid, mask=m)
    if HOLES:
        tl.store(holes_out + k, page, mask=m)
    if GUARD:  # a freed pin stays pinned, as FREED; anything else is -1 already
        old = tl.load(guard + page, mask=m, other=-1)
        tl.store(old_out + k, old, mask=m)
        tl.store(guard + page, tl.minimum(old, FREED), mask=m)


@triton.jit(do_not_specialize=["n", "q_tail", "q_cap"], do_not_specialize_on_alignment=["ids", *_DROP])
def free_kernel(
    ids, n, v2p, p2v, pages_out, q, q_tail, q_cap, holes_out, guard, old_out,
    QUEUE: tl.constexpr, HOLES: tl.constexpr, GUARD: tl.constexpr, FREED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``Arena.free`` of ``n`` distinct live ids, in their order (docs/design.md §14).

    Args:
        ids (tensor): the ids to free (distinct, live).
        n (int): how many pages (ids, tokens).
        v2p (tensor): the band's id -> page table.
        p2v (tensor): the band's page -> id table.
        pages_out (tensor): out: the pages bound or freed, by index.
        q (tensor): the free-id ring (or the ids given).
        q_tail (int): the ring index the free's first id goes to.
        q_cap (int): the ring's size.
        holes_out (tensor): the hole reserve's run the pages go to.
        guard (tensor): the in-flight guard table.
        old_out (tensor): out: the guard rows before the free.
        QUEUE (tl.constexpr): whether the ids go back to a ring (a borrower keeps none).
        HOLES (tl.constexpr): whether the pages become holes.
        GUARD (tl.constexpr): whether a forward is in flight (guard rows).
        FREED (tl.constexpr): the guard value of a freed pin.
        BLOCK (tl.constexpr): lanes a program.
    """
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = k < n
    vid = tl.load(ids + k, mask=m, other=0)
    _free_id(vid, m, k, v2p, p2v, pages_out, q, q_tail, q_cap, holes_out, guard, old_out, QUEUE, HOLES, GUARD, FREED)


@triton.jit(
    do_not_specialize=["stride", "n_tokens", "ps", "end", "count", "q_tail", "q_cap"],
    do_not_specialize_on_alignment=["tokens", "ids_out", *_DROP],
)
def free_live_kernel(
    tokens, stride, n_tokens, ps, end, count, ids_out,
    v2p, p2v, pages_out, q, q_tail, q_cap, holes_out, guard, old_out,
    QUEUE: tl.constexpr, HOLES: tl.constexpr, GUARD: tl.constexpr, FREED: tl.constexpr, WIDTH: tl.constexpr,
):  # fmt: skip
    """``Arena.free_live``: the distinct live ids among ``tokens // ps``
    (every ``stride``-th token), ascending, freed; ``count`` is how many.
    One program: the ids are sorted in one block of ``WIDTH`` lanes, dead
    ones keyed ``end`` (past every id), a repeat knocked out against its
    sorted neighbour, the rest packed to the front of ``ids_out`` (docs/design.md §14).

    Args:
        tokens (tensor): token ids (``t // ps`` is the id).
        stride (int): elements between two tokens.
        n_tokens (int): how many tokens.
        ps (int): tokens a page.
        end (int): one past the last id (the dead key).
        count (int): how many distinct live ids they name.
        ids_out (tensor): out: the ids bound (``free_live``: its sort's scratch, the ids freed first).
        v2p (tensor): the band's id -> page table.
        p2v (tensor): the band's page -> id table.
        pages_out (tensor): out: the pages bound or freed, by index.
        q (tensor): the free-id ring (or the ids given).
        q_tail (int): the ring index the free's first id goes to.
        q_cap (int): the ring's size.
        holes_out (tensor): the hole reserve's run the pages go to.
        guard (tensor): the in-flight guard table.
        old_out (tensor): out: the guard rows before the free.
        QUEUE (tl.constexpr): whether the ids go back to a ring (a borrower keeps none).
        HOLES (tl.constexpr): whether the pages become holes.
        GUARD (tl.constexpr): whether a forward is in flight (guard rows).
        FREED (tl.constexpr): the guard value of a freed pin.
        WIDTH (tl.constexpr): lanes of the one program: a power of two, at least ``n_tokens``.
    """
    lane = tl.arange(0, WIDTH).to(tl.int64)
    m = lane < n_tokens
    t = tl.load(tokens + lane * stride, mask=m, other=-1)
    vid = tl.where(t < 0, 0, t // ps)  # -1 reads the sink's row: dead
    live = tl.load(v2p + vid, mask=m, other=0) > 0
    key = tl.sort(tl.where(m & live, vid, end))
    tl.store(ids_out + lane, key)
    tl.debug_barrier()
    prev = tl.load(ids_out + lane - 1, mask=lane > 0, other=-1)
    tl.debug_barrier()
    keep = (key != prev) & (key < end)
    at = tl.cumsum(keep.to(tl.int64), 0) - 1
    tl.store(ids_out + at, key, mask=keep)
    tl.debug_barrier()
    mine = lane < count
    vid = tl.load(ids_out + lane, mask=mine, other=0)
    _free_id(
        vid, mine, lane, v2p, p2v, pages_out, q, q_tail, q_cap, holes_out, guard, old_out, QUEUE, HOLES, GUARD, FREED
    )


@triton.jit(do_not_specialize=["n", "n_ids", "ps"], do_not_specialize_on_alignment=["tokens", "slots_out", "v2p"])
def translate_kernel(tokens, slots_out, n, v2p, n_ids, ps, BLOCK: tl.constexpr):
    """Slots ``v2p[t // ps] * ps + t % ps``; a dead row, the sink's, and an
    id out of range (below 0 or past ``n_ids``: the ``-1`` sentinel's row) give 0 (docs/design.md §14).

    Args:
        tokens (tensor): token ids (``t // ps`` is the id).
        slots_out (tensor): out: the slots.
        n (int): how many pages (ids, tokens).
        v2p (tensor): the band's id -> page table.
        n_ids (int): the table's sentinel row (one past the last id).
        ps (int): tokens a page.
        BLOCK (tl.constexpr): lanes a program.
    """
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = i < n
    t = tl.load(tokens + i, mask=m, other=0)
    row = tl.where(t < 0, n_ids, tl.minimum(t // ps, n_ids))
    phys = tl.load(v2p + row, mask=m, other=0)
    slot = tl.where(phys > 0, phys * ps + tl.where(t < 0, 0, t % ps), 0)
    tl.store(slots_out + i, slot, mask=m)


@triton.jit(
    do_not_specialize=["words"],
    do_not_specialize_on_alignment=["rows", "dst", "src", "v2p", "p2v", "ids_out"],
)
def move_kernel(rows, words, dst, src, v2p, p2v, ids_out, CHUNK: tl.constexpr):
    """A relocation's pairs, one launch: program ``(i, j)`` copies words
    ``[j * CHUNK, (j + 1) * CHUNK)`` of page ``src[i]`` to page ``dst[i]``;
    program ``(i, 0)`` also moves the pair's id in the tables and writes it
    to ``ids_out[i]`` (the undo's).  The sets are disjoint (every
    destination is free), so no program reads a row another writes
    (docs/design.md §14, "Relocation").

    Args:
        rows (tensor): the pool's pages as rows of ``words`` words each.
        words (int): words a page.
        dst (tensor): destination pages, one a pair.
        src (tensor): live source pages, one a pair.
        v2p (tensor): the band's id -> page table.
        p2v (tensor): the band's page -> id table.
        ids_out (tensor): out: each pair's id (``-1``: none).
        CHUNK (tl.constexpr): words a program copies.
    """
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    s = tl.load(src + i)
    d = tl.load(dst + i)
    w = j * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    m = w < words
    tl.store(rows + d * words + w, tl.load(rows + s * words + w, mask=m), mask=m)
    if j == 0:
        vid = tl.load(p2v + s)
        tl.store(ids_out + i, vid)
        tl.store(p2v + s, -1)
        tl.store(p2v + d, vid)
        tl.store(v2p + tl.maximum(vid, 0), d, mask=vid >= 0)
