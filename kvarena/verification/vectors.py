"""Conformance vectors: JSON cases any allocator can replay.

The spec is the reference, so it writes the expectations; the torch
implementation replays them in CI, and another engine's allocator replays
them through a small adapter (a *target*).  The cases live in
``tests/vectors/`` (``kvarena vectors generate DIR`` writes them from
``kvarena.verification.vector_cases``); the schema is ``kvarena/verification/vectors.schema.json``.

The format (``"format": "kvarena-vector/1"``)
=============================================

One JSON object per file::

    {"format": "kvarena-vector/1",
     "name": "arena/alloc-end-exact/anchor",          # unique, also the file's path
     "description": "...",
     "tags": ["call:alloc", "policy:anchor", "anchor-bug:5", ...],
     "pre":  {"allocator": "arena" | "HybridSWA" | "MambaHybrid" | "TriPool",
              "config": {...},                          # constructor arguments (below)
              "lent": true,                             # optional: the buffer is an engine's (below)
              "ops": [step, ...],                       # the operations that build the pre state
              "state": observation},                    # the state they build
     "ops":  [step, ...],                               # the operations under test
     "post": observation}                               # the state after them

``lent`` (the implementation's setting, ignored elsewhere): the buffer
and page copy are an engine's (``Arena(buffer=, mover=)``), as the machine
that found the case had them; a fault step's operation count depends on it.

``config`` holds the constructor's keyword arguments as docs/design.md §10
names them: for ``"arena"`` ``total_bytes``, ``pools`` (a list of
``{name, entry_bytes, page_size, grow, kind}``), ``lazy`` (a bool or a list
of END names), ``policy`` and ``borrow`` (``{borrower: lender}`` or null);
for a composite ``total_bytes``, ``full_entry_bytes``, ``swa_entry_bytes``
(``HybridSWA``, ``TriPool``), ``state_bytes`` (``MambaHybrid``,
``TriPool``), ``page_size``, ``lazy`` and ``policy``.

A **step** calls one method with keyword arguments named as in docs/design.md
§10 and says what it returns::

    {"call": "alloc", "args": {"name": "full", "n": 4}, "returns": [40, 41, 42, 43]}
    {"call": "free", "args": {"name": "full", "ids": [0]}, "raises": "ValueError"}
    {"call": "relieve", "args": {"name": "mamba", "need_pages": 3},
     "evict": [{"ops": [step, ...], "returns": 2}, ...],  # absent or null: no evictor
     "shortfalls": [3, ...], "returns": true}

- ``returns`` is the JSON form of the result: lists of ints for ids,
  pages and token slots (tensors become lists), ints, bools, ``null`` for a
  refused allocation, a list for ``frontiers``.
- ``raises: "ValueError"``: the call must raise ``ValueError`` (bad input);
  the state must then be exactly as before (the next observation checks it).
  ``raises: "EvictorError"``: a ``relieve`` whose scripted evict round
  raised (``{"ops": [...], "raises": true}``) must pass that exception on.
- ``evict`` scripts the callback of a ``relieve``: the replayer passes a
  callable whose k-th call records its argument, runs round k's ``ops``
  (each a step, checked like any other) and returns round k's ``returns``;
  calls past the script return 0 and run nothing.  ``shortfalls`` lists the
  arguments the callback must have received.
- A step may carry ``state``: the observation expected right after it
  (cases saved by ``kvarena fuzz`` do, so the first diverging step shows),
  and ``kernels``: ``"torch"`` or ``"triton"``, the implementation's
  kernels for that call (docs/design.md §14; a machine drew them, and a
  Triton kernel's bug shows only on a Triton call); other targets ignore it.
- ``fault: {"at": k, "kernels": "torch"}`` with ``raises: "Fault"``: the
  call runs with its ``k``-th device operation failing
  (``kvarena.verification.faults``), on those kernels when given, and the
  fault must come out of it; the state is then exactly as before (docs/design.md
  §9c).  The spec has no operations to fail, so it does not make the call;
  a target that cannot inject faults reports the case unsupported.

**Forwards in flight.**  Between a ``launch`` and the ``settle`` that ends
it (the machine's own, or one inside an urgent call), the forward writes
late: at its settle every page it pinned at launch gets new bytes for the
id that page held then, and those are that id's bytes from then on, if the
id is still in the life it had (as a real forward's write does, and as
``kvarena.verification.inflight`` models it for the machines).  The spec's
content model takes the same writes, so ``data_follows`` asks of both where
each live id's last bytes are, the late write's included.

An **observation** is::

    {"pools": {name: {"frontiers": [low, high],          # bytes
                      "pages": [[vid, phys], ...],      # every live id (id 0, the sink, excluded), by id
                      "holes": [phys, ...],             # sorted
                      "free_ids": [vid, ...],           # the FIFO of unbound ids, front first
                      "available_pages": n, "available_size": n,
                      "schedulable_available_size": n, "gap_bytes": n,
                      "pinned": [phys, ...], "pending": [phys, ...],  # only while a forward is in flight
                      "reserved": [phys, ...]}},  # only while a host load holds pages
     "views": {"available_size": n, "full_available_size": n, ...},   # composites only
     "moves_held": true,     # only while the move gate or a load holds every page in place
     "data_follows": true}   # every live id's data is found at its translated page

The calls a case uses: ``ARENA_CALLS`` and ``COMPOSITE_CALLS`` below.

The adapter protocol (a *target*)
=================================

A target is an object with three methods::

    boot(allocator: str, config: dict) -> None
        Build a fresh allocator.  Raise ``Unsupported(reason)`` for a
        configuration it cannot build (the case is reported unsupported,
        never passed).
    call(call: str, args: dict) -> result
        Run one operation.  ``args["evict"]``, when present, is a callable
        to hand to ``relieve``.  Return ids, pages and slots as any
        sequence of ints; raise ``ValueError`` for bad input; raise
        ``Unsupported`` for a call it does not have.
    observe() -> dict
        The current observation.  A field it cannot see may be left out of
        a pool (the replay counts what it compared); it must report at least
        each pool's ``pages``, or the case fails: a replay that compares
        nothing passes nothing.

Register a target under a name with ``register_target(name, factory)``
(``factory(device=...)`` returns a fresh target).  ``get_target`` finds a
name registered in this process, then one declared by an installed
package's entry point in the group ``kvarena.targets``, then a module named
in ``PLUGINS`` (``"anchor"`` -> ``kvarena.anchor``, which registers itself
on import), then ``module.path:factory``.  ``spec`` and ``impl`` are
built in.
"""

