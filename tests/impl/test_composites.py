"""The implementation's token-level composites (DESIGN section 6; ANCHOR
sections 1-3): HybridSWA, MambaHybrid and TriPool over torch, at page sizes 1,
16 and 64.

Hand computations of the anchor's slot rule, the joint view's exactness on
many random states (relief disabled), anchor bugs 6 and 7, leak-free
failures, window slides with zero moves, bad input, the host-sync budget of
the per-step path, and a differential replay against ``kvarena.spec``'s
composites: token ids, snapshots and every view after every step.
"""

import ast
import inspect
import json
import random
import textwrap

import pytest
import torch

from kvarena import spec
from kvarena.impl import HybridSWA, MambaHybrid, TriPool, composites, swa_window_end

E = 8  # bytes per token of every KV pool unless a test says otherwise
PAGE_SIZES = (1, 16, 64)
KINDS = ("hybrid", "mamba", "tri")
SWA_KINDS = ("hybrid", "tri")
STATE_KINDS = ("mamba", "tri")


def make(kind, ps, pages=40, lazy=False, mod=None, device="cpu"):
    """Every grid is ``pages`` pages of ``E*ps`` bytes, min_page 1; a state slot
    is one such page.  ``mod=spec`` builds the spec twin."""
    total = E * ps * pages
    kw = {} if mod is spec else {"device": device}
    m = mod or composites
    if kind == "hybrid":
        return m.HybridSWA(total, E, E, ps, lazy=lazy, **kw)
    if kind == "mamba":
        return m.MambaHybrid(total, E, E * ps, ps, lazy=lazy, **kw)
    return m.TriPool(total, E, E, E * ps, ps, lazy=lazy, **kw)


def L(x):
    return x.tolist() if isinstance(x, torch.Tensor) else x


def fifo(c):
    return list(c.arena.snapshot()["pools"]["full"]["free_ids"])


