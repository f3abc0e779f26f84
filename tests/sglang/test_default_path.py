"""The drop-in on SGLang's default path (issue 40, item 5), against SGLang's own allocator where it applies.

- Fresh KV pages read zeros: SGLang zeroes a full or SWA page envelope when its sub-allocator hands one out
  (``MultiEndedAllocator._maybe_zero_pages`` through the KV pool's ``zero_physical_pages``), because some
  attention kernels load whole pages and a NaN past ``seq_len`` reaches their output.  On the mamba stacks a
  fresh full page can lie on a former state slot's bytes: before issue 40 kvarena handed out every such page with
  its NaNs (174 of 174 tokens at page size 1 on the mamba stack here, SGLang's 0).
"""

import types

import pytest
import torch

from kvarena.sglang import stacks
from tests.sglang import test_contract
from tests.sglang.test_contract import IMPLS, MAMBA_KINDS, Req, T, extend

build = test_contract.build  # the stack builder fixture (SGLang's kernels on CPU)
G = test_contract.G


# ------------------------------------------------------------ fresh pages read zeros


def kv_rows(s, tokens: torch.Tensor) -> list[torch.Tensor]:
    """What SGLang's attention reads for ``tokens``: their K and V rows in every
    full layer (and every SWA layer, through the SWA translation)."""
    a, kv = s.a, s.bundle.token_to_kv_pool
    layers = [(layer, a.translate_kv_loc) for layer in G.full_layers]
    if s.swa:
        layers += [(layer, a.translate_loc_from_full_to_swa) for layer in G.swa_layers]
    out = []
    for layer, translate in layers:
        rows = translate(tokens)
        out += [kv.get_key_buffer(layer)[rows], kv.get_value_buffer(layer)[rows]]
    return out


def whole_pages(ids: torch.Tensor, ps: int) -> torch.Tensor:
    """Every token of the pages ``ids`` lie on: the envelope a whole-page kernel loads."""
    pages = torch.unique(torch.div(ids, ps, rounding_mode="floor"))
    return (pages.unsqueeze(1) * ps + torch.arange(ps)).reshape(-1)


def nan_tokens(s, ids: torch.Tensor) -> int:
    """Tokens of ``ids``' pages that read a NaN in some layer."""
    toks = whole_pages(ids, s.ps)
    bad = torch.zeros(toks.numel(), dtype=torch.bool)
    for rows in kv_rows(s, toks):
        bad |= torch.isnan(rows.float()).reshape(toks.numel(), -1).any(1)
    return int(bad.sum())


def assert_zero(s, ids: torch.Tensor, what: str) -> None:
    toks = whole_pages(ids, s.ps)
    for rows in kv_rows(s, toks):
        assert not bool(rows.view(torch.uint8).any()), f"{what}: a fresh page holds stale bytes"


def poison_free_bytes(s) -> None:
    """Every byte above SGLang's reserved floor (the sink) reads 0xFF: a NaN in fp16 and bf16."""
    ub = s.bundle.unified_memory_pool
    ub._raw[ub._reserved_floor :] = 0xFF


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_every_page_handed_out_reads_zeros(build, impl, kind, ps, lazy):
    """Over poisoned free bytes, every page ``alloc``, ``alloc_extend`` and
    ``alloc_decode`` hand out (relief included) reads zeros, whole, in every
    layer it has; pages already live keep their bytes."""
    s = build(impl, kind, ps, lazy)
    a = s.a
    poison_free_bytes(s)
    first = a.alloc(4 * ps)
    assert_zero(s, first, "alloc")
    a.translate_kv_loc(first[:1])
    kv = s.bundle.token_to_kv_pool
    rows = a.translate_kv_loc(first)
    kv.get_key_buffer(G.full_layers[0])[rows] = 7.0  # live bytes: must survive the allocations below
    p, q = T([0, 0]), T([2 * ps, 2 * ps + 1])
    ext = a.alloc_extend(p, p, q, q, T([-1, -1]), 4 * ps + 1)
    assert ext is not None
    assert_zero(s, ext, "alloc_extend")
    if ps > 1:  # the first request opens a page, the second continues its own (SGLang decodes by alloc at ps 1)
        seq = T([2 * ps + 1, 2 * ps + 2])
        dec = a.alloc_decode(seq, seq, T([int(ext[2 * ps - 1]), int(ext[-1])]))
        assert dec is not None and int(dec[1]) == int(ext[-1]) + 1
        assert_zero(s, dec[:1], "alloc_decode")
        ext = torch.cat([ext, dec])
    # fill, free every other chunk, and allocate again: fresh pages from holes and after relief
    chunks = []
    while (got := a.alloc(2 * ps)) is not None:
        chunks.append(got)
    for c in chunks[::2]:
        a.free(c)
    poison_free_bytes_keep_live(s, [first, ext, *chunks[1::2]])
    again = a.alloc(len(chunks[::2]) * 2 * ps)
    assert again is not None
    assert_zero(s, again, "alloc after frees")
    assert bool((kv.get_key_buffer(G.full_layers[0])[a.translate_kv_loc(first)] == 7.0).all())