import argparse
import contextlib
import copy
import importlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import torch

FORMAT = "kvarena-vector/1"
SCHEMA_FILE = "vectors.schema.json"

ARENA_CALLS = (
    "alloc",
    "free",
    "flush",
    "make_room",
    "compact_holes",
    "open_short_side",
    "plan_floats",
    "relieve",
    "translate",
    "available_pages",
    "available_size",
    "schedulable_available_size",
    "gap_bytes",
    "frontiers",
    "holes",
    "launch",
    "settle",
    "close_gate",
    "open_gate",
    "reserve",
    "bind_reserved",
    "cancel",
)
COMPOSITE_CALLS = (
    "alloc_extend",
    "alloc_decode",
    "free",
    "free_swa",
    "alloc_state",
    "free_state",
    "available_size",
    "full_available_size",
    "swa_available_size",
    "state_available_size",
    "state_slot_token_cost",
    "relieve",
    "translate",
    "launch",
    "settle",
    "flush_opportunistic",
    "close_gate",
    "open_gate",
    "alloc_extend_swa_tail",
    "fits_tail",
)
# A composite's calls that are its arena's (HiCache's move gate, docs/design.md §13).
ARENA_OF_COMPOSITE = ("close_gate", "open_gate")
COMPOSITES = ("HybridSWA", "MambaHybrid", "TriPool")
ALLOCATORS = ("arena",) + COMPOSITES
POOL_VIEWS = ("available_pages", "available_size", "schedulable_available_size", "gap_bytes")
COMPOSITE_VIEWS = {
    "HybridSWA": ("available_size", "full_available_size", "swa_available_size"),
    "MambaHybrid": ("available_size", "full_available_size", "state_available_size", "state_slot_token_cost"),
    "TriPool": (
        "available_size",
        "full_available_size",
        "swa_available_size",
        "state_available_size",
        "state_slot_token_cost",
    ),
}

# Targets another package provides: name -> module that registers it on import.
PLUGINS = {"anchor": "kvarena.anchor"}
ENTRY_POINT_GROUP = "kvarena.targets"


class Unsupported(Exception):
    """A target cannot run this case (a configuration or call it lacks)."""


class EvictorError(RuntimeError):
    """What a scripted evict round with ``"raises": true`` throws; the
    ``relieve`` that called it must pass it on."""


def schema():
    """The JSON Schema of one vector file."""
    return json.loads(resources.files("kvarena.verification").joinpath(SCHEMA_FILE).read_text())


