"""No host sync on the decode path: ``alloc`` (also binding borrowed ids
with ``check=False``), ``bind_with_borrowers`` and ``v2p_at`` (the
composites bind and read through them), ``free(check=False)`` and
``translate``; and the composites' trusted decode step (``check=False``)
makes only its documented reads, as does the checked per-step path
(``alloc_decode``, ``free_swa``, ``translate``): one host read each in the
first two, through ``_host_read``, none in ``translate``.

Two independent checks: an AST scan of the path's source (every impl helper
it calls is followed, so a new helper cannot hide a sync; the composites'
hot methods are named), and a run of the path with the sync-forcing tensor
methods poisoned.  A self-test proves the
scan catches a planted offender.  On CUDA, tools/cuda_checks.sh runs the same
path under ``torch.cuda.set_sync_debug_mode("error")``.
"""

import ast
import contextlib
import inspect
import sys
import textwrap

import pytest
import torch

from kvarena import impl
from kvarena.impl import Arena, HybridSWA, MambaHybrid, SubPool, TriPool, composites
from kvarena.impl import arena as arena_mod
from kvarena.impl import band as band_mod
from kvarena.verification.differential import kernel_choices
from tests.api.test_composites import PAGE_SIZES, SWA_KINDS, check, make

# Entry points of the sync-free path.
ROOTS = [
    ("Arena", "alloc"),
    ("Arena", "bind_with_borrowers"),
    ("Arena", "v2p_at"),
    ("Arena", "free"),
    ("Arena", "translate"),
    ("Arena", "slots"),
    ("Arena", "free_live"),
    ("Arena", "launch"),  # the engine's step launches a forward (docs/design.md §12)
    ("Arena", "settle"),
]
# Helpers the path may call that do sync, each for a documented reason.
EXEMPT = {
    "_checked": "alloc/free(check=True) validation: a documented host read, skipped by check=False",
    "_host_ids": "ids given as a host sequence are on the host already; a tensor never takes this path",
    "_move_bytes_with_mover": "a lent arena's overlapping moves (flush, make_room, compact_holes: cold paths); "
    "eager compaction on the decode path passes disjoint=True and never calls it",
    "_move_shape": "a cold move's shape (flush, make_room, compact_holes, repack), read once; "
    "eager compaction on the decode path passes a SrcRun and never calls it",
    "_launch_ids": "launch(check=True) validation: a documented host read, skipped by check=False",
    "_pins_among": "free(check=True) while in flight counts the pins it frees; check=False never calls it",
    "_parks_guarded": "a float's last page freed while in flight, with something of it guarded (it settles if "
    "a hole or a freed page is): one read, only then",
    "_recount_guarded": "an alloc in flight that reaches holes freed unchecked in this flight, and the cold "
    "paths (flush, make_room, compact_holes, repack): one read of the guarded holes' count",
}
SYNC_ATTRS = {
    "item",
    "tolist",
    "cpu",
    "nonzero",
    "numpy",
    "unique",
    "unique_consecutive",
    "masked_select",
    "any",
    "all",
}
SYNC_BUILTINS = {"int", "bool", "float"}  # on a tensor each reads it back; flagged conservatively
CLASSES = {"Arena": arena_mod.Arena, "Band": band_mod.Band, "FreeIds": band_mod.FreeIds}