def poison_free_bytes_keep_live(s, live: list[torch.Tensor]) -> None:
    """Poison every free byte again, keeping the live tokens' rows (saved and put back)."""
    toks = torch.cat([whole_pages(t, s.ps) for t in live])
    saved = [r.clone() for r in kv_rows(s, toks)]
    poison_free_bytes(s)
    a, kv, i = s.a, s.bundle.token_to_kv_pool, 0
    layers = [(layer, a.translate_kv_loc) for layer in G.full_layers]
    if s.swa:
        layers += [(layer, a.translate_loc_from_full_to_swa) for layer in G.swa_layers]
    for layer, translate in layers:
        rows = translate(toks)
        for buf in (kv.get_key_buffer(layer), kv.get_value_buffer(layer)):
            buf[rows] = saved[i]
            i += 1


def nan_over_former_state(s) -> tuple[int, int]:
    """The issue's case: every state slot written with NaN (a mamba
    neighbour's fp32 state), freed, then full pages handed out over those
    bytes one page at a time until none is left.  (tokens handed out, NaN tokens)."""
    a, m, pool = s.a, s.m, s.bundle.req_to_token_pool.mamba_pool
    slots = []
    while True:
        if hasattr(a, "prepare_mamba_allocation"):
            a.prepare_mamba_allocation(1)
        got = m.alloc(1)
        if got is None:
            break
        slots.append(got)
    held = torch.cat(slots)
    phys = m.translate(held)
    for conv in pool.mamba_cache.conv:
        conv[:, phys] = float("nan")
    pool.mamba_cache.temporal[:, phys] = float("nan")
    m.free(held)
    fresh = []
    while (got := a.alloc(s.ps)) is not None:
        fresh.append(got)
    ids = torch.cat(fresh)
    return ids.numel(), nan_tokens(s, ids)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", MAMBA_KINDS)
def test_a_page_over_a_former_state_slot_reads_no_nan(build, impl, kind, ps, lazy):
    s = build(impl, kind, ps, lazy)
    handed, nan = nan_over_former_state(s)
    assert handed >= 8 * ps
    assert nan == 0


def test_planted_no_zeroing_reads_nan_through_a_fresh_page(build, monkeypatch):
    """Planted: the drop-in without its zeroing (kvarena before issue 40)
    hands out pages that read a former state slot's NaNs."""
    from kvarena.sglang import dropin

    monkeypatch.setattr(dropin._Dropin, "_zero_fresh", lambda self, ids, swa_n=None: None)
    handed, nan = nan_over_former_state(build("kvarena", "mamba", 4, False))
    assert nan > 0 and handed >= nan


# ------------------------------------------------------------ forward_stream


