"""The step's fused Triton kernels (``impl/triton_kernels.py``, launched by
``impl/kernels.py``; docs/design.md §14) against the torch operations they
replace.

Every test builds two identical arenas (or composites), sets them up with
torch kernels, switches one to ``kernels="triton"`` and runs the same calls
on both: the results, the whole ``snapshot()`` (tables, free-id rings,
holes, guards), the bytes of the buffer and ``verify()`` must agree, and the
Triton twin must have run the kernels the calls fuse (counted at
``kernels.launch``, the one launch point), the torch twin none.  On this
CPU-only machine the kernels run under Triton's interpreter
(``tests/conftest.py`` turns it on); on a CUDA machine they run compiled.

Covered: page sizes 1, 4 and 16; a batch of one and one past a block's
width (``BLOCK + 2`` requests, pages or ids: the second program of every
kernel, and in ``extend_kernel`` a request whose prefix sums span two
blocks); holes (binds take them, then extend); borrowers; a forward in
flight (guards); eager and lazy ENDs and floats; ring wrap-around; and the
composites' trusted step (``tests/impl/test_host_sync.py``'s
``trusted_run``).  Then: an off-by-one planted in a kernel is caught; the
choice of kernels and its errors; a failed launch changes nothing; every
kernel, in each constexpr combination its launchers use, compiles for
sm_90 (cubin) on this CPU machine, and a planted type error does not.  Two bugs
these tests found stay as regressions: an extend of no request read out of
bounds (a launch over empty tensors), and ``Arena.translate`` of int32 ids
answered int32 with Triton.
"""

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvarena import impl
from kvarena.impl import AccountingError, Arena, SubPool, kernels
from tests.api.test_composites import SWA_KINDS, make
from tests.impl.test_host_sync import trusted_run

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: one torch thread

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
# Why Triton cannot run here, or None (conftest.py has turned its interpreter on by now).
WHY = kernels.unavailable(CPU)
needs_triton = pytest.mark.skipif(WHY is not None, reason=f"Triton's kernels cannot run here: {WHY}")

PAGE_SIZES = (1, 4, 16)
BIG = kernels.BLOCK + 2  # past one block: the second program, and an extend prefix over two blocks
BATCHES = (1, BIG)
E = 8  # bytes per token of every pool
PAGES = 16384  # the arena's grid, in E*ps-byte pages: room for every float between the ENDs
CPAGES = 4096  # a composite's


def T(xs):
    return torch.tensor(list(xs), dtype=torch.int64)


# ------------------------------------------------------------ the twins


@contextlib.contextmanager
def recording():
    """The names of the kernels launched while open, in order."""
    names: list[str] = []

    def note(kernel, go):
        names.append(kernel.fn.__name__)
        go()

    with kernels.wrapped(note):
        yield names


SCALARS = {int, float, bool, str, type(None)}


def plain(x):
    """``x`` with every tensor made a ``(dtype, shape, values)`` tuple: what ``==`` compares exactly."""
    if isinstance(x, torch.Tensor):
        return str(x.dtype), tuple(x.shape), x.tolist()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not set(map(type, x)) <= SCALARS:
        return [plain(v) for v in x]
    return x


