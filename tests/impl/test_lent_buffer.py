"""An arena over a lent byte buffer, with relocation through a mover.

The SGLang drop-in lends the arena SGLang's own KV storage and routes every
move through SGLang's page copy, which needs disjoint source and
destination sets.  Here the relocation scenarios of ``test_arena`` run on a
lent buffer with a checking mover: bytes survive, the lent storage is the
one written, and the mover only ever sees disjoint sets.
"""

import pytest
import torch

from kvarena.impl import Arena, SubPool, TriPool
from tests.impl import test_arena as scenarios

pytestmark = pytest.mark.mutation


class CheckingMover:
    """Copies page envelopes on the lent buffer; refuses overlapping sets
    (self-pairs aside: eager compaction pads with dead pages copied onto
    themselves)."""

    def __init__(self):
        self.arena = None
        self.calls = []

    def __call__(self, name, dst, src):
        d, s = dst.tolist(), src.tolist()
        assert len(d) == len(s) > 0
        assert len(set(d)) == len(d) and len(set(s)) == len(s), "a page twice in one call"
        moving = [(x, y) for x, y in zip(s, d) if x != y]
        assert not {y for _, y in moving} & {x for x, _ in moving}, f"{name}: overlapping sets {s} -> {d}"
        assert not {x for x, y in zip(s, d) if x == y} & {y for _, y in moving}, f"{name}: a self-pair overwritten"
        view = self.arena.page_view(name)
        view[dst] = view[src]
        self.calls.append((name, d, s))


def lent(total, pools, **kw):
    mover = CheckingMover()
    buffer = torch.full((total,), 0xA5, dtype=torch.uint8)  # the lender's bytes, not zeros
    a = Arena(total, pools, buffer=buffer, mover=mover, **kw)
    mover.arena = a
    assert a.buffer.data_ptr() == buffer.data_ptr()
    return a


@pytest.fixture
def lent_arenas(monkeypatch):
    made = []

    def make(device, lazy=False, total=1500, pools=scenarios.POOLS):
        a = lent(total, pools, lazy=lazy, device=device)
        made.append(a)
        return a

    monkeypatch.setattr(scenarios, "make", make)
    return made


@pytest.mark.parametrize(
    "scenario, args",
    [
        (scenarios.test_eager_free_compaction_keeps_bytes, ("U",)),
        (scenarios.test_eager_free_compaction_keeps_bytes, ("D",)),
        (scenarios.test_lazy_flush_keeps_bytes, ("U", None)),
        (scenarios.test_lazy_flush_keeps_bytes, ("D", 1)),
        (scenarios.test_make_room_slide_keeps_bytes, ("low",)),
        (scenarios.test_make_room_slide_keeps_bytes, ("high",)),
        (scenarios.test_make_room_leapfrog_keeps_bytes, ("low",)),
        (scenarios.test_make_room_leapfrog_keeps_bytes, ("high",)),
        (scenarios.test_compact_holes_overlapping_moves_keep_bytes, ("low",)),
        (scenarios.test_compact_holes_overlapping_moves_keep_bytes, ("high",)),
        (scenarios.test_relieve_slides_and_bytes_survive, ()),
    ],
)
def test_relocation_goes_through_the_mover_and_keeps_bytes(lent_arenas, scenario, args):
    scenario("cpu", *args)
    (a,) = lent_arenas
    assert a.mover.calls, "a relocating scenario that never called the mover"


def test_overlapping_moves_are_split_into_disjoint_waves():
    a = lent(1500, scenarios.POOLS)
    p = scenarios.Pages(a)
    ids = p.alloc("F", 10)
    p.free("F", ids[[5]])  # one hole in the middle: five pages shift by one
    a.compact_holes("F", "low")
    p.check()
    assert [len(d) for _, d, _ in a.mover.calls] == [1] * 5  # each wave frees the next one's destination


def test_a_cycle_is_moved_through_a_temporary():
    a = lent(1500, scenarios.POOLS)
    p = scenarios.Pages(a)
    ids = p.alloc("F", 3)
    pages = a.translate("F", ids)
    before = a.read_pages("F", ids).clone()
    a._move_bytes_with_mover("F", pages.roll(1), pages)  # a 3-cycle: no wave can start
    assert not a.mover.calls
    assert torch.equal(a.page_view("F")[pages.roll(1)], before)


def test_the_lent_bytes_are_not_cleared():
    a = lent(1500, scenarios.POOLS)
    assert bool((a.buffer == 0xA5).all())
    ids = a.alloc("U", 2)
    assert ids is not None and bool((a.page_view("U")[a.translate("U", ids)] == 0xA5).all())


def test_composites_take_a_lent_buffer():
    buffer = torch.zeros(4096, dtype=torch.uint8)
    c = TriPool(4096, 32, 16, 96, page_size=2, buffer=buffer)
    assert c.arena.buffer.data_ptr() == buffer.data_ptr()


@pytest.mark.parametrize(
    "buffer, words",
    [
        (torch.zeros(1500, dtype=torch.int8), "uint8"),
        (torch.zeros(1499, dtype=torch.uint8), "1499 bytes"),
        (torch.zeros(2, 750, dtype=torch.uint8), "1-D"),
        (torch.zeros(3000, dtype=torch.uint8)[::2], "contiguous"),
        ([0] * 1500, "torch.Tensor"),
    ],
)
def test_a_bad_buffer_is_a_value_error(buffer, words):
    with pytest.raises(ValueError, match=words):
        Arena(1500, scenarios.POOLS, buffer=buffer)


def test_a_mover_must_be_callable():
    with pytest.raises(ValueError, match="callable"):
        Arena(1500, [SubPool("U", 3, 2, "up"), SubPool("D", 4, 1, "down")], mover=3)
