"""verify() and the content model catch what they claim to: planted corruptions."""

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvarena import impl, spec
from kvarena.spec import AccountingError, Arena, SubPool
from kvarena.spec.bands import Band
from kvarena.verification.draws import same_draws
from tests.support import busy as busy_arena
from tests.support import check_all, check_content

pytestmark = pytest.mark.mutation  # in the subset mutmut runs per mutant


def busy():
    a = busy_arena(Arena)
    check_all(a)
    return a


def _overlap(a):
    """Bind a float page on top of the up END's last page, consistently otherwise."""
    f, u = a.bands["f"], a.bands["u"]
    p = u.hi - 1
    v = f.free_ids.pop(0)
    f.holes.extend(range(p + 1, f.lo))
    f.bind([v], [p])
    f.live += 1  # bind writes the tables; the counts are the transition's to set
    f.lo = p


PLANTS = [
    ("u", "bounds", lambda a: setattr(a.bands["u"], "lo", 5)),
    ("d", "bounds", lambda a: setattr(a.bands["d"], "hi", 99)),
    ("f", "live page outside span", lambda a: setattr(a.bands["f"], "hi", a.bands["f"].hi - 1)),
    ("u", "sink pinned", lambda a: a.bands["u"].v2p.__setitem__(0, -1)),
    ("u", "live count", lambda a: setattr(a.bands["u"], "live", 4)),
    ("f", "v2p/p2v inverse", lambda a: a.bands["f"].v2p.__setitem__(1, a.bands["f"].v2p[2])),
    ("f", "content", lambda a: a.bands["f"].content.__setitem__(a.bands["f"].v2p[1], 2)),
    ("d", "holes", lambda a: a.bands["d"].holes.append(a.bands["d"].holes[0])),
    ("d", "conservation", lambda a: a.bands["d"].holes.clear()),
    ("f", "conservation", lambda a: setattr(a.bands["f"], "hi", a.bands["f"].hi + 1)),
    ("u", "conservation", lambda a: setattr(a.bands["u"], "hi", a.bands["u"].hi + 1)),
    ("u", "eager band has no holes", lambda a: (a.bands["u"].holes.append(6), setattr(a.bands["u"], "hi", 7))),
    ("u", "free ids", lambda a: a.bands["u"].free_ids.pop()),
    ("d", "free ids", lambda a: a.bands["d"].free_ids.append(0)),
    ("f", "opaque bands overlap", _overlap),
]


@pytest.mark.parametrize("pool,rule,plant", PLANTS, ids=[f"{p}-{r}" for p, r, _ in PLANTS])
def test_verify_names_pool_and_rule(pool, rule, plant):
    a = busy()
    plant(a)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert e.value.pool == pool and e.value.rule == rule
    assert repr(pool) in str(e.value) and rule in str(e.value)


def test_content_model_follows_every_relocation_and_catches_a_lost_copy(monkeypatch):
    a = busy()
    a.alloc("d", 3)
    a.free("d", [1, 4])
    a.flush("d")  # relocates
    a.make_room("f", "low", a.frontiers("f")[0] - a.below("f") + 32)  # relocates
    check_all(a)

    def move_without_copy(self, dst, src):  # plant: the page tables move, the bytes do not
        for d, s in zip(dst, src):
            v = self.p2v[s]
            self.p2v[s], self.p2v[d], self.v2p[v] = -1, v, d
        return len(src)

    monkeypatch.setattr(Band, "move", move_without_copy)
    b = busy()
    assert b.make_room("f", "high", b.above("f") - b.frontiers("f")[1] + 64) == 3  # 4 edge pages, one a hole
    with pytest.raises(AssertionError):
        check_content(b)
    with pytest.raises(AccountingError, match="content"):
        b.verify()


