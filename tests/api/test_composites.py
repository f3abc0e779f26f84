"""The token-level composites (docs/design.md §6; docs/anchor.md §1 to §3):
HybridSWA, MambaHybrid and TriPool at page sizes 1, 16 and 64, in both
packages.

Hand computations of the anchor's slot rule, window slides with zero moves,
anchor bugs 6 and 7, the joint view's exactness, leak-free failures, relief,
state slots, translation, the TriPool/MambaHybrid golden identity and bad
input.  Every test runs on ``kvarena.spec`` twice, plain and under
``spec.contracts.checking()`` (the arena's and every composite's method
contracts, with their ``inv: self.verify() is None``), and on
``kvarena.impl``.  The spec takes and returns lists of ints, the
implementation int64 tensors (it also takes lists): ``vec`` gives each its
own input, ``ids_of`` reads either result.  What only one package has stays
in ``tests/spec/test_composites.py`` (the contract wrapping) and
``tests/impl/test_composites.py`` (copies, tensors, memo, the trusted path,
the differential replay)."""

import copy
import json
import random

import pytest
import torch

from kvarena import impl, spec
from tests.api.test_relief_steps import moved, placed
from tests.support import check_content, ints, live_ids, unchanged

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

E = 8  # bytes per token of every KV pool unless a test says otherwise
PAGE_SIZES = (1, 16, 64)
KINDS = ("hybrid", "mamba", "tri")
SWA_KINDS = ("hybrid", "tri")
IMPL_COMPOSITES = (impl.HybridSWA, impl.MambaHybrid, impl.TriPool)


def make(pkg, kind, ps, pages=40, lazy=False, **kw):
    """Every grid is ``pages`` pages of ``E*ps`` bytes, min_page 1; a state
    slot is one such page.  ``kw`` (the implementation's ``device``) goes to
    the constructor."""
    total = E * ps * pages
    if kind == "hybrid":
        return pkg.HybridSWA(total, E, E, ps, lazy=lazy, **kw)
    if kind == "mamba":
        return pkg.MambaHybrid(total, E, E * ps, ps, lazy=lazy, **kw)
    return pkg.TriPool(total, E, E, E * ps, ps, lazy=lazy, **kw)


def on_impl(c):
    return isinstance(c, IMPL_COMPOSITES)


def pkg_of(c):
    return impl if on_impl(c) else spec


def vec(c, xs):
    """``xs`` as ``c``'s package takes it natively: a tensor for the
    implementation, a list for the spec."""
    return torch.tensor(list(xs), dtype=torch.int64) if on_impl(c) else list(xs)


def ids_of(x):
    """A composite's result as a list of ints: the spec answers a list, the
    implementation an int64 tensor."""
    if isinstance(x, torch.Tensor):
        assert x.dtype == torch.int64
        return x.tolist()
    assert isinstance(x, list)
    return x


def fifo(c):
    return list(c.arena.snapshot()["pools"]["full"]["free_ids"])


def anchor_slots(free_ids, ps, prefix, seq, last):
    """docs/anchor.md §1, position by position (written apart from either
    package): a position before the prefix's page end continues
    ``last_loc``; a position at a page start takes the next id off the
    FIFO, in batch order."""
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
    """``verify()``, a JSON-able snapshot and, in the spec (it models the
    bytes as content), every live id's content where ``v2p`` says."""
    c.verify()
    json.dumps(c.snapshot())
    if not on_impl(c):
        check_content(c.arena)


def placements(c):
    return {n: placed(c, n) for n in c.arena.chain}


def no_relief(c):
    """Disable relief on this instance: every gate is then the bare joint view."""
    c.relieve = lambda tokens=0, state_slots=0, evict=None, swa_tokens=None: False
    return c


