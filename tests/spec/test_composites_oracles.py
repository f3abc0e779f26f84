"""``spec/composites.py``: the window rule against brute force, what each
constructor builds by default, and the full text of every input error (the
scenario tests match a fragment; these pin the whole message, which names
the call and the argument).  Fast, for the mutation selection (docs/results/suite-strength.md
"Mutation score")."""

import pytest

from kvarena.spec import SubPool
from kvarena.spec.composites import HybridSWA, MambaHybrid, TriPool, swa_window_end

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def test_swa_window_end_is_the_last_page_edge_that_left_the_window():
    for seq in range(40):
        for window in range(12):
            for ps in (1, 2, 3, 4, 8):
                edge = seq - window - ps  # tokens below it are out, with one page kept
                want = max([k for k in range(0, seq + 1, ps) if k <= edge], default=0)
                assert swa_window_end(seq, window, ps) == want, (seq, window, ps)


@pytest.mark.parametrize(
    "args,msg",
    [
        ((-1, 0, 1), "swa_window_end: seq_len must be >= 0, got -1"),
        ((0, -2, 1), "swa_window_end: window must be >= 0, got -2"),
        ((0, 0, 0), "swa_window_end: page_size must be >= 1, got 0"),
        ((True, 0, 1), "swa_window_end: seq_len must be an int, got True"),
        ((0, 1.0, 1), "swa_window_end: window must be an int, got 1.0"),
        ((0, 0, "2"), "swa_window_end: page_size must be an int, got '2'"),
    ],
)
def test_swa_window_end_errors(args, msg):
    with pytest.raises(ValueError) as e:
        swa_window_end(*args)
    assert str(e.value) == msg


def test_constructor_defaults_and_pools():
    h = HybridSWA(1 << 14, 64, 32)
    m = MambaHybrid(1 << 14, 64, 512)
    t = TriPool(1 << 14, 64, 32, 512)
    for c in (h, m, t):
        assert c.page_size == 1 and c.arena.policy == "anchor"
        assert not any(c.arena.is_lazy(n) for n in c.arena.chain)
    assert h.arena.layout.pools == {"swa": SubPool("swa", 32, 1, "up"), "full": SubPool("full", 64, 1, "down")}
    assert m.arena.layout.pools == {
        "state": SubPool("state", 512, 1, "up", "state"),
        "full": SubPool("full", 64, 1, "down"),
    }
    assert t.arena.layout.pools == {
        "state": SubPool("state", 512, 1, "up", "state"),
        "swa": SubPool("swa", 32, 1, "float"),
        "full": SubPool("full", 64, 1, "down"),
    }
    assert h.arena.lenders == t.arena.lenders == {"swa": "full"} and m.arena.lenders == {}
    t2 = TriPool(1 << 14, 64, 32, 512, page_size=2, lazy=True, policy="planner")
    assert t2.arena.layout.pools["state"].page_size == 1 and t2.arena.layout.pools["swa"].page_size == 2
    assert t2.arena.is_lazy("full") and t2.arena.is_lazy("state") and t2.arena.policy == "planner"
    # one state slot displaces ceil(state_bytes / KV bytes per token) tokens
    assert m.state_slot_token_cost() == 8 and t.state_slot_token_cost() == 6
    assert TriPool(1 << 14, 64, 32, 500).state_slot_token_cost() == 6  # 500/96 rounds up


def _tri():
    c = TriPool(1 << 14, 64, 32, 512, page_size=2)
    toks = c.alloc_extend([0], [6], [-1])  # three pages
    slots = c.alloc_state(2)
    return c, toks, slots