def test_state_machine_catches_a_planted_bug(monkeypatch):
    """Plant: eager free forgets to compact (retreats the frontier, moves nothing)."""
    from kvarena.spec.arena import Arena as A
    from tests.spec.test_machine import SpecMachine

    real_free = A.free

    def lossy_free(self, name, ids):
        b = self.bands[name]
        if b.is_end and not b.lazy and len(ids) > 0:
            ids = self._ids(b, ids, bound=True)
            b.unbind(ids)
            if b.grow == "up":
                b.hi -= len(ids)
            else:
                b.lo += len(ids)
            return None
        return real_free(self, name, ids)

    monkeypatch.setattr(A, "free", lossy_free)
    with pytest.raises(AssertionError), same_draws():  # a check of the machine's, or an AccountingError
        run_state_machine_as_test(
            SpecMachine,
            settings=settings(
                max_examples=300,
                stateful_step_count=30,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.generate],
                print_blob=False,
            ),
        )


def test_conservation_is_checked_from_the_counters(monkeypatch):
    """Conservation is not a telescoping sum of frontiers: with the per-band
    checks switched off, a corrupted live counter still breaks it."""
    from kvarena.spec import bands as bands_mod

    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    a.alloc("a", 5)
    a.verify()
    monkeypatch.setattr(bands_mod.Band, "check", lambda self: None)
    a.bands["a"].live += 1
    with pytest.raises(AccountingError, match="conservation"):
        a.verify()


DRIFTS = [
    ("f", lambda b: setattr(b, "hi", b.hi + 1)),  # a float's frontier runs ahead of its pages
    ("u", lambda b: setattr(b, "hi", b.hi + 2)),  # an eager END's watermark runs ahead
    ("d", lambda b: setattr(b, "lo", b.lo - 1)),  # a lazy END's low frontier runs ahead
]


@pytest.mark.parametrize("pool,drift", DRIFTS, ids=[p for p, _ in DRIFTS])
def test_conservation_alone_catches_a_drifted_frontier(monkeypatch, pool, drift):
    """Hardening bug 4: conservation used to telescope to the total once the
    other rules passed, so it could not fail.  Now it counts each band's
    pages against its frontiers: a drift that every other rule accepts
    fails conservation, naming the band."""
    a = busy()
    drift(a.bands[pool])
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert (e.value.pool, e.value.rule) == (pool, "conservation")
    monkeypatch.setattr(Arena, "_conservation", lambda self, opaque: None)
    a.verify()  # no other rule sees the drift


# -------------------------------------- the whole message, in both packages
#
# Each rule in the same words in the spec and the implementation: the pool,
# the rule and the detail, checked whole.  Each corruption is planted in one
# table or counter of a consistent arena, so every rule before it passes.

ARENAS = [pytest.param(spec.Arena, id="spec"), pytest.param(impl.Arena, id="impl")]


def test_overlap_names_both_bands():
    a = busy()
    _overlap(a)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == "pool 'f': opaque bands overlap (low frontier 80 < u high frontier 96)"


def set_holes(b, holes):
    b.holes = torch.tensor(holes, dtype=torch.int64) if isinstance(b.holes, torch.Tensor) else list(holes)


def holes(b):
    return [int(h) for h in b.holes]


def drop_free_id(b):
    if isinstance(b.free_ids, list):
        b.free_ids.pop()
    else:
        b.free_ids.take(1)


def parked_float_off_its_park(a):
    f = a.bands["f"]
    a.free("f", [v for v, p in enumerate(a.v2p("f")) if v and p >= 0])
    f.lo = f.hi = 50


def page_below_min_page(a):
    """A consistent bind of id 40 to page 2, under the up END's first page 3."""
    u = a.bands["u"]
    u.v2p[40], u.p2v[2] = 2, 40
    u.live += 1


