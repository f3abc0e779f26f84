"""Relocation at bandwidth (issue 23, item 3): every move copies whole page
envelopes as the widest words that fit, in one pass where it can.

``Arena._page_rows`` picks the word (8, 4, 2 or 1 bytes: the widest dividing
the envelope and the buffer's address); ``Arena._copy_pages`` picks the
pass from the move's shape.  Checked here: the word chosen for every
envelope and lent-buffer offset; the bytes of every shape of move (runs,
scattered, overlapping, sync-free) against a plain reference, with the
temporary shrunk to one page so the chunk order matters; every relocation
of the arena (leapfrog both ways, make_room, compact_holes, flush, eager
compaction, the planner's repack) keeps each live id's bytes; and no move
falls back to byte rows where a wider word fits (a seam, not timing).
"""

import pytest
import torch

from kvarena.impl import Arena, SubPool
from kvarena.impl import arena as arena_mod

# envelope (bytes) -> the word a move should use on an aligned buffer
EPPS = {24: torch.int64, 12: torch.int32, 6: torch.int16, 5: torch.uint8}


def pools(epp):
    return [SubPool("lo", epp, 1, "up"), SubPool("f", epp, 1, "float"), SubPool("hi", epp, 1, "down")]


def make(epp, offset=None, lazy=False, pages=64):
    """An arena of ``pages`` envelopes; ``offset``: on a lent buffer that many
    bytes into a larger allocation (an engine's storage need not be aligned)."""
    total = epp * pages
    if offset is None:
        return Arena(total, pools(epp), lazy=lazy)
    backing = torch.zeros(total + 16, dtype=torch.uint8)
    return Arena(total, pools(epp), lazy=lazy, buffer=backing[offset : offset + total])