def jsonable(x):
    """A result in its JSON form: tensors and tuples become lists."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    return int(x)


# --------------------------------------------------------------- registry

_TARGETS: dict[str, Callable[..., Any]] = {}  # name -> factory(device=...)


def register_target(name, factory):
    """Make ``--target name`` build targets with ``factory(device=...)``."""
    _TARGETS[name] = factory


def target_names():
    """Every target name known without importing a plugin."""
    names = set(_TARGETS) | set(PLUGINS)
    with contextlib.suppress(Exception):  # a broken distribution's metadata must not hide the built-ins
        names |= {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def get_target(name, device="cpu"):
    """A fresh target named ``name`` (see the module docstring for the lookup)."""
    if name not in _TARGETS:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                register_target(name, ep.load())
        if name not in _TARGETS and name in PLUGINS:
            try:
                importlib.import_module(PLUGINS[name])
            except ImportError as e:
                raise ValueError(f"target {name!r}: its module {PLUGINS[name]} is not available ({e})") from None
        if name not in _TARGETS and ":" in name:
            mod, _, attr = name.partition(":")
            register_target(name, getattr(importlib.import_module(mod), attr))
    if name not in _TARGETS:
        raise ValueError(f"target {name!r}: unknown (known: {', '.join(target_names())})")
    return _TARGETS[name](device=device)


# ------------------------------------------------------ the built-in targets


def build(pkg, allocator, config, **extra):
    """The allocator ``config`` describes, from package ``pkg`` (spec or impl)."""
    cfg = dict(config)
    if allocator == "arena":
        pools = [
            pkg.SubPool(p["name"], p["entry_bytes"], p["page_size"], p["grow"], p["kind"]) for p in cfg.pop("pools")
        ]
        lazy = cfg.pop("lazy", False)
        lazy = set(lazy) if isinstance(lazy, list) else lazy
        return pkg.Arena(cfg.pop("total_bytes"), pools, lazy=lazy, **cfg, **extra)
    if allocator in COMPOSITES:
        lazy = cfg.pop("lazy", False)
        lazy = set(lazy) if isinstance(lazy, list) else lazy
        return getattr(pkg, allocator)(lazy=lazy, **cfg, **extra)
    raise ValueError(f"allocator {allocator!r}: not one of {ALLOCATORS}")


class _Target:
    """What the spec and impl targets share: boot, call, the observation."""

    pkg = None

    def __init__(self, device="cpu"):
        self.device = device
        self.obj = None

    lent = False  # the buffer is an engine's: the case's ``pre.lent``, set before ``boot``

    def boot(self, allocator, config):
        from kvarena.verification.inflight import hook_settle

        self.allocator = allocator
        self.obj = build(self.pkg, allocator, config, **self.extra())
        self.arena = self.obj if allocator == "arena" else self.obj.arena
        self.writes = {}  # pool -> {page: id}: what the forwards in flight write late
        hook_settle(self.arena, self._forward_done)
        self.after_call()

    def extra(self):
        return {}

    def call(self, call, args):
        allowed = ARENA_CALLS if self.allocator == "arena" else COMPOSITE_CALLS
        obj = self.arena if call in ARENA_OF_COMPOSITE else self.obj
        if call not in allowed or not hasattr(obj, call):
            raise Unsupported(f"{self.allocator} has no call {call!r}")
        done = False
        try:
            result = getattr(obj, call)(**args)
            done = True
            return result
        finally:
            if call == "launch":
                self._launched()
            if done:  # a call that raised changed nothing
                self.called(call, args, result)
            self.after_call()

    def fault(self, call, args, at, kernels=None):
        """``call`` with its ``at``-th operation failing; True if the fault
        came out of it.  Only a target with operations to fail has this."""
        raise Unsupported(f"{type(self).__name__} cannot inject a fault")

    def _launched(self):
        """A forward was launched: the pages it pinned, and the id each holds
        now, are what it writes late (a page pinned before keeps its first owner)."""
        a = self.arena
        for n in a.chain:
            p2v = jsonable(a.p2v(n))
            rows = self.writes.setdefault(n, {})
            for p in jsonable(a.pinned(n)):
                rows.setdefault(p, p2v[p])

    def _forward_done(self):
        """The arena settles: the forwards' late writes land (``late_write``)."""
        writes, self.writes = self.writes, {}
        for n, rows in writes.items():
            rows = {p: v for p, v in rows.items() if v > 0}
            if rows:
                self.late_write(n, rows)

    def late_write(self, name, rows):
        """Land a forward's write: ``rows`` maps page to the id it writes."""

    def called(self, call, args, result):
        """Hook run after every call that returned (nested ones included),
        with its arguments and result, before ``after_call``."""

    def after_call(self):
        """Hook run after every call, nested ones included."""

    def live(self, name):
        v2p = jsonable(self.arena.v2p(name))
        return [(v, p) for v, p in enumerate(v2p) if v > 0 and p >= 0]

    def observe(self):
        """The observation, after the allocator's own ``verify()`` passes
        (an ``AccountingError`` fails the case)."""
        self.obj.verify()
        a, pools = self.arena, {}
        for n in a.chain:
            pools[n] = {
                "frontiers": list(a.frontiers(n)),
                "pages": [list(vp) for vp in self.live(n)],
                "holes": sorted(jsonable(a.holes(n))),
                "free_ids": self.free_ids(n),
                **{v: int(getattr(a, v)(n)) for v in POOL_VIEWS},
            }
            if a.in_flight:  # which pages wait for the forward (docs/design.md §12); absent when none does
                pools[n].update(pinned=jsonable(a.pinned(n)), pending=jsonable(a.pending(n)))
            reserved = jsonable(a.reserved(n))
            if reserved:  # pages a host load holds (docs/design.md §13); absent when none does
                pools[n]["reserved"] = reserved
        out = {"pools": pools}
        if a.moves_held():  # the move gate or a load holds every page in place; absent when nothing does
            out["moves_held"] = True
        if self.allocator != "arena":
            out["views"] = {v: int(getattr(self.obj, v)()) for v in COMPOSITE_VIEWS[self.allocator]}
        out["data_follows"] = self.data_follows()
        return out