WORDED_PLANTS = [
    ("u lo", lambda a: setattr(a.bands["u"], "lo", 5), "pool 'u': bounds (up END must start at min_page)"),
    ("d hi", lambda a: setattr(a.bands["d"], "hi", 99), "pool 'd': bounds (down END must end at num_pages)"),
    ("u past the grid", lambda a: setattr(a.bands["u"], "hi", 101), "pool 'u': bounds (span [1, 101))"),
    ("f hi", lambda a: setattr(a.bands["f"], "hi", 55), "pool 'f': live page outside span"),
    ("v2p sink", lambda a: a.bands["u"].v2p.__setitem__(0, -1), "pool 'u': sink pinned (page 0 must map to 0)"),
    ("p2v sink", lambda a: a.bands["d"].p2v.__setitem__(0, 7), "pool 'd': sink pinned (page 0 must map to 0)"),
    ("live counter", lambda a: setattr(a.bands["u"], "live", 4), "pool 'u': live count (5 bound, counter 4)"),
    (
        "v2p alias",
        lambda a: a.bands["f"].v2p.__setitem__(1, int(a.bands["f"].v2p[2])),
        "pool 'f': v2p/p2v inverse (page 50)",
    ),
    ("p2v past the ids", lambda a: a.bands["u"].p2v.__setitem__(3, 100), "pool 'u': v2p/p2v inverse (page 3)"),
    ("stray v2p", lambda a: a.bands["u"].v2p.__setitem__(40, 3), "pool 'u': v2p/p2v inverse (stray v2p entries)"),
    ("duplicate hole", lambda a: set_holes(a.bands["d"], holes(a.bands["d"]) * 2), "pool 'd': holes (duplicate hole)"),
    (
        "live hole",
        lambda a: set_holes(a.bands["d"], holes(a.bands["d"]) + [97]),
        "pool 'd': holes (a hole outside the span or live)",
    ),
    (
        "hole at the span's end",
        lambda a: set_holes(a.bands["f"], holes(a.bands["f"]) + [56]),
        "pool 'f': holes (a hole outside the span or live)",
    ),
    (
        "eager hole",
        lambda a: (set_holes(a.bands["u"], [6]), setattr(a.bands["u"], "hi", 7)),
        "pool 'u': eager band has no holes",
    ),
    ("parked float", parked_float_off_its_park, "pool 'f': parked float (a float with no live page must park)"),
    (
        "free ids",
        lambda a: drop_free_id(a.bands["u"]),
        "pool 'u': free ids (the FIFO must hold exactly the unbound ids)",
    ),
    (
        "overlap",
        lambda a: setattr(a.bands["f"], "lo", 5),
        "pool 'f': opaque bands overlap (low frontier 80 < u high frontier 96)",
    ),
    (
        "lost hole",
        lambda a: set_holes(a.bands["d"], []),
        "pool 'd': conservation (accounted 1584 of 1600 bytes; span 5 pages, live 4 + holes 0)",
    ),
    (
        "drifted frontier",
        lambda a: setattr(a.bands["u"], "hi", 7),
        "pool 'u': conservation (accounted 1584 of 1600 bytes; span 6 pages, live 5 + holes 0)",
    ),
]


@pytest.mark.parametrize("Arena", ARENAS)
@pytest.mark.parametrize("plant,message", [(p, m) for _, p, m in WORDED_PLANTS], ids=[n for n, _, _ in WORDED_PLANTS])
def test_verify_reports_the_rule_in_the_same_words(Arena, plant, message):
    a = busy_arena(Arena)
    a.verify()
    plant(a)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == message


def test_a_wrong_content_names_the_page_and_both_ids():
    a = busy()
    a.bands["f"].content[50] = 2
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == "pool 'f': content (page 50 holds 2, not id 1)"


@pytest.mark.parametrize("Arena", ARENAS)
def test_a_page_below_min_page_is_reported(Arena):
    a = Arena(8192, [SubPool("u", 24, 1, "up", "state"), SubPool("f", 8, 2, "float"), SubPool("d", 16, 4, "down")])
    a.alloc("u", 4)
    assert a.geometry("u").min_page == 3
    page_below_min_page(a)
    with pytest.raises(AccountingError) as e:
        a.verify()
    assert str(e.value) == "pool 'u': no page below min_page"
