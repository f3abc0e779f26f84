"""One public-surface contract, run against kvarena's drop-in and against SGLang's own allocators.

Each test builds a stack through SGLang's real factory (``stacks.build``): with ``kvarena.sglang.install()`` for
``impl="kvarena"``, and SGLang's own allocator for ``impl="sglang"``, whose paged ``alloc_extend``/``alloc_decode``
run on CPU inside ``stacks.cpu_kernels()``.  The contract is what SGLang's callers rely on (counts, ``None`` on
shortfall with nothing changed, unique ids off the sink, frees and free groups, SWA tombstones, translations, live
page tables, mamba slots, ``clear``); where the two allocators may differ by policy the test asserts the contract,
not equality.  Bad input: kvarena raises ``ValueError`` naming the pool with nothing changed; SGLang asserts,
raises something else or accepts it silently, and each case says which.
"""

import contextlib
from dataclasses import dataclass

import pytest
import torch

from kvarena.sglang import stacks

I64 = torch.int64
IMPLS = ("kvarena", "sglang")
SWA_KINDS = ("swa", "mamba_swa")
MAMBA_KINDS = ("mamba", "mamba_swa")
G = stacks.Geometry(tokens=64, mamba_slots=8, context_len=64)


def T(xs) -> torch.Tensor:
    return torch.tensor(list(xs), dtype=I64)


@dataclass
class Stack:
    impl: str
    kind: str
    ps: int
    lazy: bool
    bundle: object

    @property
    def a(self):
        return self.bundle.token_to_kv_pool_allocator

    @property
    def m(self):
        """SGLang's ``UnifiedMambaSlotAllocator`` (``req_to_token_pool.mamba_allocator``), or None."""
        return self.bundle.req_to_token_pool.mamba_allocator if self.kind in MAMBA_KINDS else None

    @property
    def swa(self) -> bool:
        return self.kind in SWA_KINDS


@pytest.fixture
def build():
    """``build(impl, kind, ps, lazy)``: a fresh stack (SGLang's kernels answered on CPU for the whole test)."""
    from kvarena import sglang as ks

    def make(impl: str, kind: str, ps: int, lazy: bool = True) -> Stack:
        if impl == "kvarena":
            ks.install()
        try:
            bundle = stacks.build(kind, G, page_size=ps, lazy=lazy)
        finally:
            ks.uninstall()
        s = Stack(impl, kind, ps, lazy, bundle)
        assert hasattr(s.a, "composite") == (impl == "kvarena")
        return s

    with stacks.cpu_kernels():
        yield make


CASES = [(i, k, ps) for i in IMPLS for k in stacks.KINDS for ps in (1, 4)]
LAZY_CASES = [(i, k, ps, lazy) for i, k, ps in CASES for lazy in (False, True)]


def _id(case) -> str:
    return "-".join(str(x) if not isinstance(x, bool) else ("lazy" if x else "eager") for x in case)


@pytest.fixture(params=CASES, ids=_id)
def s(request, build) -> Stack:
    return build(*request.param)


@pytest.fixture(params=LAZY_CASES, ids=_id)
def sl(request, build) -> Stack:
    return build(*request.param)


# ------------------------------------------------------------------ helpers