def _errors():
    c, toks, slots = _tri()
    n_ids = len(c.arena.v2p("full"))
    top = n_ids * 2
    h = HybridSWA(1 << 14, 64, 32, page_size=2)
    return [
        (
            lambda: c.alloc_extend([0], [1, 2], [-1]),
            "alloc_extend: length mismatch: 1 prefix_lens, 2 seq_lens, 1 last_loc",
        ),
        (lambda: c.alloc_extend([-1], [2], [-1]), "alloc_extend: request 0: prefix_len -1 < 0"),
        (lambda: c.alloc_extend([3], [2], [toks[2]]), "alloc_extend: request 0: seq_len 2 < prefix_len 3"),
        (
            lambda: c.alloc_extend([0], [10**9], [-1]),
            f"alloc_extend: request 0: seq_len {10**9} is more than the "
            f"{(c.arena.geometry('full').num_pages - c.arena.geometry('full').min_page) * 2} tokens "
            "this arena could ever hold",
        ),
        (lambda: c.alloc_extend([0], [2], [5]), "alloc_extend: request 0: empty prefix needs last_loc -1, got 5"),
        (
            lambda: c.alloc_extend([1], [2], [-1]),
            "alloc_extend: request 0: last_loc -1 names no token (-1 is the empty-prefix sentinel)",
        ),
        (
            lambda: c.alloc_extend([1], [2], [1]),
            "alloc_extend: request 0: last_loc 1 lies in page 0, the sink, which is never allocated",
        ),
        (
            lambda: c.alloc_extend([1], [2], [top]),
            f"alloc_extend: request 0: last_loc {top} is out of range: page {n_ids} >= {n_ids} pages",
        ),
        (
            lambda: c.alloc_extend([1], [2], [toks[1]]),
            f"alloc_extend: request 0: last_loc {toks[1]} is at offset 1 of its page, "
            "but position 0 belongs at offset 0",
        ),
        (
            lambda: c.alloc_extend([5, 5], [6, 6], [toks[4], toks[4]]),
            f"alloc_extend: requests 0 and 1 both continue page {toks[4] // 2}",
        ),
        (lambda: c.alloc_extend([0], [True], [-1]), "alloc_extend: seq_lens[0] must be an int, got True"),
        (lambda: c.alloc_extend("0", [1], [-1]), "alloc_extend: prefix_lens must be a sequence of ints, got str"),
        (lambda: c.alloc_extend([0], [1], {-1}), "alloc_extend: last_loc must be a sequence of ints, got set"),
        (lambda: c.alloc_decode([0], [-1]), "alloc_decode: request 0: seq_len must be >= 1, got 0"),
        (lambda: c.alloc_decode([2], 5), "alloc_decode: last_loc must be a sequence of ints, got int"),
        (lambda: c.alloc_decode("ab", [1]), "alloc_decode: seq_lens must be a sequence of ints, got str"),
        (
            lambda: c.alloc_decode([2, 3], [toks[0]]),
            "alloc_decode: length mismatch: 2 prefix_lens, 2 seq_lens, 1 last_loc",
        ),
        (lambda: c.free([toks[0], toks[0]]), f"free: token {toks[0]} is repeated"),
        (lambda: c.free([-1]), "free: token -1 names no token (-1 is the empty-prefix sentinel)"),
        (lambda: c.free([toks[0], 1.5]), "free: token_ids[1] must be an int, got 1.5"),
        (
            lambda: c.free([top - 1]),
            f"free: token {top - 1} is not allocated (page {n_ids - 1} is unknown or already freed)",
        ),
        (lambda: c.translate([0], "mamba"), "translate: pool 'mamba': TriPool has pools state, swa, full"),
        (lambda: h.translate([0], "state"), "translate: pool 'state': HybridSWA has pools swa, full"),
        (lambda: c.translate([-2]), f"translate: pool 'full': token -2 out of range [-1, {top})"),
        (lambda: c.translate([top]), f"translate: pool 'full': token {top} out of range [-1, {top})"),
        (lambda: c.translate("ab"), "translate: token_ids must be a sequence of ints, got str"),
        (
            lambda: c.translate([600], "state"),
            f"translate: pool 'state': token 600 out of range [-1, {len(c.arena.v2p('state'))})",
        ),
        (lambda: c.free_swa(toks, 1), "free_swa: start_pos 1 must be a non-negative multiple of page_size 2"),
        (lambda: c.free_swa(toks, -2), "free_swa: start_pos -2 must be a non-negative multiple of page_size 2"),
        (lambda: c.free_swa(toks, 0.0), "free_swa: start_pos must be an int, got 0.0"),
        (lambda: c.free_swa([top], 0), f"free_swa: pool 'swa': token {top} out of range [-1, {top})"),
        (lambda: c.free_swa("ab", 0), "free_swa: token_ids must be a sequence of ints, got str"),
        (
            lambda: c.free_swa(toks[:2], 0, num_live=2),
            "free_swa: pool 'swa': num_live 2 disagrees with the 1 live pages",
        ),
        (lambda: c.free_swa(toks[:2], 0, num_live=1.5), "free_swa: num_live must be an int, got 1.5"),
        (lambda: c.fits(-1), "fits: tokens must be >= 0, got -1"),
        (lambda: c.fits(0, -1), "fits: state_slots must be >= 0, got -1"),
        (lambda: h.fits(0, 1), "fits: state_slots=1, but HybridSWA has no state pool"),
        (lambda: h.relieve(0, 2), "relieve: state_slots=2, but HybridSWA has no state pool"),
        (lambda: c.relieve(0, 0, 3), "relieve: evict must be callable or None, got 3"),
        (lambda: c.alloc_state(-1), "alloc_state: n must be >= 0, got -1"),
        (lambda: c.alloc_state("1"), "alloc_state: n must be an int, got '1'"),
        (lambda: c.free_state(5), "free_state: slots must be a sequence of ints, got int"),
        (lambda: c.free_state([slots[0], slots[0]]), None),  # the arena's message, prefixed
    ]