class Recorder(torch.cpu.Stream):
    """Overlap scheduling's streams on CPU, through torch's own CPU stream API (``torch.cuda`` untouched): during
    ``call`` this recorder is the current CPU stream, whose ``wait_stream`` records each wait (on the ``forward``
    stream only), and the pools' page copies record each move.  ``forward`` None: no forward stream, and a wait
    fails the test.  SGLang's own allocator asks ``torch.cuda`` for its stream even on CPU (docs/findings.md), so
    for it alone ``torch.cuda.current_stream`` answers with this recorder too."""

    def __init__(self, monkeypatch, bundle, forward, sglang_allocator=False) -> None:
        self.events: list[str] = []
        self.forward = forward
        if sglang_allocator:
            monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: self)
        kv, req = bundle.token_to_kv_pool, getattr(bundle, "req_to_token_pool", None)
        pools = [getattr(kv, n, None) for n in ("full_kv_pool", "swa_kv_pool", "mamba_pool")]
        pools.append(getattr(req, "mamba_pool", None))
        for pool in {id(p): p for p in pools if p is not None}.values():
            real = pool.move_physical_pages
            monkeypatch.setattr(
                pool, "move_physical_pages", lambda *a, real=real: (self.events.append("move"), real(*a))
            )

    def wait_stream(self, stream) -> None:
        assert self.forward is not None, "waited on a stream without a forward stream"
        assert stream is self.forward, "waited on a stream that is not the forward stream"
        self.events.append("wait")

    def call(self, fn) -> str:
        """``fn()``, and what it did: "wait", "wait, move" (moves, all after the wait), "move" or ""."""
        del self.events[:]
        with torch.cpu.stream(self):
            fn()
        ev = list(self.events)
        if "wait" in ev:
            assert "move" not in ev[: ev.index("wait")], f"a page moved before the wait: {ev}"
        return ", ".join(e for e in ("wait", "move") if e in ev)


def with_stream(build, monkeypatch, impl, kind, ps, lazy, forward):
    """A stack built with ``forward_stream=forward`` (as SGLang's scheduler passes it), and its recorder."""
    real = stacks.build
    monkeypatch.setattr(stacks, "build", lambda *a, **kw: real(*a, **kw, forward_stream=forward))
    s = build(impl, kind, ps, lazy)
    return s, Recorder(monkeypatch, s.bundle, forward, sglang_allocator=impl == "sglang")


def stream_script(s, rec: Recorder) -> dict[str, str]:
    """Frees of every kind, allocations, a free group and mamba slots; what each call did."""
    a, ps = s.a, s.ps
    reqs = [Req() for _ in range(4)]
    seen = {"alloc_extend": rec.call(lambda: extend(a, reqs, [3 * ps, 2 * ps, 2 * ps, 3 * ps]))}
    seen["free"] = rec.call(lambda: a.free(T(reqs[1].ids)))
    if s.swa:
        seen["free_swa_segment"] = rec.call(lambda: a.free_swa_segment(T(reqs[0].ids[:ps]), start_pos=0))
    seen["free_segment"] = rec.call(lambda: a.free_segment(T(reqs[3].ids[ps:]), start_pos=ps))
    a.free_group_begin()
    seen["grouped free"] = rec.call(lambda: a.free(T(reqs[2].ids)))
    seen["free_group_end"] = rec.call(a.free_group_end)
    seen["alloc"] = rec.call(lambda: a.alloc(2 * ps))
    if s.m is not None:
        slots = s.m.alloc(3)
        seen["mamba slot free"] = rec.call(lambda: s.m.free(slots[:1]))
    return seen


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_eager_frees_wait_on_the_forward_stream_as_sglangs(build, monkeypatch, kind, ps, lazy):
    """``forward_stream`` (overlap scheduling's): an eager free of an END
    waits on it before it writes tables or moves a page; allocations, a
    grouped free (until its group ends), a float's free (the tri-pool's SWA)
    and every lazy free do not.  The same calls on SGLang's own allocator
    wait exactly where kvarena's do (before issue 40 kvarena took the stream
    and dropped it: no call waited)."""
    seen = {}
    for impl in IMPLS:
        with monkeypatch.context() as mp:
            s, rec = with_stream(build, mp, impl, kind, ps, lazy, forward=object())
            seen[impl] = stream_script(s, rec)
    waited = {impl: {k: v.startswith("wait") for k, v in calls.items()} for impl, calls in seen.items()}
    assert waited["kvarena"] == waited["sglang"], seen
    w, eager = waited["kvarena"], not lazy
    assert w["free"] == w["free_segment"] == w["free_group_end"] == eager
    assert not w["alloc_extend"] and not w["alloc"] and not w["grouped free"]
    if s.swa:
        assert w["free_swa_segment"] == (eager and kind == "swa")  # the tri-pool's SWA is a float
    if s.m is not None:
        assert w["mamba slot free"] == eager
    assert seen["kvarena"]["free"] == ("wait, move" if eager else "")  # eager compaction: moves, after the wait


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_without_a_forward_stream_no_free_asks_for_a_stream(build, monkeypatch, kind):
    s, rec = with_stream(build, monkeypatch, "kvarena", kind, 4, False, forward=None)
    assert "move" in stream_script(s, rec).values()  # eager frees moved pages, and none asked for a stream