def _mask_names(fn):
    """Names bound to a comparison or boolean combination (likely bool tensors)."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and _is_mask(node.value, names):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_mask(expr, names):
    if isinstance(expr, ast.Compare):
        return True
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.Invert, ast.Not)):
        return True
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        return _is_mask(expr.left, names) or _is_mask(expr.right, names)
    return isinstance(expr, ast.Name) and expr.id in names


def scan_source(src, where="<source>"):
    """Offences in ``src``: (where, line, what).  Also returns called method names."""
    tree = ast.parse(textwrap.dedent(src))
    offences, calls = [], set()
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        masks = _mask_names(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute):
                    calls.add(f.attr)
                    if f.attr in SYNC_ATTRS:
                        offences.append((where, node.lineno, f".{f.attr}()"))
                elif (
                    isinstance(f, ast.Name)
                    and f.id in SYNC_BUILTINS
                    and node.args
                    and not isinstance(node.args[0], ast.Constant)
                ):
                    offences.append((where, node.lineno, f"{f.id}(...)"))
            if isinstance(node, ast.Subscript) and _is_mask(node.slice, masks):
                offences.append((where, node.lineno, "boolean-mask indexing"))
            if (
                isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert))
                and _is_mask(node.test, masks)
                and isinstance(node.test, ast.Name)
            ):
                offences.append((where, node.lineno, "branch on a mask"))
    return offences, calls


def _methods():
    out = {}
    for cname, cls in CLASSES.items():
        for name, member in vars(cls).items():
            fn = member.fget if isinstance(member, property) else member
            if inspect.isfunction(fn):
                out.setdefault(name, []).append((f"{cname}.{name}", inspect.getsource(fn)))
    return out


def scan_path(methods=None):
    """Scan the roots and every impl method they reach (by name), minus EXEMPT."""
    methods = methods or _methods()
    todo = [name for _, name in ROOTS]
    seen, offences = set(), []
    while todo:
        name = todo.pop()
        if name in seen or name in EXEMPT:
            continue
        seen.add(name)
        for where, src in methods.get(name, []):
            found, calls = scan_source(src, where)
            offences += found
            todo += [c for c in calls if c in methods]
    return offences, seen


def test_decode_path_has_no_host_sync():
    offences, seen = scan_path()
    assert {
        "alloc",
        "bind_with_borrowers",
        "v2p_at",
        "_bind",
        "free",
        "translate",
        "_compact_eager",
        "_move",
        "put",
        "take",
        "remove",
        "_extend",
        "available_pages",
        "_view",
        "_take",
        "_bind_fused",
        "_free_fused",
        "_fuses_free",
        "free_live",
        "slots",
        "advance",
        "claim",
        "hole_run",
        "_skips_guards",
        "_take_unguarded",
        "_free_in_flight",
        "_pin",
        "_keep_flight",
    } <= seen  # the walk reached the helpers
    assert not offences, offences


@pytest.mark.parametrize(
    "planted",
    [
        "def f(x):\n    return x.item()\n",
        "def f(x):\n    return x.tolist()\n",
        "def f(x):\n    return torch.unique(x)\n",
        "def f(x):\n    return x.cpu()\n",
        "def f(x):\n    return torch.nonzero(x)\n",
        "def f(x):\n    return x[x >= 0]\n",
        "def f(x):\n    keep = (x >= 0) & (x < 5)\n    return x[keep]\n",
        "def f(x):\n    return x[~(x == 3)]\n",
        "def f(x):\n    return int(x[0])\n",
        "def f(x):\n    return bool(x.sum())\n",
    ],
)
def test_scan_catches_planted_offender(planted):
    offences, _ = scan_source(planted)
    assert offences, planted


def test_scan_follows_helpers():
    """A sync planted in a helper the path calls is found through the call walk."""
    methods = _methods()
    where, src = methods["put"][0]
    planted = src.replace("self.count += k", "self.count += int(k.sum())")
    assert planted != src
    methods["put"] = [(where, planted)]
    offences, _ = scan_path(methods)
    assert [w for w, _, _ in offences] == ["FreeIds.put"]


# Helpers that read the engine's host copies: host tensors only (``_host_vec``
# rejects a device tensor), so on a GPU they never sync; on this CPU-only
# poison run they are let through by name.
HOST_COPY_HELPERS = {"_host_extend_size", "_host_decode_pages"}


def _poison(monkeypatch):
    """Every sync-forcing tensor method and function raises until
    ``monkeypatch.undo()``, except inside ``HOST_COPY_HELPERS``."""

    def let_through() -> bool:
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_name in HOST_COPY_HELPERS and f.f_globals.get("__name__") == composites.__name__:
                return True
            if f.f_globals.get("__name__", "").startswith("triton."):  # its interpreter, not a device's sync
                return True
            f = f.f_back
        return False

    def poisoned(owner, attr):
        real = getattr(owner, attr)

        def call(*a, **k):
            if let_through():
                return real(*a, **k)
            raise AssertionError("host sync on the decode path")

        monkeypatch.setattr(owner, attr, call)

    getitem = torch.Tensor.__getitem__

    def masked(self, index):
        """A boolean mask's result has a data-dependent shape: on a GPU, a sync."""
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts) and not let_through():
            raise AssertionError("host sync on the decode path (a boolean mask)")
        return getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", masked)

    for attr in (
        "item",
        "tolist",
        "cpu",
        "nonzero",
        "numpy",
        "__bool__",
        "__int__",
        "__index__",
        "__float__",
        "any",
        "all",
    ):
        poisoned(torch.Tensor, attr)
    for attr in ("unique", "nonzero", "masked_select"):
        poisoned(torch, attr)
    for attr in ("unique", "masked_select"):
        poisoned(torch.Tensor, attr)