class SpecTarget(_Target):
    """The executable spec: the reference every vector was written from."""

    from kvarena import spec as pkg

    def free_ids(self, name):
        return list(self.arena.bands[name].free_ids)

    def data_follows(self):
        """The content model: every live id's bytes sit where ``v2p`` says."""
        return all(self.arena.content(n).get(p) == v for n in self.arena.chain for v, p in self.live(n))

    def fault(self, call, args, at, kernels=None):
        """The spec has no operations to fail: a faulted call is not made,
        and leaves the state as it was.  It is made on a copy, so that a
        call the spec refuses (bad input, which changes nothing either way)
        is no faulted step: ``ValueError``."""
        dry = copy.deepcopy(self.obj)
        arena = dry if self.allocator == "arena" else dry.arena
        arena.__dict__.pop("settle", None)  # the copy's own settle, not the hook on this target
        getattr(dry, call)(**args)
        return True

    def late_write(self, name, rows):
        """The content model takes the write: each page holds the id written there."""
        content = self.arena.bands[name].content
        for p, v in rows.items():
            content[p] = v


class ImplTarget(_Target):
    """The torch implementation on ``device``: every page is stamped with a
    byte pattern of (pool, id, generation) when it becomes live, and
    ``data_follows`` reads each live page back through ``translate``."""

    from kvarena import impl as pkg

    def extra(self):
        self.stamps = {}  # pool -> {vid: generation}
        self.keys = {}  # pool -> {vid: the pattern's key}, where it is not the id: a load's page's
        self.loads = {}  # pool -> {reserved page: generation of the load's bytes there}
        self.gen = 0
        return {"device": self.device}

    def called(self, call, args, result):
        """HiCache's loads (docs/design.md §13): a reservation's pages get a
        load's bytes at once, written by physical page as an engine loads
        them; a bind makes them its ids' bytes (a bind that moved or wrote
        them is caught by ``data_follows``); a cancel drops them."""
        from kvarena.verification.differential import pattern

        a = self.arena
        if call == "reserve" and result is not None and len(result):
            name, pages = args["name"], jsonable(result)
            self.gen += 1
            data = pattern(
                a.chain.index(name), [load_key(p) for p in pages], [self.gen] * len(pages), a.geometry(name).epp
            )
            a.page_view(name).index_copy_(0, torch.tensor(pages, device=a.device), data.to(a.device))
            self.loads.setdefault(name, {}).update(dict.fromkeys(pages, self.gen))
        elif call == "bind_reserved":
            name, loads = args["name"], self.loads.get(args["name"], {})
            for v, p in zip(jsonable(args["ids"]), jsonable(args["pages"])):
                if p in loads:
                    self.stamps.setdefault(name, {})[v] = loads.pop(p)
                    self.keys.setdefault(name, {})[v] = load_key(p)
        elif call == "cancel":
            for p in jsonable(args["pages"]):
                self.loads.get(args["name"], {}).pop(p, None)

    def boot(self, allocator, config):
        if not self.lent:
            return super().boot(allocator, config)
        from kvarena.verification.differential_composites import LentBuffer

        mover = LentBuffer(config["total_bytes"], self.device)
        self.extra = lambda: {**ImplTarget.extra(self), "buffer": mover.buffer, "mover": mover}
        try:
            super().boot(allocator, config)
        finally:
            del self.extra
        mover.arena = self.arena

    def free_ids(self, name):
        return jsonable(self.arena.free_ids(name))

    def use_kernels(self, kernels):
        """Run the next call on ``kernels`` (a step's ``kernels``), then go back."""
        self.next_kernels = kernels

    def call(self, call, args):
        kernels, self.next_kernels = getattr(self, "next_kernels", None), None
        if kernels is None:
            return super().call(call, args)
        a, old = self.arena, self.arena.kernels
        a.kernels = kernels
        try:
            return super().call(call, args)
        finally:
            a.kernels = old

    def fault(self, call, args, at, kernels=None):
        """``call`` on the implementation with its ``at``-th torch operation
        (or Triton launch) failing, on ``kernels`` when given."""
        from kvarena.verification.faults import fault_at

        a, old = self.arena, self.arena.kernels
        try:
            if kernels is not None:
                a.kernels = kernels
            raised, _ = fault_at(at, lambda: getattr(self.obj, call)(**args))
        finally:
            a.kernels = old
            self.after_call()
        return raised

    def late_write(self, name, rows):
        """New bytes (a fresh generation) at each page, straight into the
        buffer as a forward writes them; an id still stamped (alive in the
        life it had at launch) takes them as its bytes.  Uncounted by a fault
        injected into the call that settles: it is the forward's work."""
        from kvarena.verification.differential import pattern
        from kvarena.verification.faults import unfaulted

        a = self.arena
        i, ids = a.chain.index(name), list(rows.values())
        with unfaulted():
            self.gen += 1
            data = pattern(i, ids, [self.gen] * len(ids), a.geometry(name).epp).to(a.device)
            a.page_view(name).index_copy_(0, torch.tensor(list(rows), device=a.device), data)
        stamped, keys = self.stamps.setdefault(name, {}), self.keys.setdefault(name, {})
        for v in ids:
            if v in stamped:
                stamped[v] = self.gen
                keys.pop(v, None)

    def after_call(self):
        from kvarena.verification.differential import pattern

        a = self.arena
        for i, n in enumerate(a.chain):
            stamped, keys = self.stamps.setdefault(n, {}), self.keys.setdefault(n, {})
            live = {v for v, _ in self.live(n)}
            for v in set(stamped) - live:
                del stamped[v]
                keys.pop(v, None)
            fresh = sorted(live - set(stamped))
            if fresh:
                self.gen += 1
                stamped.update(dict.fromkeys(fresh, self.gen))
                a.write_pages(n, fresh, pattern(i, fresh, [self.gen] * len(fresh), a.geometry(n).epp))

    def data_follows(self):
        from kvarena.verification.differential import pattern

        a = self.arena
        for i, n in enumerate(a.chain):
            ids = sorted(self.stamps.get(n, {}))
            if not ids:
                continue
            keys = self.keys.get(n, {})
            want = pattern(i, [keys.get(v, v) for v in ids], [self.stamps[n][v] for v in ids], a.geometry(n).epp)
            pages = a.translate(n, torch.tensor(ids, device=a.device))
            if not torch.equal(a.page_view(n).index_select(0, pages).cpu(), want):
                return False
        return True