# ------------------------------------------------------------ table bytes


def table_bytes(s) -> dict[str, int]:
    """The device tensors an allocator holds as tables (page tables, free-id and hole lists: every tensor of at
    least one dimension), by the attribute path that first reaches each storage; SGLang's pools and buffer,
    which both allocators share, are not walked.  Found by walking the allocator's object graph."""
    alloc, raw = s.a, s.bundle.unified_memory_pool._raw.untyped_storage().data_ptr()
    shared = {id(x) for x in s.bundle if x is not alloc}
    seen, found = set(), {}
    todo = [("a", alloc)]
    while todo:
        path, o = todo.pop()
        if id(o) in seen or id(o) in shared or o is None or isinstance(o, (str, bytes, int, float, type)):
            continue
        seen.add(id(o))
        mod = type(o).__module__ or ""
        if mod.startswith("sglang.srt.mem_cache.") and not mod.startswith("sglang.srt.mem_cache.allocator."):
            continue  # a pool of SGLang's: its memory, not an allocator's tables
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            if o.dim() >= 1 and st.nbytes() and st.data_ptr() != raw:
                found.setdefault(st.data_ptr(), (path, st.nbytes()))
            continue
        if isinstance(o, dict):
            todo += [(f"{path}[{k!r}]", v) for k, v in o.items()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(o)]
        elif hasattr(o, "__dict__") or hasattr(type(o), "__slots__"):
            attrs = dict(getattr(o, "__dict__", {}))
            for cls in type(o).__mro__:
                attrs |= {k: getattr(o, k) for k in getattr(cls, "__slots__", ()) if hasattr(o, k)}
            todo += [(f"{path}.{k}", v) for k, v in attrs.items() if not callable(v) or isinstance(v, torch.Tensor)]
    return dict(found.values())


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4, 16))
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_table_bytes_are_at_most_sglangs(build, kind, ps, lazy):
    """kvarena adds tables, not memory, and no more tables than SGLang's own
    allocator over the same stack: before issue 40 a boot-state twin repeated
    every table on the device (2.00x SGLang's bytes in every configuration).
    Measured at boot and again once the gates that price the boot state (the
    empty-pool and compacted demands of SGLang's ``reclaim_plan``) have run."""
    ours, theirs = build("kvarena", kind, ps, lazy), build("sglang", kind, ps, lazy)
    sglang = sum(table_bytes(theirs).values())
    assert sglang > 0
    assert sum(table_bytes(ours).values()) <= sglang, table_bytes(ours)
    if ours.swa:
        a = ours.a  # the two gates on the boot state (SGLang's reclaim_plan and can_reserve reach them)
        assert a._fits_page_demand(2, 1, compacted=False, empty_pool=True)
        assert a._fits_page_demand(2, 1, full_reclaim_pages=1, compacted=True)
        assert a._twin is not None  # the boot state was built, and priced
        assert sum(table_bytes(ours).values()) <= sglang, table_bytes(ours)
    live = [ours.a.full_v2p_page_table, ours.a.full_p2v_page_table]
    assert sum(table_bytes(ours).values()) >= sum(t.untyped_storage().nbytes() for t in live)  # the walk finds them