@pytest.mark.parametrize(
    "i", range(len(_errors())), ids=[msg or "free_state: the arena's message" for _, msg in _errors()]
)
def test_every_input_error_says_which_call_and_argument(i):
    call, msg = _errors()[i]
    with pytest.raises(ValueError) as e:
        call()
    if msg is None:
        assert str(e.value).startswith("free_state: pool 'state': "), str(e.value)
    else:
        assert str(e.value) == msg


def test_call_defaults():
    c = TriPool(1 << 12, 64, 32, 512, page_size=2)
    assert len(c.alloc_state()) == 1
    assert len(c.alloc_decode([1], [-1])) == 1  # a request's first token: seq_len 1 is allowed
    while c.alloc_extend([0], [2], [-1]) is not None:  # fill the buffer
        pass
    assert not c.fits(2) and c.fits() and c.fits(0, 0)


def test_the_offset_message_names_where_the_position_belongs():
    h = HybridSWA(1 << 14, 64, 32, page_size=4)
    toks = h.alloc_extend([0], [8], [-1])
    with pytest.raises(ValueError) as e:
        h.alloc_extend([2], [3], [toks[0]])
    assert str(e.value) == (
        f"alloc_extend: request 0: last_loc {toks[0]} is at offset 0 of its page, but position 1 belongs at offset 1"
    )


def test_only_requests_that_add_tokens_to_a_partly_filled_page_conflict():
    c = HybridSWA(1 << 14, 64, 32, page_size=2)
    toks = c.alloc_extend([0], [3], [-1])  # a full page, then one token of the next
    # two requests forking the same page-aligned prefix: both start fresh pages
    assert len(c.alloc_extend([2, 2], [4, 4], [toks[1], toks[1]])) == 4
    # two requests on the same partly filled page that add nothing
    assert c.alloc_extend([3, 3], [3, 3], [toks[2], toks[2]]) == []


def test_verify_names_the_composite_roles():
    c = HybridSWA(1 << 14, 64, 32)
    c.CHAIN = ("full", "swa")  # the roles this instance claims, not the arena's
    with pytest.raises(AssertionError) as e:
        c.verify()
    assert (e.value.pool, e.value.rule) == ("full", "composite roles")
    assert str(e.value) == "pool 'full': composite roles (chain ('swa', 'full'), expected ('full', 'swa'))"
    c = HybridSWA(1 << 14, 64, 32)
    c.BORROW = {"swa": "zz"}
    with pytest.raises(AssertionError) as e:
        c.verify()
    assert (e.value.pool, e.value.rule) == ("swa", "composite roles")
    assert str(e.value) == "pool 'swa': composite roles (borrow {'swa': 'full'}, expected {'swa': 'zz'})"