def load_key(page):
    """The pattern key of a load's bytes at reserved ``page``: no id's (ids are at least 1)."""
    return -1 - page


register_target("spec", lambda device="cpu": SpecTarget(device))
register_target("impl", lambda device="cpu": ImplTarget(device))


# ------------------------------------------------------------- recording


class Recorder:
    """Writes one case: every step runs on the spec and records what it did.

    A scenario calls ``r("alloc", name="full", n=4)`` for each step (the
    spec's result comes back, so later steps can use it), ``r.start()``
    where the pre state ends and the operations under test begin, and
    ``r.case(name, ...)`` at the end.  ``evict=[{"ops": [(call, args)],
    "returns": k}, ...]`` scripts a ``relieve``'s callback.
    """

    def __init__(self, allocator, config, states=False, lent=False):
        self.allocator, self.config, self.lent = allocator, copy.deepcopy(config), lent
        self.target = SpecTarget()
        self.target.boot(allocator, config)
        self.pre, self.ops = [], []
        self.phase = self.pre  # where steps go: the pre state until start()
        self.pre_state = None
        self.states = states  # record the observation after every step (fuzz repros)

    def start(self):
        self.pre_state = self.target.observe()
        self.phase = self.ops

    def __call__(self, call, evict=None, kernels=None, **args):
        step = self._run(call, args, evict)
        if kernels is not None:  # the implementation's kernels for the call (a machine's draw)
            step["kernels"] = kernels
        self.phase.append(step)
        return step.get("_result")

    def _run(self, call, args, evict):
        step = {"call": call, "args": jsonable(args)}
        real = dict(args)
        if evict is not None:
            rounds, shortfalls = [], []
            script = iter(evict)

            def callback(k):
                shortfalls.append(int(k))
                r = next(script, None)
                if r is None:
                    return 0
                nested = [self._run(c, a, None) for c, a in r["ops"]]
                if r.get("raises"):
                    rounds.append({"ops": [self._clean(s) for s in nested], "raises": True})
                    raise EvictorError(f"evict round {len(shortfalls)}")
                rounds.append({"ops": [self._clean(s) for s in nested], "returns": r["returns"]})
                return r["returns"]

            real["evict"] = callback
        try:
            result = self.target.call(call, real)
            step["returns"] = jsonable(result)
            step["_result"] = result
        except ValueError:
            step["raises"] = "ValueError"
        except EvictorError:
            step["raises"] = "EvictorError"
        if evict is not None:
            step["evict"], step["shortfalls"] = rounds, shortfalls
        if self.states:
            step["state"] = self.target.observe()
        return step

    def fault(self, call, at, kernels=None, **args):
        """Record ``call`` made with its ``at``-th operation failing (on
        ``kernels``): the spec does not make it, so the state stays."""
        step = {"call": call, "args": jsonable(args), "fault": {"at": int(at)}, "raises": "Fault"}
        if kernels is not None:
            step["fault"]["kernels"] = kernels
        self.target.fault(call, args, at, kernels)
        if self.states:
            step["state"] = self.target.observe()
        self.phase.append(step)

    @staticmethod
    def _clean(step):
        return {k: v for k, v in step.items() if not k.startswith("_")}

    def case(self, name, description="", tags=()):
        if self.pre_state is None:
            self.start()
        calls = sorted(
            {s["call"] for s in self.ops}
            | {n["call"] for s in self.ops for r in s.get("evict") or [] for n in r["ops"]}
        )
        policy = self.config.get("policy", "anchor")
        auto = [f"allocator:{self.allocator}", f"policy:{policy}"] + [f"call:{c}" for c in calls]
        if any(s.get("raises", "Fault") != "Fault" for s in self.ops):
            auto.append("bad-input")
        if any("fault" in s for s in self.ops):
            auto.append("fault")
        if self.lent:
            auto.append("lent")
        return {
            "format": FORMAT,
            "name": name,
            "description": description,
            "tags": sorted(set(auto) | set(tags)),
            "pre": {
                "allocator": self.allocator,
                "config": self.config,
                **({"lent": True} if self.lent else {}),
                "ops": [self._clean(s) for s in self.pre],
                "state": self.pre_state,
            },
            "ops": [self._clean(s) for s in self.ops],
            "post": self.target.observe(),
        }


