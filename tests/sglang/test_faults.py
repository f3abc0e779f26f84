"""Faults in the SGLang drop-in (issue 24, item 1): each call SGLang's
scheduler makes on kvarena's allocator, with each of its torch operations
failing in turn, leaves the stack as it was (``impl/journal.py``'s rule,
the harness ``kvarena.verification.faults``).

SGLang's objects do not deep-copy, so the sweep runs in place: the call is
made with operation 0 failing, then 1, and so on, and after each fault the
arena's snapshot, the allocator's counts, its host-side state (free groups,
the drain's deferred full-side frees) and every live id's bytes must be what they
were; the first run without a fault is the call itself, which must change
the state.  The script drives every moving call: extends (relief once the
buffer is full), decodes, frees (eager compaction), free groups, SWA
window frees and mamba slots.
"""

import pytest

from kvarena.sglang import stacks
from kvarena.verification.faults import fault_at
from tests.impl.test_faults import bytes_kept, stamp
from tests.sglang import test_contract
from tests.sglang.test_contract import MAMBA_KINDS, SWA_KINDS, Req, T, counts, extend, fill

build = test_contract.build  # the stack builder fixture (SGLang's kernels on CPU)


def host_state(a):
    """The drop-in's own host-side state (free groups, the drain's deferred full-side frees, the skips)."""
    groups = (a.free_group, a.full_free_group, a.free_page_reps_group, a.full_page_reps_group, a._full_after_swa)
    return [None if g is None else [t.tolist() for t in g] for g in groups], a.skipped_frees


def sweep_in_place(s, name, call):
    """Fail each operation of ``call()`` in turn on the live stack; the
    number of faults survived, and the call's result."""
    arena = s.a.composite.arena
    marks = stamp(arena)
    state = lambda: (arena.snapshot(), counts(s), host_state(s.a))  # noqa: E731
    before = state()
    k = 0
    while True:
        raised, out = fault_at(k, call)
        if not raised:
            break
        assert state() == before, f"{name}: operation {k}: the stack changed"
        arena.verify()
        bytes_kept(arena, marks)
        k += 1
    assert state() != before, f"{name}: the call changed nothing"
    arena.verify()
    return k, out


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("kind", stacks.KINDS)
def test_every_call_of_the_drop_in_is_all_or_nothing(build, kind, lazy):
    s = build("kvarena", kind, 4, lazy)
    a, ps = s.a, s.ps
    arena = a.composite.arena
    moved = []
    real = arena._move
    arena._move = lambda *args, **kw: moved.append(real(*args, **kw)) or moved[-1]
    reqs = [Req() for _ in range(6)]
    faults = {}

    def run(name, call):
        faults[name], out = sweep_in_place(s, name, call)
        return out

    def grow(reqs, news, out):
        """The requests' rows after an allocation (outside the faults: SGLang's bookkeeping)."""
        at = 0
        for r, n in zip(reqs, news):
            r.ids += out[at : at + n].tolist()
            at += n

    def extend_call(reqs, news):
        prefix = [len(r.ids) for r in reqs]
        seq = [p + n for p, n in zip(prefix, news)]
        args = (T(prefix), T(prefix), T(seq), T(seq), T(r.last for r in reqs), sum(news))
        return lambda: a.alloc_extend(*args)

    def decode_call(reqs):
        seq = T(len(r.ids) + 1 for r in reqs)
        last = T(r.last for r in reqs)
        return lambda: a.alloc_decode(seq, seq, last)

    news = [3 * ps] * 6
    grow(reqs, news, run("alloc_extend", extend_call(reqs, news)))
    run("free", lambda: a.free(T(reqs[1].ids)))
    if kind in SWA_KINDS:
        run("free_swa_segment", lambda: a.free_swa_segment(T(reqs[0].ids[: 2 * ps]), start_pos=0))
    batch = [reqs[0], reqs[2], reqs[4]]
    grow(batch, [1] * 3, run("alloc_decode", decode_call(batch)))
    a.free_group_begin()
    a.free(T(reqs[3].ids))
    a.free(T(reqs[5].ids))
    run("free_group_end", a.free_group_end)
    if kind in MAMBA_KINDS:
        slots = run("mamba alloc", lambda: s.m.alloc(3))
        run("mamba free", lambda: s.m.free(slots[1:2]))
    if lazy:  # fill, then leave holes that only relief (a move) turns into room
        while extend(a, [r := Req()], [4 * ps]) is not None:
            reqs.append(r)
        fill(s)
        before = sum(moved)
        if kind in SWA_KINDS:  # window frees: SWA holes; a larger request fits once the SWA END packs
            for r in reqs[6::2]:
                a.free_swa_segment(T(r.ids[: 2 * ps]), start_pos=0)
            run("alloc_extend with relief", extend_call([Req()], [a.available_size() + ps]))
        else:  # full's holes: the state END gets room once full packs (SGLang's tree asks first)
            for r in reqs[6::2]:
                a.free(T(r.ids))
            want = s.m.schedulable_available_size()
            run("prepare_mamba_allocation", lambda: a.prepare_mamba_allocation(want))
        assert sum(moved) > before, "the relief case moved no page"
    assert all(faults.values()), faults
    assert sum(moved), "no call moved a page"
