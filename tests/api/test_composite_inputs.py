"""Input handling the spec and implementation composites must share (found
by review): lengths no arena could ever hold are a ValueError in both (the
implementation used to wrap int64 sums and crash), and any ordered
sequence of ints is accepted where a list is."""

import pytest
import torch

from kvarena import impl, spec

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

PACKAGES = [pytest.param(spec, id="spec"), pytest.param(impl, id="impl")]


def make(pkg, ps=1):
    return pkg.HybridSWA(1 << 16, 64, 32, page_size=ps)


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize(
    "ps,seq", [(1, [2**62] * 4), (1, [2**63 - 1, 2**63 - 1, 3]), (16, [2**63 - 1]), (1, [0, 2**62])]
)
def test_a_length_no_arena_could_hold_is_a_value_error(pkg, ps, seq):
    c = make(pkg, ps)
    before = c.snapshot()
    with pytest.raises(ValueError, match="could ever hold"):
        c.alloc_extend([0] * len(seq), seq, [-1] * len(seq))
    assert c.snapshot() == before


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_longest_request_that_could_fit_is_a_shortfall_not_an_error(pkg):
    c = make(pkg, 4)
    g = c.arena.geometry("full")
    most = (g.num_pages - g.min_page) * 4
    assert c.alloc_extend([0], [most], [-1]) is None  # swa needs room too: a shortfall
    with pytest.raises(ValueError):
        c.alloc_extend([0], [most + 1], [-1])


@pytest.mark.parametrize("pkg", PACKAGES)
def test_any_ordered_sequence_of_ints(pkg):
    c = make(pkg, 4)
    toks = list(c.alloc_extend(range(1), range(6, 7), (-1,)))
    assert len(toks) == 6
    assert list(c.translate(range(toks[0], toks[0] + 2))) == list(c.translate(toks[:2]))
    c.free_swa(tuple(toks[:4]), 0)
    c.free(range(toks[0], toks[0] + 6))
    c.verify()
    for bad in ("abc", {1, 2}, {1: 2}, 5):
        with pytest.raises(ValueError):
            c.free(bad)


def made(pkg):
    """A HybridSWA (page_size 4) holding one request of six tokens: 4 to 9,
    pages 1 and 2."""
    c = pkg.HybridSWA(1 << 16, 64, 32, page_size=4)
    assert [int(t) for t in c.alloc_extend([0], [6], [-1])] == [4, 5, 6, 7, 8, 9]
    return c