@contextlib.contextmanager
def cuda_syncs_raise():
    """The CUDA driver raises on any host sync while the block runs."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def counted_read(monkeypatch, reads):
    """Record the size of each documented host read (``_host_read``)."""
    orig = torch.Tensor.tolist  # the real one: _poison replaces the attribute

    def read(t):
        reads.append(t.numel())
        return orig(t)

    monkeypatch.setattr(composites, "_host_read", read)


def lifted_read(monkeypatch, reads):
    """On CUDA: count each documented host read and lift the sync check
    around it (``cuda_syncs_raise``)."""
    orig = composites._host_read

    def read(t):
        reads.append(1)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return orig(t)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(composites, "_host_read", read)


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name", ["U", "F", "D"])
def test_decode_path_runs_with_syncs_poisoned(monkeypatch, lazy, name):
    a = Arena(3000, [SubPool("U", 3, 2, "up"), SubPool("F", 5, 1, "float"), SubPool("D", 4, 4, "down")], lazy=lazy)
    ids = a.alloc(name, 9)
    want = a.translate(name, ids)
    a.write_pages(name, ids, torch.arange(9 * a.geometry(name).epp, dtype=torch.uint8).reshape(9, -1))
    keep = a.read_pages(name, ids[1::2])
    _poison(monkeypatch)
    out = ids.clone()
    a.translate(name, out, out=out)  # aliased out on the poisoned path
    a.free(name, ids[0::2], check=False)
    a.translate(name, ids)
    with pytest.raises(AssertionError, match="host sync"):
        ids.item()  # the poison is live
    monkeypatch.undo()
    assert out.tolist() == want.tolist()
    a.verify()
    assert torch.equal(a.read_pages(name, ids[1::2]), keep)
    _poison(monkeypatch)
    a.free(name, ids[1::2], check=False)  # the last pages: a float parks here
    monkeypatch.undo()
    a.verify()


def borrowing_arena(device="cpu", lazy=False):
    """docs/spec.md's tri-pool geometry with the SWA float on the full END's ids."""
    return Arena(
        1 << 16,
        [SubPool("mamba", 512, 1, "up", "state"), SubPool("swa", 32, 4, "float"), SubPool("full", 64, 4, "down")],
        lazy=lazy,
        borrow={"swa": "full"},
        device=device,
    )


def decode_step(a):
    """One decode step's allocator calls: mint full pages, bind the same ids
    in the borrowing SWA band, translate, and free SWA pages that left the
    window; every call on the sync-free path."""
    ids = a.alloc("full", 6)
    a.alloc("swa", 6, ids=ids, check=False)
    a.translate("swa", ids)
    a.free("swa", ids[:3], check=False)
    return ids


@pytest.mark.parametrize("lazy", [False, True])
def test_borrowed_decode_path_runs_with_syncs_poisoned(monkeypatch, lazy):
    a = borrowing_arena(lazy=lazy)
    a.alloc("full", 2)  # the queue is not at its start
    _poison(monkeypatch)
    ids = decode_step(a)
    monkeypatch.undo()
    a.verify()
    assert a.v2p("swa")[ids[3:]].ge(0).all() and a.v2p("swa")[ids[:3]].eq(-1).all()
    assert a.live_pages("swa") == 3 and a.live_pages("full") == 8


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_borrowed_decode_path_under_cuda_sync_debug_error():
    a = borrowing_arena(device="cuda")
    with cuda_syncs_raise():
        decode_step(a)
    a.verify()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("name", ["U", "F", "D"])
def test_decode_path_under_cuda_sync_debug_error(lazy, name):
    """On CUDA the driver itself reports any sync on the path."""
    a = Arena(
        3000,
        [SubPool("U", 3, 2, "up"), SubPool("F", 5, 1, "float"), SubPool("D", 4, 4, "down")],
        lazy=lazy,
        device="cuda",
    )
    ids = a.alloc(name, 9)
    want = a.translate(name, ids).tolist()
    out = ids.clone()
    with cuda_syncs_raise():
        a.translate(name, out, out=out)
        a.free(name, ids[0::2], check=False)
        a.translate(name, ids)
        a.free(name, ids[1::2], check=False)
    assert out.tolist() == want
    a.verify()


# ------------------------------------------- the composites' trusted step


def trusted_run(kind, lazy, device="cpu", steps=20, host_copies=False):
    """A composite with requests in flight, and a closure running one trusted
    decode step (``alloc_decode`` + ``free_swa`` + ``translate``, all
    ``check=False``) for every request, freeing each window page as it
    leaves (ps 4, window 4).  Sized so that no step runs short (a shortfall's
    relief is a cold path)."""
    ps = 4
    c = make(impl, kind, ps, pages=4096, lazy=lazy, device=device)
    lens = [5, 9, 12]
    reqs = [c.alloc_extend([0], [n], [-1]) for n in lens]
    table = torch.zeros(len(lens), max(lens) + steps + 1, dtype=torch.int64, device=device)
    for i, r in enumerate(reqs):
        table[i, : r.numel()] = r
    state = {
        "seq": torch.tensor(lens, device=device),
        "last": torch.stack([r[-1] for r in reqs]),
        "rows": torch.arange(len(lens), device=device),
        "seq_cpu": torch.tensor(lens),  # the engine's host copy
        "steps": 0,
        "freed": [0] * len(lens),  # each request's window end as freed so far
    }

    def step():
        seq = state["seq"] + 1
        state["seq_cpu"] = state["seq_cpu"] + 1
        state["steps"] += 1
        copy = {"seq_lens_cpu": state["seq_cpu"]} if host_copies else {}
        out = c.alloc_decode(seq, state["last"], check=False, **copy)
        table[state["rows"], seq - 1] = out
        state["seq"], state["last"] = seq, out
        if kind != "mamba":
            # each request's page [end - ps, end) with end = floor_ps(seq - 4 - ps); -1 where none left
            end = torch.div(seq - 4 - ps, ps, rounding_mode="floor") * ps
            cols = torch.clamp(end - ps, min=0).unsqueeze(1) + torch.arange(ps, device=device)
            toks = torch.where((end >= ps).unsqueeze(1), table[state["rows"].unsqueeze(1), cols], -1)
            # the engine's count of window pages: one for each request whose end passed the first page
            # the scheduler's own ints: a request frees a live page when its window end passes a new one
            ends = [(n + state["steps"] - 4 - ps) // ps * ps for n in lens]
            count = {"num_live": sum(e > f for e, f in zip(ends, state["freed"]))} if host_copies else {}
            state["freed"] = [max(e, f) for e, f in zip(ends, state["freed"])]
            c.free_swa(toks.reshape(-1), 0, check=False, **count)
            c.translate(out, "swa", check=False)
        c.translate(out, check=False)
        return out

    return c, step


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_trusted_decode_step_makes_only_its_documented_reads(monkeypatch, kind, lazy):
    """With every sync-forcing tensor method poisoned, a trusted step reads
    the host once in ``alloc_decode`` and once in ``free_swa``, each time
    through ``_host_read`` (counted here), and never in ``translate``."""
    c, step = trusted_run(kind, lazy)
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    for _ in range(12):
        step()
    assert reads == [1, 1] * 12 if kind != "mamba" else reads == [1] * 12
    monkeypatch.undo()
    c.verify()
    live_swa = c.arena.live_pages("swa") if kind != "mamba" else None
    assert live_swa is None or 0 < live_swa < c.arena.live_pages("full")  # window pages were freed


@pytest.mark.parametrize("choice", kernel_choices("cpu"))
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_host_copies_take_every_read_out_of_the_decode_step(monkeypatch, kind, choice):
    """With the engine's host copies (``seq_lens_cpu``, and ``free_swa``'s
    ``num_live``), the trusted step reads nothing back (syncs poisoned), and
    the slots, the states and the bytes are the read-sized step's (on
    torch), on either kernels (docs/design.md §14)."""
    twin, twin_step = trusted_run(kind, True)
    c, step = trusted_run(kind, True, host_copies=True)
    c.arena.kernels = choice
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    got = [step() for _ in range(12)]
    assert reads == []
    monkeypatch.undo()
    assert all(torch.equal(g, twin_step()) for g in got)
    assert c.arena.snapshot() == twin.arena.snapshot()
    assert torch.equal(c.arena.buffer, twin.arena.buffer)
    c.verify()
    assert kind == "mamba" or 0 < c.arena.live_pages("swa") < c.arena.live_pages("full")  # window pages were freed


def overlap_steps(c, step, steps, settle_each):
    """The engine's overlap pattern (docs/design.md §12): launch the forward
    of the step just prepared (``launch(check=False)``), then prepare the
    next one while it is in flight; ``settle_each``: the previous forward
    is waited on before the next launch."""
    outs, last = [], None
    for _ in range(steps):
        if settle_each:
            c.settle()
        if last is not None:
            c.launch(last, check=False)
        last = step()
        outs.append(last)
    return outs


def counting(monkeypatch, owner, name, calls):
    real = getattr(owner, name)

    def call(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, call)


@pytest.mark.parametrize("choice", kernel_choices("cpu"))
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_launch_and_the_trusted_step_with_a_forward_in_flight_read_nothing(monkeypatch, kind, lazy, choice):
    """Settle, launch, then the trusted step with the host copies, every
    step: nothing is read back (syncs poisoned), the in-flight paths ran
    (pins scattered, window frees marking freed pins), and the slots, and
    once settled the state and bytes, are those of the same steps with no
    forward at all."""
    twin, twin_step = trusted_run(kind, lazy, host_copies=True)
    c, step = trusted_run(kind, lazy, host_copies=True)
    c.arena.kernels = choice  # the twin stays on torch
    calls, reads = [], []
    counting(monkeypatch, Arena, "_pin", calls)
    counting(monkeypatch, Arena, "_free_in_flight", calls)
    counting(monkeypatch, Arena, "_free_fused", calls)
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    got = overlap_steps(c, step, 12, settle_each=True)
    assert reads == []
    monkeypatch.undo()
    assert calls.count("_pin") == 11 * (3 if kind == "tri" else 2)  # every pool, every launch but the first
    # a window free while in flight: the torch path's guard marking, or the fused free's (swa lazy, or a float)
    fused = choice == "triton" and (lazy or kind == "tri")
    assert kind == "mamba" or ("_free_fused" if fused else "_free_in_flight") in calls
    assert all(torch.equal(g, twin_step()) for g in got)
    c.verify()
    c.settle()
    assert c.arena.snapshot() == twin.arena.snapshot()
    assert torch.equal(c.arena.buffer, twin.arena.buffer)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_launch_and_the_trusted_step_in_flight_never_sync_on_cuda(kind):
    """The overlap step (settle, launch, the trusted step with the host
    copies) under the driver's own sync check."""
    c, step = trusted_run(kind, True, device="cuda", host_copies=True)
    with cuda_syncs_raise():
        overlap_steps(c, step, 8, settle_each=True)
    assert c.arena.in_flight
    c.verify()