# ---------------------------------------------------------------- replay


@dataclass
class Result:
    name: str
    status: str  # "pass", "fail" or "unsupported"
    detail: str = ""
    compared: int = 0  # steps' results and observed fields compared
    unobserved: set = field(default_factory=set)  # expected fields the target did not report
    fault_missed: bool = False  # a fault step's fault did not come out: the case no longer reaches its state

    @property
    def ok(self):
        return self.status == "pass"


class Mismatch(AssertionError):
    pass


def _compare_state(where, want, got, res):
    """Compare an observation field by field; a missing pool fails."""
    for pool, fields in want.get("pools", {}).items():
        have = got.get("pools", {}).get(pool)
        if have is None:
            raise Mismatch(f"{where}: pool {pool!r} not observed")
        if "pages" not in have:
            raise Mismatch(f"{where}: pool {pool!r}: the target reports no pages")
        for k, v in fields.items():
            if k not in have:
                res.unobserved.add(f"pools.{k}")
                continue
            res.compared += 1
            if jsonable(have[k]) != v:
                raise Mismatch(f"{where}: pool {pool!r} {k}: expected {_short(v)}, got {_short(jsonable(have[k]))}")
    for k in ("views",):
        for view, v in want.get(k, {}).items():
            if view not in got.get(k, {}):
                res.unobserved.add(f"{k}.{view}")
                continue
            res.compared += 1
            if got[k][view] != v:
                raise Mismatch(f"{where}: view {view}: expected {v}, got {got[k][view]}")
    if want.get("moves_held", False) != got.get("moves_held", False):
        held = (want.get("moves_held", False), got.get("moves_held", False))
        raise Mismatch(f"{where}: moves held: expected {held[0]}, got {held[1]}")
    res.compared += 1
    if "data_follows" in want:
        if "data_follows" not in got:
            res.unobserved.add("data_follows")
        else:
            res.compared += 1
            if got["data_follows"] != want["data_follows"]:
                raise Mismatch(f"{where}: live data is not at its translated page")


def _short(v, n=160):
    s = json.dumps(v)
    return s if len(s) <= n else s[:n] + "..."