# Every bad batch, in the same words in both packages: the call, the request,
# and what is wrong with it (the implementation finds the request on its
# error path, after the vectorised check has failed).
BAD_CALLS = [
    (lambda c: c.alloc_decode([0], [-1]), "alloc_decode: request 0: seq_len must be >= 1, got 0"),
    (lambda c: c.alloc_decode([5, -3], [7, -1]), "alloc_decode: request 1: seq_len must be >= 1, got -3"),
    (lambda c: c.alloc_decode([1, 0], [-1, -1]), "alloc_decode: request 1: seq_len must be >= 1, got 0"),
    (lambda c: c.alloc_extend([-1], [3], [-1]), "alloc_extend: request 0: prefix_len -1 < 0"),
    # requests before the bad one that are fine, each at an edge of a rule
    (
        lambda c: c.alloc_extend([0, 0], [1020, 3], [-1, 5]),
        "alloc_extend: request 1: empty prefix needs last_loc -1, got 5",
    ),  # the longest request that could fit
    (
        lambda c: c.alloc_extend([4, 4, -1], [5, 5, 3], [7, 7, -1]),
        "alloc_extend: request 2: prefix_len -1 < 0",
    ),  # two page-aligned prefixes: neither continues page 1
    (
        lambda c: c.alloc_extend([6, 6, -1], [6, 6, 3], [9, 9, -1]),
        "alloc_extend: request 2: prefix_len -1 < 0",
    ),  # no new token: neither continues page 2
    (
        lambda c: c.alloc_extend([0], [1021], [-1]),
        "alloc_extend: request 0: seq_len 1021 is more than the 1020 tokens this arena could ever hold",
    ),
    (lambda c: c.alloc_extend([0, 4], [2, 3], [-1, 7]), "alloc_extend: request 1: seq_len 3 < prefix_len 4"),
    (
        lambda c: c.alloc_extend([0], [10**9], [-1]),
        "alloc_extend: request 0: seq_len 1000000000 is more than the 1020 tokens this arena could ever hold",
    ),
    (lambda c: c.alloc_extend([0], [3], [4]), "alloc_extend: request 0: empty prefix needs last_loc -1, got 4"),
    (
        lambda c: c.alloc_extend([2], [3], [-5]),
        "alloc_extend: request 0: last_loc -5 names no token (-1 is the empty-prefix sentinel)",
    ),
    (
        lambda c: c.alloc_extend([2], [3], [1]),
        "alloc_extend: request 0: last_loc 1 lies in page 0, the sink, which is never allocated",
    ),
    (
        lambda c: c.alloc_extend([2], [3], [10**6]),
        "alloc_extend: request 0: last_loc 1000000 is out of range: page 250000 >= 256 pages",
    ),
    (
        lambda c: c.alloc_extend([2], [3], [13]),
        "alloc_extend: request 0: last_loc 13 is not allocated (page 3 is unknown or already freed)",
    ),
    (
        lambda c: c.alloc_extend([6], [7], [8]),
        "alloc_extend: request 0: last_loc 8 is at offset 0 of its page, but position 5 belongs at offset 1",
    ),
    (lambda c: c.alloc_extend([6, 6], [7, 8], [9, 9]), "alloc_extend: requests 0 and 1 both continue page 2"),
    (lambda c: c.alloc_extend([3, 3], [4, 4], [6, 6]), "alloc_extend: requests 0 and 1 both continue page 1"),
    (lambda c: c.alloc_decode([1, 7, 7], [-1, 9, 9]), "alloc_decode: requests 1 and 2 both continue page 2"),
    # seq 1 needs -1 itself, not another token at a page's last offset (dead, or live)
    (lambda c: c.alloc_decode([1], [-5]), "alloc_decode: request 0: empty prefix needs last_loc -1, got -5"),
    (lambda c: c.alloc_decode([7, 1], [9, 11]), "alloc_decode: request 1: empty prefix needs last_loc -1, got 11"),
    (lambda c: c.alloc_decode([1], [15]), "alloc_decode: request 0: empty prefix needs last_loc -1, got 15"),
    # a live last_loc at the right offset does not make a length the arena could never hold
    (
        lambda c: c.alloc_decode([1023], [9]),
        "alloc_decode: request 0: seq_len 1023 is more than the 1020 tokens this arena could ever hold",
    ),
    (
        lambda c: c.alloc_decode([7, 2**62 + 3], [9, 9]),
        f"alloc_decode: request 1: seq_len {2**62 + 3} is more than the 1020 tokens this arena could ever hold",
    ),
    (
        lambda c: c.alloc_extend([0, 0], [3], [-1]),
        "alloc_extend: length mismatch: 2 prefix_lens, 1 seq_lens, 1 last_loc",
    ),
    (lambda c: c.free_swa([10**6], 0), "free_swa: pool 'swa': token 1000000 out of range [-1, 1024)"),
    (
        lambda c: c.free_swa([-1, -1, -1, -1, 10**6], 0),  # a -1 representative is skipped, not named
        "free_swa: pool 'swa': token 1000000 out of range [-1, 1024)",
    ),
    (lambda c: c.free_swa([4, 5, 6, 7, -2], 0), "free_swa: pool 'swa': token -2 out of range [-1, 1024)"),
    (lambda c: c.free_swa([4], 3), "free_swa: start_pos 3 must be a non-negative multiple of page_size 4"),
    (lambda c: c.relieve(tokens=-1), "relieve: tokens must be >= 0, got -1"),
    (lambda c: c.translate([10**7]), "translate: pool 'full': token 10000000 out of range [-1, 1024)"),
]


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("call,message", BAD_CALLS, ids=[m for _, m in BAD_CALLS])
def test_a_bad_call_gets_the_same_words_in_both(pkg, call, message):
    c = made(pkg)
    before = c.snapshot()
    with pytest.raises(ValueError) as e:
        call(c)
    assert str(e.value) == message
    assert c.snapshot() == before


@pytest.mark.parametrize("pkg", PACKAGES)
def test_a_bad_state_call_gets_the_same_words_in_both(pkg):
    c = pkg.TriPool(1 << 20, 4096, 64, 32, page_size=4)
    slot = int(c.alloc_state(1)[0])
    for call, message in [
        (lambda: c.alloc_state(-1), "alloc_state: n must be >= 0, got -1"),
        (lambda: c.relieve(state_slots=-1), "relieve: state_slots must be >= 0, got -1"),
        (lambda: pkg.composites.swa_window_end(10, 4, 0), "swa_window_end: page_size must be >= 1, got 0"),
        (lambda: c.free_state([0]), "free_state: pool 'state': id 0 is the sink and is never allocated"),
        (lambda: c.free_state([slot, slot]), f"free_state: pool 'state': repeated id in [{slot}, {slot}]"),
        (lambda: c.free_state([10**6]), "free_state: pool 'state': id 1000000 out of range [512, 32768)"),
    ]:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == message