@pytest.mark.parametrize("kind", ["hybrid", "tri"])
def test_in_a_continuous_flight_the_only_reads_are_guarded_hole_counts(monkeypatch, kind):
    """Never settled between steps (each launch adds its pins), window
    frees leave holes whose pins only the device knows: the one read the
    trusted step may then make is the count of guarded holes, when an
    allocation reaches them (``Arena._recount_guarded``; docs/design.md §12),
    and it settles once the pins it would need are freed ones.  The slots
    and, once settled, the state are those of the steps with no forward."""
    twin, twin_step = trusted_run(kind, True, host_copies=True)
    c, step = trusted_run(kind, True, host_copies=True)
    recounts, reads, tolist = [], [], torch.Tensor.tolist

    def recount(self, b):  # the real count, through the unpoisoned read
        recounts.append(b.name)
        b.g_lo = b.g_hi = sum(tolist((b.guard.index_select(0, b.holes) != -1).to(torch.int64)))

    monkeypatch.setattr(Arena, "_recount_guarded", recount)
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    got = overlap_steps(c, step, 12, settle_each=False)
    assert reads == []
    monkeypatch.undo()
    assert recounts and set(recounts) <= {"swa"} and len(recounts) <= 12
    assert all(torch.equal(g, twin_step()) for g in got)
    c.verify()
    c.settle()
    assert c.arena.snapshot() == twin.arena.snapshot()