@pytest.mark.parametrize("kind", ("swa", "mamba_swa"))
@pytest.mark.parametrize("ps", (1, 4))
def test_the_table_free_boot_state_gives_the_twins_answers(build, kind, ps):
    """The boot state the gates price keeps no table; it answers every demand
    as a whole boot-state composite (with its tables) does."""
    from kvarena.sglang import dropin

    a = build("kvarena", kind, ps).a
    twin = a._boot_state()
    assert all(b.v2p.numel() == b.p2v.numel() == 0 for b in twin.arena.bands.values())
    args, kw, raw = a._twin_args
    whole = a.KIND(*args, **kw, buffer=raw, mover=dropin._refuse_moves)
    most = a.composite.arena.geometry("full").num_pages * ps
    slots = (0, 1, 5) if kind == "mamba_swa" else (0,)
    for tokens in range(0, most + 3 * ps, max(1, most // 23)):
        for swa in (None, 0, tokens // 2, tokens):
            for state in slots:
                assert twin.fits(tokens, state_slots=state, swa_tokens=swa) == whole.fits(
                    tokens, state_slots=state, swa_tokens=swa
                ), (tokens, swa, state)


# ------------------------------------------------------------ bind


def recover_evicted_swa(s, kept: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """SGLang's own caller of ``swa_attn_allocator.bind``: the unified radix cache's SWA component recovering an
    evicted SWA range (``RecoverEvictedSWA`` -> ``_set_swa``): the node's ids take the incoming ids' SWA pages,
    then it tombstones the incoming ids itself.  Run as SGLang's code, on a component holding only what it reads."""
    from kvarena.anchor.loader import import_sglang

    cls = import_sglang("sglang.srt.mem_cache.unified_cache.components.swa").SWAComponent
    comp = object.__new__(cls)
    comp.cache = types.SimpleNamespace(token_to_kv_pool_allocator=s.a)
    comp.tree_core = types.SimpleNamespace(page_size=s.ps)
    return cls._set_swa(comp, kept, incoming)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", test_contract.SWA_KINDS)
def test_bind_rebinds_tables_as_sglangs(build, impl, kind, ps, lazy):
    """``bind`` moves ownership of live SWA pages to other ids by rewriting the
    tables, as SGLang's does: the node's ids translate to exactly the pages
    (and bytes) the incoming ids had, no page moves, no count changes, and
    both requests free cleanly after.  Before issue 40 kvarena freed the old
    owners and bound the new ones where the arena placed them, copying the
    bytes through a temporary: other pages, and in eager mode a compaction."""
    s = build(impl, kind, ps, lazy)
    a = s.a
    node, incoming, other = Req(), Req(), Req()
    assert extend(a, [node, other, incoming], [3 * ps, 2 * ps + 1, 3 * ps]) is not None
    a.free_swa(T(node.ids))  # the node's SWA range was evicted (eager: the SWA END compacts here)
    kv = s.bundle.token_to_kv_pool
    layer = G.swa_layers[0]
    rows = a.translate_loc_from_full_to_swa(T(incoming.ids))
    kv.get_key_buffer(layer)[rows] = torch.arange(rows.numel(), dtype=torch.float16).reshape(-1, 1, 1) + 1
    data = kv.get_key_buffer(layer)[rows].clone()
    before, moved = test_contract.counts(s), []
    for name in ("swa_kv_pool", "full_kv_pool"):
        pool = getattr(kv, name)
        real = pool.move_physical_pages
        pool.move_physical_pages = lambda *args, real=real: (moved.append(args), real(*args))
    got = recover_evicted_swa(s, T(node.ids), T(incoming.ids))
    assert torch.equal(got, rows)  # the node's SWA slots: the incoming ids' own
    assert torch.equal(a.translate_loc_from_full_to_swa(T(node.ids)), rows)
    assert bool((a.translate_loc_from_full_to_swa(T(incoming.ids)) == 0).all())  # tombstoned: the sink
    assert torch.equal(kv.get_key_buffer(layer)[rows], data)
    assert moved == [] and test_contract.counts(s) == before
    if impl == "kvarena":
        assert a.verify_byte_accounting() == []
    a.free(T(incoming.ids))
    a.free(T(node.ids))
    a.free(T(other.ids))
    assert a.swa_attn_allocator.allocated_count() == a.full_attn_allocator.allocated_count() == 0


def test_a_bad_bind_is_a_value_error_and_changes_nothing(build):
    s = build("kvarena", "swa", 4)
    a, node, incoming = s.a, Req(), Req()
    assert extend(a, [node, incoming], [8, 8]) is not None
    swa = a.swa_attn_allocator
    pages = swa.virtual_to_physical[T(incoming.ids[::4]) // 4]
    with test_contract.unchanged(s):
        for kept in (T(node.ids[::4]) // 4, T([node.ids[0] // 4]), T([10**6, 10**6 + 1])):  # still live; 1 for 2
            with pytest.raises(ValueError, match="pool 'swa'"):
                swa.bind(kept, pages)
    assert a.verify_byte_accounting() == []