@pytest.mark.parametrize("pkg", PACKAGES)
def test_the_defaults_are_one_token_pages_and_eager_ends(pkg):
    for c in (pkg.HybridSWA(1 << 16, 64, 32), pkg.MambaHybrid(1 << 20, 64, 4096), pkg.TriPool(1 << 20, 64, 32, 4096)):
        assert c.page_size == 1
        assert not any(c.arena.is_lazy(n) for n in c.arena.chain)


def test_a_wrong_type_names_the_argument_and_what_it_takes():
    """The implementation also takes a tensor; each says what it accepts."""
    for pkg, takes in ((spec, "a sequence of ints"), (impl, "a tensor or a sequence of ints")):
        for call, arg in (
            (lambda c: c.translate("ab"), "translate: token_ids"),
            (lambda c: c.alloc_extend([0], [1], "ab"), "alloc_extend: last_loc"),
        ):
            with pytest.raises(ValueError) as e:
                call(made(pkg))
            assert str(e.value) == f"{arg} must be {takes}, got str"


# The step path an engine drives (kvarena.sglang): the implementation's
# trusted calls (check=False) with the engine's host copies, which read
# nothing from the device, against the spec given the same lists.  Bad input
# that the host copies (or, for a window free, the call's one read) show is
# the spec's ValueError in both, raised before anything changes; before
# issue 40 the trusted path crashed inside torch (a negative extend: "negative
# dimension") or freed the wrong pages.  Each case: the call, its arguments
# (prefix, seq, last_loc, prefix_cpu, seq_cpu, extend_num_tokens for an
# extend; seq, last_loc, seq_cpu for a decode; the tokens for a window free).
STEP_CALLS = [
    ("extend", ([6], [3], [9], [6], [3], -3), "alloc_extend: request 0: seq_len 3 < prefix_len 6"),
    ("extend", ([0, 6], [2, 3], [-1, 9], [0, 6], [2, 3], -1), "alloc_extend: request 1: seq_len 3 < prefix_len 6"),
    ("extend", ([-1], [3], [-1], [-1], [3], 4), "alloc_extend: request 0: prefix_len -1 < 0"),
    (
        "extend",
        ([0], [1021], [-1], [0], [1021], 1021),
        "alloc_extend: request 0: seq_len 1021 is more than the 1020 tokens this arena could ever hold",
    ),
    (
        "extend",
        ([0, 0, 0], [2**63 - 1, 2**63 - 1, 3], [-1] * 3, [0] * 3, [2**63 - 1, 2**63 - 1, 3], None),
        f"alloc_extend: request 0: seq_len {2**63 - 1} is more than the 1020 tokens this arena could ever hold",
    ),
    ("extend", ([0], [5], [-1], [0], [5], 4), "alloc_extend: extend_num_tokens 4 != 5 tokens asked"),
    ("extend", ([6], [3], [9], [6], [3], 0), "alloc_extend: extend_num_tokens 0 != -3 tokens asked"),
    (
        "extend",
        ([0, 0], [3], [-1], [0, 0], [3], 3),
        "alloc_extend: length mismatch: 2 prefix_lens, 1 seq_lens, 1 last_loc",
    ),
    (
        "extend",
        ([0], [3], [-1, -1], [0], [3], 3),
        "alloc_extend: length mismatch: 1 prefix_lens, 1 seq_lens, 2 last_loc",
    ),
    ("extend", ([0], [5], [-1], [0, 0], [5], 5), "alloc_extend: prefix_lens_cpu has 2 entries, prefix_lens 1"),
    ("extend", ([0], [5], [-1], [0], [], 5), "alloc_extend: seq_lens_cpu has 0 entries, seq_lens 1"),
    ("decode", ([0], [-1], [0]), "alloc_decode: request 0: seq_len must be >= 1, got 0"),
    ("decode", ([7, -3], [9, -1], [7, -3]), "alloc_decode: request 1: seq_len must be >= 1, got -3"),
    (
        "decode",
        ([1023], [9], [1023]),
        "alloc_decode: request 0: seq_len 1023 is more than the 1020 tokens this arena could ever hold",
    ),
    ("decode", ([7, 1], [9], [7, 1]), "alloc_decode: length mismatch: 2 prefix_lens, 2 seq_lens, 1 last_loc"),
    ("decode", ([7], [9], [7, 7]), "alloc_decode: seq_lens_cpu has 2 entries, seq_lens 1"),
    ("free_swa", ([10**6],), "free_swa: pool 'swa': token 1000000 out of range [-1, 1024)"),
    ("free_swa", ([4, 5, 6, 7, -2],), "free_swa: pool 'swa': token -2 out of range [-1, 1024)"),
]