def test_host_copies_take_the_read_out_of_alloc_extend(monkeypatch):
    c = make(impl, "tri", 4, pages=512, lazy=True)
    twin = make(impl, "tri", 4, pages=512, lazy=True)
    first = twin.alloc_extend([0, 0], [5, 9], [-1, -1])
    prefix, seq, last = torch.tensor([0, 0]), torch.tensor([5, 9]), torch.tensor([-1, -1])
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    out = c.alloc_extend(prefix, seq, last, check=False, prefix_lens_cpu=prefix, seq_lens_cpu=seq, extend_num_tokens=14)
    assert reads == []
    monkeypatch.undo()
    assert torch.equal(out, first)
    c.verify()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "tri"])
def test_trusted_decode_step_under_cuda_sync_debug_error(monkeypatch, kind):
    """On CUDA the driver reports any sync but the documented reads, which
    lift the check around themselves."""
    c, step = trusted_run(kind, True, device="cuda")
    reads = []
    lifted_read(monkeypatch, reads)
    with cuda_syncs_raise():
        for _ in range(8):
            step()
    assert len(reads) == 16
    c.verify()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_trusted_decode_step_with_host_copies_never_syncs_on_cuda(kind):
    """With the engine's host copies nothing is lifted: the driver itself
    reports any sync of the whole step."""
    c, step = trusted_run(kind, True, device="cuda", host_copies=True)
    with cuda_syncs_raise():
        for _ in range(8):
            step()
    c.verify()