def anchor_slots(free_ids, ps, prefix, seq, last):
    """ANCHOR section 1, position by position (a loop, unlike the impl): a
    position before the prefix's page end continues ``last_loc``; a position
    at a page start takes the next id off the FIFO, in batch order."""
    out, it = [], iter(free_ids)
    for p, s, loc in zip(prefix, seq, last):
        page = None
        for pos in range(p, s):
            if pos < -(-p // ps) * ps:
                out.append(loc + (pos - p + 1))
            else:
                if pos % ps == 0:
                    page = next(it)
                out.append(page * ps + pos % ps)
    return out


def check(c):
    c.verify()
    json.dumps(c.snapshot())


class Unchanged:
    def __init__(self, c):
        self.c = c

    def __enter__(self):
        self.before = self.c.snapshot()

    def __exit__(self, *exc):
        assert self.c.snapshot() == self.before
        self.c.verify()


def no_relief(c):
    """Disable relief on this instance: every gate is then the bare joint view."""
    c.relieve = lambda tokens=0, state_slots=0, evict=None: False
    return c


class MoveCounter:
    """Counts pages relocated through the arena's one move primitive."""

    def __init__(self, c):
        self.moved = 0
        orig = c.arena._move

        def counting(b, dst, src):
            k = orig(b, dst, src)
            self.moved += k
            return k

        c.arena._move = counting


# ------------------------------------------------------------ extend/decode


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_extend_page_boundaries(kind, ps):
    c = make(kind, ps)
    pre, seq, last = [0, 0, 0], [ps + 3, 2 * ps, 1], [-1, -1, -1]
    want = anchor_slots(fifo(c), ps, pre, seq, last)
    got = c.alloc_extend(torch.tensor(pre), torch.tensor(seq), torch.tensor(last))
    assert got.dtype == torch.int64 and got.tolist() == want and len(want) == sum(seq)
    got = got.tolist()
    r0, r1, r2 = got[: ps + 3], got[ps + 3 : 3 * ps + 3], got[3 * ps + 3 :]
    pre, seq, last = (ps + 3, 2 * ps, 1), (3 * ps + 1, 2 * ps + 5, 1), (r0[-1], r1[-1], r2[-1])
    want = anchor_slots(fifo(c), ps, pre, seq, last)
    got2 = c.alloc_extend(pre, seq, last).tolist()  # tuples are accepted
    assert got2 == want and len(got2) == (2 * ps - 2) + 5
    assert len(set(got + got2)) == len(got + got2)
    if ps > 1:
        assert got2[: ps - 3] == list(range(r0[-1] + 1, r0[-1] + ps - 2))  # part (1)
    assert (c.translate(got + got2) > 0).all()
    if kind != "mamba":
        assert (c.translate(got + got2, "swa") > 0).all()
    check(c)


def test_extend_and_decode_literal_ps16():
    """A hand computation, not an oracle: a fresh composite's FIFO is 1, 2, 3, ..."""
    for kind in KINDS:
        c = make(kind, 16)
        got = c.alloc_extend([0, 0, 0], [19, 32, 1], [-1, -1, -1])
        assert got.tolist() == list(range(16, 35)) + list(range(48, 80)) + [80]
        assert c.alloc_extend([19], [50], [34]).tolist() == list(range(35, 48)) + list(range(96, 112)) + [112, 113]
        assert c.alloc_decode([51, 33], [113, 79]).tolist() == [114, 128]  # 51 % 16 = 3; 33 % 16 = 1: page 8
        assert c.alloc_extend([], [], []).tolist() == [] and c.alloc_decode([], []).tolist() == []
        check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_decode_page_boundaries(kind, ps):
    c = make(kind, ps)
    seqs = [max(1, ps - 1), 1]
    toks = c.alloc_extend([0, 0], seqs, [-1, -1]).tolist()
    reqs = [toks[: seqs[0]], toks[seqs[0] :]]
    new_pages = 0
    for _ in range(2 * ps + 3):
        seqs = [s + 1 for s in seqs]
        last = [r[-1] for r in reqs]
        ids = fifo(c)
        want, k = [], 0
        for s, loc in zip(seqs, last):  # a new page iff seq % ps == 1 (ps = 1: always)
            if ps == 1 or s % ps == 1:
                want.append(ids[k] * ps)
                k += 1
            else:
                want.append(loc + 1)
        new_pages += k
        got = c.alloc_decode(torch.tensor(seqs), torch.tensor(last)).tolist()
        assert got == want == anchor_slots(ids, ps, [s - 1 for s in seqs], seqs, last)
        for r, t in zip(reqs, got):
            r.append(t)
    assert new_pages >= 4
    assert c.arena.live_pages("full") == sum(-(-len(r) // ps) for r in reqs)
    check(c)


# ---------------------------------------------------------------- windows


def test_swa_window_end():
    assert swa_window_end(300, 127, 16) == 144
    assert swa_window_end(300, 127, 1) == 172
    assert swa_window_end(143, 127, 16) == 0
    assert swa_window_end(10, 127, 16) == 0
    assert swa_window_end(2048, 1023, 64) == 960
    for s in range(0, 200, 7):
        for w in (0, 3, 31, 127):
            for ps in (1, 16, 64):
                assert swa_window_end(s, w, ps) == spec.swa_window_end(s, w, ps)
    for args in [(-1, 1, 1), (1, -1, 1), (1, 1, 0), (1.0, 1, 1), (True, 1, 1)]:
        with pytest.raises(ValueError):
            swa_window_end(*args)


def window_run(c, ps, steps, window):
    """One request: a prefix of 1, then ``steps`` decodes, each followed by the
    window free.  Returns (tokens, done, pages reused from swa holes)."""
    toks = c.alloc_extend([0], [1], [-1]).tolist()
    done, reused = 0, 0
    for _ in range(steps):
        holes = c.arena.snapshot()["pools"]["swa"]["holes"]  # oldest first
        seq = len(toks) + 1
        (t,) = c.alloc_decode([seq], [toks[-1]]).tolist()
        toks.append(t)
        if (seq - 1) % ps == 0 and holes:  # a new page takes the oldest swa hole
            assert c.arena.v2p("swa")[t // ps] == holes[0]
            reused += 1
        end = swa_window_end(seq, window, ps)
        if end > done:
            c.free_swa(torch.tensor(toks[done:end]), done)
            done = end
        v2p = c.arena.v2p("swa")
        assert [v for v in range(1, len(v2p)) if v2p[v] >= 0] == sorted({x // ps for x in toks[done:]})
    return toks, done, reused


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_window_slide_reuses_swa_pages_with_zero_moves(kind, ps):
    c = make(kind, ps, pages=32, lazy=(kind == "hybrid"))  # a lazy END or a float keeps holes
    moves = MoveCounter(c)
    toks, done, reused = window_run(c, ps, 7 * ps + 2, 2 * ps + ps // 2)
    assert moves.moved == 0 and done >= 3 * ps and reused >= 2
    assert c.arena.live_pages("full") == -(-len(toks) // ps)  # full keeps every page
    assert c.arena.live_pages("swa") == len({t // ps for t in toks[done:]}) < c.arena.live_pages("full")
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_free_after_free_swa(kind, ps):
    c = make(kind, ps, pages=32)
    toks, done, _ = window_run(c, ps, 5 * ps + 1, 2 * ps)
    other = c.alloc_extend([0], [ps + 1], [-1]).tolist()
    assert done > 0 and c.translate(toks[:1], "swa").tolist() == [0] and c.translate(toks[:1]).tolist() != [0]
    c.free_swa(toks[:done], 0)  # again: already freed, skipped silently
    c.free(torch.tensor(toks))
    assert c.arena.live_pages("full") == c.arena.live_pages("swa") == 2
    assert not c.translate(toks).any() and not c.translate(toks, "swa").any()
    c.free_swa(other[:ps], 0)
    c.free(other)
    assert c.arena.live_pages("full") == c.arena.live_pages("swa") == 0
    check(c)


def test_free_swa_skips_sentinels_repeats_and_reads_representatives_only():
    ps = 16
    c = make("tri", ps)
    toks = c.alloc_extend([0], [3 * ps], [-1]).tolist()
    before = c.arena.live_pages("swa")
    c.free_swa([-1] * ps + [0] * ps, 0)
    assert c.arena.live_pages("swa") == before
    c.free_swa(toks[ps : 3 * ps] + [-1] * 3, ps)
    assert c.arena.live_pages("swa") == 1 and c.arena.live_pages("full") == 3
    c2 = make("tri", 1)
    t = c2.alloc_extend([0], [5], [-1])
    c2.free_swa(torch.stack([t[3], t[1], t[3], t[1]]), 0)  # repeats: each page freed once, ascending
    assert c2.arena.live_pages("swa") == 3
    assert c2.arena.holes("swa").tolist() == sorted(c2.arena.snapshot()["pools"]["swa"]["holes"])
    check(c)
    check(c2)


# ------------------------------------------------------------ joint views


def bug7_hybrid(ps):
    """Lazy HybridSWA, both grids 11 pages: 2 holes in each END, a 2-page gap."""
    c = make("hybrid", ps, pages=11, lazy=True)
    toks = c.alloc_extend([0], [4 * ps], [-1]).tolist()
    c.free([toks[0], toks[ps]])
    return c


def bug7_tri(ps):
    """Eager TriPool on 13 pages: state 1 slot, 3 free pages, swa 2 pages, 4 free, full 2."""
    c = make("tri", ps, pages=13)
    c.alloc_extend([0], [2 * ps], [-1])
    c.alloc_state(1)
    assert c.arena.frontiers("swa") == (5 * E * ps, 7 * E * ps)
    return c


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("build", [bug7_hybrid, bug7_tri])
def test_bug7_component_views_four_joint_three(build, ps):
    c = build(ps)
    assert c.full_available_size() == 4 * ps and c.swa_available_size() == 4 * ps
    assert c.available_size() == 3 * ps  # the gate, not the min of the components
    assert c.fits(3 * ps) and not c.fits(3 * ps + 1)
    no_relief(c)
    with Unchanged(c):
        assert c.alloc_extend([0], [3 * ps + 1], [-1]) is None
    moves = MoveCounter(c)
    got = c.alloc_extend([0], [3 * ps], [-1])
    assert got is not None and got.numel() == 3 * ps and moves.moved == 0
    check(c)


def random_walk(c, rng, steps, ps, probe):
    """Random extends, decodes, window frees, frees and state slots on ``c``;
    ``probe(c)`` after every step."""
    reqs = []
    g = c.arena.geometry("full")
    most = (g.num_pages - g.min_page) * ps  # a longer request is bad input, not a shortfall
    for _ in range(steps):
        r = rng.random()
        if r < 0.35 or not reqs:
            n = min(rng.randint(1, 3 * ps), most)
            got = c.alloc_extend([0], [n], [-1])
            if got is not None:
                reqs.append(got.tolist())
        elif r < 0.55:
            req = rng.choice(reqs)
            k = min(rng.randint(1, 2 * ps), most - len(req))
            got = c.alloc_extend([len(req)], [len(req) + k], [req[-1]]) if k > 0 else None
            if got is not None:
                req += got.tolist()
        elif r < 0.7:
            batch = [q for q in rng.sample(reqs, rng.randint(1, len(reqs))) if len(q) < most]
            if not batch:
                continue
            got = c.alloc_decode([len(q) + 1 for q in batch], [q[-1] for q in batch])
            if got is not None:
                for q, t in zip(batch, got.tolist()):
                    q.append(t)
        elif r < 0.8 and hasattr(c, "free_swa"):
            req = rng.choice(reqs)
            end = swa_window_end(len(req), rng.choice([0, ps, 2 * ps]), ps)
            c.free_swa(req[:end], 0)
        elif r < 0.9 and hasattr(c, "alloc_state"):
            if rng.random() < 0.6:
                c.alloc_state(rng.randint(1, 2))
            else:
                live = [v for v, p in enumerate(c.arena.v2p("state").tolist()) if v and p >= 0]
                if live:
                    c.free_state(rng.sample(live, rng.randint(1, len(live))))
        else:
            c.free(reqs.pop(rng.randrange(len(reqs))))
        probe(c)


def joint_is_exact(c):
    """``alloc_extend([0], [n], [-1])`` succeeds for ``n = available_size()``
    and fails (leaking nothing) for ``n + ps``, relief disabled; the bind is
    undone afterwards (the walk goes on from a slightly different state)."""
    ps = c.page_size
    saved = c.__dict__.get("relieve")
    no_relief(c)
    n = c.available_size()
    assert n % ps == 0 and c.fits(n) and not c.fits(n + 1)
    with Unchanged(c):
        assert c.alloc_extend([0], [n + ps], [-1]) is None
    got = c.alloc_extend([0], [n], [-1])
    assert got is not None and got.numel() == n
    if n:
        c.free(got)
    if saved is None:
        del c.relieve
    c.verify()


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", KINDS)
def test_joint_view_is_exact_on_random_states(kind, ps, lazy):
    for seed in range(3):
        c = make(kind, ps, pages=24, lazy=lazy)
        random_walk(c, random.Random(seed), 40, ps, joint_is_exact)


@pytest.mark.parametrize("pages", (9, 13, 24, 41))
def test_joint_view_closed_forms_match_a_linear_scan(pages):
    """The closed forms and the search against the bare predicate, scanned:
    the largest ``P`` whose coupled bind passes both arena gates, found by
    trying every ``P`` on a rebuilt twin with relief disabled."""
    for kind in KINDS:
        for lazy in (False, True):
            for seed in range(4):

                def rebuilt():
                    c = make(kind, 1, pages=pages, lazy=lazy)
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
    c = make("tri", 16)
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
    h = make("hybrid", 16)
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


# --------------------------------------------------------------- shortfalls


def fill_to_one_page(kind, ps):
    c = make(kind, ps, pages=12 if kind == "hybrid" else 14)
    a = c.alloc_extend([0], [2 * ps], [-1]).tolist()
    if kind == "tri":
        c.alloc_state((c.arena.frontiers("swa")[0] - c.arena.frontiers("state")[1]) // (E * ps))
    b = c.alloc_extend([0], [c.available_size()], [-1]).tolist()
    assert c.available_size() == 0 and c.full_available_size() == ps
    return c, a, b


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_failed_alloc_decode_leaks_nothing(kind, ps):
    c, a, b = fill_to_one_page(kind, ps)
    with Unchanged(c):
        assert c.alloc_decode([len(a) + 1, len(b) + 1], [a[-1], b[-1]]) is None
    with Unchanged(c):
        assert c.alloc_decode(torch.tensor([len(a) + 1]), torch.tensor([a[-1]])) is None
    with Unchanged(c):
        assert c.alloc_extend([0], [1], [-1]) is None
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_failed_alloc_decode_leaks_nothing_mamba(ps):
    c = make("mamba", ps, pages=12)
    c.alloc_state(c.state_available_size() - 3)
    a = c.alloc_extend([0], [3 * ps], [-1]).tolist()
    assert c.available_size() == 0
    with Unchanged(c):
        assert c.alloc_decode([3 * ps + 1], [a[-1]]) is None
    check(c)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, k):
        self.calls.append(k)
        return 0


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_bug6_state_starvation_relieved_by_slide_before_eviction(ps):
    c = bug7_tri(ps)
    c.alloc_state(3)
    assert c.state_available_size() == 0 and c.arena.gap_bytes("state") < E * ps
    twin = bug7_tri(ps)
    twin.alloc_state(3)
    rec = Recorder()
    assert twin.relieve(state_slots=1, evict=rec) is True and rec.calls == []
    assert twin.arena.frontiers("swa") != c.arena.frontiers("swa")  # the float moved up
    slot = c.alloc_state(1)
    assert slot is not None and slot.numel() == 1
    assert c.arena.frontiers("swa") == twin.arena.frontiers("swa")
    check(c)


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_evicts_in_rounds(ps):
    c = bug7_tri(ps)
    reqs = [c.alloc_extend([0], [ps], [-1]) for _ in range(3)]
    n = c.available_size() + 3 * ps
    asked = []

    def evict(k):
        asked.append(k)
        c.free(reqs.pop())
        return ps

    assert not c.fits(n)
    assert c.relieve(tokens=n, evict=evict) is True
    assert 1 <= len(asked) <= 3 and all(k > 0 for k in asked) and c.fits(n)
    rec = Recorder()
    assert c.relieve(tokens=10**4 * ps, evict=rec) is False and len(rec.calls) == 1
    check(c)


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_shortfall_when_each_part_fits_alone(ps):
    c = make("mamba", ps, pages=10)
    c.alloc_extend([0], [ps], [-1])
    n = c.available_size()
    assert c.fits(n) and c.fits(0, 1) and not c.fits(n, 1)
    rec = Recorder()
    assert c.relieve(tokens=n, state_slots=1, evict=rec) is False and rec.calls == [ps]
    check(c)


def test_state_slots_and_cost():
    assert TriPool(1 << 16, 64, 32, 500, 16).state_slot_token_cost() == 6
    assert MambaHybrid(1 << 16, 64, 500, 16).state_slot_token_cost() == 8
    for name in ("alloc_state", "free_state", "state_available_size", "state_slot_token_cost"):
        assert not hasattr(HybridSWA, name)
    for name in ("free_swa", "swa_available_size"):
        assert not hasattr(MambaHybrid, name)
    c = make("tri", 16)
    s = c.alloc_state(3)
    assert s.tolist() == [1, 2, 3] and c.translate(s, "state").tolist() == [1, 2, 3]
    c.free_state(s[1:2])
    assert c.translate(s, "state").tolist() == [1, 0, 2]
    assert c.alloc_state(0).tolist() == [] and c.alloc_state(1).tolist() == [4]
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_translate(kind, ps):
    c = make(kind, ps)
    toks = c.alloc_extend([0, 0], [ps + 2, 3], [-1, -1])
    for pool in ["full"] + (["swa"] if kind != "mamba" else []):
        v2p = c.arena.v2p(pool)
        assert c.translate(toks, pool).tolist() == [v2p[t // ps].item() * ps + t % ps for t in toks.tolist()]
        assert c.translate([-1, -1], pool).tolist() == [0, 0]
        n_tok = v2p.numel() * ps
        assert c.translate(torch.tensor([-5, n_tok, 10**9]), pool).tolist() == [0, 0, 0]  # tensor: no raise
        if ps > 1:
            assert c.translate([1, ps - 1], pool).tolist() == [0, 0]
    c.free(toks[ps + 2 :])
    assert c.translate(toks[ps + 2 :]).tolist() == [0, 0, 0]
    check(c)


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_is_a_value_error_with_nothing_changed(kind, ps):
    c = make(kind, ps)
    a = c.alloc_extend([0, 0], [ps + 2, 2 * ps], [-1, -1]).tolist()
    r0 = a[: ps + 2]
    c.alloc_extend([0], [3], [-1])
    if kind != "hybrid":
        c.alloc_state(2)
    freed = c.alloc_extend([0], [ps], [-1]).tolist()
    c.free(freed)
    fresh_page = max(v for v, p in enumerate(c.arena.v2p("full").tolist()) if p < 0) * ps
    n_tokens = c.arena.v2p("full").numel() * ps
    T = torch.tensor
    calls = [
        (c.alloc_extend, ([0], [1, 2], [-1]), "length mismatch"),
        (c.alloc_extend, ([3], [2], [r0[2]]), "seq_len 2 < prefix_len 3"),
        (c.alloc_extend, (T([3]), T([2]), T([r0[2]])), "seq_len 2 < prefix_len 3"),
        (c.alloc_extend, ([-1], [2], [-1]), "prefix_len -1"),
        (c.alloc_extend, ([0], [2], [r0[0]]), "empty prefix needs last_loc -1"),
        (c.alloc_extend, ([1], [2], [-1]), "names no token"),
        (c.alloc_extend, ([1], [2], [freed[0]]), "is not allocated"),
        (c.alloc_extend, ([0], [True], [-1]), "must be an int"),
        (c.alloc_extend, ([0], T([1.0]), [-1]), "must hold ints"),
        (c.alloc_extend, (0, [1], [-1]), "sequence of ints"),
        (c.alloc_decode, ([0], [-1]), "seq_len must be >= 1"),
        (c.alloc_decode, (T([0]), T([-1])), "seq_len must be >= 1"),
        (c.alloc_decode, ([2, 3], [r0[0]]), "length mismatch"),
        (c.alloc_decode, ([2], [freed[0]]), "is not allocated"),
        (c.alloc_decode, (T([2]), T([n_tokens])), "is out of range"),
        (c.free, ([r0[0], r0[0]],), "repeated"),
        (c.free, ([r0[0], freed[0]],), "not allocated"),
        (c.free, ([fresh_page],), "not allocated"),
        (c.free, ([-1],), "names no token"),
        (c.free, (T([0]),), "page 0"),
        (c.free, ([n_tokens],), "out of range"),
        (c.free, ([1.5],), "must be an int"),
        (c.translate, ([-2],), "out of range"),
        (c.translate, ([n_tokens],), "out of range"),
        (c.translate, ([0], "mamba"), "has pools"),
        (c.relieve, (-1,), ">= 0"),
        (c.relieve, (0, 0, 3), "callable"),
        (c.fits, ("1",), "must be an int"),
    ]
    if ps > 1:
        calls += [
            (c.alloc_extend, ([ps + 2], [ps + 3], [r0[ps]]), "offset"),
            (c.alloc_extend, ([ps + 2, ps + 2], [ps + 3, ps + 4], [r0[-1], r0[-1]]), "both continue page"),
            (c.alloc_decode, (T([ps + 3]), T([r0[-2]])), "offset"),
        ]
    if kind == "mamba":
        calls += [(c.translate, ([0], "swa"), "has pools")]
    else:
        calls += [
            (c.free_swa, (r0, -ps), "start_pos"),
            (c.free_swa, (r0, 1.0), "must be an int"),
            (c.free_swa, ([n_tokens], 0), "out of range"),
            (c.free_swa, (T([-2]), 0), "out of range"),
        ]
        if ps > 1:
            calls += [(c.free_swa, (r0, 1), "start_pos 1 must be a non-negative multiple")]
    if kind == "hybrid":
        calls += [
            (c.relieve, (0, 1), "no state pool"),
            (c.fits, (0, 1), "no state pool"),
            (c.translate, ([1], "state"), "has pools"),
        ]
    else:
        slot = c.alloc_state(1).tolist()
        c.free_state(slot)
        live = [v for v, p in enumerate(c.arena.v2p("state").tolist()) if v and p >= 0]
        calls += [
            (c.free_state, (slot,), "not allocated"),
            (c.free_state, ([live[0], live[0]],), "repeated"),
            (c.free_state, ([0],), "sink"),
            (c.free_state, ([10**6],), "out of range"),
            (c.free_state, (5,), "sequence of ints"),
            (c.alloc_state, (-1,), ">= 0"),
            (c.alloc_state, ("1",), "must be an int"),
            (c.relieve, (0, -1), ">= 0"),
        ]
    for fn, args, match in calls:
        with Unchanged(c), pytest.raises(ValueError, match=match):
            fn(*args)


def test_bad_construction_and_snapshot():
    with pytest.raises(ValueError):
        HybridSWA(1 << 12, 64, 32, 16, lazy=None)
    with pytest.raises(ValueError):
        TriPool(100, 64, 32, 500, 16)
    c = TriPool(1 << 16, 64, 32, 500, 16, lazy=True)
    snap = json.loads(json.dumps(c.snapshot()))
    assert snap["composite"] == "TriPool" and snap["page_size"] == 16 and snap["arena"] == c.arena.snapshot()
    assert c.arena.chain == ("state", "swa", "full") and c.arena.lenders == {"swa": "full"}
    assert HybridSWA(1 << 16, 64, 32, 16).arena.chain == ("swa", "full")
    assert MambaHybrid(1 << 16, 64, 500, 16).arena.lenders == {}


# ------------------------------------------------------------- host syncs


HOT = [
    "alloc_decode",
    "alloc_extend",
    "free_swa",
    "translate",
    "_request_flags",
    "_new_pages",
    "_slots",
    "_take_pages",
    "_vec",
    "joint_pages",
    "_joint_pages",
    "_end_room",
    "_decode_trusted",
    "_translate",
    "_live_once",
]
SYNC_ATTRS = {
    "item",
    "tolist",
    "cpu",
    "nonzero",
    "numpy",
    "unique",
    "unique_consecutive",
    "masked_select",
    "any",
    "all",
}


def scan(src):
    """Sync-forcing calls in ``src``: (line, what)."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(src))):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in SYNC_ATTRS:
                found.append((node.lineno, f.attr))
            if (
                isinstance(f, ast.Name)
                and f.id in {"int", "bool", "float"}
                and node.args
                and not isinstance(node.args[0], ast.Constant)
            ):
                found.append((node.lineno, f.id))
    return found


def hot_sources():
    for cls in (composites._Composite, composites._WithSWA, HybridSWA, MambaHybrid, TriPool):
        for name in HOT:
            fn = vars(cls).get(name)
            fn = getattr(fn, "__func__", fn)  # a staticmethod's function
            if inspect.isfunction(fn):
                yield f"{cls.__name__}.{name}", inspect.getsource(fn)


def test_hot_path_source_has_no_sync_but_the_documented_read():
    """An AST scan of the per-step path: its one host read goes through
    ``_host_read``; ``_explain``/``_explain_reps`` run only to raise."""
    srcs = dict(hot_sources())
    assert {
        "_Composite.alloc_decode",
        "_WithSWA.free_swa",
        "_Composite.translate",
        "TriPool._joint_pages",
        "_Composite._decode_trusted",
        "_Composite._translate",
        "_WithSWA._live_once",
    } <= set(srcs)
    for where, src in srcs.items():
        assert scan(src) == [], where
    assert [
        c.attr for c in ast.walk(ast.parse(inspect.getsource(composites._host_read))) if isinstance(c, ast.Attribute)
    ] == ["tolist"]
    planted = srcs["_WithSWA.free_swa"].replace("live = inside & (rows > 0)", "live = (rows > 0); live.any()")
    assert scan(planted)  # the scan can fail


def _poison(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("host sync on the decode path")

    for attr in (
        "item",
        "tolist",
        "cpu",
        "nonzero",
        "numpy",
        "__bool__",
        "__int__",
        "__index__",
        "__float__",
        "any",
        "all",
    ):
        monkeypatch.setattr(torch.Tensor, attr, boom)
    monkeypatch.setattr(torch, "unique", boom)
    monkeypatch.setattr(torch, "nonzero", boom)
    monkeypatch.setattr(torch, "masked_select", boom)


def counted_read(monkeypatch, reads):
    orig = torch.Tensor.tolist

    def read(t):
        reads.append(t.numel())
        return orig(t)

    monkeypatch.setattr(composites, "_host_read", read)


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_decode_step_makes_one_documented_read(monkeypatch, kind, ps, lazy):
    """``alloc_decode`` + ``free_swa`` + ``translate`` with every sync-forcing
    tensor method poisoned: each of the first two makes exactly one host read
    (through ``_host_read``), ``translate`` none."""
    c = make(kind, ps, pages=48, lazy=lazy)
    reqs = [c.alloc_extend([0], [n], [-1]).tolist() for n in (ps, 2 * ps + 1, 3)]
    seqs = torch.tensor([len(r) for r in reqs])
    last = torch.tensor([r[-1] for r in reqs])
    toks = torch.tensor(reqs[1])
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    outs = []
    for step in range(ps + 2):
        seqs = seqs + 1
        out = c.alloc_decode(seqs, last)
        assert len(reads) == 1
        last = out
        outs.append(out)
        c.free_swa(toks[:ps], 0)  # the first page leaves the window (the second call: skipped)
        assert len(reads) == 2
        c.translate(out)
        c.translate(out, "swa")
        assert len(reads) == 2
        reads.clear()
    monkeypatch.undo()
    assert c.arena.v2p("swa")[reqs[1][0] // ps].item() == -1
    for i, r in enumerate(reqs):
        assert c.translate([r[-1] + 0]).tolist() != [0]
        r += [o[i].item() for o in outs]
    assert len({t for r in reqs for t in r}) == sum(map(len, reqs))
    check(c)


def test_alloc_extend_makes_one_documented_read(monkeypatch):
    c = make("tri", 16)
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    out = c.alloc_extend(torch.tensor([0, 0]), torch.tensor([17, 5]), torch.tensor([-1, -1]))
    assert len(reads) == 1 and out.numel() == 22
    monkeypatch.undo()
    check(c)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_decode_step_under_cuda_sync_debug_error(monkeypatch, kind):
    """On CUDA the driver reports any sync; the documented read lifts the
    check around itself and is counted."""
    ps = 16
    c = make(kind, ps, pages=48, device="cuda")
    r = c.alloc_extend([0], [2 * ps + 1], [-1])
    seqs, last, toks = torch.tensor([r.numel()], device="cuda"), r[-1:], r
    orig, reads = composites._host_read, []

    def read(t):
        reads.append(1)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return orig(t)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(composites, "_host_read", read)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(ps + 2):
            seqs = seqs + 1
            last = c.alloc_decode(seqs, last)
            c.free_swa(toks[:ps], 0)
            c.translate(last, "swa")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(reads) == 2 * (ps + 2)
    check(c)


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
        di, ds = Driver(make(kind, ps, pages=20, lazy=lazy)), Driver(make(kind, ps, pages=20, lazy=lazy, mod=spec))
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
    other, on the same valid inputs; admissions, finishes and relief alike.
    After every step the states, the bytes and every result agree."""
    rng = random.Random(seed)
    C, T = make(kind, ps, pages=pages, lazy=lazy), make(kind, ps, pages=pages, lazy=lazy)
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
            C.free_swa(toks, 0)
            T.free_swa(toks.clone(), 0, check=False)
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

    def off_by_one(self, seq, loc):
        out = orig(self, seq, loc)
        return None if out is None else torch.where(torch.remainder(seq - 1, self.page_size) == 0, out + 1, out)

    monkeypatch.setattr(composites._Composite, "_decode_trusted", off_by_one)
    with pytest.raises(AssertionError):
        drive_checked_and_trusted("hybrid", 16, True, 0)