def same(path, a, b, out):
    """Append to ``out`` where ``a`` and ``b`` (``plain``) differ."""
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for k in a:
            same(f"{path}.{k}", a[k], b[k], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            same(f"{path}[{i}]", x, y, out)
    else:
        out.append(f"{path}: {a!r} vs {b!r}"[:2000])


def differences(build, script):
    """Run ``script`` on two objects ``build()`` makes (set up with torch
    kernels, each with an ``arena``), one with torch kernels and one with
    Triton's; the ways the Triton run differs (results, snapshot, bytes,
    ``verify``) and the kernels it launched."""
    ref = build()
    with recording() as names:
        want = script(ref)
    assert names == [], f"the torch kernels launched {names}"
    ref.arena.verify()
    x = build()
    x.arena.kernels = "triton"
    with recording() as names:
        try:
            got = script(x)
        except Exception as e:  # a planted kernel may leave a state the next call rejects
            return [f"the Triton run raised {type(e).__name__}: {e}"], names
    diffs: list[str] = []
    same("result", plain(want), plain(got), diffs)
    same("snapshot", ref.arena.snapshot(), x.arena.snapshot(), diffs)
    if not torch.equal(ref.arena.buffer, x.arena.buffer):
        at = (ref.arena.buffer != x.arena.buffer).nonzero().reshape(-1)
        diffs.append(f"bytes differ at {at.numel()} offsets, first {at[:8].tolist()}")
    try:
        x.arena.verify()
    except AccountingError as e:
        diffs.append(f"verify: {e}")
    return diffs, names


def assert_same(build, script, launched):
    """The twins agree, and the Triton twin launched each kernel of ``launched``."""
    diffs, names = differences(build, script)
    assert not diffs, "\n".join(diffs[:6])
    assert set(launched) <= set(names), f"launched {sorted(set(names))}, expected {sorted(launched)}"


# -------------------------------------------------------- arena helpers


def fill(a, salt=0):
    """Distinct bytes into every live page of every pool (a function of pool, id and salt)."""
    for k, name in enumerate(a.chain):
        v2p = a.v2p(name)
        ids = torch.nonzero(v2p[1:] >= 0).reshape(-1) + 1
        if ids.numel():
            epp = a.geometry(name).epp
            data = (ids[:, None] * 131 + torch.arange(epp) * 7 + 17 * k + 29 * salt) % 251
            a.write_pages(name, ids, data.to(torch.uint8))


def live(a, name):
    return [v for v, p in enumerate(a.v2p(name).tolist()) if v > 0 and p >= 0]


def dead(a, name):
    """Ids that are not live (never bound, or freed), the sink excluded."""
    return [v for v, p in enumerate(a.v2p(name).tolist()) if v > 0 and p < 0]


def new_arena(ps, lazy):
    """An up END lending its ids to two floats, a float of its own, a down END."""
    pools = [
        SubPool("full", E, ps, "up"),
        SubPool("swa", E, ps, "float"),
        SubPool("swa2", E, ps, "float"),
        SubPool("F", 2 * E, ps, "float"),
        SubPool("D", E, ps, "down"),
    ]
    return Arena(E * ps * PAGES, pools, lazy=lazy, borrow={"swa": "full", "swa2": "full"}, kernels="torch")


def arena_case(ps, n, lazy, flight=False):
    """``3n + 2`` pages in every pool, bytes written, ``n + 1`` of them freed
    in a shuffled order (holes, oldest first in that order; an eager END
    compacts instead), one more in ``swa`` only; a forward in flight if asked.
    Every id live in ``swa`` is live in ``swa2``, and every one live in
    ``full`` is live in ``swa2``."""

    def build():
        a = new_arena(ps, lazy)
        rng = random.Random(ps * 7919 + n)
        m = 3 * n + 2
        ids = a.alloc("full", m)
        a.alloc("D", m)  # the ENDs first: the floats then sit between them
        a.alloc("swa", m, ids=ids, check=False)
        a.alloc("swa2", m, ids=ids, check=False)
        a.alloc("F", m)
        fill(a)
        gone = rng.sample(ids.tolist(), n + 1)
        a.free("swa", [*gone, *rng.sample(sorted(set(ids.tolist()) - set(gone)), 1)])
        a.free("swa2", gone)
        a.free("full", gone)
        a.free("F", rng.sample(live(a, "F"), n + 1))
        a.free("D", rng.sample(live(a, "D"), n + 1))
        if flight:
            a.launch({"full": live(a, "full")[::2], "swa": live(a, "swa")[1::2], "F": None, "D": live(a, "D")[::3]})
        a.verify()
        return SimpleNamespace(arena=a, ps=ps, n=n, rng=random.Random(n))

    return build


# ------------------------------------------------------------ arena calls


@needs_triton
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_matches_torch(ps, n, lazy):
    """Plain binds, a borrower's (ids given, checked and not), a lender's with
    its two borrowers in one launch, a float's and both ENDs': holes first
    (in the order they were made), then the extension."""

    def script(x):
        a, out = x.arena, []
        ids = a.alloc("full", n)  # holes only: n + 1 of them
        out += [ids, a.alloc("swa", n, ids=ids, check=False), a.alloc("swa2", n, ids=ids)]
        out.append(a.snapshot())
        out.append(a.bind_with_borrowers("full", n + 2))  # the last hole, then the extension
        out += [a.alloc("F", n + 2), a.alloc("D", n + 2), a.alloc("full", n)]  # extension only, for full
        out.append(a.alloc("swa", 1, ids=out[-1][:1], check=False))
        fill(a, salt=1)
        return out

    assert_same(arena_case(ps, n, lazy), script, {"bind_kernel"})


@needs_triton
@pytest.mark.parametrize("check", [True, False])
def test_a_borrower_binds_the_ids_of_a_strided_view(check):
    """The kernel reads the ids given as a ring: a view's, not its storage's (``ids[::2]``)."""

    def build():
        a = new_arena(4, True)
        return SimpleNamespace(arena=a, ids=a.alloc("full", 6))

    assert_same(build, lambda x: x.arena.alloc("swa", 3, ids=x.ids[::2], check=check), {"bind_kernel"})


@needs_triton
@pytest.mark.parametrize("flight", [False, True])
@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_free_matches_torch(ps, n, lazy, check, flight):
    """Frees in a shuffled order: the borrowers' (no ring), the lender's (a
    lazy END's is fused; an eager END's compacts with torch), a float's, the
    down END's, then a float's last pages (it parks); in flight, freed pins
    stay pinned; then binds reuse the holes and the forward settles."""

    def script(x):
        a, rng, out = x.arena, x.rng, []
        ids = rng.sample(live(a, "swa2"), n + 1)
        for name in ("swa", "swa2"):
            held = set(live(a, name))
            a.free(name, [v for v in ids if v in held], check=check)
        a.free("full", ids, check=check)
        out.append(a.snapshot())
        a.free("F", rng.sample(live(a, "F"), n), check=check)
        a.free("D", rng.sample(live(a, "D"), n), check=check)
        out.append(a.snapshot())
        a.free("F", live(a, "F"), check=check)  # the float's last pages
        out.append(a.snapshot())
        out += [a.alloc("full", n + 1), a.alloc("D", n), a.alloc("F", 2)]
        a.settle()
        out.append(a.alloc("full", n))
        fill(a, salt=1)
        return out

    assert_same(arena_case(ps, n, lazy, flight), script, {"free_kernel"})


def tokens_of(ids, ps, rng):
    """A token on each id's page, at a random offset."""
    return [v * ps + rng.randrange(ps) for v in ids]


# past a block (a sort 256 wide, slow under the interpreter) in flight at ps 4 only
FREE_LIVE_CASES = [(ps, n, f) for ps in PAGE_SIZES for n in BATCHES for f in (False, True) if n == 1 or f == (ps == 4)]


@needs_triton
@pytest.mark.parametrize(("ps", "n", "flight"), FREE_LIVE_CASES)
def test_free_live_matches_torch(ps, n, flight):
    """``free_live``: every token a live page of its own (count ==
    len(tokens)); then with ``-1`` padding, the sink, repeats and dead pages,
    through a strided view; in a borrower (no ring), its lender and a float."""

    def script(x):
        a, rng, out = x.arena, x.rng, []
        # all live and distinct, shuffled
        ids = rng.sample(live(a, "swa"), n)
        toks = T(tokens_of(ids, ps, rng))
        a.free_live("swa", toks, ps, len(ids))
        out.append(a.snapshot())
        # mixed, in the other borrower, the same ids: repeats, -1, the sink, dead ids; strided
        mixed = tokens_of(ids, ps, rng) + tokens_of(ids[: n // 2 + 1], ps, rng) + [-1] * 3
        mixed += [rng.randrange(ps), *tokens_of(rng.sample(dead(a, "swa2"), 3), ps, rng)]
        rng.shuffle(mixed)
        pad = torch.stack([T(mixed), torch.full((len(mixed),), -7)], 1)  # column 0: stride 2
        a.free_live("swa2", pad[:, 0], ps, len(ids))
        out.append(a.snapshot())
        # the lender: the same ids, which no borrower holds any more (a lazy END's free is fused)
        rng.shuffle(ids)
        a.free_live("full", T(tokens_of(ids, ps, rng) + [-1] + tokens_of(ids[:1], ps, rng)), ps, len(ids))
        out.append(a.snapshot())
        ids = live(a, "F")[:9]
        a.free_live("F", T(tokens_of(ids, ps, rng)), ps, len(ids))
        a.free_live("F", T([-1]), ps, 0)  # nothing to free: no launch, nothing changes
        out.append(a.snapshot())
        out += [a.alloc("full", n + 1), a.alloc("F", n)]
        return out

    assert_same(arena_case(ps, n, True, flight), script, {"free_live_kernel"})


@needs_triton
@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_translate_and_slots_match_torch(ps, n):
    """``translate`` of any shape (live, dead, the sink, -1, out of range
    either side), from a host list, into an ``out`` that aliases the ids or is
    not contiguous; ``slots`` of tokens likewise."""

    def script(x):
        a, rng, out = x.arena, x.rng, []
        for name in ("full", "swa", "F", "D"):
            end = a.id_end(name)
            ids = live(a, name)[:n] + dead(a, name)[:n] + [0, -1, end - 1, end, end + 5, -9]
            rng.shuffle(ids)
            grid = T(ids + [0] * (len(ids) % 2)).reshape(2, -1)
            out.append(a.translate(name, grid))
            out.append(a.translate(name, [v for v in ids if -1 <= v < end]))  # host: range-checked
            alias = grid.clone()
            out += [a.translate(name, alias, out=alias), alias]
            strided = torch.empty(grid.shape[::-1], dtype=torch.int64).t()
            out += [a.translate(name, grid, out=strided), strided]
            flipped = grid.clone().t()  # not contiguous, and its own out
            out += [a.translate(name, flipped), a.translate(name, flipped, out=flipped), flipped]
            out += [a.translate(name, T(ids[:1]).reshape(())), a.translate(name, torch.empty(0, 3, dtype=torch.int64))]
            toks = T(tokens_of(ids, ps, rng) + [-1, end * ps, end * ps + ps - 1, -ps])
            out.append(a.slots(name, toks, ps))
        return out

    assert_same(arena_case(ps, n, True), script, {"translate_kernel"})


@needs_triton
@pytest.mark.parametrize("lazy", [False, True])
def test_a_small_arena_cycling_its_rings_matches_torch(lazy):
    """Random binds and frees in a small arena, so that the free-id ring
    wraps around, binds taking ids and frees appending them across its end,
    in and out of a forward in flight."""
    crossed = {"bind": 0, "free": 0}

    def build():
        a = Arena(
            E * 4 * 48,
            [SubPool("full", E, 4, "up"), SubPool("swa", E, 4, "float"), SubPool("D", E, 4, "down")],
            lazy=lazy,
            borrow={"swa": "full"},
            kernels="torch",
        )
        return SimpleNamespace(arena=a, rng=random.Random(5))

    def script(x):
        a, rng, out = x.arena, x.rng, []
        ring = a.bands["full"].free_ids
        for step in range(60):
            k = rng.randint(1, 9)
            if rng.random() < 0.55 and k <= a.available_pages("full") and k <= a.available_pages("swa"):
                crossed["bind"] += ring.head + k > ring.cap
                ids = a.alloc("full", k)
                out += [ids, a.alloc("swa", k, ids=ids, check=False), a.alloc("D", rng.randint(0, 2))]
            else:
                held = live(a, "swa")
                gone = rng.sample(held, min(k, len(held)))
                if rng.random() < 0.5:
                    a.free_live("swa", T(tokens_of(gone, 4, rng) + [-1]), 4, len(gone))
                else:
                    a.free("swa", gone, check=False)
                crossed["free"] += (ring.head + ring.count) % ring.cap + len(gone) > ring.cap
                a.free("full", gone, check=bool(step % 2))
                if live(a, "D"):
                    a.free("D", live(a, "D")[:1])
            if step % 9 == 4:
                a.launch({"full": live(a, "full")[::2], "swa": None})
            elif step % 9 == 8:
                a.settle()
            out.append(a.snapshot())
        return out

    assert_same(build, script, {"bind_kernel", "free_kernel", "free_live_kernel"})
    assert crossed["bind"] >= 2 and crossed["free"] >= 2, crossed  # in each twin


# ------------------------------------------------------------ composites


def grown(reqs, prefix, seq, out):
    """Each request's slots after an extend that gave it ``out``'s next ``seq - prefix``."""
    flat, at, res = out.tolist(), 0, []
    for r, p, s in zip(reqs, prefix, seq):
        assert len(r) == p
        res.append(r + flat[at : at + s - p])
        at += s - p
    return res


def composite_case(kind, ps, lazy, n):
    """``n + n // 2 + 2`` requests of 1 to ``3 ps`` tokens, every third one
    freed (holes in a lazy END or a float), bytes written, state slots."""

    def build():
        c = make(impl, kind, ps, pages=CPAGES, lazy=lazy, kernels="torch")
        rng = random.Random(1000 * ps + n)
        count = n + n // 2 + 2
        lens = [rng.randint(1, 3 * ps) for _ in range(count)]
        reqs = grown([[] for _ in lens], [0] * count, lens, c.alloc_extend([0] * count, lens, [-1] * count))
        c.free([t for r in reqs[0::3] for t in r])
        reqs = [r for i, r in enumerate(reqs) if i % 3]
        states = None if kind == "hybrid" else c.alloc_state(3)
        fill(c.arena)
        c.verify()
        return SimpleNamespace(arena=c.arena, c=c, kind=kind, ps=ps, lazy=lazy, reqs=reqs, states=states)

    return build


def swa_count(a, toks, ps):
    """The engine's count of the distinct live swa pages among ``toks[::ps]``."""
    v2p = a.v2p("swa").tolist()
    return len({t // ps for t in toks[::ps] if t >= 0 and v2p[t // ps] > 0})


def composite_script(x):
    c, ps, reqs, rng, out = x.c, x.ps, x.reqs, random.Random(7), []

    def record(r):
        out.append(r)
        out.append(x.arena.snapshot())

    # one extend over every request (past a block for BIG), some not growing, three new ones,
    # one of more than a block of tokens (and of pages, for ps 1); checked, or trusted with
    # the host copies (the same launch: the host work differs)
    prefix = [len(r) for r in reqs] + [0, 0, 0]
    seq = [p + rng.choice([0, 1, ps, 2 * ps + 1]) for p in prefix[:-3]] + [ps + 1, 2 * kernels.BLOCK + 3, 1]
    last = [r[-1] for r in reqs] + [-1, -1, -1]
    if x.lazy and ps != 4:
        got = c.alloc_extend(prefix, seq, last)
    else:
        total = sum(s - p for p, s in zip(prefix, seq))
        got = c.alloc_extend(
            T(prefix), T(seq), T(last), False, prefix_lens_cpu=prefix, seq_lens_cpu=seq, extend_num_tokens=total
        )
    record(got)
    reqs = grown([*reqs, [], [], []], prefix, seq, got)
    fill(x.arena, salt=1)
    # extends that bind no page: to each partly filled page's end (ps > 1), and of no token at all
    prefix = [len(r) for r in reqs[:12]]
    seq = [-(-p // ps) * ps for p in prefix]
    last = [r[-1] for r in reqs[:12]]
    got = c.alloc_extend(T(prefix), T(seq), T(last), False, prefix_lens_cpu=prefix, seq_lens_cpu=seq)
    record(got)
    reqs[:12] = grown(reqs[:12], prefix, seq, got)
    lens = [len(r) for r in reqs[:2]]
    record(c.alloc_extend(lens, lens, [r[-1] for r in reqs[:2]]))
    # nothing at all: an empty decode batch, an empty translate (an empty extend: EMPTY_EXTEND below)
    record(c.alloc_decode(T([]), T([]), False, seq_lens_cpu=[]))
    record(c.translate(T([]), check=False))
    # small extends on three requests: checked, trusted with host copies, trusted without
    for mode in ("checked", "host", "trusted"):
        few = rng.sample(range(len(reqs)), min(3, len(reqs)))
        prefix = [len(reqs[i]) for i in few]
        seq = [p + rng.randint(0, 2 * ps + 1) for p in prefix]
        last = [reqs[i][-1] for i in few]
        if mode == "checked":
            got = c.alloc_extend(prefix, seq, last)
        elif mode == "host":
            got = c.alloc_extend(T(prefix), T(seq), T(last), False, prefix_lens_cpu=prefix, seq_lens_cpu=seq)
        else:
            got = c.alloc_extend(T(prefix), T(seq), T(last), False)
        record(got)
        for i, r in zip(few, grown([reqs[i] for i in few], prefix, seq, got)):
            reqs[i] = r

    def decode(mode):
        seq = [len(r) + 1 for r in reqs]
        last = [r[-1] for r in reqs]
        if mode == "checked":
            got = c.alloc_decode(seq, last, seq_lens_cpu=seq)
        elif mode == "host":
            got = c.alloc_decode(T(seq), T(last), False, seq_lens_cpu=seq)
        else:
            got = c.alloc_decode(T(seq), T(last), False)
        record(got)
        for r, t in zip(reqs, got.tolist()):
            r.append(t)

    for mode in ("checked", "trusted", "host"):
        decode(mode)

    freed = [0] * len(reqs)  # each request's window end so far

    def window(steps):
        """The first 12 requests' next window pages (0 to ``steps`` each), never
        a request's last page (a free_live of BIG tokens is the arena tests')."""
        toks = []
        for i, r in enumerate(reqs[:12]):
            upto = min(freed[i] + ps * rng.randint(0, steps), (len(r) - 1) // ps * ps)
            if upto > freed[i]:
                toks += r[freed[i] : upto]
                freed[i] = upto
        return toks

    if x.kind in SWA_KINDS:
        # trusted, num_live given: all live and distinct (count == len), then mixed
        toks = window(2)
        c.free_swa(T(toks), 0, False, num_live=len(toks) // ps)
        record(None)
        stale = toks[: 2 * ps]
        toks = window(2)
        toks = toks + [-1] * ps + toks[:ps] + stale + list(range(ps))  # repeats, padding, dead, the sink
        c.free_swa(T(toks), 0, False, num_live=swa_count(x.arena, toks, ps))
        record(None)
        c.free_swa(T(window(1) + stale), 0, False)  # trusted, counted on the device
        record(None)
        toks = window(1) + stale
        c.free_swa(toks, 0, num_live=swa_count(x.arena, toks, ps))  # checked
        record(None)
        c.free_swa(window(1) + [-1] * ps, 0)
        record(None)
    flat = [t for r in reqs for t in r]
    record(c.translate(T(flat + [-1]), check=False))
    record(c.translate(T(flat[:5] + [-1, 0, 10**9, -4])))
    if x.kind in SWA_KINDS:
        record(c.translate(T(flat + [-1]), "swa", check=False))
    if x.states is not None:
        record(c.translate(torch.cat([x.states, T([-1, 0])]), "state", check=False))
        record(c.translate([*x.states.tolist(), -1], "state"))
    c.free(reqs.pop(0))  # a cold free: the arena's fused free
    freed.pop(0)
    record(None)
    decode("host")  # binds reuse its holes
    # a forward in flight: its pages pinned while requests free, decode and leave
    c.launch(T([t for r in reqs[:4] for t in r]), check=False)
    decode("host")
    if x.kind in SWA_KINDS:
        toks = window(2)
        c.free_swa(T(toks), 0, False, num_live=swa_count(x.arena, toks, ps))
        record(None)
    c.free(reqs.pop(0))  # freed pins stay pinned (checked in flight: counted)
    freed.pop(0)
    record(None)
    decode("trusted")
    c.settle()
    decode("trusted")
    fill(x.arena, salt=2)
    return out


# past a block, lazy only: the launches are those of an eager run
COMPOSITE_CASES = [
    (kind, ps, n, lazy)
    for kind in ("hybrid", "tri", "mamba")
    for ps in PAGE_SIZES
    for n in BATCHES
    for lazy in (False, True)
    if n == 1 or lazy
]


@needs_triton
@pytest.mark.parametrize(("kind", "ps", "n", "lazy"), COMPOSITE_CASES)
def test_composite_calls_match_torch(kind, ps, n, lazy):
    """``alloc_extend`` (checked, trusted with and without host copies),
    ``alloc_decode`` (checked, trusted with and without ``seq_lens_cpu``),
    ``free_swa`` (``num_live`` given, equal to the representatives or not,
    and not given; trusted and checked), ``translate`` of every pool, the
    cold ``free``, and all of it again with a forward in flight."""
    launched = {"extend_kernel", "decode_kernel", "translate_kernel"}
    if lazy or kind == "tri":  # an eager END's free compacts with torch; tri's swa is a float
        launched.add("free_kernel")
    if kind == "tri" or (kind == "hybrid" and lazy):
        launched.add("free_live_kernel")
    assert_same(composite_case(kind, ps, lazy, n), composite_script, launched)


@needs_triton
@pytest.mark.parametrize(("kind", "ps"), [("hybrid", 4), ("tri", 1)])
def test_a_small_composite_cycling_its_ring_matches_torch(kind, ps):
    """Requests come (a trusted extend), decode and leave in a small
    composite, the full pool's free-id ring wrapping around; then an extend
    and a decode whose ids cross the ring's end (the kernels read a bound
    page's id back from it)."""

    def build():
        c = make(impl, kind, ps, pages=48, lazy=True, kernels="torch")
        return SimpleNamespace(arena=c.arena, c=c)

    def script(x):
        c, rng, reqs, out = x.c, random.Random(9), [], []
        ring = x.arena.bands["full"].free_ids

        def extend(lens):
            zeros = [0] * len(lens)
            got = c.alloc_extend(
                T(zeros), T(lens), T([-1] * len(lens)), False, prefix_lens_cpu=zeros, seq_lens_cpu=lens
            )
            out.append(got)
            return [] if got is None else grown([[] for _ in lens], zeros, lens, got)

        def decode():
            seq = [len(r) + 1 for r in reqs]
            got = c.alloc_decode(T(seq), T([r[-1] for r in reqs]), False, seq_lens_cpu=seq)
            out.append(got)
            for r, t in zip(reqs, [] if got is None else got.tolist()):
                r.append(t)

        def walk():  # the ring's head to two ids short of its end, by requests that come and go
            while gap := (ring.cap - ring.head - 2) % ring.cap:
                c.free([t for r in extend([min(gap, 8) * ps]) for t in r])
            out.append(x.arena.snapshot())

        for _ in range(24):
            while len(reqs) > 6 or (reqs and rng.random() < 0.3):
                c.free(reqs.pop(rng.randrange(len(reqs))))
            reqs += extend([rng.randint(1, 3 * ps) for _ in range(rng.randint(1, 3))])
            if reqs:
                decode()
            out.append(x.arena.snapshot())
        while reqs:
            c.free(reqs.pop())
        walk()
        reqs += extend([ps] * 4)  # four full pages, their ids from cap - 2 on: across the end
        assert len(reqs) == 4 and ring.head == 2
        walk()
        decode()  # the four open a page each, their ids across the end again
        assert ring.head == 2
        out.append(x.arena.snapshot())
        return out

    assert_same(build, script, {"extend_kernel", "decode_kernel", "free_kernel"})


@needs_triton
@pytest.mark.parametrize("host_copies", [False, True])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_trusted_run_matches_torch(kind, lazy, host_copies):
    """``tests/impl/test_host_sync.py``'s trusted decode steps, every output and state."""
    steps = 12

    def build():
        c, step = trusted_run(kind, lazy, steps=steps, host_copies=host_copies)
        return SimpleNamespace(arena=c.arena, step=step)

    def script(x):
        return [[x.step(), x.arena.snapshot()] for _ in range(steps)]

    launched = {"decode_kernel", "translate_kernel"}
    if host_copies and (kind == "tri" or (kind == "hybrid" and lazy)):  # an eager END's free compacts with torch
        launched.add("free_live_kernel")
    assert_same(build, script, launched)


# An extend of no request, in a process of its own: it reads out of bounds (a
# segmentation fault under the interpreter, an illegal address on CUDA).
EMPTY_EXTEND = """
import sys, torch
from kvarena.impl import HybridSWA, kernels
dev = "cuda" if torch.cuda.is_available() and not kernels.interpreting() else "cpu"
out = []
for k in ("torch", "triton"):
    c = HybridSWA(1 << 16, 64, 32, page_size=4, lazy=True, device=dev, kernels=k)
    e = torch.empty(0, dtype=torch.int64, device=dev)
    out.append([c.alloc_extend(e, e, e, False).tolist(), c.alloc_extend([], [], []).tolist(), c.snapshot()])
assert out[0] == out[1], out
print("same")
"""


@needs_triton
def test_an_extend_of_no_request_matches_torch():
    run = subprocess.run([sys.executable, "-c", EMPTY_EXTEND], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "same", (run.returncode, run.stderr[-2000:])


@needs_triton
def test_translate_of_int32_ids_is_int64():
    def build():
        a = small_arena(kernels="torch")
        a.alloc("U", 5)
        return SimpleNamespace(arena=a)

    assert_same(build, lambda x: x.arena.translate("U", T([1, 2, -1, 0, 99]).to(torch.int32)), {"translate_kernel"})


# ------------------------------------------------- a planted off-by-one


def planted_source(old, new):
    """``impl/triton_kernels.py``'s source with the one match of the regular
    expression ``old`` made ``new``."""
    src, count = re.subn(old, new, Path(inspect.getfile(kernels._triton())).read_text())
    assert count == 1, f"plant site {old!r} matches {count} times"
    return src


def planted(tmp_path, old, new, name="planted_kernels"):
    """``impl/triton_kernels.py`` with ``old`` (a regular expression, once in it) made ``new``, as a module."""
    path = tmp_path / f"{name}.py"
    path.write_text(planted_source(old, new))
    spec = importlib.util.spec_from_file_location(f"{name}_{tmp_path.name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def decode_only(n):
    """``n`` requests of varied lengths (some open a page at the next decode
    in each block), then one trusted decode step."""

    def build():
        c = make(impl, "hybrid", 4, pages=1024, lazy=True, kernels="torch")
        lens = [1 + (7 * i) % 9 for i in range(n)]
        out = c.alloc_extend([0] * n, lens, [-1] * n)
        return SimpleNamespace(arena=c.arena, c=c, lens=lens, last=out[torch.cumsum(T(lens), 0) - 1])

    def script(x):
        seq = T(x.lens) + 1
        return x.c.alloc_decode(seq, x.last, False, seq_lens_cpu=seq.tolist())

    return build, script


def extend_only(n):
    """``n`` requests, then one extend continuing each."""

    def build():
        c = make(impl, "tri", 4, pages=2048, lazy=True, kernels="torch")
        lens = [1 + (5 * i) % 11 for i in range(n)]
        out = c.alloc_extend([0] * n, lens, [-1] * n)
        return SimpleNamespace(arena=c.arena, c=c, lens=lens, last=out[torch.cumsum(T(lens), 0) - 1].tolist())

    def script(x):
        seq = [p + 1 + i % 6 for i, p in enumerate(x.lens)]
        return x.c.alloc_extend(x.lens, seq, x.last)

    return build, script


def arena_script(call):
    """One arena call on ``arena_case(4, 2, lazy=True, flight=True)``."""

    def script(x):
        a, rng = x.arena, random.Random(3)
        if call == "alloc":
            return a.alloc("full", 4)
        if call == "free":
            a.free("F", live(a, "F")[:3], check=False)  # pinned: the forward holds all of F
            return None
        if call == "free_live":
            ids = live(a, "swa")[:2]
            a.free_live("swa", T([-1, *tokens_of(ids, 4, rng), -1]), 4, len(ids))
            return None
        ids = live(a, "full")[:2] + dead(a, "full")[:2] + [-1]
        return a.slots("full", T([*tokens_of(ids, 4, rng), 1, 3]), 4)  # 1, 3: the sink's page

    return arena_case(4, 2, True, flight=True), script


# Each plant: a regular expression matching one place in the kernels' source, its
# replacement, and a scenario on which the twins must then differ.
PLANTS = {
    # the ring's k-th id: one past it
    "bind ring": (
        r"vid = tl\.load\(q \+ \(q_head \+ k\) % q_cap, mask=m,",
        "vid = tl.load(q + (q_head + k + 1) % q_cap, mask=m,",
        arena_script("alloc"),
    ),
    # the openers of the blocks before: one block short (seen only past one block)
    "decode blocks": (r"for j in range\((0, )?pid\):", "for j in range(0, pid - 1):", decode_only(BIG)),
    # an extend's sums over the requests before it: one request short
    "extend prefix": (r"earlier = other < r\b", "earlier = other < r - 1", extend_only(5)),
    # ... over blocks of requests: one block short for request BLOCK + 1 only
    "extend blocks": (r"tl\.cdiv\(r, BLOCK\)", "tl.cdiv(r, BLOCK + 1)", extend_only(BIG)),
    # a freed pin pinned as FREED - 1 (unpinned) rather than FREED
    "free pin": (r"tl\.minimum\(old, FREED\)", "tl.minimum(old, FREED - 1)", arena_script("free")),
    # the sink's row (0) taken for live
    "free_live sink": (
        r"live = tl\.load\(v2p \+ vid, mask=m, other=0\) > 0",
        "live = tl.load(v2p + vid, mask=m, other=0) > -1",
        arena_script("free_live"),
    ),
    # the sink's row (page 0) translated rather than giving 0
    "translate sink": (r"slot = tl\.where\(phys > 0,", "slot = tl.where(phys > -1,", arena_script("slots")),
}


@needs_triton
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_off_by_one_is_caught(monkeypatch, tmp_path, plant):
    """The comparison can fail: with one kernel of ``impl/triton_kernels.py``
    one off (a copy of the module, loaded in its place), the twins differ."""
    old, new, (build, script) = PLANTS[plant]
    assert_same(build, script, set())  # the real kernels agree
    mod = planted(tmp_path, old, new)
    monkeypatch.setattr(kernels, "_triton", lambda: mod)
    ran = []
    with kernels.wrapped(lambda kernel, go: (ran.append(kernel), go())):
        diffs, _ = differences(build, script)
    assert ran and all(k in vars(mod).values() for k in ran), "the planted kernels did not run"
    assert diffs, f"plant {plant!r} went unnoticed"


@needs_triton
def test_the_decode_plant_needs_a_batch_past_one_block(monkeypatch, tmp_path):
    """Why the batches go past ``BLOCK``: the planted skip of block 0's
    openers changes nothing until a second program runs."""
    old, new, _ = PLANTS["decode blocks"]
    mod = planted(tmp_path, old, new)
    monkeypatch.setattr(kernels, "_triton", lambda: mod)
    assert differences(*decode_only(kernels.BLOCK))[0] == []
    assert differences(*decode_only(BIG))[0] != []


# ------------------------------------------------------ choice and errors


def small_arena(**kw):
    return Arena(4096, [SubPool("U", 8, 4, "up"), SubPool("D", 8, 4, "down")], **kw)


def test_an_unknown_choice_is_a_value_error():
    for bad in ("cuda?", "Triton", ""):
        with pytest.raises(ValueError, match="kernels must be one of torch, triton"):
            kernels.choose(bad, CPU)
    with pytest.raises(ValueError, match="'bogus'"):
        small_arena(kernels="bogus")
    with pytest.raises(ValueError, match="'bogus'"):
        make(impl, "tri", 4, kernels="bogus")
    a = small_arena()
    with pytest.raises(ValueError, match="'bogus'"):
        a.kernels = "bogus"
    assert a.kernels == "torch"


def test_torch_is_the_default_on_the_cpu():
    assert kernels.choose(None, CPU) == "torch"
    assert small_arena().kernels == "torch"
    for kind in ("hybrid", "mamba", "tri"):
        assert make(impl, kind, 4).arena.kernels == "torch"
    assert small_arena(kernels="torch").kernels == "torch"


@needs_triton
def test_triton_runs_on_the_cpu_under_its_interpreter():
    assert kernels.interpreting()
    assert kernels.unavailable(CPU) is None
    assert kernels.choose("triton", CPU) == "triton"
    a = small_arena(kernels="triton")
    assert a.kernels == "triton"
    a.kernels = "torch"
    assert a.kernels == "torch"
    a.kernels = "triton"
    with recording() as names:
        ids = a.alloc("U", 3)
    assert names == ["bind_kernel"] and ids.tolist() == [1, 2, 3]
    assert make(impl, "hybrid", 4, kernels="triton").arena.kernels == "triton"
    # the interpreter runs CPU tensors only: CUDA's default stays torch, an explicit Triton is refused
    cuda = torch.device("cuda")
    assert "TRITON_INTERPRET" in kernels.unavailable(cuda)
    assert kernels.choose(None, cuda) == "torch"
    with pytest.raises(ValueError, match="interpreter"):
        kernels.choose("triton", cuda)
    with pytest.raises(ValueError, match="not meta"):
        kernels.choose("triton", torch.device("meta"))


def test_without_triton_the_choice_says_why(monkeypatch):
    """Where ``triton`` does not import, ``unavailable`` gives the reason, torch is
    the default, and asking for Triton is a ValueError carrying it."""
    package = importlib.import_module(kernels.__package__)
    try:
        monkeypatch.setitem(sys.modules, "kvarena.impl.triton_kernels", None)  # import fails
        monkeypatch.delattr(package, "triton_kernels", raising=False)
        kernels._triton.cache_clear()
        why = kernels.unavailable(CPU)
        assert why is not None and why.startswith("Triton is not installed")
        assert kernels.unavailable(torch.device("cuda")) == why
        assert not kernels.interpreting()
        assert kernels.choose(None, CPU) == "torch"
        with pytest.raises(ValueError, match="Triton is not installed"):
            kernels.choose("triton", CPU)
        with pytest.raises(ValueError, match="Triton is not installed"):
            small_arena(kernels="triton")
        assert small_arena().kernels == "torch"
    finally:
        monkeypatch.undo()
        kernels._triton.cache_clear()
    assert kernels.unavailable(CPU) == WHY


def test_interpret_without_cuda_keeps_an_explicit_setting(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the interpreter stays off")
    monkeypatch.delitem(sys.modules, "triton", raising=False)  # as before anything imported it
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernels.interpret_without_cuda()
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernels.interpret_without_cuda()
    assert os.environ["TRITON_INTERPRET"] == "0"


# --------------------------------------------------------- all or nothing


def fail_launch(monkeypatch, at):
    """Make the ``at``-th kernel launch from now raise (the others run)."""
    real, seen = kernels.launch, []

    def launch(kernel, grid, *args, **consts):
        seen.append(kernel.fn.__name__)
        if len(seen) == at:
            raise RuntimeError(f"planted launch failure: {kernel.fn.__name__}")
        real(kernel, grid, *args, **consts)

    monkeypatch.setattr(kernels, "launch", launch)
    return seen


def failing_calls():
    """(name, build, call, launch to fail): each call on its built object."""
    arena = arena_case(4, 3, True, flight=True)
    cases = [
        ("alloc", arena, lambda x: x.arena.alloc("full", 6), 1),
        ("bind_with_borrowers", arena, lambda x: x.arena.bind_with_borrowers("full", 6), 1),
        ("bind_with_borrowers, second borrower", arena, lambda x: x.arena.bind_with_borrowers("full", 6), 2),
        ("free", arena, lambda x: x.arena.free("D", live(x.arena, "D")[-3:], check=False), 1),
        ("free checked", arena, lambda x: x.arena.free("swa", live(x.arena, "swa")[:3]), 1),
        (
            "free_live",
            arena,
            lambda x: x.arena.free_live("swa", T([-1, *[4 * v + 1 for v in live(x.arena, "swa")[:3]], 0]), 4, 3),
            1,
        ),
    ]
    comp = composite_case("tri", 4, True, 5)

    def decode(x):
        seq = [len(r) + 1 for r in x.reqs]
        return x.c.alloc_decode(T(seq), T([r[-1] for r in x.reqs]), False, seq_lens_cpu=seq)

    def extend(x):
        prefix = [len(r) for r in x.reqs]
        return x.c.alloc_extend(prefix, [p + 5 for p in prefix], [r[-1] for r in x.reqs])

    def free_swa(x):
        toks = [t for r in x.reqs for t in r[: (len(r) - 1) // 4 * 4]]
        return x.c.free_swa(T(toks), 0, False, num_live=swa_count(x.arena, toks, 4))

    cases += [("alloc_decode", comp, decode, 1), ("alloc_extend", comp, extend, 1), ("free_swa", comp, free_swa, 1)]
    return cases


@needs_triton
@pytest.mark.parametrize("case", failing_calls(), ids=lambda c: c[0] if isinstance(c, tuple) else None)
def test_a_failed_launch_changes_nothing(monkeypatch, case):
    """A launch that raises leaves the state, the bytes and ``verify()`` as
    the call found them (the journal restores the host fields, and a call
    registers its undo only once its launch ran); the same call then runs
    as the torch one does."""
    _, build, call, at = case

    def script(x):
        if x.arena.kernels == "triton":
            before, data = x.arena.snapshot(), x.arena.buffer.clone()
            with monkeypatch.context() as m:
                seen = fail_launch(m, at)
                with pytest.raises(RuntimeError, match="planted launch failure"):
                    call(x)
            assert len(seen) == at, seen
            assert x.arena.snapshot() == before
            assert torch.equal(x.arena.buffer, data)
            x.arena.verify()
        return call(x)

    assert_same(build, script, set())


@needs_triton
def test_the_failed_launch_check_sees_a_missing_rollback(monkeypatch):
    """The check above can fail: without the journal's rollback, a decode whose
    launch failed leaves the host's counters moved (its ids taken off the ring)."""
    from kvarena.impl import journal

    _, build, call, at = next(c for c in failing_calls() if c[0] == "alloc_decode")
    x = build()
    x.arena.kernels = "triton"
    before = x.arena.snapshot()
    monkeypatch.setattr(journal.Journal, "rollback", lambda self: None)
    fail_launch(monkeypatch, at)
    with pytest.raises(RuntimeError, match="planted launch failure"):
        call(x)
    assert x.arena.snapshot() != before


# -------------------------------------------------- compiled for sm_90


def _compiler_missing():
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
        from triton.runtime.jit import mangle_type  # noqa: F401
    except ImportError as e:
        return f"Triton's compiler does not import: {e}"
    return None


NO_COMPILER = _compiler_missing()
needs_compiler = pytest.mark.skipif(NO_COMPILER is not None, reason=str(NO_COMPILER))

# Each constexpr combination the launchers use (BLOCK and FREED are fixed).  A
# free's HOLES is always True (an eager END, the one free without holes,
# compacts with torch); the False half is compiled too ("spare" below).
FLAGS = [{"QUEUE": q, "GUARD": g} for q in (True, False) for g in (True, False)]
COMBOS = (
    [("bind_kernel", {"BORROW": b}) for b in (True, False)]
    + [("decode_kernel", {"BORROW": b}) for b in (True, False)]
    + [("extend_kernel", {"BORROW": b}) for b in (True, False)]
    + [("free_kernel", {**f, "HOLES": True}) for f in FLAGS]
    + [("free_live_kernel", {**f, "HOLES": True, "WIDTH": w}) for w in (16, 256) for f in FLAGS]
    + [("translate_kernel", {})]
    + [("move_kernel", {})]
)
FIXED = {"BLOCK": kernels.BLOCK, "FREED": 0, "CHUNK": kernels.MOVE_CHUNK}
# Compiled: all but two of the wide sorts (their flags are the narrow ones', 1.3 s each to compile).
COMPILED = [(n, c) for n, c in COMBOS if c.get("WIDTH") != 256 or c["QUEUE"] == c["GUARD"]]


def key(name, consts):
    return name, tuple(sorted((k, v) for k, v in consts.items() if k not in FIXED))


def record_launches():
    """Every launch of a run through each combination, with its arguments'
    types as the JIT would see them (``mangle_type``: a tensor ``*i64``, an
    int ``i32`` or ``i64``) and its constexprs: ``{key: (signature, constexprs)}``."""
    from triton.runtime.jit import mangle_type

    seen = {}
    real = kernels.launch

    def launch(kernel, grid, *args, **consts):
        names = list(inspect.signature(kernel.fn).parameters)
        sig = {n: mangle_type(a) for n, a in zip(names, args)}
        sig |= dict.fromkeys(consts, "constexpr")
        assert list(sig) == names, (kernel.fn.__name__, list(sig), names)
        seen.setdefault(key(kernel.fn.__name__, consts), (sig, consts))
        real(kernel, grid, *args, **consts)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "launch", launch)
        for flight in (False, True):
            a = arena_case(4, 8, True, flight)().arena
            a.kernels = "triton"
            ids = a.alloc("full", 3)
            a.alloc("swa", 3, ids=ids, check=False)
            a.bind_with_borrowers("full", 2)
            both = live(a, "swa")[:10]
            for name in ("swa", "swa2", "full"):  # 5 tokens (WIDTH 16), then 5 ids among BIG tokens (WIDTH 256)
                a.free_live(name, T([4 * v for v in both[:5]]), 4, 5)
                a.free_live(name, T([4 * v + 3 for v in both[5:]] + [-1] * BIG), 4, 5)
            a.free("swa", live(a, "swa")[:2], check=False)
            a.free("swa2", live(a, "swa2")[:2])
            a.free("full", sorted(set(live(a, "full")) - set(live(a, "swa")) - set(live(a, "swa2")))[:2])
            a.translate("full", ids)
            lo, _ = a.frontiers("F")
            assert a.make_room("F", "low", lo - a.below("F") + 3 * a.geometry("F").epp)  # a slide: the move
        for kind in ("hybrid", "mamba"):
            x = composite_case(kind, 4, True, 1)()
            x.arena.kernels = "triton"
            composite_script(x)
    return seen


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The launches recorded, and what compiling each (and the spare and
    planted kernels) for sm_90 gave, in one fresh process with Triton's
    interpreter off: ``(recorded, {job id: "ok" or the error})``.

    A process of its own, since under ``TRITON_INTERPRET=1`` Triton's own
    library (``tl.sum``, ``tl.cdiv``, ...) was made of interpreted
    functions when ``triton`` was imported, and the compiler cannot call them."""
    recorded = record_launches()
    here = str(Path(inspect.getfile(kernels._triton())))
    jobs = []
    wanted = {key(n, c) for n, c in COMPILED}
    for k, (sig, consts) in recorded.items():
        if k not in wanted:
            continue
        jobs.append({"id": repr(k), "file": here, "kernel": k[0], "signature": sig, "constexprs": consts})
        if k[0] in ("free_kernel", "free_live_kernel") and consts.get("WIDTH", 16) == 16:
            spare = {**consts, "HOLES": False}
            jobs.append({**jobs[-1], "id": repr(key(k[0], spare)), "constexprs": spare})
    for k in {k[0]: k for k in reversed(recorded) if k in wanted}.values():  # one of each, every int an i64
        sig, consts = recorded[k]
        wide = {n: "i64" if t == "i32" else t for n, t in sig.items()}
        jobs.append({"id": f"{k!r} i64", "file": here, "kernel": k[0], "signature": wide, "constexprs": consts})
    folder = tmp_path_factory.mktemp("plants")
    typo = planted_source(r"tl\.store\(slots_out \+ i, slot,", "tl.store(slots_out + v2p, slot,")  # pointer + pointer
    (folder / "typo.py").write_text(typo)
    (folder / "tiny.py").write_text(TINY)
    sig, consts = recorded[key("translate_kernel", {})]
    jobs.append({"id": "typo", "file": str(folder / "typo.py"), "kernel": "translate_kernel", "signature": sig})
    jobs[-1]["constexprs"] = consts
    tiny = {"p": "*i64", "q": "*i64", "n": "i32", "BLOCK": "constexpr"}
    for name in ("tiny", "tiny_typo"):
        jobs.append({"id": name, "file": str(folder / "tiny.py"), "kernel": name, "signature": tiny})
        jobs[-1]["constexprs"] = {"BLOCK": 64}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(jobs), capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return recorded, json.loads(run.stdout.strip().splitlines()[-1])


TINY = """
import triton
import triton.language as tl


@triton.jit
def tiny(p, q, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(q + i, tl.load(p + i, mask=i < n), mask=i < n)


@triton.jit
def tiny_typo(p, q, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(q + p, tl.load(p + i, mask=i < n), mask=i < n)
"""

# Compiles each job of stdin's JSON for sm_90 and prints {id: "ok" or the error} as its last line.
CHILD = """
import importlib.util, json, sys, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

mods, out = {}, {}
for job in json.load(sys.stdin):
    f = job["file"]
    if f not in mods:
        spec = importlib.util.spec_from_file_location(f"compiled_{len(mods)}", f)
        mods[f] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[f])
    fn = getattr(mods[f], job["kernel"])
    try:
        assert isinstance(fn, JITFunction), type(fn)
        src = ASTSource(fn=fn, signature=job["signature"], constexprs=job["constexprs"])
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        out[job["id"]] = "ok" if k.asm.get("cubin") else "no cubin"
    except Exception as e:
        out[job["id"]] = f"{type(e).__name__}: {str(e)[-600:]}"
print()
print(json.dumps(out))
"""


@needs_triton
@needs_compiler
def test_the_launchers_use_exactly_the_listed_combinations(compiled):
    """``COMBOS`` is what the launchers pass: no combination missing, none unlisted."""
    recorded, _ = compiled
    assert set(recorded) == {key(n, c) for n, c in COMBOS}
    for (name, _), (_, consts) in recorded.items():
        assert {k: v for k, v in consts.items() if k in FIXED} == {k: v for k, v in FIXED.items() if k in consts}, name


@needs_triton
@needs_compiler
@pytest.mark.parametrize(("name", "consts"), COMPILED + [("free_kernel", {**f, "HOLES": False}) for f in FLAGS])
def test_every_kernel_compiles_for_sm90(compiled, name, consts):
    """To a cubin for sm_90 (an H100/H200), with the argument types a real launch has."""
    _, results = compiled
    k = key(name, consts)
    assert results.get(repr(k)) == "ok", results.get(repr(k), f"{k} was not compiled")


@needs_triton
@needs_compiler
def test_free_live_without_holes_and_ints_as_i64_compile(compiled):
    """The spare combinations, and each kernel with every int argument an i64 (a huge arena's)."""
    _, results = compiled
    spare = [k for k in results if "'HOLES', False" in k]
    assert len(spare) == 8, spare
    wide = [k for k in results if k.endswith(" i64")]
    assert len(wide) == 7, wide  # one a kernel
    assert all(results[k] == "ok" for k in spare + wide), {k: results[k] for k in spare + wide}


@needs_triton
@needs_compiler
def test_a_planted_type_error_does_not_compile(compiled):
    """The check can fail: a pointer added to a pointer, in a tiny kernel and in ``translate_kernel``."""
    _, results = compiled
    assert results["tiny"] == "ok"
    assert results["tiny_typo"].startswith("CompilationError"), results["tiny_typo"]
    assert results["typo"].startswith("CompilationError"), results["typo"]


@needs_triton
@pytest.mark.parametrize("choice", kernels.KERNELS)
def test_free_live_refuses_a_bad_count_or_page_size_and_changes_nothing(choice):
    a = small_arena(kernels=choice)
    ids = a.alloc("U", 4)
    before = a.snapshot()
    for count, ps in ((5, 1), (-1, 1), (2, 0), (True, 1)):
        with pytest.raises(ValueError, match="pool 'U'"):
            a.free_live("U", ids, ps, count)
        assert a.snapshot() == before
    a.free_live("U", ids, 1, 4)  # the good call still frees them all
    assert a.live_pages("U") == 0
