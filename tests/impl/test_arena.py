"""Unit tests of the torch implementation: bytes through every relocation,
typed views, translate (aliased ``out=``, tombstones), validation, devices."""

import json

import pytest
import torch

from kvarena import spec
from kvarena.impl import AccountingError, Arena, SubPool

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
    ),
]

POOLS = [SubPool("U", 3, 2, "up"), SubPool("F", 5, 2, "float"), SubPool("D", 4, 1, "down", "state")]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def make(device, lazy=False, total=1500, pools=POOLS):
    return Arena(total, pools, lazy=lazy, device=device)


class Pages:
    """Tracks a byte pattern per live id and checks it after each relocation."""

    def __init__(self, a):
        self.a, self.want, self.seed = a, {}, 0

    def alloc(self, name, n):
        ids = self.a.alloc(name, n)
        assert ids is not None
        epp = self.a.geometry(name).epp
        self.seed += 1
        data = (torch.arange(n * epp).reshape(n, epp) * 13 + self.seed * 101 + len(name)) % 256
        data = data.to(torch.uint8)
        self.a.write_pages(name, ids, data)
        for i, v in enumerate(ids.tolist()):
            self.want[(name, v)] = data[i]
        return ids

    def free(self, name, ids):
        self.a.free(name, ids)
        for v in torch.as_tensor(ids).tolist():
            del self.want[(name, v)]

    def check(self):
        self.a.verify()
        for (name, v), data in self.want.items():
            assert torch.equal(self.a.read_pages(name, [v])[0].cpu(), data), (name, v)
            page = self.a.translate(name, [v])
            assert torch.equal(self.a.page_view(name)[page][0].cpu(), data)


def test_buffer_is_one_zeroed_uint8_tensor(device):
    a = make(device)
    assert a.buffer.dtype == torch.uint8 and a.buffer.numel() == a.total_bytes
    assert a.buffer.device.type == torch.device(device).type
    assert int(a.buffer.sum()) == 0
    for n in a.chain:
        assert a.v2p(n).device.type == a.buffer.device.type
        assert a.v2p(n).dtype == torch.int64


@pytest.mark.parametrize("name", ["U", "D"])
def test_eager_free_compaction_keeps_bytes(device, name):
    a = make(device)
    p = Pages(a)
    ids = p.alloc(name, 12)
    p.free(name, ids[[0, 3, 4, 9]])  # survivors sit in the vacated pages
    p.check()
    assert not a.holes(name).numel()
    span = a.bands[name].hi - a.bands[name].lo
    assert span == 8


@pytest.mark.parametrize("name", ["U", "D"])
@pytest.mark.parametrize("cap", [None, 1, 2])
def test_lazy_flush_keeps_bytes(device, name, cap):
    a = make(device, lazy=True)
    p = Pages(a)
    ids = p.alloc(name, 10)
    inner = ids[2:6] if name == "U" else ids[4:8]  # behind the frontier
    p.free(name, inner)
    assert a.holes(name).numel() == 4
    moved = a.flush(name, cap)
    assert moved == (2 if cap is None else cap) or (cap is None and moved > 0)
    p.check()


def float_with_holes(device):
    a = make(device)
    p = Pages(a)
    ids = p.alloc("F", 10)
    p.free("F", ids[[1, 2, 5]])
    p.check()
    return a, p


@pytest.mark.parametrize("side", ["low", "high"])
def test_make_room_slide_keeps_bytes(device, side):
    a, p = float_with_holes(device)
    low, high = a.frontiers("F")
    band = low - a.below("F") if side == "low" else a.above("F") - high
    moved = a.make_room("F", side, band + 2 * a.geometry("F").epp)
    assert 0 < moved < a.live_pages("F")
    p.check()
    low2, high2 = a.frontiers("F")
    band2 = low2 - a.below("F") if side == "low" else a.above("F") - high2
    assert band2 >= band + 2 * a.geometry("F").epp


