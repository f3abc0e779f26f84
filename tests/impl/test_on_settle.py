"""``Arena.on_settle``: the engine's wait on an in-flight forward
(docs/design.md §12).  An engine that launches forwards asynchronously
(SGLang's overlap scheduling) sets it to its stream wait on the forward's
done event; every settle runs it first, while the guards still hold: an
explicit ``settle``, and the urgent path's settle inside a call (here an
eager END's free, which compacts)."""

import torch

from kvarena.impl import HybridSWA

I64 = torch.int64


def _composite(lazy: bool) -> HybridSWA:
    """A HybridSWA with two requests of 8 tokens (page size 4)."""
    c = HybridSWA(64 * 1024, 64, 64, page_size=4, lazy=lazy)
    seq = torch.tensor([8, 8])
    zero = torch.zeros(2, dtype=I64)
    out = c.alloc_extend(zero, seq, torch.full((2,), -1, dtype=I64), prefix_lens_cpu=zero, seq_lens_cpu=seq)
    assert out is not None
    return c


def _watch(c: HybridSWA) -> list[tuple[bool, int]]:
    """Record, at each call, whether a forward was in flight and how many pages it pinned."""
    calls: list[tuple[bool, int]] = []

    def wait() -> None:
        calls.append((c.arena.in_flight, int(c.arena.pinned("full").numel())))

    c.arena.on_settle = wait
    return calls


def test_settle_runs_the_hook_once_while_the_guards_hold():
    c = _composite(lazy=True)
    calls = _watch(c)
    c.settle()  # nothing in flight: nothing to wait for
    assert calls == []
    c.launch(torch.tensor([8, 9, 10, 11]), check=False)  # the forward writes one page
    c.settle()
    c.settle()
    assert calls == [(True, 1)] and not c.arena.in_flight


def test_an_urgent_settle_inside_a_call_runs_the_hook_first():
    c = _composite(lazy=False)
    calls = _watch(c)
    c.launch(torch.tensor([8, 9, 10, 11]), check=False)
    c.free(torch.tensor([4]))  # an eager END compacts: it settles first
    assert calls == [(True, 1)] and not c.arena.in_flight


def test_without_a_hook_settle_only_lifts_the_guards():
    c = _composite(lazy=False)
    assert c.arena.on_settle is None
    c.launch(torch.tensor([8]), check=False)
    c.free(torch.tensor([4]))
    assert not c.arena.in_flight and c.arena.pinned("full").numel() == 0
