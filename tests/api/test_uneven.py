"""The uneven demand (docs/design.md §11): ``fits`` and ``relieve`` with
``swa_tokens``, in both packages.

Full binds ``P_f = cdiv(tokens, ps)`` new pages and swa only the last ``P_s
= cdiv(swa_tokens, ps)`` of those ids (a prefill over a cached prefix needs
fewer SWA pages than full ones); state slots come first, as for the coupled
demand.  Checked here: ``swa_tokens=None`` is the coupled demand, unchanged;
the verdict is the bind on a copy (an oracle written with the arena's own
calls, apart from either package); hand-computed edges; bad input is a
``ValueError`` with nothing changed; ``relieve`` for an uneven demand, the
shortfall ``evict`` is asked for, and ``fits`` after it.  Every test runs on
``kvarena.spec`` (plain and under its contracts) and on ``kvarena.impl``.
"""

import copy
import random

import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import contracts
from tests.api.test_composites import E, ids_of, make

KINDS = ("hybrid", "mamba", "tri")
SWA_KINDS = ("hybrid", "tri")


def oracle(arena, ps, tokens, slots, swa):
    """The uneven bind on a copy of a spec ``arena``, by the arena's own
    calls: state slots, ``P_f`` full pages, then the last ``P_s`` of their
    ids in swa (where the chain has swa).  The test's own calls: unchecked
    under ``spec-contracts`` (the composite under test is what it checks)."""
    with contracts.unchecked():
        a = copy.deepcopy(arena)
        if slots and a.alloc("state", slots) is None:
            return False
        pf = -(-tokens // ps)
        ids = a.alloc("full", pf)
        if ids is None:
            return False
        if "swa" in a.chain:
            k = pf if swa is None else -(-swa // ps)
            if k and a.alloc("swa", k, ids=ids[pf - k :]) is None:
                return False
        return True


def twins(pkg, kind, ps, lazy, pages=12):
    """``pkg``'s composite and a spec twin, driven alike (the oracle reads
    the twin's arena, which the snapshots hold equal)."""
    return make(pkg, kind, ps, pages=pages, lazy=lazy), make(spec, kind, ps, pages=pages, lazy=lazy)


def churn(c, ref, rng, ps, steps):
    """Random admissions, SWA window frees, state slots and finishes on both."""
    reqs = []
    for _ in range(steps):
        r = rng.random()
        if r < 0.45:
            n = rng.randint(1, 3 * ps)
            got, want = c.alloc_extend([0], [n], [-1]), ref.alloc_extend([0], [n], [-1])
            assert (got is None) == (want is None)
            if want is not None:
                assert ids_of(got) == want
                reqs.append(want)
        elif r < 0.6 and "state" in ref.arena.chain:
            assert (c.alloc_state(1) is None) == (ref.alloc_state(1) is None)
        elif r < 0.8 and reqs:
            q = reqs.pop(rng.randrange(len(reqs)))
            c.free(q)
            ref.free(q)
        elif reqs and "swa" in ref.arena.chain:
            q = reqs[rng.randrange(len(reqs))]
            k = rng.randint(0, len(q) // ps) * ps
            c.free_swa(q[:k], 0)
            ref.free_swa(q[:k], 0)
        assert c.arena.snapshot() == ref.arena.snapshot()
        yield


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", KINDS)
def test_uneven_fits_is_the_bind_on_a_copy(pkg, kind, ps, lazy):
    """On small arenas along random runs: ``fits(tokens, slots, swa)`` is
    the oracle's verdict for every full demand up to past full's own view
    (swa: its ends, a page short of ``tokens``, and two drawn values)."""
    rng = random.Random(f"{kind}-{ps}-{lazy}")
    c, ref = twins(pkg, kind, ps, lazy)
    slot_range = (0, 1, 2) if kind != "hybrid" else (0,)
    seen = set()
    for _ in churn(c, ref, rng, ps, 15):
        top = max(ref.available_size(), ref.full_available_size()) + 2 * ps
        for tokens in range(0, top + 1, max(1, ps // 2)):
            # swa's ends, a page short, and two drawn (every value: too slow under the contracts)
            swas = {0, tokens} | ({max(0, tokens - ps), rng.randint(0, tokens), rng.randint(0, tokens)} - {0, tokens})
            swas = sorted(swas) if kind != "mamba" else (0, tokens)
            for swa in swas:
                for slots in slot_range:
                    want = oracle(ref.arena, ps, tokens, slots, swa)
                    assert c.fits(tokens, slots, swa) == want, (tokens, slots, swa)
                    if want and not oracle(ref.arena, ps, tokens, slots, None):
                        seen.add("uneven fits where the coupled demand does not")
    if kind != "mamba":
        assert seen, "the runs never reached a demand only the uneven form admits"


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", KINDS)
def test_swa_tokens_none_is_the_coupled_demand(pkg, kind, lazy):
    """``swa_tokens=None`` (and ``swa_tokens=tokens``) is today's coupled
    demand: the same ``fits`` verdict, the joint view's gate, and the same
    ``relieve`` (verdict, moves, evict calls) as the call without it."""
    ps = 4
    rng = random.Random(7)
    c, ref = twins(pkg, kind, ps, lazy)
    for _ in churn(c, ref, rng, ps, 20):
        for tokens in range(c.available_size() + 3 * ps):
            for slots in (0, 1) if kind != "hybrid" else (0,):
                want = oracle(ref.arena, ps, tokens, slots, None)
                assert c.fits(tokens, slots) == c.fits(tokens, slots, None) == c.fits(tokens, slots, tokens) == want
            assert c.fits(tokens) == (tokens <= c.available_size())
    tokens = c.available_size() + 2 * ps
    a, b = copy.deepcopy(c), copy.deepcopy(c)
    asked_a, asked_b = [], []
    ok_a = a.relieve(tokens, 0, lambda k: asked_a.append(k) or 0)
    ok_b = b.relieve(tokens, 0, lambda k: asked_b.append(k) or 0, swa_tokens=None)
    assert ok_a == ok_b and asked_a == asked_b and a.arena.snapshot() == b.arena.snapshot()


@pytest.mark.parametrize("ps", (1, 16))
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_uneven_edges_by_hand(pkg, kind, ps):
    """40 pages of ``E*ps`` bytes per grid, empty: 39 pages between the
    ENDs (TriPool: the float's region).  Coupled, ``2P <= 39``: 19 pages.
    Uneven, ``P_f + P_s <= 39``: (30, 9) fits, (30, 10) does not, nor one
    token more of SWA (a whole page more).  With one state slot (TriPool)
    the region starts a page higher: (30, 8) fits, (30, 9) does not."""
    c = make(pkg, kind, ps, pages=40)
    assert c.available_size() == 19 * ps and not c.fits(20 * ps)
    assert c.fits(30 * ps, 0, 9 * ps) and not c.fits(30 * ps, 0, 9 * ps + 1) and not c.fits(30 * ps, 0, 10 * ps)
    assert c.fits(39 * ps, 0, 0) and not c.fits(39 * ps + 1, 0, 0)  # swa binds nothing: full alone
    if kind == "tri":
        assert c.fits(30 * ps, 1, 8 * ps) and not c.fits(30 * ps, 1, 9 * ps)
        assert not c.fits(39 * ps, 1, 0) and c.fits(38 * ps, 1, 0)


@pytest.mark.parametrize("ps", (1, 16))
def test_mamba_takes_only_a_coupled_swa_count(pkg, ps):
    """``MambaHybrid`` has no swa: ``swa_tokens`` may be None, 0 or
    ``tokens`` (each the same demand); full alone decides."""
    c = make(pkg, "mamba", ps, pages=40)
    for swa_of in (lambda t: None, lambda t: 0, lambda t: t):
        assert c.fits(39 * ps, 0, swa_of(39 * ps)) and not c.fits(39 * ps + 1, 0, swa_of(39 * ps + 1))
    assert c.relieve(5 * ps, 0, None, 0) and c.relieve(5 * ps, 1, None, 5 * ps)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_swa_tokens_is_a_value_error_with_nothing_changed(pkg, kind):
    ps = 4
    c = make(pkg, kind, ps, pages=20, lazy=True)
    t = ids_of(c.alloc_extend([0], [9], [-1]))
    if kind != "mamba":
        c.free_swa(t[:4], 0)
    before = c.arena.snapshot()
    name = type(c).__name__
    bad = [(8, -1, "swa_tokens"), (8, 1.5, "swa_tokens"), (8, True, "swa_tokens"), (8, "3", "swa_tokens")]
    bad += [(-1, 0, "tokens")]
    if kind == "mamba":
        bad += [(8, 3, f"{name} has no swa pool"), (8, 9, f"{name} has no swa pool")]
    else:
        bad += [(8, 9, "subset"), (0, 1, "subset")]
    for tokens, swa, words in bad:
        for call in (lambda t=tokens, w=swa: c.fits(t, 0, w), lambda t=tokens, w=swa: c.relieve(t, 0, None, w)):
            with pytest.raises(ValueError, match=words):
                call()
            assert c.arena.snapshot() == before
    with pytest.raises(ValueError, match="state pool" if kind == "hybrid" else "evict"):
        c.relieve(8, 1, None, 4) if kind == "hybrid" else c.relieve(8, 0, 3, 8 if kind == "mamba" else 4)
    assert c.arena.snapshot() == before
    c.verify()


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_uneven_compacts_then_fits(pkg, ps):
    """Lazy, 40-page grids, two requests of 8 pages: swa [1, 17) below, full
    [24, 40) above, 7 pages between; the first request's window frees its
    8 SWA pages, holes under the second's.  (11, 4) needs 11 pages of gap
    once swa's holes take its 4: the ladder compacts swa's surplus (8 - 4
    holes) in steps until the gap is 11, and then fits, 4 holes left.  The
    coupled (11) could not fit even packed (22 > 15) and swa has no
    surplus for it, so its ladder changes nothing."""
    c = make(pkg, "hybrid", ps, pages=40, lazy=True)
    a = ids_of(c.alloc_extend([0], [8 * ps], [-1]))
    c.alloc_extend([0], [8 * ps], [-1])
    c.free_swa(a, 0)
    assert not c.fits(11 * ps, 0, 4 * ps)
    coupled = copy.deepcopy(c)
    before = coupled.arena.snapshot()
    assert not coupled.relieve(11 * ps) and coupled.arena.snapshot() == before
    assert c.relieve(11 * ps, swa_tokens=4 * ps)
    assert c.fits(11 * ps, 0, 4 * ps) and len(c.arena.holes("swa")) == 4
    c.verify()


@pytest.mark.parametrize("ps", (1, 16))
def test_relieve_uneven_asks_evict_for_the_uneven_shortfall(pkg, ps):
    """Eager, nothing to compact: 9 pages free after a 15-page request.
    (8, 4) needs 8 + 4 = 12: both sides shedding pages together, 6 full
    pages (swa 2) fit, so ``evict`` is asked for 2 pages' worth of tokens
    (the coupled (8) would ask for 8 - 4 = 4).  Evicting the request fits it."""
    c = make(pkg, "hybrid", ps, pages=40)
    req = ids_of(c.alloc_extend([0], [15 * ps], [-1]))
    asked = []

    def evict(k):
        asked.append(k)
        c.free(req)
        return len(req)

    coupled = copy.deepcopy(c)
    coupled_asked = []
    assert not coupled.relieve(8 * ps, 0, lambda k: coupled_asked.append(k) or 0)
    assert coupled_asked == [4 * ps]
    assert c.relieve(8 * ps, 0, evict, 4 * ps) and asked == [2 * ps]
    assert c.fits(8 * ps, 0, 4 * ps)


@pytest.mark.parametrize("ps", (1, 4))
def test_relieve_uneven_with_state_slots_on_tripool(pkg, ps):
    """TriPool: slots first, then the uneven bind; ``relieve`` for the
    vector agrees with the spec twin (verdict, evict's asks, arena) and its
    verdict is ``fits``."""
    rng = random.Random(11)
    for lazy in (False, True):
        c, ref = twins(pkg, "tri", ps, lazy, pages=16)
        for _ in churn(c, ref, rng, ps, 12):
            pass
        for _ in range(6):
            tokens = ref.available_size() + rng.randint(0, 4 * ps)
            swa, slots = rng.randint(0, tokens), rng.randint(0, 2)
            logs: dict[str, list[int]] = {}

            def recorder(key, logs=logs):
                return lambda k: logs.setdefault(key, []).append(k) or 0

            ok = c.relieve(tokens, slots, recorder("c"), swa)
            assert ok == ref.relieve(tokens, slots, recorder("ref"), swa) == c.fits(tokens, slots, swa)
            assert logs.get("c") == logs.get("ref") and c.arena.snapshot() == ref.arena.snapshot()


def test_ps_rounding_of_the_swa_tail(pkg):
    """``P_s = cdiv(swa_tokens, ps)``: one token past a page boundary is a
    whole page more, and a demand within one page is the coupled one."""
    ps = 16
    c = make(pkg, "hybrid", ps, pages=40)
    assert c.fits(30 * ps, 0, 9 * ps) and not c.fits(30 * ps, 0, 9 * ps + 1)
    assert not c.fits(19 * ps + 3, 0, 19 * ps + 1) and not c.fits(19 * ps + 3)  # both 20 pages a side
    assert c.fits(19 * ps + 3, 0, 18 * ps) and c.arena.geometry("swa").epp == E * ps


@pytest.mark.parametrize("kind", KINDS)
def test_impl_uneven_fits_reads_nothing_from_the_device(pkg, kind, monkeypatch):
    """The implementation's uneven gate is host ints only (docs/design.md §11:
    admission asks it per request): every sync-forcing tensor method raises while ``fits`` with ``swa_tokens`` runs."""
    if pkg is not impl:
        pytest.skip("the implementation's host counters")
    ps = 4
    c = make(pkg, kind, ps, pages=20, lazy=True)
    t = ids_of(c.alloc_extend([0], [9], [-1]))
    if kind != "mamba":
        c.free_swa(t[:4], 0)
    slot = 1 if kind != "hybrid" else 0
    demands = ((8, 0, 8), (40, 0, 0), (60, slot, 60)) if kind == "mamba" else ((8, 0, 4), (40, 0, 0), (60, slot, 8))
    want = [c.fits(n, s, w) for n, s, w in demands]

    def sync(*a, **k):
        raise AssertionError("a host sync in the uneven gate")

    for attr in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__index__", "any", "all"):
        monkeypatch.setattr(torch.Tensor, attr, sync)
    got = [c.fits(n, s, w) for n, s, w in demands]
    monkeypatch.undo()
    assert got == want
