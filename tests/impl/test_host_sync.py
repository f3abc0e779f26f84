"""No host sync on the decode path: ``alloc`` (also binding borrowed ids
with ``check=False``), ``_bind`` (the composites' trusted path binds through
it), ``free(check=False)`` and ``translate``; and the composites' trusted
decode step (``check=False``) makes only its documented reads.

Two independent checks: an AST scan of the path's source (every impl helper
it calls is followed, so a new helper cannot hide a sync), and a run of the
path with the sync-forcing tensor methods poisoned.  A self-test proves the
scan catches a planted offender.  On CUDA, tools/cuda_checks.sh runs the same
path under ``torch.cuda.set_sync_debug_mode("error")``.
"""

import ast
import inspect
import textwrap

import pytest
import torch

from kvarena.impl import Arena, SubPool
from kvarena.impl import arena as arena_mod
from kvarena.impl import band as band_mod

# Entry points of the sync-free path.
ROOTS = [("Arena", "alloc"), ("Arena", "_bind"), ("Arena", "free"), ("Arena", "translate")]
# Helpers the path may call that do sync, each for a documented reason.
EXEMPT = {
    "_checked": "alloc/free(check=True) validation: a documented host read, skipped by check=False",
    "_host_ids": "ids given as a host sequence are on the host already; a tensor never takes this path",
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


def _poison(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("host sync on the decode path")

    for attr in ("item", "tolist", "cpu", "nonzero", "numpy", "__bool__", "__int__", "__index__", "__float__"):
        monkeypatch.setattr(torch.Tensor, attr, boom)
    monkeypatch.setattr(torch, "unique", boom)
    monkeypatch.setattr(torch, "nonzero", boom)
    monkeypatch.setattr(torch, "masked_select", boom)


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
    """The README's tri-pool geometry with the SWA float on the full END's ids."""
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
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode_step(a)
    finally:
        torch.cuda.set_sync_debug_mode(0)
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
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        a.translate(name, out, out=out)
        a.free(name, ids[0::2], check=False)
        a.translate(name, ids)
        a.free(name, ids[1::2], check=False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.tolist() == want
    a.verify()


# ------------------------------------------- the composites' trusted step


def trusted_run(kind, lazy, device="cpu", steps=20):
    """A composite with requests in flight, and a closure running one trusted
    decode step (``alloc_decode`` + ``free_swa`` + ``translate``, all
    ``check=False``) for every request, freeing each window page as it
    leaves (ps 4, window 4).  Sized so that no step runs short (a shortfall's
    relief is a cold path)."""
    from kvarena.impl import HybridSWA, MambaHybrid, TriPool

    ps, e = 4, 8
    total = 4096 * e * ps
    c = {
        "hybrid": lambda: HybridSWA(total, e, e, ps, lazy=lazy, device=device),
        "mamba": lambda: MambaHybrid(total, e, e * ps, ps, lazy=lazy, device=device),
        "tri": lambda: TriPool(total, e, e, e * ps, ps, lazy=lazy, device=device),
    }[kind]()
    lens = [5, 9, 12]
    reqs = [c.alloc_extend([0], [n], [-1]) for n in lens]
    table = torch.zeros(len(lens), max(lens) + steps + 1, dtype=torch.int64, device=device)
    for i, r in enumerate(reqs):
        table[i, : r.numel()] = r
    state = {
        "seq": torch.tensor(lens, device=device),
        "last": torch.stack([r[-1] for r in reqs]),
        "rows": torch.arange(len(lens), device=device),
    }

    def step():
        seq = state["seq"] + 1
        out = c.alloc_decode(seq, state["last"], check=False)
        table[state["rows"], seq - 1] = out
        state["seq"], state["last"] = seq, out
        if kind != "mamba":
            # each request's page [end - ps, end) with end = floor_ps(seq - 4 - ps); -1 where none left
            end = torch.div(seq - 4 - ps, ps, rounding_mode="floor") * ps
            cols = torch.clamp(end - ps, min=0).unsqueeze(1) + torch.arange(ps, device=device)
            toks = torch.where((end >= ps).unsqueeze(1), table[state["rows"].unsqueeze(1), cols], -1)
            c.free_swa(toks.reshape(-1), 0, check=False)
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
    from kvarena.impl import composites

    c, step = trusted_run(kind, lazy)
    orig, reads = torch.Tensor.tolist, []

    def read(t):
        reads.append(t.numel())
        return orig(t)

    monkeypatch.setattr(composites, "_host_read", read)
    _poison(monkeypatch)
    for _ in range(12):
        step()
    assert reads == [1, 1] * 12 if kind != "mamba" else reads == [1] * 12
    monkeypatch.undo()
    c.verify()
    live_swa = c.arena.live_pages("swa") if kind != "mamba" else None
    assert live_swa is None or 0 < live_swa < c.arena.live_pages("full")  # window pages were freed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "tri"])
def test_trusted_decode_step_under_cuda_sync_debug_error(monkeypatch, kind):
    """On CUDA the driver reports any sync but the documented reads, which
    lift the check around themselves."""
    from kvarena.impl import composites

    c, step = trusted_run(kind, True, device="cuda")
    orig, reads = composites._host_read, []

    def read(t):
        reads.append(1)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return orig(t)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(composites, "_host_read", read)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(reads) == 16
    c.verify()
