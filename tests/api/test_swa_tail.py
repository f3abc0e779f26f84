"""PD disaggregation's decode-side preallocation (docs/design.md §13):
``alloc_extend_swa_tail``, ``tail_demand`` and ``fits_tail`` in both
packages, on ``HybridSWA`` and ``TriPool``.

Checked against an oracle written with the arena's own calls (full binds
the new pages, swa the pages that hold a tail token, counted token by
token): the slots are ``alloc_extend``'s; swa binds exactly the tail's new
pages; ``fits_tail`` is the verdict without relief; the three cases
SGLang's own tests pin (the tail binds only its pages, a short tail fits
past the joint view, a full-side shortfall is refused); the gate (PD's
source) held through it; and bad input, a ``ValueError`` with nothing
changed.  Every test runs on ``kvarena.spec`` (plain and under its
contracts) and on ``kvarena.impl``.
"""

import copy
import random

import pytest
import torch

from kvarena import impl, spec
from kvarena.spec import contracts
from tests.api.test_composites import ids_of, make, on_impl, vec

SWA_KINDS = ("hybrid", "tri")


def tail_pages(prefix, seq, tail, ps):
    """The new pages holding one of the last ``tail`` tokens, token by token."""
    new = set(range(-(-prefix // ps), -(-seq // ps)))
    return sorted(new & {t // ps for t in range(seq - tail, seq)})


def oracle(ref, prefix, seq, last):
    """On a copy of the spec twin, by a call apart from the one under test:
    the extend's slots and full's table after it (``alloc_extend``)."""
    with contracts.unchecked():
        c = copy.deepcopy(ref)
        slots = c.alloc_extend([prefix], [seq], [last])
        return slots, list(c.arena.v2p("full"))


def drive(c, prefix, seq, last, tail, trusted=False):
    if trusted and on_impl(c):
        t = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
        return c.alloc_extend_swa_tail(
            t(prefix), t(seq), t(last), False, swa_tail_len=tail, prefix_lens_cpu=[prefix], seq_lens_cpu=[seq]
        )
    return c.alloc_extend_swa_tail(vec(c, [prefix]), vec(c, [seq]), vec(c, [last]), swa_tail_len=tail)


@pytest.mark.parametrize("ps", (1, 2, 4))
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_the_tail_binds_exactly_its_new_pages(pkg, kind, ps):
    """From an empty prefix and continuing a partly filled page: the slots
    are the extend's, swa holds exactly the new pages with a tail token,
    and the arena matches the oracle's (full live, the rest of swa free)."""
    rng = random.Random(f"{kind}-{ps}")
    for trusted in (False, True):
        c, ref = make(pkg, kind, ps, pages=60, lazy=True), make(spec, kind, ps, pages=60, lazy=True)
        first = ref.alloc_extend([0], [ps + 1], [-1])  # a partly filled page to continue (ps > 1)
        assert ids_of(c.alloc_extend(vec(c, [0]), vec(c, [ps + 1]), vec(c, [-1]))) == first
        cases = [(ps + 1, ps + 1 + k, first[-1], t) for k in (ps - 1, 3 * ps) for t in {0, 1, k} if t <= k]
        cases += [(0, s, -1, rng.randint(0, s)) for s in (1, ps, 3 * ps + 1, 5 * ps)]
        for prefix, seq, last, tail in cases:
            want, full = oracle(ref, prefix, seq, last)
            live = ref.arena.live_pages("swa")
            got = drive(c, prefix, seq, last, tail, trusted)
            assert want is not None and ids_of(got) == want, (prefix, seq, tail)
            with contracts.unchecked():
                assert ids_of(drive(ref, prefix, seq, last, tail)) == want
            assert c.arena.snapshot() == ref.arena.snapshot() and list(ref.arena.v2p("full")) == full
            assert ref.arena.live_pages("swa") == live + len(tail_pages(prefix, seq, tail, ps))
            swa, first_new = ref.arena.v2p("swa"), -(-prefix // ps)
            new = {t // ps: pos for pos, t in zip(range(prefix, seq), want) if pos // ps >= first_new}
            tail_ids = {
                t // ps for pos, t in zip(range(prefix, seq), want) if pos >= seq - tail and pos // ps >= first_new
            }
            assert sorted(v for v in new if swa[v] > 0) == sorted(tail_ids), (prefix, seq, tail)
            assert len(tail_ids) == len(tail_pages(prefix, seq, tail, ps))
            if prefix == ps + 1:  # the continued page cannot be extended twice: start a fresh one
                c, ref = make(pkg, kind, ps, pages=60, lazy=True), make(spec, kind, ps, pages=60, lazy=True)
                first = ref.alloc_extend([0], [ps + 1], [-1])
                c.alloc_extend(vec(c, [0]), vec(c, [ps + 1]), vec(c, [-1]))


@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_fits_tail_is_the_verdict_without_relief(pkg, kind, ps):
    """Along random churn: for every length up to past full's own view and a
    few tails, ``fits_tail`` says whether the call succeeds on a copy with
    no relief to run (the oracle), and the call agrees with it."""
    rng = random.Random(f"fits-{kind}-{ps}")
    c, ref = make(pkg, kind, ps, pages=24, lazy=True), make(spec, kind, ps, pages=24, lazy=True)
    reqs = []
    for _ in range(12):
        n = rng.randint(1, 3 * ps)
        got = c.alloc_extend(vec(c, [0]), vec(c, [n]), vec(c, [-1]))
        want = ref.alloc_extend([0], [n], [-1])
        if want is not None:
            reqs.append(want)
        if reqs and rng.random() < 0.4:
            q = reqs.pop(rng.randrange(len(reqs)))
            c.free(vec(c, q))
            ref.free(q)
        assert (got is None) == (want is None)
        top = max(ref.available_size(), ref.full_available_size()) + 2 * ps
        for seq in range(1, top + 1, max(1, ps // 2)):
            for tail in sorted({0, 1, seq, rng.randint(0, seq)}):
                promised = c.fits_tail(0, seq, tail)
                assert promised == ref.fits_tail(0, seq, tail)
                tokens, swa = ref.tail_demand(0, seq, tail)
                assert (tokens, swa) == c.tail_demand(0, seq, tail) and promised == ref.fits(tokens, 0, swa)
                if seq * 2 < top or rng.random() < 0.1:  # the call on a copy: relief may not run before it
                    with contracts.unchecked():
                        trial = copy.deepcopy(ref)
                        ok = trial.alloc_extend_swa_tail([0], [seq], [-1], swa_tail_len=tail) is not None
                    assert ok >= promised, (seq, tail)


@pytest.mark.parametrize("ps", (2, 4))
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_a_short_tail_fits_past_the_joint_view(pkg, kind, ps):
    """SGLang's second case: a request longer than the joint view, whose
    tail needs few SWA pages, fits and binds; the coupled extend of the
    same length does not."""
    c, ref = make(pkg, kind, ps, pages=24, lazy=True), make(spec, kind, ps, pages=24, lazy=True)
    seq = ref.available_size() + ps
    assert seq <= ref.full_available_size() and not ref.fits(seq)
    assert ref.fits_tail(0, seq, 1) and c.fits_tail(0, seq, 1)
    with contracts.unchecked():
        assert copy.deepcopy(ref).alloc_extend([0], [seq], [-1]) is None
    got = drive(c, 0, seq, -1, 1)
    assert got is not None and ids_of(got) == ids_of(drive(ref, 0, seq, -1, 1))
    assert ref.arena.live_pages("swa") == 1 and ref.arena.live_pages("full") == seq // ps
    assert c.arena.snapshot() == ref.arena.snapshot()


@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", SWA_KINDS)
def test_a_full_side_shortfall_is_refused_with_nothing_allocated(pkg, kind, ps):
    """SGLang's third case: full cannot hold the request even after relief,
    so the call answers None and no id is taken on either side."""
    c, ref = make(pkg, kind, ps, pages=24, lazy=True), make(spec, kind, ps, pages=24, lazy=True)
    ref.alloc_extend([0], [8 * ps], [-1])
    c.alloc_extend(vec(c, [0]), vec(c, [8 * ps]), vec(c, [-1]))
    with contracts.unchecked():  # the shortest request relief cannot make room for
        seq = next(
            n
            for n in range(ps, 24 * ps, ps)
            if copy.deepcopy(ref).alloc_extend_swa_tail([0], [n], [-1], swa_tail_len=0) is None
        )
    live = {n: ref.arena.live_pages(n) for n in ref.arena.chain}
    assert not c.fits_tail(0, seq, 0) and not ref.fits_tail(0, seq, 0)
    assert drive(c, 0, seq, -1, 0) is None and drive(ref, 0, seq, -1, 0) is None
    assert c.arena.snapshot() == ref.arena.snapshot()  # relief may have moved pages, alike
    assert {n: ref.arena.live_pages(n) for n in ref.arena.chain} == live  # no id taken on any side


@pytest.mark.parametrize("kind", SWA_KINDS)
def test_under_pds_gate_nothing_moves_and_the_promise_holds(pkg, kind):
    """PD's gate held (docs/design.md §13): the preallocation takes holes
    and frontiers only; ``fits_tail`` keeps its word; no bound id moves."""
    ps = 4
    c, ref = make(pkg, kind, ps, pages=40, lazy=True), make(spec, kind, ps, pages=40, lazy=True)
    reqs = [ref.alloc_extend([0], [n], [-1]) for n in (3 * ps, 2 * ps, 4 * ps)]
    for n in (3 * ps, 2 * ps, 4 * ps):
        c.alloc_extend(vec(c, [0]), vec(c, [n]), vec(c, [-1]))
    for x in (c, ref):
        x.free(vec(x, reqs[0]) if x is c else reqs[0])  # holes below live pages: compaction would move them
        x.arena.close_gate("disagg")
    placed = {n: list(ref.arena.v2p(n)) for n in ref.arena.chain}
    for seq, tail in ((2 * ps, ps), (ref.full_available_size() + ps, 1), (ps, ps)):
        promised = ref.fits_tail(0, seq, tail)
        got, want = drive(c, 0, seq, -1, tail), drive(ref, 0, seq, -1, tail)
        assert (got is None) == (want is None) and (want is not None or not promised)
        assert c.arena.snapshot() == ref.arena.snapshot()
    after = {n: list(ref.arena.v2p(n)) for n in ref.arena.chain}
    assert all(after[n][v] == p for n, m in placed.items() for v, p in enumerate(m) if p >= 0)
    assert ref.arena.moves_held() and c.arena.moves_held()


@pytest.mark.parametrize("kind", SWA_KINDS)
def test_bad_input_is_a_value_error_and_changes_nothing(pkg, kind):
    ps = 4
    c = make(pkg, kind, ps, pages=24, lazy=True)
    before = c.arena.snapshot()
    bad = [
        (([0, 0], [4, 4], [-1, -1]), {"swa_tail_len": 1}, "one request at a time"),
        (([0], [4], [-1]), {"swa_tail_len": 5}, "swa_tail_len 5 is not within the 4 new tokens"),
        (([0], [4], [-1]), {"swa_tail_len": -1}, "swa_tail_len"),
        (([2], [1], [-1]), {"swa_tail_len": 0}, "seq_len 1 < prefix_len 2"),
        (([0], [4], [7]), {"swa_tail_len": 0}, "empty prefix needs last_loc -1"),
        (([0], [4], [-1]), {"swa_tail_len": 1, "extend_num_tokens": 3}, "extend_num_tokens 3"),
    ]
    for args, kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            c.alloc_extend_swa_tail(*(vec(c, a) for a in args), **kw)
        assert c.arena.snapshot() == before
    for call in (c.fits_tail, c.tail_demand):
        with pytest.raises(ValueError, match="swa_tail_len 5 is not within"):
            call(0, 4, 5)


def test_a_composite_without_swa_has_no_tail_preallocation():
    for kind in ("mamba",):
        assert not hasattr(make(spec, kind, 4), "alloc_extend_swa_tail")
        assert not hasattr(make(impl, kind, 4), "alloc_extend_swa_tail")