class Req:
    """One request's kv row: its token ids, position by position."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.slots: torch.Tensor | None = None  # its mamba state slots, where it has some

    @property
    def last(self) -> int:
        return self.ids[-1] if self.ids else -1


def extend(a, reqs: list[Req], news: list[int]) -> torch.Tensor | None:
    """``alloc_extend`` of ``news[i]`` more tokens for each request (ScheduleBatch's call at page size > 1; both
    allocators serve it at page size 1 too)."""
    prefix = [len(r.ids) for r in reqs]
    seq = [p + n for p, n in zip(prefix, news)]
    out = a.alloc_extend(T(prefix), T(prefix), T(seq), T(seq), T(r.last for r in reqs), sum(news))
    if out is not None:
        assert out.dtype == I64 and out.shape == (sum(news),)
        at = 0
        for r, n in zip(reqs, news):
            r.ids += out[at : at + n].tolist()
            at += n
    return out


def decode(a, reqs: list[Req]) -> torch.Tensor | None:
    """One more token per request, as ScheduleBatch asks: ``alloc_decode`` when pages hold several tokens, and
    ``alloc(bs)`` at page size 1 (SGLang's ``alloc_decode`` counts no new page there: ``seq % 1 == 1`` never
    holds)."""
    seq = [len(r.ids) + 1 for r in reqs]
    last = T(r.last for r in reqs).to(torch.int32)  # req_to_token rows are int32
    out = a.alloc(len(reqs)) if a.page_size == 1 else a.alloc_decode(T(seq), T(seq), last)
    if out is not None:
        assert out.dtype == I64 and out.shape == (len(reqs),)
        for r, t in zip(reqs, out.tolist()):
            r.ids.append(t)
    return out


def counts(s: Stack) -> dict[str, int]:
    a = s.a
    c = {"available": a.available_size(), "full": a.full_available_size()}
    if s.swa:
        c |= {
            "swa": a.swa_available_size(),
            "conserve_full": a.conserve_full_available_size(),
            "conserve_swa": a.conserve_swa_available_size(),
        }
    if s.m is not None:
        c |= {"slots": s.m.available_size(), "slots_schedulable": s.m.schedulable_available_size()}
    return c


def tables(s: Stack) -> dict[str, torch.Tensor]:
    t = {"full_v2p": s.a.full_v2p_page_table.clone(), "full_p2v": s.a.full_p2v_page_table.clone()}
    if s.swa:
        t["swa_v2p"] = s.a.swa_v2p_page_table.clone()
    if s.m is not None:
        t["slot_v2p"] = s.m.virtual_to_physical.clone()
    return t


def snapshot(s: Stack):
    return counts(s), tables(s)


def assert_same(s: Stack, snap) -> None:
    c, t = snap
    assert counts(s) == c
    now = tables(s)
    assert now.keys() == t.keys()
    for k in t:
        assert torch.equal(now[k], t[k]), k


@contextlib.contextmanager
def unchanged(s: Stack):
    snap = snapshot(s)
    yield
    assert_same(s, snap)


def fill(s: Stack) -> torch.Tensor:
    """Take everything ``available_size`` promises, in one ``alloc``; nothing is left."""
    n = s.a.available_size() // s.ps * s.ps
    ids = s.a.alloc(n)
    assert ids is not None and ids.numel() == n
    return ids


def pages_of(ids: torch.Tensor, ps: int) -> torch.Tensor:
    return torch.unique(torch.div(ids, ps, rounding_mode="floor"))


# --------------------------------------------------------------------- counts


@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("lazy", (False, True))
def test_boot_views_agree(build, kind, ps, lazy):
    """At boot both allocators report the same counts and sub-allocator geometry: one buffer, one layout."""
    ours, theirs = build("kvarena", kind, ps, lazy), build("sglang", kind, ps, lazy)
    assert counts(ours) == counts(theirs)
    c = counts(ours)
    assert c["available"] > 0 and c["available"] % ps == 0 and c["full"] > 0
    if ours.m is not None:
        assert c["slots"] == ours.m.size > 0 and c["slots_schedulable"] > 0
    fields = ("page_size", "entry_bytes", "entry_bytes_per_page", "num_pages", "min_page_index", "min_slot_index")
    fields += ("grow_direction", "num_virtual_ids", "sub_pool_name")
    for view in ("full_attn_allocator", "swa_attn_allocator", "mamba_allocator"):
        if hasattr(theirs.a, view):
            mine, sg = getattr(ours.a, view), getattr(theirs.a, view)
            assert {f: getattr(mine, f) for f in fields} == {f: getattr(sg, f) for f in fields}, view
            assert (mine.allocated_count(), mine.available_size()) == (sg.allocated_count(), sg.available_size())
    for name in ("size", "size_full", "size_swa", "size_mamba", "page_size"):
        if hasattr(theirs.a, name):
            assert getattr(ours.a, name) == getattr(theirs.a, name), name
    assert ours.a.get_kvcache() is ours.bundle.token_to_kv_pool


def test_available_size_is_what_alloc_takes(sl):
    """``available_size()`` never over-promises: after holes (lazy) or none (eager), ``alloc(available)`` succeeds,
    and once it has, a further page is refused with nothing changed."""
    s = sl
    a, ps = s.a, s.ps
    reqs = [Req() for _ in range(3)]
    assert extend(a, reqs, [3 * ps, 2 * ps + 1, ps]) is not None
    a.free(T(reqs[1].ids))
    assert a.available_size() % ps == 0
    fill(s)
    assert a.available_size() < ps
    with unchanged(s):
        assert a.alloc(ps) is None


# --------------------------------------------------------- shortfall is None


def test_shortfall_returns_none_and_changes_nothing(s):
    a, ps = s.a, s.ps
    with unchanged(s):
        assert a.alloc(1000 * ps) is None
        assert extend(a, [Req()], [1000 * ps]) is None
        assert extend(a, [Req(), Req()], [a.available_size(), ps]) is None
    r = Req()
    assert extend(a, [r], [ps]) is not None  # one full page: its next decode opens a new one
    fill(s)
    with unchanged(s):
        assert a.alloc(ps) is None
        assert extend(a, [Req()], [1]) is None
        assert decode(a, [r]) is None
    assert len(r.ids) == ps


# --------------------------------------------------------------------- ids


def test_ids_are_unique_paged_and_never_the_sink(s):
    """A mixed workload until the pool runs dry: every id is fresh, never on page 0, laid out by page (position
    ``p`` of a request sits at ``page * ps + p % ps``, one page per ``ps`` positions), and its physical slots are
    distinct and off the sink too."""
    a, ps = s.a, s.ps
    reqs: list[Req] = []
    while True:
        batch = [Req(), Req()]
        if extend(a, batch, [2 * ps + 1, ps - 1 or 1]) is None:
            break
        reqs += batch
        if extend(a, batch[:1], [ps + 2]) is None or decode(a, batch) is None:
            break
    assert len(reqs) >= 4
    while decode(a, reqs[:2]) is not None:
        pass
    ids = T(t for r in reqs for t in r.ids)
    assert ids.unique().numel() == ids.numel()
    assert bool((torch.div(ids, ps, rounding_mode="floor") > 0).all())
    for r in reqs:
        row = T(r.ids)
        pos = torch.arange(row.numel())
        assert torch.equal(row % ps, pos % ps)
        page = torch.div(row, ps, rounding_mode="floor")
        same = torch.div(pos[1:], ps, rounding_mode="floor") == torch.div(pos[:-1], ps, rounding_mode="floor")
        assert torch.equal(page[1:] == page[:-1], same)
    phys = a.translate_kv_loc(ids)
    assert bool((phys > 0).all()) and phys.unique().numel() == ids.numel()
    if s.swa:
        sw = a.translate_loc_from_full_to_swa(ids)
        assert bool((sw > 0).all()) and sw.unique().numel() == ids.numel()


# ------------------------------------------------------------------- frees


FREES = ("free", "free_segment", "free_segments")


@pytest.mark.parametrize("how", FREES)
def test_frees_restore_the_views(sl, how):
    s = sl
    a, ps = s.a, s.ps
    boot = counts(s)
    reqs = [Req() for _ in range(3)]
    assert extend(a, reqs, [2 * ps + 1, ps, 3]) is not None
    assert decode(a, reqs) is not None
    assert counts(s)["available"] < boot["available"]
    for r in reqs:
        row = T(r.ids)
        if how == "free":
            a.free(row)
        elif how == "free_segment":
            a.free_segment(row, start_pos=0)
        else:
            cut = ps * (len(r.ids) // (2 * ps))  # two page-disjoint segments of one row
            a.free_segments([(row[:cut], 0), (row[cut:], cut)])
    assert counts(s) == boot
    assert bool((a.full_v2p_page_table[1:] < 0).all()) and bool((a.full_p2v_page_table[1:] < 0).all())
    if s.swa:
        assert bool((a.swa_v2p_page_table[1:] < 0).all())


def test_free_group_takes_effect_at_its_end(s):
    a, ps = s.a, s.ps
    boot = counts(s)
    reqs = [Req() for _ in range(4)]
    assert extend(a, reqs, [ps + 1, 2 * ps, ps, 2]) is not None
    a.free_group_begin()
    with unchanged(s):
        a.free(T(reqs[0].ids))
        a.free_segment(T(reqs[1].ids), start_pos=0)
        a.free_segments([(T(reqs[2].ids), 0)])
    if s.swa:  # the SWA side goes at once (see the SWA tests), the full side with the group
        a.free_swa(T(reqs[3].ids))
        with unchanged(s):
            a.free_full_segments([(T(reqs[3].ids), 0)])
    else:
        with unchanged(s):
            a.free_full_segments([(T(reqs[3].ids), 0)])  # no SWA peer: a plain free
    assert counts(s) != boot
    a.free_group_end()
    assert counts(s) == boot
    a.free_group_begin()  # a group closes: another may open
    a.free_group_end()
    assert counts(s) == boot


# --------------------------------------------------------------------- SWA


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", SWA_KINDS)
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("how", ("free_swa", "free_swa_segment"))
def test_swa_frees_tombstone_only_swa(build, impl, kind, ps, how):
    s = build(impl, kind, ps)
    a = s.a
    boot = counts(s)
    r = Req()
    assert extend(a, [r], [3 * ps]) is not None
    row, k = T(r.ids), 2 * ps  # the first two pages leave the window
    full_before, swa_before = a.translate_kv_loc(row), a.translate_loc_from_full_to_swa(row)
    v2p_before = a.full_v2p_page_table.clone()
    before = counts(s)
    if how == "free_swa":
        a.free_swa(row[:k])
        a.free_swa(row[:k])  # already tombstoned: nothing more
    else:
        a.free_swa_segment(row[:k], start_pos=0)
    swa_after = a.translate_loc_from_full_to_swa(row)
    assert bool((swa_after[:k] == 0).all()) and torch.equal(swa_after[k:], swa_before[k:])
    assert torch.equal(a.translate_kv_loc(row), full_before) and torch.equal(a.full_v2p_page_table, v2p_before)
    assert bool((a.swa_v2p_page_table[pages_of(row[:k], ps)] < 0).all())
    after = counts(s)
    assert after["conserve_full"] == before["conserve_full"]
    assert after["conserve_swa"] == before["conserve_swa"] + k
    assert after["swa"] >= before["swa"]
    a.free_full_segment(row[:k], start_pos=0)  # the full side of the tombstoned pages
    a.free(row[k:])  # the rest, both sides
    assert counts(s) == boot


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", SWA_KINDS)
@pytest.mark.parametrize("ps", (1, 4))
def test_swa_tombstones_are_immediate_inside_a_group(build, impl, kind, ps):
    """In a free group, ``free_swa_segment`` applies at once (SGLang's window eviction relies on it) and
    ``free_full`` waits for the end."""
    s = build(impl, kind, ps)
    a = s.a
    boot = counts(s)
    r = Req()
    assert extend(a, [r], [2 * ps]) is not None
    row = T(r.ids)
    a.free_group_begin()
    a.free_swa_segment(row, start_pos=0)
    assert bool((a.translate_loc_from_full_to_swa(row) == 0).all())
    held = snapshot(s)
    a.free_full(row)
    assert_same(s, held)
    a.free_group_end()
    assert counts(s) == boot


# --------------------------------------------------------------- translation


def _translations(s: Stack):
    a = s.a
    out = {"translate_kv_loc": a.translate_kv_loc, "translate_write_loc": a.translate_write_loc}
    if s.swa:
        out["translate_loc_from_full_to_swa"] = a.translate_loc_from_full_to_swa
    return out


def test_translation_semantics(s):
    a, ps = s.a, s.ps
    reqs = [Req(), Req()]
    assert extend(a, reqs, [2 * ps + 1, ps + 3]) is not None
    ids = T(t for r in reqs for t in r.ids)
    gone = Req()
    assert extend(a, [gone], [ps]) is not None
    a.free(T(gone.ids))  # an unbound id
    n_ids = a.full_attn_allocator.num_virtual_ids * ps
    bad = T([-5, -1, -ps - 1, gone.ids[0], n_ids, n_ids + 1, 10**9])
    for name, f in _translations(s).items():
        ref = f(ids)
        assert ref.dtype == I64 and ref.shape == ids.shape and bool((ref > 0).all()), name
        assert torch.equal(f(ids.to(torch.int32)), ref), name
        n = ids.numel() // 2 * 2
        two = f(ids[:n].reshape(2, -1))
        assert two.shape == (2, n // 2) and torch.equal(two.reshape(-1), ref[:n]), name
        out = torch.full_like(ids, 7)
        got = f(ids, out=out)
        assert got.data_ptr() == out.data_ptr() and torch.equal(out, ref), name
        assert torch.equal(f(bad), torch.zeros_like(bad)), name
        assert torch.equal(f(T([0])), T([0])), name  # the sink maps to itself
    wide = torch.full((ids.numel() + 3,), 7, dtype=I64)
    a.translate_write_loc(ids, out=wide, out_width=ids.numel() + 2)
    assert torch.equal(wide[: ids.numel()], a.translate_kv_loc(ids))
    assert wide[ids.numel() :].tolist() == [0, 0, 7]


def test_page_tables_are_live(s):
    """References taken at boot see every later binding: the properties are one tensor, updated in place."""
    a, ps = s.a, s.ps
    full_v2p, full_p2v = a.full_v2p_page_table, a.full_p2v_page_table
    swa_v2p = a.swa_v2p_page_table if s.swa else None
    slot_v2p = s.m.virtual_to_physical if s.m is not None else None
    fa = a.full_attn_allocator
    for t in (full_v2p, full_p2v, swa_v2p, slot_v2p):
        if t is not None:
            assert t.dtype == I64 and int(t[0]) == 0
    assert full_v2p.numel() == fa.num_virtual_ids + 1 and int(full_v2p[-1]) == -1
    assert full_p2v.numel() >= fa.num_pages  # SGLang's has one more row, a -1 sentinel; kvarena's stops at num_pages
    r = Req()
    assert extend(a, [r], [2 * ps + 1]) is not None
    pages = pages_of(T(r.ids), ps)
    assert a.full_v2p_page_table.data_ptr() == full_v2p.data_ptr()
    assert torch.equal(a.full_v2p_page_table, full_v2p) and torch.equal(a.full_p2v_page_table, full_p2v)
    phys = full_v2p[pages]
    assert bool((phys > 0).all()) and torch.equal(full_p2v[phys], pages)
    assert torch.equal(a.translate_kv_loc(T(r.ids)), phys.repeat_interleave(ps)[: len(r.ids)] * ps + T(r.ids) % ps)
    if swa_v2p is not None:
        assert bool((swa_v2p[pages] > 0).all()) and torch.equal(a.swa_v2p_page_table, swa_v2p)
    if slot_v2p is not None:
        slots = s.m.alloc(2)
        assert slots is not None and bool((slot_v2p[slots] > 0).all())
        assert torch.equal(s.m.translate(slots), slot_v2p[slots])
    a.free(T(r.ids))
    assert bool((full_v2p[pages] < 0).all()) and bool((full_p2v[phys] < 0).all())
    if swa_v2p is not None:
        assert bool((swa_v2p[pages] < 0).all())


# ------------------------------------------------------------------ mamba


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", MAMBA_KINDS)
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("lazy", (False, True))
def test_mamba_slots(build, impl, kind, ps, lazy):
    s = build(impl, kind, ps, lazy)
    a, m = s.a, s.m
    boot = counts(s)
    size = m.size
    assert m.available_size() == size
    with unchanged(s):
        assert m.alloc(size + 1) is None
    slots = m.alloc(3)
    assert slots is not None and slots.dtype == I64 and slots.shape == (3,)
    assert slots.unique().numel() == 3 and bool((slots > 0).all())
    phys = m.translate(slots)
    assert bool((phys > 0).all()) and phys.unique().numel() == 3
    assert m.available_size() == size - 3
    assert a.available_size() <= boot["available"]  # state slots and tokens share the buffer
    m.free(slots)
    assert_restored(s, boot)
    m.alloc_group_begin(3)
    one = m.alloc(1)
    assert one is not None and one.numel() == 1
    m.alloc_group_end()  # the two unused come back
    assert m.available_size() == size - 1
    m.free(one)
    assert_restored(s, boot)


def assert_restored(s: Stack, boot: dict[str, int]) -> None:
    """The counts are back; with lazy compaction, freed state slots may stay holes at the state END's frontier
    until a flush, so the joint token view may stay lower (both allocators do this)."""
    now = counts(s)
    if s.lazy:
        assert now.pop("available") <= boot["available"]
        boot = {k: v for k, v in boot.items() if k != "available"}
    assert now == boot


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", MAMBA_KINDS)
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("lazy", (False, True))
def test_prepare_mamba_allocation_then_alloc(build, impl, kind, ps, lazy):
    """Tokens fill the buffer, then every other request is freed (lazy: holes the state END cannot use without a
    move).  The donor calls SGLang's tree makes: ``full_tokens_before_mamba_recheck`` is a count, and after
    ``prepare_mamba_allocation(k)`` for the ``k`` that ``schedulable_available_size`` promises, ``alloc(k)``
    succeeds."""
    s = build(impl, kind, ps, lazy)
    a, m = s.a, s.m
    reqs = []
    while extend(a, [r := Req()], [4 * ps]) is not None:
        reqs.append(r)
    fill(s)
    for r in reqs[::2]:
        a.free(T(r.ids))
    donor = a.mamba_full_cache_donor()
    assert donor is a
    want = m.schedulable_available_size()
    assert want > 0 or kind == "mamba_swa"  # the float between them keeps the freed bytes from the state END
    assert donor.full_tokens_before_mamba_recheck(want + 1) > 0
    assert donor.full_tokens_before_mamba_recheck(0) == 0
    a.prepare_mamba_allocation(want)
    assert a.mamba_allocator.available_size() >= want
    got = m.alloc(want)
    assert got is not None and got.numel() == want and got.unique().numel() == want
    m.free(got)


# ------------------------------------------------------- SGLang's radix cache


def radix_cache(s: Stack):
    """SGLang's own ``UnifiedRadixCache`` over the stack (the components unified memory builds, less MAMBA: a state
    component needs page size 1 and per-request slots, which the eviction hooks do not read)."""
    from kvarena.anchor.loader import import_sglang

    params = import_sglang("sglang.srt.mem_cache.cache_init_params")
    comp = import_sglang("sglang.srt.mem_cache.unified_cache.components").ComponentType
    urc = import_sglang("sglang.srt.mem_cache.unified_radix_cache")
    if s.m is not None:
        rtp = s.bundle.req_to_token_pool
    else:
        pool = import_sglang("sglang.srt.mem_cache.memory_pool")
        rtp = pool.ReqToTokenPool(size=4, max_context_len=256 * s.ps, device="cpu", enable_memory_saver=False)
    return urc.UnifiedRadixCache(
        params.CacheInitParams(
            disable=False,
            req_to_token_pool=rtp,
            token_to_kv_pool_allocator=s.a,
            page_size=s.ps,
            sliding_window_size=G.window * s.ps,
            tree_components=(comp.FULL, comp.SWA) if s.swa else (comp.FULL,),
        )
    )


def test_eviction_hooks_reclaim_from_sglangs_radix_cache(s):
    """The pool is full of cached, unlocked pages: ``evict_to_free_tokens`` (before every allocation) and
    ``check_decode_capacity`` (every decode) make the demand fit by evicting from SGLang's own tree."""
    from array import array

    from kvarena.anchor.loader import import_sglang

    bp = import_sglang("sglang.srt.mem_cache.base_prefix_cache")
    key = import_sglang("sglang.srt.mem_cache.radix_cache").RadixKey
    a, ps = s.a, s.ps
    cache = radix_cache(s)
    ids = fill(s)
    for i in range(ids.numel() // ps):
        cache.insert(
            bp.InsertParams(key=key(array("q", range(i * 1000, i * 1000 + ps))), value=ids[i * ps : (i + 1) * ps])
        )
    assert a.available_size() < ps and cache.full_evictable_size() == ids.numel()
    assert a.evict_to_free_tokens(cache, 5 * ps) in (True, None)  # None: "not checked" (the mamba stack's base hook)
    assert a.available_size() >= 5 * ps
    assert a.check_decode_capacity(num_tokens=9 * ps, tree_cache=cache)
    assert a.available_size() >= 9 * ps
    assert 9 * ps <= ids.numel() - cache.full_evictable_size() <= ids.numel()
    assert extend(a, [Req()], [9 * ps]) is not None


# ------------------------------------------------------------------- clear


def test_clear_returns_to_boot(sl):
    s = sl
    a, ps = s.a, s.ps
    boot = snapshot(s)
    reqs = [Req() for _ in range(3)]
    assert extend(a, reqs, [3 * ps, ps + 1, 2 * ps]) is not None
    a.free(T(reqs[1].ids))  # a hole, where lazy
    if s.swa:
        a.free_swa(T(reqs[0].ids[:ps]))
    if s.m is not None:
        assert s.m.alloc(2) is not None
    a.free_group_begin()
    a.free(T(reqs[2].ids))  # left pending: clear drops the group
    a.clear()
    assert_same(s, boot)
    a.free_group_begin()  # no group left open
    a.free_group_end()


# --------------------------------------------------------------- bad input

# Each case: what it does, and what SGLang 0.5.23 does with it (an exception type it raises, with nothing
# changed; or None: it accepts the call and its state goes wrong or stays, unchecked here).  kvarena raises
# ValueError naming the pool, with nothing changed, except where SGLang's engine trusts the call (the
# drop-in's contract, docs/guides/integrating.md "Frees"): a plain free skips and counts a bad id
# (``TOLERATED``); a per-step slot free is trusted, its breach reported by the idle check (``REPORTED``).
BAD = {
    "alloc_negative": (lambda s, r: s.a.alloc(-s.ps), None),  # SGLang: None (swa kinds) or an empty tensor
    "alloc_not_a_page_multiple": (lambda s, r: s.a.alloc(s.ps + 1), AssertionError),  # ps > 1 only
    "free_segment_misaligned": (lambda s, r: s.a.free_segment(T(r.ids[1:]), start_pos=1), AssertionError),
    "nested_free_group": (lambda s, r: (s.a.free_group_begin(), s.a.free_group_begin()), AssertionError),
    "double_free": (lambda s, r: (s.a.free(T(r.ids)), s.a.free(T(r.ids))), None),  # SGLang: counts overflow
    "free_never_allocated": (lambda s, r: s.a.free(T([r.ids[-1] + 8 * s.ps])), None),
    "free_slot_twice": (lambda s, r: (s.m.free(r.slots), s.m.free(r.slots)), None),
    "free_slot_out_of_range": (lambda s, r: s.m.free(T([10**6])), IndexError),
}
TOLERATED = {"double_free": lambda r: 2 * len(r.ids), "free_never_allocated": lambda r: 1}  # the ids it skips
REPORTED = {"free_slot_twice": "pool 'state'"}
RAISES = {"free_slot_out_of_range": IndexError}  # the trusted gather fails before anything changes, as SGLang's


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(s, case):
    act, sglang_raises = BAD[case]
    if case.startswith("free_slot") and s.m is None:  # the SWA-only stack has no slot pool to misuse
        assert s.kind == "swa" and not hasattr(s.a, "mamba_allocator")
        return
    if case in ("alloc_not_a_page_multiple", "free_segment_misaligned") and s.ps == 1:
        # every count is a page multiple at page size 1: the same calls are legal there
        got = s.a.alloc(2)
        assert got is not None and got.numel() == 2
        s.a.free_segment(got[1:], start_pos=1)
        return
    r = Req()
    assert extend(s.a, [r], [2 * s.ps + 1]) is not None
    r.slots = s.m.alloc(2) if s.m is not None else None
    if case == "double_free":  # the first free is legal: compare against the state after it
        s.a.free(T(r.ids[: s.ps]))
        r.ids = r.ids[: s.ps]
    if case == "free_slot_twice":
        s.m.free(r.slots[:1])
        r.slots = r.slots[:1]
    snap = snapshot(s)
    if s.impl == "kvarena" and case in TOLERATED:
        skipped = s.a.skipped_frees
        act(s, r)
        assert s.a.skipped_frees - skipped == TOLERATED[case](r)
        assert_same(s, snap)
        assert s.a.verify_byte_accounting() == []
    elif s.impl == "kvarena" and case in REPORTED:
        assert s.a.verify_byte_accounting() == []
        act(s, r)
        found = s.a.verify_byte_accounting()
        assert found and REPORTED[case] in found[0]
    elif s.impl == "kvarena" and case in RAISES:
        with pytest.raises(RAISES[case]):
            act(s, r)
        assert_same(s, snap)
    elif s.impl == "kvarena":
        with pytest.raises(ValueError, match=r"pool '(full|swa|state)'"):
            act(s, r)
        assert_same(s, snap)
    elif sglang_raises is not None:
        with pytest.raises(sglang_raises):
            act(s, r)
        assert_same(s, snap)
    else:
        act(s, r)  # SGLang accepts it; nothing to assert about its state
    s.a.free_group = None  # a nested-group case leaves SGLang's first group open


# ----------------------------------------------------------------- planted


def _plants():
    """A bug each, planted in kvarena's classes: ``(class, member, replacement, the test it breaks, what fails)``."""
    from kvarena.sglang import allocators as A
    from kvarena.sglang import dropin, views

    alloc, translate = dropin._Dropin.alloc, views.BandView.translate_kv_loc

    def leaky_alloc(self, n):  # a shortfall that still takes a page
        got = alloc(self, n)
        if got is None and self.available_size() >= self.page_size:
            alloc(self, self.page_size)
        return got

    def trusting_free(self, idx):  # SGLang-like: a plain free trusts its ids, a dead one freed again
        self._free_reps(idx.reshape(-1).to(torch.int64)[:: self.page_size], 0)

    return {
        "alloc_leaks_on_shortfall": (dropin._Dropin, "alloc", leaky_alloc, "shortfall", AssertionError),
        "translate_wraps_negative_ids": (
            views.BandView,
            "translate_kv_loc",
            lambda self, loc, *, out=None: translate(self, loc.abs(), out=out),
            "translation",
            AssertionError,
        ),
        "group_frees_at_once": (dropin._Dropin, "free_group_begin", lambda self: None, "group", AssertionError),
        "swa_segment_frees_full_too": (
            A._SWACalls,
            "free_swa_segment",
            lambda self, idx, *, start_pos: dropin._Dropin.free_segment(self, idx, start_pos=start_pos),
            "swa",
            AssertionError,
        ),
        "clear_does_nothing": (dropin._Dropin, "clear", lambda self: None, "clear", AssertionError),
        "bad_free_trusted": (dropin._Dropin, "free", trusting_free, "bad", AssertionError),
        "page_table_is_a_copy": (
            dropin._Dropin,
            "full_v2p_page_table",
            property(lambda self: self.full_attn_allocator.virtual_to_physical.clone()),
            "tables",
            AssertionError,
        ),
        "slot_free_does_nothing": (views.StateView, "free", lambda self, idx: None, "slots", AssertionError),
        "tri_pool_eviction_gate_missing": (
            A.UnifiedMambaSWATokenToKVPoolAllocator,
            "_token_reclaim_satisfied",
            A._BASE_OF[A.UnifiedMambaSWATokenToKVPoolAllocator]._token_reclaim_satisfied,
            "evict",
            NotImplementedError,
        ),
    }


PLANTED = (
    "alloc_leaks_on_shortfall",
    "translate_wraps_negative_ids",
    "group_frees_at_once",
    "swa_segment_frees_full_too",
    "clear_does_nothing",
    "bad_free_trusted",
    "page_table_is_a_copy",
    "slot_free_does_nothing",
    "tri_pool_eviction_gate_missing",
)


@pytest.mark.parametrize("plant", PLANTED)
def test_planted_the_contract_catches(build, monkeypatch, plant):
    """Each planted bug in kvarena's drop-in makes the contract test it concerns fail."""
    cls, member, bad, which, fails = _plants()[plant]
    monkeypatch.setattr(cls, member, bad)
    run = {
        "shortfall": lambda: test_shortfall_returns_none_and_changes_nothing(build("kvarena", "swa", 4)),
        "translation": lambda: test_translation_semantics(build("kvarena", "swa", 4)),
        "group": lambda: test_free_group_takes_effect_at_its_end(build("kvarena", "mamba", 4)),
        "swa": lambda: test_swa_frees_tombstone_only_swa(build, "kvarena", "swa", 4, "free_swa_segment"),
        "clear": lambda: test_clear_returns_to_boot(build("kvarena", "mamba_swa", 4, True)),
        "bad": lambda: test_bad_input(build("kvarena", "swa", 4), "double_free"),
        "tables": lambda: test_page_tables_are_live(build("kvarena", "swa", 1)),
        "slots": lambda: test_mamba_slots(build, "kvarena", "mamba", 1, False),
        "evict": lambda: test_eviction_hooks_reclaim_from_sglangs_radix_cache(build("kvarena", "mamba_swa", 1)),
    }[which]
    with pytest.raises(fails):
        run()