@pytest.mark.parametrize("side", ["low", "high"])
def test_make_room_leapfrog_keeps_bytes(device, side):
    a, p = float_with_holes(device)
    lo, hi = a.region("F")
    epp, live = a.geometry("F").epp, a.live_pages("F")
    reach = (hi - live) * epp - a.below("F") if side == "low" else a.above("F") - (lo + live) * epp
    moved = a.make_room("F", side, reach)
    assert moved > 0
    p.check()
    assert a.bands["F"].hi == hi if side == "low" else a.bands["F"].lo == lo
    assert not a.holes("F").numel()


@pytest.mark.parametrize("side", ["low", "high"])
def test_compact_holes_overlapping_moves_keep_bytes(device, side):
    a, p = float_with_holes(device)
    order = a.p2v("F")
    moved = a.compact_holes("F", side)
    assert moved > 0
    p.check()
    after = a.p2v("F")
    assert [v for v in order.tolist() if v > 0] == [v for v in after.tolist() if v > 0]  # order kept


def test_relieve_slides_and_bytes_survive(device):
    a = make(device)
    p = Pages(a)
    p.alloc("F", 6)
    p.alloc("U", a.available_pages("U"))
    need = a.available_pages("U") + 3
    assert a.relieve("U", need)
    p.alloc("U", need)
    p.check()


def test_typed_views(device):
    pools = [SubPool("K", 4, 4, "up"), SubPool("S", 6, 1, "down", "state")]
    a = Arena(800, pools, device=device)
    k = a.kv_view("K")
    assert k.shape == (a.geometry("K").num_pages, 4, 4) and k.dtype == torch.uint8
    h = a.kv_view("K", torch.float16)
    assert h.shape == (a.geometry("K").num_pages, 4, 2)
    s = a.kv_view("S")
    assert s.shape == (a.geometry("S").num_pages, 6)
    assert a.page_view("K").shape == (a.geometry("K").num_pages, 16)
    ids = a.alloc("K", 2)
    page = a.translate("K", ids)
    h[page[1], 3, 1] = 1.5  # slot 3, second half-word of entry
    raw = a.read_pages("K", ids[1:])[0]
    assert raw.view(torch.float16)[7].item() == 1.5
    sid = a.alloc("S", 1)
    s[a.translate("S", sid)[0]] = torch.arange(6, dtype=torch.uint8, device=a.device)
    assert a.read_pages("S", sid)[0].tolist() == list(range(6))


def test_translate_aliased_out(device):
    a = make(device)
    ids = a.alloc("U", 6)
    a.free("U", ids[:2])
    want = a.translate("U", ids.clone())
    assert want[:2].tolist() == [0, 0]  # tombstones land on the sink
    buf = ids.clone()
    got = a.translate("U", buf, out=buf)
    assert got is buf and buf.tolist() == want.tolist()
    # An out that overlaps the input shifted by one must not read written values.
    both = torch.cat([ids, ids[:1]])
    a.translate("U", both[:-1], out=both[1:])
    assert both[1:].tolist() == want.tolist()


def test_translate_tombstones_and_sentinel(device):
    a = make(device)
    n = a.geometry("U").num_pages
    t = torch.tensor([-1, 0, n, n + 5, -7], device=a.device)
    assert a.translate("U", t).tolist() == [0, 0, 0, 0, 0]  # never out of range
    assert a.translate("U", [-1, 0]).tolist() == [0, 0]
    with pytest.raises(ValueError, match="'U'"):
        a.translate("U", [n])
    assert a.bands["U"].v2p[n].item() == -1  # the trailing sentinel row


def test_free_validation_names_pool_and_changes_nothing(device):
    a = make(device)
    ids = a.alloc("D", 4)
    a.free("D", ids[:1])
    before = a.snapshot()
    for bad in ([ids[0].item()], [ids[1].item(), ids[1].item()], [0], [-1], [10**6], ["x"]):
        with pytest.raises(ValueError, match="'D'"):
            a.free("D", bad)
        assert a.snapshot() == before
    a.free("D", ids[1:], check=False)  # the sync-free path
    a.verify()