def _replay_fault(target, where, step, res):
    """A faulted step: the fault must come out of the call (see the module docstring)."""
    fault, inject = step["fault"], getattr(target, "fault", None)
    if inject is None:  # an adapter without fault injection (the protocol's three methods)
        raise Unsupported(f"{type(target).__name__} cannot inject a fault")
    if not inject(step["call"], dict(step.get("args", {})), fault["at"], fault.get("kernels")):
        res.fault_missed = True
        raise Mismatch(
            f"{where} {step['call']}: the fault at operation {fault['at']} did not come out "
            "(the call made fewer operations, or swallowed it)"
        )
    res.compared += 1
    if "state" in step:
        _compare_state(f"{where} (after the faulted {step['call']})", step["state"], target.observe(), res)


def _replay_step(target, where, step, res):
    if "fault" in step:
        return _replay_fault(target, where, step, res)
    if "kernels" in step and hasattr(target, "use_kernels"):
        target.use_kernels(step["kernels"])
    args = dict(step.get("args", {}))
    shortfalls = []
    if step.get("evict") is not None:
        script = iter(step["evict"])

        def evict(k):
            shortfalls.append(int(k))
            r = next(script, None)
            if r is None:
                return 0
            for j, s in enumerate(r["ops"]):
                _replay_step(target, f"{where} evict round {len(shortfalls)} op {j}", s, res)
            if r.get("raises"):
                raise EvictorError(f"evict round {len(shortfalls)}")
            return r["returns"]

        args["evict"] = evict
    try:
        got = jsonable(target.call(step["call"], args))
        raised = None
    except (ValueError, EvictorError) as e:
        got, raised = None, e
    if "raises" in step:
        if type(raised).__name__ != step["raises"]:
            raise Mismatch(
                f"{where} {step['call']}: expected {step['raises']}, "
                f"{'raised ' + type(raised).__name__ if raised else 'returned ' + _short(got)}"
            )
    elif raised is not None:
        raise Mismatch(f"{where} {step['call']}: raised {type(raised).__name__}: {raised}")
    elif got != step["returns"]:
        raise Mismatch(
            f"{where} {step['call']}({_short(step.get('args'), 80)}): "
            f"expected {_short(step['returns'])}, got {_short(got)}"
        )
    res.compared += 1
    if step.get("evict") is not None:
        res.compared += 1
        if shortfalls != step.get("shortfalls", []):
            raise Mismatch(f"{where} {step['call']}: evict called with {shortfalls}, expected {step['shortfalls']}")
    if "state" in step:
        _compare_state(f"{where} (after {step['call']})", step["state"], target.observe(), res)


def replay_case(case, target):
    """Replay one case on ``target`` (an object or a registered name)."""
    if isinstance(target, str):
        target = get_target(target)
    res = Result(case.get("name", "?"), "pass")
    try:
        if case.get("format") != FORMAT:
            raise Mismatch(f"format {case.get('format')!r}, this replayer reads {FORMAT!r}")
        pre = case["pre"]
        target.lent = pre.get("lent", False)
        target.boot(pre["allocator"], pre["config"])
        for i, s in enumerate(pre["ops"]):
            _replay_step(target, f"pre op {i}", s, res)
        if "state" in pre:
            _compare_state("pre state", pre["state"], target.observe(), res)
        for i, s in enumerate(case["ops"]):
            _replay_step(target, f"op {i}", s, res)
        _compare_state("post state", case["post"], target.observe(), res)
    except Unsupported as e:
        res.status, res.detail = "unsupported", str(e)
    except Mismatch as e:
        res.status, res.detail = "fail", str(e)
    except Exception as e:  # a crash in the target is a failure of that case, reported
        res.status, res.detail = "fail", f"{type(e).__name__}: {e}"
    if res.status == "pass" and res.compared == 0:
        res.status, res.detail = "fail", "nothing was compared"
    return res


# ------------------------------------------------------------------ files


def case_path(root, name):
    return Path(root) / (name + ".json")


def write_cases(root, cases):
    """Write each case to ``root/<name>.json`` (a fresh tree) and an index."""
    root = Path(root)
    for old in sorted(root.rglob("*.json")) if root.exists() else []:
        old.unlink()
    names = set()
    for c in cases:
        if c["name"] in names:
            raise ValueError(f"vector {c['name']!r}: duplicate name")
        names.add(c["name"])
        p = case_path(root, c["name"])
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(dump(c), encoding="utf-8")
    index = {"format": FORMAT, "cases": len(cases), "coverage": coverage(cases)}
    (root / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return len(cases)


def dump(case):
    """One case as text: keys sorted, one key per line, lists of numbers
    on one line (stable and diffable, and a third of ``indent=1``'s size)."""
    return _dump(case, 0) + "\n"


def _dump(x, depth):
    pad = " " * (depth + 1)
    if isinstance(x, dict) and x and not all(_flat(v) for v in x.values()):
        items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_dump(x[k], depth + 1)}" for k in sorted(x)]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    if isinstance(x, list) and any(isinstance(v, (dict, list)) for v in x) and not _pairs(x):
        return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in x) + "\n" + " " * depth + "]"
    # ensure_ascii=False: a citation's "§" stays readable, and the citation test reads it
    return json.dumps(x, sort_keys=True, separators=(",", ":") if _pairs(x) else (", ", ": "), ensure_ascii=False)