# ------------------------------------------- the composites' checked step


# The composites' methods on the per-step path, scanned by name.
HOT = [
    "alloc_decode",
    "alloc_extend",
    "free_swa",
    "translate",
    "_request_flags",
    "_same_length",
    "_opens_page",
    "_decode_slots",
    "_slots",
    "_take_pages",
    "_vec",
    "joint_pages",
    "_joint_pages",
    "_decode_trusted",
    "_live_pages",
    "_fused",
    "_bind_slots",
    "_extend_slots",
    "_decode_slots_fused",
    "_decode_flags",
    "_owner_table",
    "_request_rows",
    "free_segment",  # the engine's free of a finished request's rows
    "_swa_live_count",
    "free_state",
]


def hot_sources():
    for cls in (composites._Composite, composites._WithSWA, HybridSWA, MambaHybrid, TriPool):
        for name in HOT:
            fn = vars(cls).get(name)
            fn = getattr(fn, "__func__", fn)  # a staticmethod's function
            if inspect.isfunction(fn):
                yield f"{cls.__name__}.{name}", inspect.getsource(fn)


@pytest.mark.mutation
def test_hot_path_source_has_no_sync_but_the_documented_read():
    """An AST scan of the per-step path: its one host read goes through
    ``_host_read``; ``_explain``/``_explain_reps`` run only to raise."""
    srcs = dict(hot_sources())
    assert {
        "_Composite.alloc_decode",
        "_WithSWA.free_swa",
        "_Composite.translate",
        "TriPool._joint_pages",
        "_Composite._decode_trusted",
        "_Composite._bind_slots",
        "_WithSWA._live_pages",
    } <= set(srcs)
    for where, src in srcs.items():
        assert scan_source(src, where)[0] == [], where
    body = ast.parse(inspect.getsource(composites._host_read)).body[0].body  # not the annotations
    assert [c.attr for stmt in body for c in ast.walk(stmt) if isinstance(c, ast.Attribute)] == ["tolist"]
    planted = srcs["_WithSWA.free_swa"].replace("if count:", "if count and key.any():")
    assert scan_source(planted)[0]  # the scan can fail


