"""The implementation's token-level composites (docs/design.md §6), what only
the torch package has: no page copied where ``tests/api/test_composites.py``
sees no move (counted at the arena's one move primitive), tensors'
out-of-range ids, the joint view's closed forms against a linear scan, its
memo, the composite roles in ``verify``'s words, a differential replay
against ``kvarena.spec``'s composites (token ids, snapshots and every view
after every step), and the trusted decode path (``check=False``) against the
checked one.  The behaviour both packages share, and the scenarios reused
here, are in ``tests/api/test_composites.py``; the per-step path's host
reads in ``tests/impl/test_host_sync.py``.
"""

import random

import pytest
import torch

from kvarena import impl, spec
from kvarena.impl import composites, swa_window_end
from tests.api.test_composites import (
    KINDS,
    PAGE_SIZES,
    SWA_KINDS,
    bug7_hybrid,
    bug7_tri,
    check,
    make,
    no_relief,
    random_walk,
    window_run,
)

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def L(x):
    return x.tolist() if isinstance(x, torch.Tensor) else x


class MoveCounter:
    """Counts pages relocated through the arena's one move primitive."""

    def __init__(self, c):
        self.moved = 0
        orig = c.arena._move

        def counting(b, dst, src, *rest):
            k = orig(b, dst, src, *rest)
            self.moved += k
            return k

        c.arena._move = counting


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_no_page_is_copied_on_a_window_slide_or_a_bind_within_the_joint_view(ps):
    """Where the api tests see every live id keep its page, the arena copies
    no page either (not even a dead one onto itself)."""
    for kind in SWA_KINDS:
        c = make(impl, kind, ps, pages=32, lazy=(kind == "hybrid"))  # a lazy END or a float keeps holes
        moves = MoveCounter(c)
        window_run(c, ps, 7 * ps + 2, 2 * ps + ps // 2)
        assert moves.moved == 0
    for build in (bug7_hybrid, bug7_tri):
        c = no_relief(build(impl, ps))
        moves = MoveCounter(c)
        got = c.alloc_extend([0], [3 * ps], [-1])
        assert got is not None and got.numel() == 3 * ps and moves.moved == 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_translate_reads_a_tensors_out_of_range_ids_as_slot_0(kind, ps):
    """A list's out-of-range id is bad input (``tests/api``); a tensor's maps
    to slot 0, as a tombstone does: the sync-free path has no read to raise on."""
    c = make(impl, kind, ps)
    c.alloc_extend([0, 0], [ps + 2, 3], [-1, -1])
    for pool in ["full"] + (["swa"] if kind != "mamba" else []):
        n_tok = c.arena.v2p(pool).numel() * ps
        assert c.translate(torch.tensor([-5, n_tok, 10**9]), pool).tolist() == [0, 0, 0]
    check(c)


@pytest.mark.parametrize("pages", (9, 13, 24, 41))
def test_joint_view_closed_forms_match_a_linear_scan(pages):
    """The closed forms and the search against the bare predicate, scanned:
    the largest ``P`` whose coupled bind passes both arena gates, found by
    trying every ``P`` on a rebuilt twin with relief disabled."""
    for kind in KINDS:
        for lazy in (False, True):
            for seed in range(4):

                def rebuilt(kind=kind, lazy=lazy, seed=seed):
                    c = make(impl, kind, 1, pages=pages, lazy=lazy)
                    random_walk(c, random.Random(seed), 25, 1, lambda c: None)
                    return no_relief(c)

                c = rebuilt()
                g = c.arena.geometry("full")
                want = 0
                for p in range(1, min(pages, g.num_pages - g.min_page) + 1):  # longer is bad input
                    if rebuilt().alloc_extend([0], [p], [-1]) is None:
                        break
                    want = p
                assert c.available_size() == want, (kind, lazy, seed)


def test_joint_view_is_memoised_on_the_chain_epoch():
    c = make(impl, "tri", 16)
    c.alloc_extend([0], [40], [-1])
    computed = []
    fresh = c._joint_pages

    def counting(ext=0):
        computed.append(ext)
        return fresh(ext)

    c._joint_pages = counting
    a = c.available_size()
    assert c.available_size() == a and computed == [0]  # the second read is a hit
    assert c._memo.clock is c.arena._memo.clock  # one clock for the arena and the composite
    c.alloc_state(1)  # ticks the arena's clock: the composite's memo is empty again
    assert c.available_size() == fresh(0) * 16 and computed == [0, 0]
    h = make(impl, "hybrid", 16)
    h.alloc_extend([0], [40], [-1])
    assert h.available_size() == 16 * ((40 - 1 - 3 - 3) // 2)
    band = h.arena.bands["full"]
    band.__dict__["lo"] = band.lo - 2  # a write around the descriptor: the key does not move
    assert h.available_size() == 16 * ((40 - 1 - 3 - 3) // 2)  # served stale from the memo
    with pytest.raises(composites.AccountingError) as e:
        h.verify()
    assert (
        str(e.value) == f"pool 'full': stale memo (joint_pages memo {(40 - 1 - 3 - 3) // 2}, fresh {h._joint_pages(0)})"
    )


def test_verify_names_the_composite_roles():
    """The implementation's words are the spec's (``test_composites_oracles``)."""
    c = composites.HybridSWA(1 << 14, 64, 32)
    c.CHAIN = ("full", "swa")  # the roles this instance claims, not the arena's
    with pytest.raises(composites.AccountingError) as e:
        c.verify()
    assert str(e.value) == "pool 'full': composite roles (chain ('swa', 'full'), expected ('full', 'swa'))"
    c = composites.HybridSWA(1 << 14, 64, 32)
    c.BORROW = {"swa": "zz"}
    with pytest.raises(composites.AccountingError) as e:
        c.verify()
    assert str(e.value) == "pool 'swa': composite roles (borrow {'swa': 'full'}, expected {'swa': 'zz'})"


# ------------------------------------------------- differential vs the spec


class Driver:
    """One composite plus its requests; every op returns plain data."""

    def __init__(self, c):
        self.c, self.reqs = c, []  # reqs: [tokens, state slot or None, window done]

    def evict(self, k):
        if not self.reqs:
            return 0
        toks, slot, _ = self.reqs.pop()
        self.c.free(toks)
        if slot is not None:
            self.c.free_state([slot])
        return len(toks)


def step(d, op, rng_vals, ps):
    c = d.c
    if op == "admit":
        n, with_state = rng_vals
        slot = None
        if with_state and hasattr(c, "alloc_state"):
            s = c.alloc_state(1)
            if s is None:
                return ("state-none",)
            slot = L(s)[0]
        got = c.alloc_extend([0], [n], [-1])
        if got is None:
            ok = c.relieve(tokens=n, evict=d.evict)
            got = c.alloc_extend([0], [n], [-1]) if ok else None
        if got is None:
            if slot is not None:
                c.free_state([slot])
            return ("none",)
        d.reqs.append([L(got), slot, 0])
        return ("ok", L(got))
    if op == "extend":
        i, k = rng_vals
        toks = d.reqs[i][0]
        got = c.alloc_extend([len(toks)], [len(toks) + k], [toks[-1]])
        if got is None:
            return ("none",)
        toks += L(got)
        return ("ok", L(got))
    if op == "decode":
        batch = rng_vals
        got = c.alloc_decode([len(d.reqs[i][0]) + 1 for i in batch], [d.reqs[i][0][-1] for i in batch])
        if got is None:
            return ("none",)
        for i, t in zip(batch, L(got)):
            d.reqs[i][0].append(t)
        return ("ok", L(got))
    if op == "window":
        window = rng_vals
        if not hasattr(c, "free_swa"):
            return ("skip",)
        for r in d.reqs:
            end = swa_window_end(len(r[0]), window, ps)
            if end > r[2]:
                c.free_swa(r[0][r[2] : end], r[2])
                r[2] = end
        return ("ok",)
    if op == "finish":
        toks, slot, _ = d.reqs.pop(rng_vals)
        c.free(toks)
        if slot is not None:
            c.free_state([slot])
        return ("ok",)
    if op == "state":
        n = rng_vals
        if not hasattr(c, "alloc_state"):
            return ("skip",)
        s = c.alloc_state(n)
        return ("ok", None if s is None else L(s))
    raise AssertionError(op)


def views(c):
    out = {"joint": c.available_size(), "full": c.full_available_size(), "snap": c.snapshot()}
    if hasattr(c, "swa_available_size"):
        out["swa"] = c.swa_available_size()
    if hasattr(c, "state_available_size"):
        out["state"] = c.state_available_size()
        out["cost"] = c.state_slot_token_cost()
    return out


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", KINDS)
def test_differential_against_spec(kind, ps, lazy):
    """A small scheduler replayed on both twins: admit (state slot, extend,
    relieve with an evictor that retracts the newest request), extend,
    decode, window frees, finish, bare state slots.  After every step:
    the same answers, the same snapshots, the same views, and the same
    translations of every live token."""
    steps = {1: 60, 16: 40, 64: 30}[ps]
    for seed in range(2):
        rng = random.Random(1000 * seed + ps)
        di, ds = Driver(make(impl, kind, ps, pages=20, lazy=lazy)), Driver(make(spec, kind, ps, pages=20, lazy=lazy))
        for _ in range(steps):
            op, vals = random_op(rng, ds, ps)
            a, b = step(di, op, vals, ps), step(ds, op, vals, ps)
            assert a == b, (op, vals)
            assert [r[:2] for r in di.reqs] == [r[:2] for r in ds.reqs]
            assert views(di.c) == views(ds.c), (op, vals)
            live = [t for r in ds.reqs for t in r[0]]
            for pool in ("full", "swa"):
                if pool in ds.c.arena.chain:
                    assert di.c.translate(live, pool).tolist() == ds.c.translate(live, pool)
            for probe in (0, ps, 3 * ps):
                assert di.c.fits(probe) == ds.c.fits(probe)
                if kind != "hybrid":
                    assert di.c.fits(probe, 1) == ds.c.fits(probe, 1)
        di.c.verify()


def random_op(rng, ds, ps):
    r = rng.random()
    if r < 0.3 or not ds.reqs:
        return "admit", (rng.randint(1, 4 * ps), rng.random() < 0.7)
    if r < 0.45:
        return "extend", (rng.randrange(len(ds.reqs)), rng.randint(1, 2 * ps))
    if r < 0.7:
        return "decode", sorted(rng.sample(range(len(ds.reqs)), rng.randint(1, len(ds.reqs))))
    if r < 0.8:
        return "window", rng.choice([0, 1, ps, 2 * ps])
    if r < 0.92:
        return "finish", rng.randrange(len(ds.reqs))
    return "state", rng.randint(1, 3)


@pytest.mark.parametrize("seed", range(6))
def test_differential_against_spec_off_grid_geometries(seed):
    """Unequal entry sizes, off-grid totals and state slots, partial lazy
    sets: the grids disagree, so the float's grid-aware region and the
    two-END closed form's rounding are exercised."""
    rng = random.Random(seed)
    done = 0
    while done < 4:
        ps = rng.choice([1, 2, 4, 16])
        fe, se, sb = rng.choice([8, 12, 20, 64]), rng.choice([4, 6, 8, 32]), rng.choice([50, 100, 300, 500])
        total = rng.randint(30, 60) * max(fe, se) * ps + rng.randint(0, 100)
        kind = rng.choice(KINDS)
        lazy = rng.choice([False, True, {"full"}, {"state" if kind != "hybrid" else "swa"}])
        args = {"hybrid": (total, fe, se, ps), "mamba": (total, fe, sb, ps), "tri": (total, fe, se, sb, ps)}[kind]
        cls = {"hybrid": "HybridSWA", "mamba": "MambaHybrid", "tri": "TriPool"}[kind]
        try:
            ds = Driver(getattr(spec, cls)(*args, lazy=lazy))
        except ValueError:
            continue  # a layout with no page for some pool: a configuration error in both
        di = Driver(getattr(composites, cls)(*args, lazy=lazy))
        done += 1
        for _ in range(50):
            op, vals = random_op(rng, ds, ps)
            assert step(di, op, vals, ps) == step(ds, op, vals, ps), (op, vals)
            assert views(di.c) == views(ds.c), (op, vals)
            for probe in (0, ps, 3 * ps, 7 * ps):
                assert di.c.fits(probe) == ds.c.fits(probe)
                if kind != "hybrid":
                    assert di.c.fits(probe, 2) == ds.c.fits(probe, 2)
        di.c.verify()


# ------------------------------------------------------- the trusted path


def _stamp(cs, pools, ids, value):
    """Write the same bytes into the pages ``ids`` of every pool on both twins."""
    for pool in pools:
        epp = cs[0].arena.geometry(pool).epp
        data = (torch.arange(ids.numel() * epp, dtype=torch.int64).reshape(-1, epp) + value) % 251
        for c in cs:
            c.arena.write_pages(pool, ids, data.to(torch.uint8))


def _same(checked, trusted):
    assert checked.arena.snapshot() == trusted.arena.snapshot()  # v2p, p2v, holes, frontiers, FIFOs
    assert torch.equal(checked.arena.buffer, trusted.arena.buffer)  # and every byte


def drive_checked_and_trusted(kind, ps, lazy, seed, steps=60, pages=40):
    """One scheduler drives two twins: every decode-path call (``alloc_decode``,
    ``free_swa``, ``translate``) checked on one and ``check=False`` on the
    other, on the same valid inputs (``free_swa`` with the engine's host count
    or without); admissions, finishes and relief alike.
    After every step the states, the bytes and every result agree."""
    rng = random.Random(seed)
    C, T = make(impl, kind, ps, pages=pages, lazy=lazy), make(impl, kind, ps, pages=pages, lazy=lazy)
    has_swa, has_state = kind != "mamba", kind != "hybrid"
    pools = ["full"] + (["swa"] if has_swa else [])
    window = rng.randint(1, 2 * ps)
    reqs = []  # {"tokens": [...], "freed": int, "slot": [...] or None}
    opened = 0
    for step in range(steps):
        if not reqs or rng.random() < 0.3:
            slot = None
            if has_state:
                slot = C.alloc_state(1)
                assert L(slot) == L(T.alloc_state(1))
            n = rng.randint(1, 3 * ps)
            a, b = C.alloc_extend([0], [n], [-1]), T.alloc_extend([0], [n], [-1])
            assert L(a) == L(b)
            if a is None:
                if slot is not None:
                    C.free_state(slot)
                    T.free_state(slot)
            else:
                reqs.append({"tokens": a.tolist(), "freed": 0, "slot": None if slot is None else slot.tolist()})
                _stamp((C, T), pools, torch.tensor(sorted({t // ps for t in a.tolist()})), step)
        if reqs:
            batch = rng.sample(range(len(reqs)), rng.randint(1, len(reqs)))
            seq = torch.tensor([len(reqs[i]["tokens"]) + 1 for i in batch])
            last = torch.tensor([reqs[i]["tokens"][-1] for i in batch])
            a = C.alloc_decode(seq, last)
            b = T.alloc_decode(seq.clone(), last.clone(), check=False)
            assert L(a) == L(b)
            if a is not None:
                new = [t for s, t in zip(seq.tolist(), a.tolist()) if (s - 1) % ps == 0]
                opened += len(new)
                if new:
                    _stamp((C, T), pools, torch.tensor([t // ps for t in new]), step + 100)
                for i, t in zip(batch, a.tolist()):
                    reqs[i]["tokens"].append(t)
            elif reqs:  # a shortfall relief could not cover: retire the newest, as a scheduler would
                r = reqs.pop()
                for c in (C, T):
                    c.free(r["tokens"])
                    if r["slot"] is not None:
                        c.free_state(r["slot"])
        if has_swa and reqs:
            chunks = []  # every request's pages that left the window, in one call, with -1 padding
            for r in reqs:
                end = swa_window_end(len(r["tokens"]), window, ps)
                if end > r["freed"]:
                    chunks += r["tokens"][r["freed"] : end]
                    r["freed"] = end
                if rng.random() < 0.2:
                    chunks += [-1] * ps
            toks = torch.tensor(chunks, dtype=torch.int64)
            # the engine's host count, when drawn: every real representative is a live page of its own
            host = {"num_live": sum(t >= 0 for t in chunks[::ps])} if rng.random() < 0.5 else {}
            C.free_swa(toks, 0, **(host if rng.random() < 0.5 else {}))
            T.free_swa(toks.clone(), 0, check=False, **host)
        if reqs and rng.random() < 0.15:
            r = reqs.pop(rng.randrange(len(reqs)))
            for c in (C, T):
                c.free(r["tokens"])
                if r["slot"] is not None:
                    c.free_state(r["slot"])
        live = torch.tensor([t for r in reqs for t in r["tokens"]] + [-1], dtype=torch.int64)
        for pool in pools:
            assert L(C.translate(live, pool)) == L(T.translate(live, pool, check=False)), pool
        if has_state:
            slots = torch.tensor([s for r in reqs if r["slot"] for s in r["slot"]] + [-1], dtype=torch.int64)
            assert L(C.translate(slots, "state")) == L(T.translate(slots, "state", check=False))
        _same(C, T)
    check(C)
    check(T)
    return opened


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4, 16))
@pytest.mark.parametrize("kind", KINDS)
def test_trusted_decode_path_matches_the_checked_path(kind, ps, lazy, seed):
    assert drive_checked_and_trusted(kind, ps, lazy, seed) > 0  # pages were opened on the path


def test_trusted_decode_path_comparison_can_fail(monkeypatch):
    """Plant a slot bug in the trusted path alone (a new page's slot one past
    its first): the twin drive catches it."""
    orig = composites._Composite._decode_trusted

    def off_by_one(self, seq, loc, seq_lens_cpu=None):
        out = orig(self, seq, loc, seq_lens_cpu)
        return None if out is None else torch.where(torch.remainder(seq - 1, self.page_size) == 0, out + 1, out)

    monkeypatch.setattr(composites._Composite, "_decode_trusted", off_by_one)
    with pytest.raises(AssertionError):
        drive_checked_and_trusted("hybrid", 16, True, 0)


def test_trusted_window_free_with_the_host_count_keeps_page_order(monkeypatch):
    """Plant the host-count path's bug: free a batch's pages in the order
    given, not ascending (requests' windows interleave).  The twin drive
    catches it: the holes, and so later placements, differ."""
    real = composites._WithSWA.free_swa

    def planted(self, token_ids, start_pos, check=True, *, num_live=None):
        page = torch.div(token_ids[:: self.page_size], self.page_size, rounding_mode="floor")
        if check or num_live != page.numel():
            return real(self, token_ids, start_pos, check, num_live=num_live)
        if num_live:
            self.arena.free("swa", page, check=False)
        return None

    monkeypatch.setattr(composites._WithSWA, "free_swa", planted)
    with pytest.raises(AssertionError):
        drive_checked_and_trusted("hybrid", 1, True, 0)  # page size 1: every request frees each step
