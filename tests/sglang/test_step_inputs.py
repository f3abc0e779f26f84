"""Bad input on the drop-in's step path (issue 40, item 6).

SGLang's scheduler calls ``alloc_extend``, ``alloc_decode``, ``free_swa`` and
``free_swa_segment`` with its host copies; the drop-in runs the composite's
trusted path, which reads nothing back from the device.  What the host copies
(and ``free_swa``'s one read) show wrong is a ``ValueError`` naming the
argument, raised before anything changes: a negative extend used to be a
``RuntimeError`` about a tensor's negative dimension from inside
``impl/composites.py``, a zero ``seq_len`` was served as if it opened a page,
and an out-of-range window token failed a gather.
"""

import pytest
import torch

from kvarena.sglang import stacks
from tests.sglang import test_contract
from tests.sglang.test_contract import SWA_KINDS, Req, T, assert_same, extend, snapshot

build = test_contract.build  # the stack builder fixture


def bad_calls(s, r):
    """``(name, call, what the error names)`` for request ``r`` (two pages
    and a token, prefilled) on stack ``s``."""
    a, n, last = s.a, len(r.ids), r.last
    cases = [
        ("negative extend", lambda: a.alloc_extend(T([n]), T([n]), T([n - 2]), T([n - 2]), T([last]), -2), "seq_len"),
        ("negative prefix", lambda: a.alloc_extend(T([-1]), T([-1]), T([3]), T([3]), T([-1]), 4), "prefix_len -1"),
        ("extend count", lambda: a.alloc_extend(T([0]), T([0]), T([5]), T([5]), T([-1]), 4), "extend_num_tokens"),
        (
            "extend host copy",
            lambda: a.alloc_extend(T([0]), T([0, 0]), T([5]), T([5]), T([-1]), 5),
            "prefix_lens_cpu has 2 entries",
        ),
        (
            "extend last_loc",
            lambda: a.alloc_extend(T([0]), T([0]), T([5]), T([5]), T([-1, -1]), 5),
            "2 last_loc",
        ),
        ("decode seq 0", lambda: a.alloc_decode(T([0]), T([0]), T([-1])), "seq_len must be >= 1"),
        ("decode host copy", lambda: a.alloc_decode(T([n + 1]), T([n + 1, 1]), T([last])), "seq_lens_cpu"),
        ("decode last_loc", lambda: a.alloc_decode(T([n + 1, 1]), T([n + 1, 1]), T([last])), "1 last_loc"),
    ]
    if s.swa:
        end = a.swa_attn_allocator.num_virtual_ids * s.ps
        cases += [
            ("window token past the end", lambda: a.free_swa(T([end])), f"free_swa: pool 'swa': token {end}"),
            ("window token below -1", lambda: a.free_swa(T([r.ids[0], -2])), "free_swa: pool 'swa': token -2"),
            ("window start", lambda: a.free_swa_segment(T(r.ids[:4]), start_pos=-s.ps), "start_pos"),
        ]
        if s.ps > 1:
            cases.append(
                ("window start off a page", lambda: a.free_swa_segment(T(r.ids[1:]), start_pos=1), "start_pos 1")
            )
    return cases


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", (1, 4))
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_bad_step_path_input_is_a_value_error_naming_it(build, kind, ps, lazy):
    s = build("kvarena", kind, ps, lazy)
    r = Req()
    assert extend(s.a, [r], [2 * ps + 1]) is not None
    names = []
    for name, call, words in bad_calls(s, r):
        snap = snapshot(s)
        with pytest.raises(ValueError, match=words):
            call()
        assert_same(s, snap)
        assert s.a.verify_byte_accounting() == []
        names.append(name)
    assert len(names) == (12 if s.swa and ps > 1 else 11 if s.swa else 8)
    # longer than any state holds: SGLang's allocator returns None (more pages than ids), and so does the drop-in
    snap = snapshot(s)
    assert s.a.alloc_decode(T([10**9]), T([10**9]), T([r.last])) is None
    assert s.a.alloc_extend(T([0]), T([0]), T([10**9]), T([10**9]), T([-1]), 10**9) is None
    assert_same(s, snap)
    assert extend(s.a, [r], [ps]) is not None  # the stack still serves


def test_a_negative_extend_used_to_crash_in_torch(build, monkeypatch):
    """Planted: the trusted path without its host checks (the code before
    issue 40) fails the negative extend with torch's RuntimeError, which the
    test above refuses."""
    from kvarena.impl import composites

    def unchecked(prefix_cpu, seq_cpu, ps, lengths, extend_num_tokens, most):
        p, s = composites._host_vec(prefix_cpu), composites._host_vec(seq_cpu)
        return int((composites._cdiv_t(s, ps) - composites._cdiv_t(p, ps)).sum()), int((s - p).sum())

    monkeypatch.setattr(composites, "_host_extend_size", unchecked)
    s = build("kvarena", "swa", 4)
    r = Req()
    assert extend(s.a, [r], [9]) is not None
    call = bad_calls(s, r)[0][1]
    # torch's own error, not the ValueError the test above wants (its words depend on which op meets the count first)
    with pytest.raises(RuntimeError, match=r"negative dimension|inconsistent with step sign"):
        call()


@pytest.mark.parametrize("kind", SWA_KINDS)
def test_good_window_frees_still_pass(build, kind):
    """The range check refuses nothing SGLang sends: -1 padding and pages
    already tombstoned are skipped, as before."""
    s = build("kvarena", kind, 4)
    r = Req()
    assert extend(s.a, [r], [12]) is not None
    swa = s.a.swa_attn_allocator
    s.a.free_swa(T(r.ids[:4] + [-1, -1]))
    s.a.free_swa(T(r.ids[:5]))  # page 1 again, and a token of page 2
    assert swa.allocated_count() == 4
    s.a.free_swa_segment(T(r.ids[8:12]), start_pos=8)
    assert swa.allocated_count() == 0 and s.a.verify_byte_accounting() == []
    assert torch.equal(s.a.translate_kv_loc(T(r.ids)) > 0, torch.ones(12, dtype=torch.bool))