class Recorder:
    """An evictor that records what it is asked for and frees nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, k):
        self.calls.append(k)
        return 0


# ------------------------------------------------------------ extend/decode


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_extend_page_boundaries(pkg, kind, ps):
    c = make(pkg, kind, ps)
    pre, seq, last = [0, 0, 0], [ps + 3, 2 * ps, 1], [-1, -1, -1]
    want = anchor_slots(fifo(c), ps, pre, seq, last)
    got = ids_of(c.alloc_extend(vec(c, pre), vec(c, seq), vec(c, last)))
    assert got == want and len(got) == sum(seq)
    r0, r1, r2 = got[: ps + 3], got[ps + 3 : 3 * ps + 3], got[3 * ps + 3 :]
    # continue: r0 mid-page (for ps > 1), r1 page-aligned, r2 by nothing; tuples are accepted
    pre, seq, last = (ps + 3, 2 * ps, 1), (3 * ps + 1, 2 * ps + 5, 1), (r0[-1], r1[-1], r2[-1])
    want = anchor_slots(fifo(c), ps, pre, seq, last)
    got2 = ids_of(c.alloc_extend(pre, seq, last))
    assert got2 == want and len(got2) == (2 * ps - 2) + 5
    assert len(set(got + got2)) == len(got + got2)
    if ps > 1:
        assert got2[: ps - 3] == list(range(r0[-1] + 1, r0[-1] + ps - 2))  # part (1): last_loc + 1, ...
    # every token's page is live in full (and in swa where present)
    for pool in ["full"] + (["swa"] if kind != "mamba" else []):
        assert all(s > 0 for s in ids_of(c.translate(got + got2, pool)))
    check(c)


@pytest.mark.parametrize("kind", KINDS)
def test_extend_and_decode_literal_ps16(pkg, kind):
    """A hand computation, not an oracle: a fresh composite's FIFO is 1, 2, 3, ..."""
    c = make(pkg, kind, 16)
    got = ids_of(c.alloc_extend([0, 0, 0], [19, 32, 1], [-1, -1, -1]))
    assert got == list(range(16, 35)) + list(range(48, 80)) + [80]
    assert ids_of(c.alloc_extend([19], [50], [34])) == list(range(35, 48)) + list(range(96, 112)) + [112, 113]
    assert ids_of(c.alloc_decode([51, 33], [113, 79])) == [114, 128]  # 51 % 16 = 3: last + 1; 33 % 16 = 1: page 8
    assert ids_of(c.alloc_extend([], [], [])) == [] and ids_of(c.alloc_decode([], [])) == []
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_decode_page_boundaries(pkg, kind, ps):
    c = make(pkg, kind, ps)
    seqs = [max(1, ps - 1), 1]
    toks = ids_of(c.alloc_extend([0, 0], seqs, [-1, -1]))
    reqs = [toks[: seqs[0]], toks[seqs[0] :]]
    new_pages = 0
    for _ in range(2 * ps + 3):
        seqs = [s + 1 for s in seqs]
        last = [r[-1] for r in reqs]
        ids = fifo(c)
        want, k = [], 0
        for s, loc in zip(seqs, last):  # the rule: a new page iff seq % ps == 1 (ps = 1: always)
            if ps == 1 or s % ps == 1:
                want.append(ids[k] * ps)
                k += 1
            else:
                want.append(loc + 1)
        new_pages += k
        got = ids_of(c.alloc_decode(vec(c, seqs), vec(c, last)))
        assert got == want == anchor_slots(ids, ps, [s - 1 for s in seqs], seqs, last)
        for r, t in zip(reqs, got):
            r.append(t)
    assert new_pages >= 4  # crossings happened in both requests
    assert c.arena.live_pages("full") == sum(-(-len(r) // ps) for r in reqs)
    check(c)


# ---------------------------------------------------------------- windows


def test_swa_window_end(pkg):
    swa_window_end = pkg.swa_window_end
    assert swa_window_end(300, 127, 16) == 144  # floor_to_page(300 - 127 - 16 = 157)
    assert swa_window_end(300, 127, 1) == 172
    assert swa_window_end(143, 127, 16) == 0  # 0 exactly: clamped, nothing leaves
    assert swa_window_end(10, 127, 16) == 0
    assert swa_window_end(2048, 1023, 64) == 960
    for s in range(0, 200, 7):
        for w in (0, 3, 31, 127):
            for ps in PAGE_SIZES:  # docs/anchor.md §2: floor_to_page(seq_len - window - page_size), clamped at 0
                assert swa_window_end(s, w, ps) == max(0, (s - w - ps) // ps * ps)
    for args in [(-1, 1, 1), (1, -1, 1), (1, 1, 0), (1.0, 1, 1), (True, 1, 1)]:
        with pytest.raises(ValueError):
            swa_window_end(*args)


def window_run(c, ps, steps, window, zero_moves=True):
    """One request: a prefix of 1, then ``steps`` decodes, each followed by
    the window free; returns (tokens, done, pages reused from swa holes).
    Each new page takes the oldest swa hole while there is one, and swa
    holds exactly the pages of the window's tokens.  With ``zero_moves``
    no live id of any pool ever leaves the page it was bound to."""
    toks = ids_of(c.alloc_extend([0], [1], [-1]))
    done, reused = 0, 0
    home = placements(c)
    for _ in range(steps):
        holes = list(c.arena.snapshot()["pools"]["swa"]["holes"])  # oldest first
        seq = len(toks) + 1
        (t,) = ids_of(c.alloc_decode([seq], [toks[-1]]))
        toks.append(t)
        if (seq - 1) % ps == 0 and holes:  # a new page
            assert ints(c.arena.v2p("swa"))[t // ps] == holes[0]
            reused += 1
        end = pkg_of(c).swa_window_end(seq, window, ps)
        if end > done:
            c.free_swa(vec(c, toks[done:end]), done)
            done = end
        if zero_moves:
            assert moved(home, c) == 0
            home = placements(c)
        v2p = ints(c.arena.v2p("swa"))
        assert [v for v in range(1, len(v2p)) if v2p[v] >= 0] == sorted({x // ps for x in toks[done:]})
    return toks, done, reused


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_window_slide_reuses_swa_pages_with_zero_moves(pkg, kind, ps):
    c = make(pkg, kind, ps, pages=32, lazy=(kind == "hybrid"))  # a lazy END or a float keeps holes
    toks, done, reused = window_run(c, ps, 7 * ps + 2, 2 * ps + ps // 2)
    assert done >= 3 * ps and reused >= 2
    assert c.arena.live_pages("full") == -(-len(toks) // ps)  # full keeps every page
    assert c.arena.live_pages("swa") == len({t // ps for t in toks[done:]}) < c.arena.live_pages("full")
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_free_after_free_swa(pkg, kind, ps):
    c = make(pkg, kind, ps, pages=32)
    toks, done, _ = window_run(c, ps, 5 * ps + 1, 2 * ps, zero_moves=False)  # eager HybridSWA compacts
    other = ids_of(c.alloc_extend([0], [ps + 1], [-1]))
    assert done > 0 and ids_of(c.translate(toks[:1], "swa")) == [0] and ids_of(c.translate(toks[:1])) != [0]
    c.free_swa(toks[:done], 0)  # again: already freed, skipped silently
    c.free(vec(c, toks))  # pages whose swa entry left already, and pages whose swa entry is live
    assert c.arena.live_pages("full") == c.arena.live_pages("swa") == 2
    assert ids_of(c.translate(toks)) == [0] * len(toks) and ids_of(c.translate(toks, "swa")) == [0] * len(toks)
    c.free_swa(other[:ps], 0)  # one page of the other request: swa only
    c.free(other)
    assert c.arena.live_pages("full") == c.arena.live_pages("swa") == 0
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_free_segment_is_free_of_the_representatives(pkg, kind, ps):
    """SGLang's per-step free (``free_segment``): a request's row from a
    page-aligned position; it frees what ``free`` of its page
    representatives frees, the live window first, and checks the engine's
    count of those window entries (a wrong one: ``ValueError``, nothing changed)."""
    c, twin = make(pkg, kind, ps, pages=32), make(pkg, kind, ps, pages=32)
    for x in (c, twin):
        a = ids_of(x.alloc_extend([0, 0], [3 * ps + 1, 2 * ps], [-1, -1]))
        row, other = a[: 3 * ps + 1], a[3 * ps + 1 :]
        if kind != "mamba":
            x.free_swa(row[:ps], 0)  # the row's first page left the window
    live = 0 if kind == "mamba" else 3  # the row's 4 pages, the first out of the window
    before = c.arena.snapshot()
    with pytest.raises(ValueError, match="num_live"):
        c.free_segment(row, 0, num_live=live + 1)
    with pytest.raises(ValueError, match="start_pos"):
        c.free_segment(row[1:], 1 if ps > 1 else -1)
    assert c.arena.snapshot() == before
    c.free_segment(vec(c, row), 0, num_live=live)
    twin.free(row[::ps])
    assert c.arena.snapshot() == twin.arena.snapshot()
    c.free_segment(other[ps:], ps)  # a segment from a later page: the row's head stays
    assert c.arena.live_pages("full") == 1 and ids_of(c.translate(other[:1])) != [0]
    with pytest.raises(ValueError, match=r"free: .*token"):
        c.free_segment(other[ps:], ps)  # freed already
    check(c)


def test_free_swa_skips_sentinels_repeats_and_reads_representatives_only(pkg):
    ps = 16
    c = make(pkg, "tri", ps)
    toks = ids_of(c.alloc_extend([0], [3 * ps], [-1]))
    before = c.arena.live_pages("swa")
    c.free_swa([-1] * ps + [0] * ps, 0)  # -1 and page 0: skipped, nothing else happens
    assert c.arena.live_pages("swa") == before
    # representatives toks[::ps] are the pages' first tokens; the others are never read
    c.free_swa(toks[ps : 3 * ps] + [-1] * 3, ps)
    assert c.arena.live_pages("swa") == 1 and c.arena.live_pages("full") == 3
    c2 = make(pkg, "tri", 1)
    t = ids_of(c2.alloc_extend([0], [5], [-1]))
    c2.free_swa(vec(c2, [t[3], t[1], t[3], t[1]]), 0)  # repeats: each page freed once, ascending
    assert c2.arena.live_pages("swa") == 3
    assert ints(c2.arena.holes("swa")) == sorted(c2.arena.snapshot()["pools"]["swa"]["holes"])
    check(c)
    check(c2)


# ------------------------------------------------------------ joint views


def bug7_hybrid(pkg, ps):
    """Lazy HybridSWA, both grids 11 pages: 2 holes in each END, a 2-page gap."""
    c = make(pkg, "hybrid", ps, pages=11, lazy=True)
    toks = ids_of(c.alloc_extend([0], [4 * ps], [-1]))
    c.free([toks[0], toks[ps]])  # pages 1 and 2: a hole in each END
    return c


def bug7_tri(pkg, ps):
    """Eager TriPool on 13 pages: state 1 slot, 3 free pages, swa 2 pages, 4 free, full 2."""
    c = make(pkg, "tri", ps, pages=13)
    c.alloc_extend([0], [2 * ps], [-1])  # full at pages 11, 12; swa parks at [5, 7)
    c.alloc_state(1)
    assert c.arena.frontiers("swa") == (5 * E * ps, 7 * E * ps)
    return c


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("build", [bug7_hybrid, bug7_tri])
def test_bug7_component_views_four_joint_three(pkg, build, ps):
    c = build(pkg, ps)
    assert c.full_available_size() == 4 * ps and c.swa_available_size() == 4 * ps  # the static split's answer: 4
    assert c.available_size() == 3 * ps  # the gate, not the min of the components
    assert c.fits(3 * ps) and not c.fits(3 * ps + 1) and not c.fits(4 * ps)
    with unchanged(c):  # one token past the joint view, relief off: refused, nothing leaked
        assert no_relief(c).alloc_extend([0], [3 * ps + 1], [-1]) is None
    del c.relieve  # relief on again: a bind within the joint view runs none
    before = placements(c)
    got = c.alloc_extend([0], [3 * ps], [-1])
    assert got is not None and len(ids_of(got)) == 3 * ps
    # nothing moved: every earlier live id is live on its page
    assert moved(before, c) == 0 and all(before[n].keys() <= placed(c, n).keys() for n in before)
    check(c)


@pytest.mark.parametrize("ps", (1, 16))
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", KINDS)
def test_joint_view_is_exact_along_a_run(pkg, kind, ps, lazy):
    c = make(pkg, kind, ps, pages=20, lazy=lazy)
    reqs = []
    for step in range(14):
        n = c.available_size()
        assert n % ps == 0 and c.fits(n) and not c.fits(n + 1)
        trial = copy.deepcopy(c)
        assert trial.alloc_extend([0], [n], [-1]) is not None
        if kind == "mamba":
            assert n == c.full_available_size()
        if step % 4 == 3 and reqs:
            c.free(reqs.pop(1 if len(reqs) > 1 else 0))
        elif n:
            reqs.append(ids_of(c.alloc_extend([0], [min(n, 2 * ps + step % 3)], [-1])))
        if kind != "hybrid" and step % 5 == 0:
            c.alloc_state(1)
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
                reqs.append(ids_of(got))
        elif r < 0.55:
            req = rng.choice(reqs)
            k = min(rng.randint(1, 2 * ps), most - len(req))
            got = c.alloc_extend([len(req)], [len(req) + k], [req[-1]]) if k > 0 else None
            if got is not None:
                req += ids_of(got)
        elif r < 0.7:
            batch = [q for q in rng.sample(reqs, rng.randint(1, len(reqs))) if len(q) < most]
            if not batch:
                continue
            got = c.alloc_decode([len(q) + 1 for q in batch], [q[-1] for q in batch])
            if got is not None:
                for q, t in zip(batch, ids_of(got)):
                    q.append(t)
        elif r < 0.8 and hasattr(c, "free_swa"):
            req = rng.choice(reqs)
            end = pkg_of(c).swa_window_end(len(req), rng.choice([0, ps, 2 * ps]), ps)
            c.free_swa(req[:end], 0)
        elif r < 0.9 and hasattr(c, "alloc_state"):
            if rng.random() < 0.6:
                c.alloc_state(rng.randint(1, 2))
            else:
                live = live_ids(c.arena, "state")
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
    no_relief(c)
    n = c.available_size()
    assert n % ps == 0 and c.fits(n) and not c.fits(n + 1)
    with unchanged(c):
        assert c.alloc_extend([0], [n + ps], [-1]) is None
    got = c.alloc_extend([0], [n], [-1])
    assert got is not None and len(ids_of(got)) == n
    if n:
        c.free(got)
    del c.relieve
    c.verify()


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", KINDS)
def test_joint_view_is_exact_on_random_states(pkg, kind, ps, lazy):
    for seed in range(3):
        c = make(pkg, kind, ps, pages=24, lazy=lazy)
        random_walk(c, random.Random(seed), 40, ps, joint_is_exact)


# --------------------------------------------------------------- shortfalls


def fill_to_one_page(pkg, kind, ps):
    """Eager, the ENDs (and the float) packed with one page left above full's
    neighbour: full alone could take it, the coupled bind cannot."""
    c = make(pkg, kind, ps, pages=12 if kind == "hybrid" else 14)
    a = ids_of(c.alloc_extend([0], [2 * ps], [-1]))
    if kind == "tri":  # swa parked mid-region; close the low gap with state slots
        c.alloc_state((c.arena.frontiers("swa")[0] - c.arena.frontiers("state")[1]) // (E * ps))
    b = ids_of(c.alloc_extend([0], [c.available_size()], [-1]))
    assert c.available_size() == 0
    assert c.full_available_size() == ps  # the one page
    return c, a, b


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_failed_alloc_decode_leaks_nothing(pkg, kind, ps):
    c, a, b = fill_to_one_page(pkg, kind, ps)
    with unchanged(c):  # both at a page boundary: two new pages, one would fit
        assert c.alloc_decode([len(a) + 1, len(b) + 1], [a[-1], b[-1]]) is None
    with unchanged(c):  # one page: full has it, swa does not
        assert c.alloc_decode(vec(c, [len(a) + 1]), vec(c, [a[-1]])) is None
    with unchanged(c):
        assert c.alloc_extend([0], [1], [-1]) is None
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_failed_alloc_decode_leaks_nothing_mamba(pkg, ps):
    c = make(pkg, "mamba", ps, pages=12)
    c.alloc_state(c.state_available_size() - 3)
    a = ids_of(c.alloc_extend([0], [3 * ps], [-1]))
    assert c.available_size() == 0
    with unchanged(c):
        assert c.alloc_decode([3 * ps + 1], [a[-1]]) is None
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_extend_relieves_by_sliding_the_float(pkg, ps):
    """full is short only because swa sits next to it: the call slides swa
    (no eviction) and then allocates."""
    c = make(pkg, "tri", ps, pages=24)
    slots = c.alloc_state(10)  # state at pages 1..10
    c.alloc_extend([0], [4 * ps], [-1])  # full at 20..23; swa parks mid-region [11, 20): at [13, 17)
    c.free_state(slots)  # the low gap is now 12 pages, the high gap 3
    assert c.arena.frontiers("swa") == (13 * E * ps, 17 * E * ps)
    assert c.full_available_size() == 3 * ps and not c.fits(4 * ps) and c.fits(3 * ps)
    rec = Recorder()
    assert copy.deepcopy(c).relieve(tokens=4 * ps, evict=rec) and rec.calls == []
    got = c.alloc_extend([0], [4 * ps], [-1])
    assert got is not None and len(ids_of(got)) == 4 * ps
    # make_room(high) moved swa's top two pages below it ([11, 15)); then swa grew low by 4
    assert c.arena.frontiers("swa") == (7 * E * ps, 15 * E * ps)
    check(c)


def swa_one_page_mid_region(pkg, ps, policy):
    """TriPool on 24 pages: full holds 1 page at 23, swa 1 page at [10, 11)
    with 9 free pages below and 12 above.  A coupled demand of 10 pages each
    fits some placement of swa (20 <= 21), not this one."""
    c = make(pkg, "tri", ps, pages=24, policy=policy)
    a = c.alloc_extend([0], [2 * ps], [-1])
    c.free_swa(a, 0)
    c.alloc_extend([0], [ps], [-1])
    c.free(a)
    assert c.arena.frontiers("swa") == (10 * E * ps, 11 * E * ps) and not c.fits(10 * ps)
    return c


@pytest.mark.parametrize("ps", (1, 16))
def test_anchor_policy_refuses_a_feasible_coupled_demand_once(pkg, ps):
    """docs/findings.md, policy findings 1 and 6 at the token level, pinned (policy "anchor"):
    only the float looks short, so the policy opens its larger-surplus side
    (low) and leapfrogs it against full.  The call returns None; the same
    call again leapfrogs it back and succeeds."""
    c = swa_one_page_mid_region(pkg, ps, "anchor")
    page = E * ps
    assert c.alloc_extend([0], [10 * ps], [-1]) is None
    assert c.arena.frontiers("swa") == (22 * page, 23 * page)  # leapfrogged high: full is blocked
    assert c.arena.live_pages("full") == 1  # no id allocated
    assert c.alloc_extend([0], [10 * ps], [-1]) is not None
    assert c.arena.frontiers("swa")[0] == page
    check(c)


def test_planner_meets_the_coupled_demand_in_one_call(pkg):
    """The same state under ``policy="planner"`` (docs/design.md §4b, the fix):
    the first call succeeds."""
    c = swa_one_page_mid_region(pkg, 16, "planner")
    assert c.alloc_extend([0], [10 * 16], [-1]) is not None
    check(c)


# --------------------------------------------------------- state (bug 6)


def starved_tri(pkg, ps):
    c = bug7_tri(pkg, ps)
    c.alloc_state(3)  # the low gap is gone: state's gap is smaller than one slot
    assert c.state_available_size() == 0 and c.arena.gap_bytes("state") < E * ps
    return c


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_bug6_state_starvation_relieved_by_slide_before_eviction(pkg, ps):
    c = starved_tri(pkg, ps)
    trial = copy.deepcopy(c)
    rec = Recorder()
    assert trial.relieve(state_slots=1, evict=rec) is True and rec.calls == []
    assert trial.arena.frontiers("swa") != c.arena.frontiers("swa")  # the float moved up
    slot = c.alloc_state(1)  # the same relief, inside alloc_state, then the slot
    assert slot is not None and len(ids_of(slot)) == 1
    assert c.arena.frontiers("swa") == trial.arena.frontiers("swa")
    check(c)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_bug6_state_starvation_relieved_by_flush_before_eviction(pkg, ps):
    c = make(pkg, "mamba", ps, pages=12, lazy={"full"})
    c.alloc_extend([0], [2 * ps], [-1])
    c.alloc_extend([0], [3 * ps], [-1])
    newest = c.alloc_extend([0], [ps], [-1])  # the down END binds below: at its low frontier
    c.alloc_state(c.state_available_size())
    c.free(newest)  # a lazy hole at full's frontier: gap for nobody until a flush
    assert c.state_available_size() == 0 and ints(c.arena.holes("full"))
    trial = copy.deepcopy(c)
    rec = Recorder()
    assert trial.relieve(state_slots=1, evict=rec) is True and rec.calls == []
    assert c.alloc_state(1) is not None and ints(c.arena.holes("full")) == []
    check(c)


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_evicts_in_rounds(pkg, ps):
    c = bug7_tri(pkg, ps)
    reqs = [c.alloc_extend([0], [ps], [-1]) for _ in range(3)]
    n = c.available_size() + 3 * ps
    asked = []

    def evict(k):  # retract the newest request
        asked.append(k)
        c.free(reqs.pop())
        return ps

    assert not c.fits(n)
    assert c.relieve(tokens=n, evict=evict) is True
    assert 1 <= len(asked) <= 3 and all(k > 0 for k in asked)
    assert c.fits(n)
    # a falsy evictor ends the rounds at once
    rec = Recorder()
    assert c.relieve(tokens=10**4 * ps, evict=rec) is False and len(rec.calls) == 1
    check(c)


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_shortfall_when_each_part_fits_alone(pkg, ps):
    """Tokens and a slot each fit, together they do not: evict is asked for
    at least one token (not 0)."""
    c = make(pkg, "mamba", ps, pages=10)
    c.alloc_extend([0], [ps], [-1])
    n = c.available_size()
    assert c.fits(n) and c.fits(0, 1) and not c.fits(n, 1)
    rec = Recorder()
    assert c.relieve(tokens=n, state_slots=1, evict=rec) is False
    assert rec.calls == [ps]  # one state slot displaces ps tokens here
    check(c)


def test_state_slot_token_cost(pkg):
    assert pkg.TriPool(1 << 16, 64, 32, 500, 16).state_slot_token_cost() == 6  # ceil(500 / 96)
    assert pkg.MambaHybrid(1 << 16, 64, 500, 16).state_slot_token_cost() == 8  # ceil(500 / 64)
    assert not hasattr(pkg.HybridSWA(1 << 16, 64, 32, 16), "state_slot_token_cost")
    for name in ("alloc_state", "free_state", "state_available_size", "state_slot_token_cost"):
        assert not hasattr(pkg.HybridSWA, name)
    for name in ("free_swa", "swa_available_size"):
        assert not hasattr(pkg.MambaHybrid, name)


def test_state_slots_alloc_free(pkg):
    c = make(pkg, "tri", 16)
    s = ids_of(c.alloc_state(3))
    assert s == [1, 2, 3] and ids_of(c.translate(vec(c, s), "state")) == [1, 2, 3]
    c.free_state(vec(c, [s[1]]))
    assert ids_of(c.translate(vec(c, s), "state")) == [1, 0, 2]  # eager state END compacted: slot 3 moved down
    assert ids_of(c.alloc_state(0)) == []
    assert ids_of(c.alloc_state(1)) == [4]  # FIFO: freed ids go to the back
    check(c)


# ----------------------------------------------------------------- translate


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_translate(pkg, kind, ps):
    c = make(pkg, kind, ps)
    toks = c.alloc_extend([0, 0], [ps + 2, 3], [-1, -1])
    for pool in ["full"] + (["swa"] if kind != "mamba" else []):
        v2p = ints(c.arena.v2p(pool))
        slots = ids_of(c.translate(toks, pool))
        assert slots == [v2p[t // ps] * ps + t % ps for t in ids_of(toks)]
        assert all(s >= ps for s in slots)  # never inside page 0
        assert ids_of(c.translate([-1, -1], pool)) == [0, 0]
        if ps > 1:
            assert ids_of(c.translate([1, ps - 1], pool)) == [0, 0]  # page 0: slot 0 itself
    c.free(toks[ps + 2 :])
    assert ids_of(c.translate(toks[ps + 2 :])) == [0, 0, 0]  # tombstones: slot 0, not an offset in page 0
    if kind != "hybrid":
        s = ids_of(c.alloc_state(2))
        assert ids_of(c.translate(s + [-1], "state")) == ints(c.arena.translate("state", s)) + [0]
    check(c)


# ------------------------------------------------------------ golden identity


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("lazy", (False, True))
def test_golden_identity_tripool_with_empty_float_is_mamba(pkg, ps, lazy):
    """TriPool with its swa float emptied after every step behaves as the
    MambaHybrid of the same sizes: same ids, same state and full bands, same
    per-component views; its joint view is the two-END closed form
    ``min(gap // (epp_full + epp_swa), full's view)`` (eager, grid-aligned).
    Lazy, it holds while full has no holes at a coupled bind (see below)."""
    total, fe, se, sb = E * ps * 30, E, E // 2, E * ps  # swa epp <= full epp: the same sink
    tri, mam = pkg.TriPool(total, fe, se, sb, ps, lazy=lazy), pkg.MambaHybrid(total, fe, sb, ps, lazy=lazy)
    reqs = {}

    def both(fn):
        a, b = (x.tolist() if isinstance(x, torch.Tensor) else x for x in (fn(tri), fn(mam)))
        assert a == b
        return a

    def empty_float():
        for r in reqs.values():
            tri.free_swa(r, 0)
        assert tri.arena.live_pages("swa") == 0
        parked = tri.arena.geometry("swa").num_pages * tri.arena.geometry("swa").epp
        assert tri.arena.frontiers("swa") == (parked, parked)

    def same():
        st, sm = tri.arena.snapshot()["pools"], mam.arena.snapshot()["pools"]
        for name in ("state", "full"):
            assert st[name] == sm[name]
            assert tri.arena.gap_bytes(name) == mam.arena.gap_bytes(name)
        assert tri.full_available_size() == mam.full_available_size() == mam.available_size()
        assert tri.state_available_size() == mam.state_available_size()
        if not lazy:
            gf = tri.arena.geometry("full").epp + tri.arena.geometry("swa").epp
            want = min(tri.arena.gap_bytes("full") // gf, tri.full_available_size() // ps) * ps
            assert tri.available_size() == want
        tri.verify()
        mam.verify()

    slots = both(lambda c: c.alloc_state(2))
    reqs["a"] = both(lambda c: c.alloc_extend([0], [2 * ps + 1], [-1]))
    reqs["b"] = both(lambda c: c.alloc_extend([0], [3], [-1]))
    empty_float()
    same()
    for _ in range(ps + 2):
        ra, rb = reqs["a"], reqs["b"]
        got = both(lambda c, ra=ra, rb=rb: c.alloc_decode([len(ra) + 1, len(rb) + 1], [ra[-1], rb[-1]]))
        ra.append(got[0])
        rb.append(got[1])
        empty_float()
        same()
    both(lambda c: c.free_state([slots[0]]))
    gone = reqs.pop("a")
    both(lambda c: c.free(gone))
    same()
    more = both(lambda c: c.alloc_state(c.state_available_size() + 1))  # starvation: relief, same in both
    assert (more is not None) == lazy  # lazy: flushing full's holes gives ground; eager: nothing to give
    same()
    if more:
        both(lambda c: c.free_state(more))
    # The relief above stopped at the fit and left full's far holes.  A hole
    # that full reuses still needs a fresh swa page, which the two-END layout
    # does not: the identity holds while full has no holes at a coupled bind.
    both(lambda c: c.arena.flush("full"))
    reqs["c"] = both(lambda c: c.alloc_extend([0], [ps + 5], [-1]))
    assert reqs["c"] is not None
    empty_float()
    same()
    both(lambda c: c.alloc_state(2))
    same()


# ----------------------------------------------------------------- bad input


def in_use(pkg, kind, ps):
    """Two requests (returned), a third of three tokens and, with a state
    pool, two slots."""
    c = make(pkg, kind, ps)
    a = ids_of(c.alloc_extend([0, 0], [ps + 2, 2 * ps], [-1, -1]))
    c.alloc_extend([0], [3], [-1])
    if kind != "hybrid":
        c.alloc_state(2)
    return c, a[: ps + 2], a[ps + 2 :]


@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_is_a_value_error_with_nothing_changed(pkg, kind, ps):
    c, r0, _ = in_use(pkg, kind, ps)
    freed = ids_of(c.alloc_extend([0], [ps], [-1]))
    c.free(freed)
    full = ints(c.arena.v2p("full"))
    fresh_page = max(v for v, p in enumerate(full) if p < 0) * ps
    n_tokens = len(full) * ps
    calls = [
        (c.alloc_extend, ([0], [1, 2], [-1]), "length mismatch"),
        (c.alloc_extend, ([3], [2], [r0[2]]), "seq_len 2 < prefix_len 3"),
        (c.alloc_extend, ([-1], [2], [-1]), "prefix_len -1"),
        (c.alloc_extend, ([0], [2], [r0[0]]), "empty prefix needs last_loc -1"),
        (c.alloc_extend, ([1], [2], [-1]), "names no token"),
        (c.alloc_extend, ([1], [2], [freed[0]]), "is not allocated"),
        (c.alloc_extend, ([0], [True], [-1]), "must be an int"),
        (c.alloc_extend, (0, [1], [-1]), "sequence of ints"),
        (c.alloc_extend, (iter([0]), [1], [-1]), "sequence of ints"),
        (c.alloc_decode, ([0], [-1]), "seq_len must be >= 1"),
        (c.alloc_decode, ([2, 3], [r0[0]]), "length mismatch"),
        (c.alloc_decode, ([2], [freed[0]]), "is not allocated"),
        (c.alloc_decode, ([2], [n_tokens]), "is out of range"),
        (c.free, ([r0[0], r0[0]],), "repeated"),
        (c.free, ([r0[0], freed[0]],), "not allocated"),
        (c.free, ([fresh_page],), "not allocated"),
        (c.free, ([-1],), "names no token"),
        (c.free, ([0],), "page 0"),
        (c.free, ([n_tokens],), "out of range"),
        (c.free, ([1.5],), "must be an int"),
        (c.translate, ([-2],), "out of range"),
        (c.translate, ([n_tokens],), "out of range"),
        (c.translate, ([0], "mamba"), "has pools"),
        (c.relieve, (-1,), ">= 0"),
        (c.relieve, (0, 0, 3), "callable"),
        (c.fits, ("1",), "must be an int"),
    ]
    if on_impl(c):  # tensors: the implementation's own input
        calls += [
            (c.alloc_extend, (vec(c, [3]), vec(c, [2]), vec(c, [r0[2]])), "seq_len 2 < prefix_len 3"),
            (c.alloc_extend, ([0], torch.tensor([1.0]), [-1]), "must hold ints"),
            (c.alloc_decode, (vec(c, [0]), vec(c, [-1])), "seq_len must be >= 1"),
            (c.alloc_decode, (vec(c, [2]), vec(c, [n_tokens])), "is out of range"),
            (c.free, (vec(c, [0]),), "page 0"),
        ]
    if ps > 1:
        calls += [
            (c.alloc_extend, ([ps + 2], [ps + 3], [r0[ps]]), "offset"),  # r0[ps] is position ps
            (c.alloc_extend, ([ps + 2, ps + 2], [ps + 3, ps + 4], [r0[-1], r0[-1]]), "both continue page"),
            (c.alloc_decode, (vec(c, [ps + 3]), vec(c, [r0[-2]])), "offset"),
        ]
    if kind == "mamba":
        calls += [(c.translate, ([0], "swa"), "has pools")]
    else:
        calls += [
            (c.free_swa, (r0, -ps), "start_pos"),
            (c.free_swa, (r0, 1.0), "must be an int"),
            (c.free_swa, ([n_tokens], 0), "out of range"),
            (c.free_swa, (vec(c, [-2]), 0), "out of range"),
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
        slot = ids_of(c.alloc_state(1))
        c.free_state(slot)
        live = live_ids(c.arena, "state")
        calls += [
            (c.free_state, (slot,), "not allocated"),
            (c.free_state, ([live[0], live[0]],), "repeated"),
            (c.free_state, ([0],), "sink"),
            (c.free_state, ([10**6],), "out of range"),
            (c.free_state, ([live[0], slot[0]],), "not allocated"),
            (c.free_state, (5,), "sequence of ints"),
            (c.alloc_state, (-1,), ">= 0"),
            (c.alloc_state, ("1",), "must be an int"),
            (c.relieve, (0, -1), ">= 0"),
        ]
    for fn, args, match in calls:
        with unchanged(c), pytest.raises(ValueError, match=match):
            fn(*args)


def test_bad_construction(pkg):
    with pytest.raises(ValueError, match="page_size"):
        pkg.TriPool(1 << 16, 64, 32, 512, page_size=0)
    with pytest.raises(ValueError, match="lazy"):
        pkg.HybridSWA(1 << 16, 64, 32, lazy="full")
    with pytest.raises(ValueError, match="lazy"):
        pkg.HybridSWA(1 << 12, 64, 32, 16, lazy=None)
    with pytest.raises(ValueError, match="policy"):
        pkg.MambaHybrid(1 << 16, 64, 512, policy="greedy")
    with pytest.raises(ValueError, match="float is never lazy"):
        pkg.TriPool(1 << 16, 64, 32, 512, lazy={"swa"})
    with pytest.raises(ValueError, match="'full'"):
        pkg.HybridSWA(1 << 16, -1, 32)
    with pytest.raises(ValueError):
        pkg.TriPool(100, 64, 32, 500, 16)  # no room for a page of every pool
    c = pkg.TriPool(1 << 16, 64, 32, 512, page_size=16, lazy={"full"})
    assert c.arena.chain == ("state", "swa", "full") and c.arena.is_lazy("full") and not c.arena.is_lazy("state")
    assert c.arena.lender("swa") == "full" and c.page_size == 16
    for ps in (1, 16):
        assert pkg.HybridSWA(1 << 16, 64, 32, ps).arena.chain == ("swa", "full")
        m = pkg.MambaHybrid(1 << 16, 64, 500, ps)
        assert m.arena.chain == ("state", "full") and m.arena.lenders == {}


def test_snapshot_is_json_and_holds_the_arena(pkg):
    for c in (in_use(pkg, "tri", 16)[0], pkg.TriPool(1 << 16, 64, 32, 500, 16, lazy=True)):
        snap = c.snapshot()
        assert json.loads(json.dumps(snap)) == snap
        assert snap["arena"] == c.arena.snapshot() and snap["composite"] == "TriPool" and snap["page_size"] == 16
        assert c.arena.chain == ("state", "swa", "full") and c.arena.lenders == {"swa": "full"}