def _flat(x, nested=True):
    """A number, string, bool, null, a list of them, or (one level down) a
    dict of them: printed inline."""
    if isinstance(x, list):
        return not any(isinstance(v, (dict, list)) for v in x)
    if isinstance(x, dict):
        return nested and all(_flat(v, nested=False) for v in x.values())
    return True


def _pairs(x):
    """A list of [vid, page] pairs: printed on one line."""
    return (
        isinstance(x, list) and bool(x) and all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in x)
    )


def load_cases(root):
    """Every case under ``root`` (files or a single file), sorted by name."""
    root = Path(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.json") if p.name != "index.json")
    return sorted((json.loads(p.read_text()) for p in files), key=lambda c: c["name"])


def coverage(cases):
    """Tag -> number of cases carrying it."""
    out = {}
    for c in cases:
        for t in c["tags"]:
            out[t] = out.get(t, 0) + 1
    return dict(sorted(out.items()))


def replay_dir(root: str | Path, target: str = "impl", device: str = "cpu", progress=None) -> list[Result]:
    """Replay every case under ``root``; a list of ``Result``."""
    results = []
    cases = load_cases(root)
    for c in cases:
        results.append(replay_case(c, get_target(target, device=device)))
        if progress:
            progress(results[-1])
    return results


def default_dir():
    """``tests/vectors`` of a source checkout, where the shipped set lives."""
    return Path(os.environ.get("KVARENA_VECTORS", Path(__file__).resolve().parents[2] / "tests" / "vectors"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvarena.verification import command_line as cl

    actions = parser.add_subparsers(dest="action", required=True)
    generate = actions.add_parser("generate", help="write the cases to DIR (replacing its *.json)")
    generate.add_argument("dir")
    replay = actions.add_parser("replay", help="replay every case under DIR on a target")
    replay.add_argument("dir")
    replay.add_argument("--target", default="impl", help="spec, impl, anchor, or module:factory (default impl)")
    cl.add_device(replay)
    cl.add_json(replay, "also write every case's result as JSON")
    replay.add_argument("--show", type=int, default=20, help="failing cases to print (default 20)")


def run(args: argparse.Namespace) -> int:
    """``kvarena vectors generate`` / ``replay``."""
    from rich.table import Table

    from kvarena.verification import command_line as cl
    from kvarena.verification import vector_cases

    console = cl.console()
    if args.action == "generate":
        cases = vector_cases.generate()
        n = write_cases(args.dir, cases)
        pols = sorted({t.split(":")[1] for c in cases for t in c["tags"] if t.startswith("policy:")})
        console.print(f"kvarena vectors: wrote {n} cases to {args.dir} (policies: {', '.join(pols)})")
        return 0
    if cl.no_device("vectors", args.device):
        return 2
    t = time.perf_counter()
    results = replay_dir(args.dir, args.target, args.device)
    status = Counter(r.status for r in results)
    bad = [r for r in results if r.status != "pass"]
    if bad:
        tab = Table(title=f"vectors not passing on {args.target}")
        for col in ("case", "status", "detail"):
            tab.add_column(col, overflow="fold")
        for r in bad[: args.show]:
            tab.add_row(r.name, r.status, r.detail)
        console.print(tab)
    unobserved = sorted(set().union(*(r.unobserved for r in results))) if results else []
    colour = "red" if status["fail"] or not results else "green"
    console.print(
        f"[{colour}]kvarena vectors replay ({args.target}, {args.device}): {status['pass']} passed, "
        f"{status['fail']} failed, {status['unsupported']} unsupported of {len(results)} cases; "
        f"{sum(r.compared for r in results)} comparisons"
        + (f"; not observed by the target: {', '.join(unobserved)}" if unobserved else "")
        + f" in {time.perf_counter() - t:.1f}s[/{colour}]"
    )
    if args.json:
        rows = [
            {
                "name": r.name,
                "status": r.status,
                "detail": r.detail,
                "compared": r.compared,
                "unobserved": sorted(r.unobserved),
            }
            for r in results
        ]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if status["fail"] or not results else 0