def test_alloc_api(device):
    a = make(device)
    assert a.alloc("U", 0).numel() == 0
    with pytest.raises(ValueError, match="'U'"):
        a.alloc("U", -1)
    free = a.free_ids("F")[:3].flip(0)
    got = a.alloc("F", 3, ids=free)  # borrowed ids, as a tensor
    assert got.tolist() == free.tolist()
    assert a.free_ids("F")[:2].tolist() == [a.geometry("F").min_page + 3, a.geometry("F").min_page + 4]
    with pytest.raises(ValueError, match="'F'"):
        a.alloc("F", 1, ids=free[:1])  # already allocated
    avail = a.available_pages("U")
    assert a.alloc("U", avail + 1) is None
    ids = a.alloc("U", avail)
    assert ids.dtype == torch.int64 and ids.numel() == avail
    assert a.alloc("U", 1) is None
    a.verify()


def test_snapshot_matches_spec_and_is_json(device):
    s, a = spec.Arena(1500, POOLS, lazy=True), make(device, lazy=True)
    for arena in (s, a):
        u = arena.alloc("U", 7)
        arena.alloc("F", 5)
        arena.free("U", list(u[1:3]))
        arena.flush("U", 1)
    assert a.snapshot() == s.snapshot()
    json.dumps(a.snapshot())


def test_verify_recounts_live_from_p2v(device):
    a = make(device)
    a.alloc("U", 3)
    a.bands["U"].p2v[a.bands["U"].hi - 1] = -1  # a table write the counters do not see
    with pytest.raises(AccountingError, match="'U'"):
        a.verify()


def test_bad_config_names_pool():
    with pytest.raises(ValueError, match="'X'"):
        Arena(1000, [SubPool("U", 2, 1, "up"), SubPool("X", 2, 1, "up"), SubPool("D", 2, 1, "down")])
    with pytest.raises(ValueError, match="'F'"):
        Arena(1000, POOLS, lazy={"F"})


def test_conservation_uses_the_recounted_pages(monkeypatch):
    """With the per-band rules passing, a recount that disagrees with the
    frontiers still breaks conservation: the check is not a telescoping sum."""
    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    a.alloc("a", 5)
    a.verify()
    real = Arena._check_band
    monkeypatch.setattr(Arena, "_check_band", lambda self, b: real(self, b) + (b.name == "a"))
    with pytest.raises(AccountingError, match="conservation"):
        a.verify()


def test_write_pages_rejects_a_wrong_shape():
    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    ids = a.alloc("a", 2)
    before = a.read_pages("a", ids).clone()
    for data, got in ((torch.ones(2, 15, dtype=torch.uint8), "(2, 15)"), ([[1] * 16] * 2, "list")):
        with pytest.raises(ValueError) as e:
            a.write_pages("a", ids, data)
        assert str(e.value) == f"pool 'a': data must be a tensor of shape (2, 16), got {got}"
    assert torch.equal(a.read_pages("a", ids), before)


def test_write_pages_stores_any_integer_tensor_as_bytes():
    """``write_pages`` converts its data to uint8 on the arena's device, so a
    caller's int64 pattern (values below 256) lands byte for byte."""
    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    ids = a.alloc("a", 2)
    data = torch.arange(32, dtype=torch.int64).reshape(2, 16)
    a.write_pages("a", ids, data)
    assert torch.equal(a.read_pages("a", ids), data.to(torch.uint8))


def test_verify_names_a_written_sentinel_row():
    """The tables' trailing row (the sentinel that -1 and tombstones gather
    from) must hold -1; the implementation checks it."""
    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    b = a.bands["b"]
    b.v2p[b.id_end] = 3
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == "pool 'b': sentinel (the trailing row must hold -1)"