def random_bytes(a):
    a.buffer.copy_(
        torch.randint(0, 256, (a.buffer.numel(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    )


# ------------------------------------------------------------- the word


@pytest.mark.parametrize("epp", list(EPPS))
def test_the_word_is_the_widest_dividing_the_envelope(epp):
    a = make(epp)
    rows = a._page_rows("f")
    assert rows.dtype == EPPS[epp]
    assert rows.shape == (a.geometry("f").num_pages, epp // rows.element_size())
    assert rows.data_ptr() == a.page_view("f").data_ptr()  # the same bytes, not a copy


@pytest.mark.parametrize(
    ("offset", "want"),
    [
        (0, torch.int64),
        (8, torch.int64),
        (4, torch.int32),
        (2, torch.int16),
        (6, torch.int16),
        (1, torch.uint8),
        (3, torch.uint8),
    ],
)
def test_a_lent_buffer_caps_the_word_at_its_alignment(offset, want):
    a = make(24, offset)
    assert a.buffer.data_ptr() % 8 == offset % 8
    assert a._page_rows("f").dtype == want


# --------------------------------------------------------- the copy itself

# name -> (src, dst) as offsets from the grid's first page; each a shape
# ``_copy_pages`` treats its own way
SHAPES = {
    "both runs": (list(range(8)), list(range(20, 28))),
    "destination run": ([1, 3, 4, 9, 12], list(range(20, 25))),
    "destination run inside the sources": ([0, 30], [10, 11]),
    "source run": (list(range(5)), [30, 22, 25, 21, 33]),
    "scattered": ([1, 5, 2, 40], [30, 20, 26, 3]),
    "interleaved": ([0, 2, 4, 6], [1, 3, 5, 7]),
    "shift up": (list(range(10)), list(range(3, 13))),
    "pack up": ([0, 2, 3, 6], [4, 5, 6, 7]),
    "shift down": (list(range(5, 15)), list(range(2, 12))),
    "pack down": ([3, 5, 8, 9], [1, 2, 3, 4]),
    "cycle": ([1, 2, 3], [2, 3, 1]),
    "crossing": ([1, 9, 4], [5, 2, 8]),
}
DISJOINT = {
    "both runs",
    "destination run",
    "destination run inside the sources",
    "source run",
    "scattered",
    "interleaved",
}


def copy_and_compare(a, name, src, dst, disjoint):
    m = a.geometry(name).min_page
    src_t = torch.tensor([m + s for s in src], dtype=torch.int64)
    dst_t = torch.tensor([m + d for d in dst], dtype=torch.int64)
    before = a.page_view(name).clone()
    want = before.clone()
    want[dst_t] = before[src_t]  # every source read before any destination is written
    a._copy_pages(name, dst_t, src_t, disjoint)
    assert torch.equal(a.page_view(name), want)


@pytest.fixture(params=["default", "one page"])
def temp(request, monkeypatch):
    """The gather's temporary as built, or one envelope: every pair its own
    chunk, so a chunk order that overwrites a source before it is read fails."""
    if request.param == "one page":
        monkeypatch.setattr(arena_mod, "TEMP_BYTES", {"cpu": 1, "cuda": 1})
    return request.param


@pytest.mark.parametrize("offset", [None, 1, 4])
@pytest.mark.parametrize("epp", list(EPPS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_cold_moves_land_where_the_pairs_say(shape, epp, offset, temp):
    a = make(epp, offset)
    random_bytes(a)
    src, dst = SHAPES[shape]
    copy_and_compare(a, "f", src, dst, False)


@pytest.mark.parametrize("epp", list(EPPS))
@pytest.mark.parametrize("shape", sorted(DISJOINT))
def test_sync_free_moves_land_where_the_pairs_say(shape, epp, temp):
    a = make(epp)
    random_bytes(a)
    src, dst = SHAPES[shape]
    copy_and_compare(a, "f", src, dst, True)


@pytest.mark.parametrize("offset", [None, 3])
@pytest.mark.parametrize("epp", list(EPPS))
def test_a_source_run_with_self_pairs_lands_in_one_pass(epp, offset):
    """Eager compaction's shape: the vacated run, survivors to holes below,
    dead pages onto themselves."""
    a = make(epp, offset)
    random_bytes(a)
    m = a.geometry("f").min_page
    src = list(range(20, 26))
    dst = [3, 20, 7, 22, 23, 1]  # 20, 22, 23 stay
    copy_and_compare(a, "f", src, dst, arena_mod.SrcRun(m + 20))


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        ("both runs", (False, True, False, 0, 20)),
        ("destination run", (False, True, False, None, 20)),
        ("source run", (False, False, False, 0, None)),
        ("scattered", (False, False, False, None, None)),
        ("destination run inside the sources", (False, False, False, None, 10)),
        ("shift up", (True, True, False, 0, 3)),
        ("pack down", (True, False, True, None, 1)),
        ("cycle", (True, False, False, 1, None)),
    ],
)
def test_the_shape_read(shape, want):
    a = make(8)
    src, dst = SHAPES[shape]
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    assert a._move_shape(t(dst), t(src)) == want


# ------------------------------------------------ every relocation, end to end


def stamped(a):
    """Stamp every live id of every pool with its own bytes; return a checker."""
    data = {}
    for name in a.chain:
        v2p, _ = a.live_tables(name)
        ids = [i for i in range(a.id_end(name)) if int(v2p[i]) >= 0 and i > 0]
        epp = a.geometry(name).epp
        d = torch.randint(0, 256, (len(ids), epp), dtype=torch.uint8, generator=torch.Generator().manual_seed(len(ids)))
        if ids:
            a.write_pages(name, ids, d)
        data[name] = (ids, d)

    def check():
        a.verify()
        for name, (ids, d) in data.items():
            live = [i for i in ids if int(a.live_tables(name)[0][i]) >= 0]
            keep = [ids.index(i) for i in live]
            if live:
                assert torch.equal(a.read_pages(name, live), d[keep]), name

    return check


def relocations(a):
    """Every kind of relocation the arena makes, each checked to move pages
    and to keep every live id's bytes."""
    epp = a.geometry("f").epp
    lo, f, hi = a.alloc("lo", 8), a.alloc("f", 12), a.alloc("hi", 6)
    check = stamped(a)
    a.free("f", f[1:10:2])  # holes in the float
    check = stamped(a)
    moved = {}
    moved["make_room low"] = a.make_room("f", "low", a.frontiers("f")[0] - a.below("f") + 3 * epp)
    check()
    moved["compact_holes"] = a.compact_holes("f", "low")
    check()
    n = a.live_pages("f")
    moved["leapfrog high"] = a.make_room("f", "high", a.above("f") - a.below("f") - n * epp)
    check()
    moved["leapfrog low"] = a.make_room("f", "low", a.above("f") - a.below("f") - n * epp)
    check()
    a.free("f", a.alloc("f", 3)[:2])
    moved["make_room high"] = a.make_room("f", "high", a.above("f") - a.frontiers("f")[1] + 2 * epp)
    check()
    moved["repack"] = a.plan_floats({"hi": a.available_pages("hi") + 3})
    check()
    for name, ids in (("lo", lo[[1, 2, 6]]), ("hi", hi[[1, 4]])):
        # eager: compaction (a survivor and dead pages in the vacated run); lazy: holes for the flush
        a.free(name, ids)
        moved[f"{name} free/flush"] = a.flush(name) if a.is_lazy(name) else ids.numel()
        check()
    return moved


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("offset", [None, 1, 2, 4])
@pytest.mark.parametrize("epp", list(EPPS))
def test_every_relocation_keeps_the_bytes(epp, offset, lazy, temp):
    moved = relocations(make(epp, offset, lazy))
    assert all(moved.values()), moved  # each step moved pages


# ------------------------------------------------------------ the seam


def words_used(monkeypatch, a):
    """Run every relocation on ``a``, recording the word of each move's rows;
    byte rows (``page_view``) may not be read during a move."""
    used = []
    real_rows = arena_mod.Arena._page_rows
    real_copy = arena_mod.Arena._copy_pages

    def rows(self, name):
        r = real_rows(self, name)
        used.append(r.dtype)
        return r

    def copy(self, *args):
        n = len(used)
        with monkeypatch.context() as m:
            m.setattr(arena_mod.Arena, "page_view", lambda *_: pytest.fail("a move read byte rows"))
            real_copy(self, *args)
        assert len(used) > n, "a move copied without _page_rows"

    monkeypatch.setattr(arena_mod.Arena, "_page_rows", rows)
    monkeypatch.setattr(arena_mod.Arena, "_copy_pages", copy)
    relocations(a)
    monkeypatch.undo()
    return used


def only_word(used, epp):
    assert used and set(used) == {EPPS[epp]}, f"moves used {sorted(set(map(str, used)))}, want {EPPS[epp]}"


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("epp", list(EPPS))
def test_no_move_falls_back_to_bytes_where_a_word_fits(monkeypatch, epp, lazy):
    only_word(words_used(monkeypatch, make(epp, lazy=lazy)), epp)


def test_the_seam_catches_a_byte_copy(monkeypatch):
    """Planted: moves through uint8 rows, as before issue 23.  Caught."""
    monkeypatch.setattr(arena_mod.Arena, "_page_rows", arena_mod.Arena.page_view)
    used = words_used(monkeypatch, make(24))
    with pytest.raises(AssertionError, match="moves used"):
        only_word(used, 24)