@pytest.mark.parametrize("lazy", (False, True))
@pytest.mark.parametrize("ps", PAGE_SIZES)
@pytest.mark.parametrize("kind", SWA_KINDS)
@pytest.mark.mutation
def test_decode_step_makes_one_documented_read(monkeypatch, kind, ps, lazy):
    """``alloc_decode`` + ``free_swa`` + ``translate`` with every sync-forcing
    tensor method poisoned: each of the first two makes exactly one host read
    (through ``_host_read``), ``translate`` none."""
    c = make(impl, kind, ps, pages=48, lazy=lazy)
    reqs = [c.alloc_extend([0], [n], [-1]).tolist() for n in (ps, 2 * ps + 1, 3)]
    seqs = torch.tensor([len(r) for r in reqs])
    last = torch.tensor([r[-1] for r in reqs])
    toks = torch.tensor(reqs[1])
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    outs = []
    for _ in range(ps + 2):
        seqs = seqs + 1
        out = c.alloc_decode(seqs, last)
        assert len(reads) == 1
        last = out
        outs.append(out)
        c.free_swa(toks[:ps], 0)  # the first page leaves the window (the second call: skipped)
        assert len(reads) == 2
        c.translate(out)
        c.translate(out, "swa")
        assert len(reads) == 2
        reads.clear()
    monkeypatch.undo()
    assert c.arena.v2p("swa")[reqs[1][0] // ps].item() == -1
    for i, r in enumerate(reqs):
        assert c.translate([r[-1] + 0]).tolist() != [0]
        r += [o[i].item() for o in outs]
    assert len({t for r in reqs for t in r}) == sum(map(len, reqs))
    check(c)


@pytest.mark.mutation
def test_alloc_extend_makes_one_documented_read(monkeypatch):
    c = make(impl, "tri", 16)
    reads = []
    counted_read(monkeypatch, reads)
    _poison(monkeypatch)
    out = c.alloc_extend(torch.tensor([0, 0]), torch.tensor([17, 5]), torch.tensor([-1, -1]))
    assert len(reads) == 1 and out.numel() == 22
    monkeypatch.undo()
    check(c)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", SWA_KINDS)
@pytest.mark.mutation
def test_decode_step_under_cuda_sync_debug_error(monkeypatch, kind):
    """On CUDA the driver reports any sync; the documented read lifts the
    check around itself and is counted."""
    ps = 16
    c = make(impl, kind, ps, pages=48, device="cuda")
    r = c.alloc_extend([0], [2 * ps + 1], [-1])
    seqs, last, toks = torch.tensor([r.numel()], device="cuda"), r[-1:], r
    reads = []
    lifted_read(monkeypatch, reads)
    with cuda_syncs_raise():
        for _ in range(ps + 2):
            seqs = seqs + 1
            last = c.alloc_decode(seqs, last)
            c.free_swa(toks[:ps], 0)
            c.translate(last, "swa")
    assert len(reads) == 2 * (ps + 2)
    check(c)


@pytest.mark.parametrize("choice", kernel_choices("cpu"))
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_the_trusted_segment_free_reads_nothing_with_the_host_count(monkeypatch, kind, choice):
    """SGLang's per-step frees on the trusted path with the engine's count
    of live window entries (``free_segment(check=False, num_live=)``): a
    row whose window is partly gone (``free_live`` picks the live ones), a
    row whose window is all live, a row whose window is all gone, and a
    state slot; nothing is read back (syncs poisoned) and the state and
    bytes are the checked calls'."""
    for ps in (1, 16):
        c, twin = make(impl, kind, ps, pages=32, lazy=True), make(impl, kind, ps, pages=32, lazy=True)
        c.arena.kernels = choice
        swa = kind != "mamba"
        frees = []
        for x in (c, twin):
            t = x.alloc_extend([0, 0, 0], [3 * ps + 1, 2 * ps, ps], [-1, -1, -1]).tolist()
            rows = [t[: 3 * ps + 1], t[3 * ps + 1 : 5 * ps + 1], t[5 * ps + 1 :]]
            if swa:
                x.free_swa(rows[0][:ps], 0)
                x.free_swa(rows[2], 0)
            slot = x.alloc_state(1) if kind != "hybrid" else None
            frees.append((rows, slot))
        (rows, slot), (twin_rows, twin_slot) = frees
        counts = [3, 2, 0] if swa else [0, 0, 0]
        _poison(monkeypatch)
        for row, n in zip(rows, counts):
            c.free_segment(torch.tensor(row), 0, False, num_live=n)
        if slot is not None:
            c.free_state(slot, check=False)
        monkeypatch.undo()
        for row, n in zip(twin_rows, counts):
            twin.free_segment(row, 0, num_live=n)
        if twin_slot is not None:
            twin.free_state(twin_slot)
        assert c.arena.snapshot() == twin.arena.snapshot(), (kind, ps)
        assert torch.equal(c.arena.buffer, twin.arena.buffer)
        assert c.arena.live_pages("full") == 0
        check(c)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "mamba", "tri"])
def test_no_kernel_compiles_after_the_prewarm_on_cuda(kind):
    """On a GPU, Triton's own caches: after ``Arena.prewarm`` the trusted
    step, with forwards in flight and the per-step frees, compiles nothing."""
    from kvarena.impl import triton_kernels as tk

    kernels = (tk.bind_kernel, tk.decode_kernel, tk.extend_kernel, tk.free_kernel, tk.free_live_kernel, tk.move_kernel)

    def compiled():
        return sum(len(cache[0]) for k in (*kernels, tk.translate_kernel) for cache in k.device_caches.values())

    c, step = trusted_run(kind, True, device="cuda", host_copies=True)
    c.arena.kernels = "triton"
    assert c.arena.prewarm() == 47 + len({c.arena._page_rows(n).dtype for n in c.arena.chain})  # + a slide's copy
    torch.cuda.synchronize()
    before = compiled()
    assert before > 0
    last = None
    for _ in range(8):
        if last is not None:
            c.launch(last, check=False)
        last = step()
    c.settle()
    t = c.alloc_extend([0], [9], [-1])
    c.free_segment(t, 0, False, num_live=0 if kind == "mamba" else 3)  # 9 tokens: 3 pages, their window live
    torch.cuda.synchronize()
    assert compiled() == before
