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