def step_call(pkg, c, call, args):
    """``call`` as an engine makes it: the spec with lists and the host
    copies; the implementation on its trusted path, device tensors and host
    copies (CPU tensors), as ``kvarena.sglang`` calls it."""
    t = (lambda x: x) if pkg is spec else (lambda x: torch.tensor(x, dtype=torch.int64))
    trusted = {} if pkg is spec else {"check": False}
    if call == "extend":
        prefix, seq, loc, prefix_cpu, seq_cpu, n = args
        return c.alloc_extend(
            t(prefix),
            t(seq),
            t(loc),
            **trusted,
            prefix_lens_cpu=t(prefix_cpu),
            seq_lens_cpu=t(seq_cpu),
            extend_num_tokens=n,
        )
    if call == "decode":
        seq, loc, seq_cpu = args
        return c.alloc_decode(t(seq), t(loc), **trusted, seq_lens_cpu=t(seq_cpu))
    return c.free_swa(t(args[0]), 0, **trusted)


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize("call,args,message", STEP_CALLS, ids=[m for _, _, m in STEP_CALLS])
def test_bad_step_path_input_is_the_specs_value_error_on_the_trusted_path(pkg, call, args, message):
    c = made(pkg)
    before = c.snapshot()
    with pytest.raises(ValueError) as e:
        step_call(pkg, c, call, args)
    assert str(e.value) == message
    assert c.snapshot() == before


@pytest.mark.parametrize("pkg", PACKAGES)
def test_good_step_path_input_passes_the_host_checks(pkg):
    """The host checks refuse nothing the spec takes: an extend continuing
    the request's page, a fresh one, a decode at a page's edge, a window
    free with a -1 and a freed page."""
    c = made(pkg)
    assert [int(t) for t in step_call(pkg, c, "extend", ([6, 0], [9, 4], [9, -1], [6, 0], [9, 4], 7))] == [
        10,
        11,
        12,
        16,
        17,
        18,
        19,
    ]
    assert [int(t) for t in step_call(pkg, c, "decode", ([10, 5], [12, 19], [10, 5]))] == [13, 20]
    step_call(pkg, c, "free_swa", ([4, 5, 6, 7, -1, -1, -1, -1, 4],))
    step_call(pkg, c, "free_swa", ([4],))  # page 1 again: no longer live, skipped
    assert c.arena.live_pages("swa") == 4
    c.verify()


@pytest.mark.parametrize("reduction", ["ints", "numpy", "torch"])
@pytest.mark.parametrize(
    "call,args,message", [s for s in STEP_CALLS if s[0] == "decode"], ids=[m for c, _, m in STEP_CALLS if c == "decode"]
)
def test_the_decode_host_copy_is_checked_by_each_of_its_reductions(monkeypatch, reduction, call, args, message):
    """The trusted decode reduces its host copy as Python ints (a short
    batch), through numpy, or through torch (no numpy): each finds the same
    bad input, and counts the same pages, at a short batch and a long one."""
    from kvarena.impl import composites

    monkeypatch.setattr(composites, "HOST_INTS", 64 if reduction == "ints" else 0)
    if reduction == "torch":
        monkeypatch.setattr(composites, "_np", None)
    test_bad_step_path_input_is_the_specs_value_error_on_the_trusted_path(impl, call, args, message)
    checked, trusted = impl.HybridSWA(1 << 20, 64, 32, page_size=4), impl.HybridSWA(1 << 20, 64, 32, page_size=4)
    for n in (3, 100):  # a short batch and one past HOST_INTS, of mixed lengths (some open a page)
        lens = [1 + (7 * i) % 13 for i in range(n)]
        for a in (checked, trusted):
            out = a.alloc_extend([0] * n, lens, [-1] * n)
        last = out[torch.cumsum(torch.tensor(lens), 0) - 1]
        seq = torch.tensor(lens) + 1
        got = trusted.alloc_decode(seq, last, check=False, seq_lens_cpu=seq)
        assert torch.equal(got, checked.alloc_decode(seq.tolist(), last.tolist()))
        assert trusted.snapshot() == checked.snapshot()
