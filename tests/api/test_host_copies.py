"""The engine's host copies (``prefix_lens_cpu``, ``seq_lens_cpu``,
``extend_num_tokens``; docs/anchor.md §1; ``free_swa``'s ``num_live``) in both packages: given and agreeing
they change nothing; disagreeing they are a ``ValueError`` with nothing
changed; on the implementation's trusted path they size the call (the
read-free path, ``tests/impl/test_host_sync.py``) and give the same slots."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvarena import impl, spec
from tests.api.test_composites import make
from tests.support import unchanged

PKGS = {"spec": spec, "impl": impl}


def ints(xs):
    return [int(x) for x in xs]


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
@pytest.mark.parametrize("ps", [1, 4])
def test_agreeing_copies_change_nothing(pkg, kind, ps):
    plain, copied = make(PKGS[pkg], kind, ps), make(PKGS[pkg], kind, ps)
    first = plain.alloc_extend([0, 0], [5, 9], [-1, -1])
    assert ints(
        copied.alloc_extend([0, 0], [5, 9], [-1, -1], prefix_lens_cpu=[0, 0], seq_lens_cpu=[5, 9], extend_num_tokens=14)
    ) == ints(first)
    last = [int(first[4]), int(first[13])]
    assert ints(copied.alloc_decode([6, 10], last, seq_lens_cpu=[6, 10])) == ints(plain.alloc_decode([6, 10], last))
    assert copied.snapshot() == plain.snapshot()


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize("kind", ["hybrid", "tri"])
@pytest.mark.parametrize("ps", [1, 4])
def test_an_agreeing_window_count_changes_nothing(pkg, kind, ps):
    """``num_live`` right, on two requests' windows with a freed page, a
    ``-1`` and a repeat among the representatives: the same pages freed."""
    plain, counted = make(PKGS[pkg], kind, ps), make(PKGS[pkg], kind, ps)
    a, b = (ints(plain.alloc_extend([0], [n], [-1])) for n in (3 * ps, 2 * ps))
    assert ints(counted.alloc_extend([0], [3 * ps], [-1])) == a and ints(counted.alloc_extend([0], [2 * ps], [-1])) == b
    for c in (plain, counted):
        c.free_swa(a[:ps], 0)  # a's first page: no longer live
    window = b + a[: 2 * ps] + [-1] * ps + b[:ps]  # live: b's 2 pages and a's second
    plain.free_swa(window, 0)
    counted.free_swa(window, 0, num_live=3)
    assert counted.snapshot() == plain.snapshot()
    assert counted.arena.live_pages("swa") == 1  # a's third page


@pytest.mark.parametrize("pkg", PKGS)
@pytest.mark.parametrize(
    "call, words",
    [
        (lambda c: c.alloc_extend([0], [5], [-1], prefix_lens_cpu=[1]), "prefix_lens_cpu"),
        (lambda c: c.alloc_extend([0], [5], [-1], seq_lens_cpu=[6]), "seq_lens_cpu"),
        (lambda c: c.alloc_extend([0], [5], [-1], extend_num_tokens=4), "extend_num_tokens"),
        (lambda c: c.alloc_decode([1], [-1], seq_lens_cpu=[2]), "seq_lens_cpu"),
        (lambda c: c.free_swa([-1] * 4, 0, num_live=1), "pool 'swa': num_live 1 disagrees with the 0 live pages"),
        (lambda c: c.free_swa([-1] * 4, 0, num_live=True), "num_live must be an int"),
    ],
)
def test_a_disagreeing_copy_is_a_value_error_and_changes_nothing(pkg, call, words):
    c = make(PKGS[pkg], "tri", 4)
    with unchanged(c), pytest.raises(ValueError, match=words):
        call(c)


@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
@pytest.mark.parametrize("ps", [1, 4])
def test_the_trusted_path_sized_by_host_copies_gives_the_checked_slots(kind, ps):
    checked, trusted = make(impl, kind, ps), make(impl, kind, ps)
    first = checked.alloc_extend([0, 0, 0], [5, 9, 2], [-1, -1, -1])
    t = torch.tensor
    got = trusted.alloc_extend(
        t([0, 0, 0]),
        t([5, 9, 2]),
        t([-1, -1, -1]),
        check=False,
        prefix_lens_cpu=t([0, 0, 0]),
        seq_lens_cpu=t([5, 9, 2]),
        extend_num_tokens=16,
    )
    assert torch.equal(got, first)
    last = first[[4, 13, 15]]
    seq = t([6, 10, 3])
    assert torch.equal(trusted.alloc_decode(seq, last, check=False, seq_lens_cpu=seq), checked.alloc_decode(seq, last))
    assert trusted.snapshot() == checked.snapshot()


def test_a_host_copy_on_the_device_is_refused():
    """A copy must already be on the host: reading one back is the sync it saves."""
    c = make(impl, "hybrid", 4)
    meta = torch.tensor([5], device="meta")
    with pytest.raises(ValueError, match="CPU tensor"):
        c.alloc_extend(
            torch.tensor([0]),
            torch.tensor([5]),
            torch.tensor([-1]),
            check=False,
            prefix_lens_cpu=torch.tensor([0]),
            seq_lens_cpu=meta,
        )


@pytest.mark.parametrize("pkg", PKGS)
def test_a_window_count_of_every_representative_is_checked(pkg):
    """``num_live`` equal to the number of representatives claims each is a
    live page of its own: a repeat, a freed page or an out-of-range
    representative breaks the claim (``ValueError``, nothing changed)."""
    c = make(PKGS[pkg], "tri", 4)
    toks = ints(c.alloc_extend([0], [12], [-1]))  # three pages
    c.free_swa(toks[:4], 0)  # the first leaves the window
    for window, words in [
        (toks[4:8] + toks[4:8], "num_live 2 disagrees with the 1 live pages"),  # a repeat
        (toks[:8], "num_live 2 disagrees with the 1 live pages"),  # a freed page
        (toks[4:8] + [10**9] * 4, "token 1000000000 out of range"),
    ]:
        with unchanged(c), pytest.raises(ValueError, match=words):
            c.free_swa(window, 0, num_live=2)
    c.free_swa(toks[4:], 0, num_live=2)  # the claim holds
    assert c.arena.live_pages("swa") == 0


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.integers(-2, 13), min_size=1, max_size=8), freed=st.sets(st.integers(0, 5), max_size=3))
def test_the_claim_check_agrees_with_the_selection(picks, freed):
    """The implementation's two ways to size a window free give one
    answer: a count of every representative is accepted by the claim check
    (each page live, none repeated) exactly when the selection, asked
    without a count, frees that many pages, and then both free the same.
    A representative is a token of one of six pages (some freed first),
    -1, page 0's, or past the id space."""
    ps = 4
    claimed, selected = make(impl, "hybrid", ps), make(impl, "hybrid", ps)
    for c in (claimed, selected):
        toks = ints(c.alloc_extend([0], [6 * ps], [-1]))  # the same tokens in both
        c.free_swa([t for i in sorted(freed) for t in toks[i * ps : (i + 1) * ps]], 0)
    end = claimed.arena.id_end("swa") * ps
    reps = [{-2: -1, -1: 1, 12: end, 13: 10**9}.get(p, toks[min(p, 5) * ps]) for p in picks]
    window = [t for r in reps for t in [r] + [-1] * (ps - 1)]
    live = selected.arena.live_pages("swa")
    try:
        selected.free_swa(window, 0)
        selection = live - selected.arena.live_pages("swa")  # pages the selection freed
    except ValueError:
        selection = None  # a representative out of range: the claim must fail too
    if selection == len(reps):
        claimed.free_swa(window, 0, num_live=len(reps))
        assert claimed.snapshot() == selected.snapshot()
    else:
        with unchanged(claimed), pytest.raises(ValueError):
            claimed.free_swa(window, 0, num_live=len(reps))
