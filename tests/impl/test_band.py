"""``impl/band.py`` on its own: the device free-id ring against a Python
deque, and the dtype of every table a band hands out (docs/impl.md's
"Mutation score" names the mutants these kill)."""

import collections
import random

import pytest
import torch

from kvarena import impl
from kvarena.impl.band import FreeIds
from kvarena.spec import SubPool

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def test_free_ids_is_a_fifo():
    rng = random.Random(3)
    for first, end in ((1, 9), (3, 4), (2, 40)):
        ring, model = FreeIds(first, end, "cpu"), collections.deque(range(first, end))
        out = collections.deque()  # ids handed out, oldest first
        for _ in range(300):
            op = rng.choice(("take", "put", "remove"))
            if op == "take" and model:
                n = rng.randint(1, len(model))
                got = ring.take(n)
                assert got.dtype == torch.int64 and got.tolist() == [model.popleft() for _ in range(n)]
                out.extend(got.tolist())
            elif op == "put" and out:
                ids = [out.popleft() for _ in range(rng.randint(1, len(out)))]
                ring.put(torch.tensor(ids, dtype=torch.int64))
                model.extend(ids)
            elif op == "remove" and model:
                drop = rng.sample(list(model), rng.randint(1, len(model)))
                ring.remove(torch.tensor(drop, dtype=torch.int64))
                model = collections.deque(v for v in model if v not in drop)
                out.extend(drop)
            assert ring.count == len(model) and ring.queue().tolist() == list(model)


def test_every_table_is_int64():
    a = impl.Arena(
        4096, [SubPool("u", 8, 1, "up"), SubPool("f", 8, 1, "float"), SubPool("d", 8, 1, "down")], borrow={"f": "d"}
    )
    for name in ("u", "f", "d"):
        for t in (a.free_ids(name), a.v2p(name), a.p2v(name), a.bands[name].holes, a.bands[name].pages(1, 3)):
            assert t.dtype == torch.int64, name
    assert a.free_ids("f").numel() == 0  # a borrower has no queue of its own


@pytest.mark.parametrize("name", ["d", "f"])  # a lazy END; a float, which parks when it empties
def test_holes_are_a_fifo_appended_in_place(name):
    """``append_holes`` against a list: oldest first, each free copied in
    behind the holes when they end at the reserve's mark and it has room
    (else a fresh reserve), and a view taken earlier never changes under a
    later append, refresh or park (a bind's pages, a journal's saved holes)."""
    rng = random.Random(5)
    pools = [SubPool("u", 8, 1, "up"), SubPool("f", 8, 1, "float"), SubPool("d", 8, 1, "down")]
    a = impl.Arena(1 << 16, pools, lazy={"d"})
    b = a.bands[name]
    model, live, kept = [], [], []
    in_place = refreshed = parked = 0
    for _ in range(600):
        if live and (rng.random() < 0.5 or a.available_pages(name) == 0):
            ids = rng.sample(live, rng.randint(1, min(5, len(live))))
            pages = a.v2p(name)[ids].tolist()
            reserve = b._reserve
            a.free(name, ids)
            live = [v for v in live if v not in ids]
            model += pages
            if not live and name == "f":  # a float with no live page parks: no holes
                model, parked = [], parked + 1
            else:
                same = b.holes._base is reserve
                in_place, refreshed = in_place + same, refreshed + (not same)
        else:
            n = rng.randint(1, min(4, a.available_pages(name)))
            live += a.alloc(name, n).tolist()
            del model[: min(n, len(model))]  # holes go first, oldest first
        assert b.holes.tolist() == model
        kept.append((b.holes, list(model)))
    assert all(view.tolist() == values for view, values in kept)
    assert in_place > 50 and refreshed >= 1, (in_place, refreshed)
    assert parked >= (name == "f"), parked


@pytest.mark.parametrize("name", ["d", "f"])
def test_a_run_of_frees_appends_in_place(name):
    """Frees with no bind between them: after the first, every free writes
    behind the holes in the same reserve, since a fresh reserve holds at
    least the grid's page count and the holes never outnumber the pages."""
    pools = [SubPool("u", 8, 1, "up"), SubPool("f", 8, 1, "float"), SubPool("d", 8, 1, "down")]
    a = impl.Arena(1 << 12, pools, lazy={"d"})
    b = a.bands[name]
    ids = a.alloc(name, 60).tolist()
    pages = a.v2p(name)[ids].tolist()
    a.free(name, ids[:1])
    reserve = b._reserve
    for v in ids[1:-1]:  # one stays live, so the float does not park
        a.free(name, [v])
        assert b._reserve is reserve and b.holes._base is reserve
    assert b.holes.tolist() == pages[:-1]
