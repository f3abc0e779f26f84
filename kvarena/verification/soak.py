"""``kvarena fuzz --soak OPS``: one long life of a composite, the
implementation beside the spec (issue 24, item 3).

A seeded scheduler drives one TriPool (full KV, SWA KV, state slots: every
kind, lazy full) in each package, per relief policy, for ``OPS``
operations: admit a request (a state slot, then its prompt), extend one,
decode a batch, free each request's SWA tokens that left the window,
finish one, and, when an admission does not fit, ``relieve`` with an
evictor that retracts the newest request.  Every result is compared as it
comes; every ``check_every`` operations the two arenas' snapshots, views
and ``verify()`` are compared too.  ``samples`` times along the run it
records the process's resident memory and the number of live tensors, so a
leak shows as a slope: the summary gives both at the first and last sample
and the largest growth after the first.

Nothing here is random beyond ``random.Random(seed)``: the same arguments
replay the same run.
"""

import gc
import os
import random
import time
from typing import Any

import torch

from kvarena import impl, spec
from kvarena.spec import POLICIES

from .differential_composites import build, host

PS, FULL, SWA = 4, 8, 8  # page size; bytes of a full and a SWA entry
STATE = 3 * FULL * PS  # a state slot: three full pages
PAGES = 96  # the buffer, in full-and-SWA page pairs
WINDOW = 2 * PS  # the engine's sliding window, less one
LONGEST = 12 * PS  # no request grows past this: requests finish and make room


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc``; else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))  # type(): no __class__ lookups


class Mismatch(AssertionError):
    """The implementation and the spec disagreed."""


class Twins:
    """One scheduler, the spec and the implementation composite."""

    def __init__(self, policy: str, seed: int, device: str) -> None:
        total = PAGES * (FULL + SWA) * PS + 6 * STATE
        self.S = build(spec, "tri", total, FULL, SWA, STATE, PS, {"full"}, {}, policy)
        self.I = build(impl, "tri", total, FULL, SWA, STATE, PS, {"full"}, {"device": device}, policy)
        self.rng = random.Random(seed)
        self.reqs: list[dict[str, Any]] = []  # tokens, state slot, SWA freed up to
        self.counts: dict[str, int] = {}

    def both(self, call):
        got = [host(x) if not isinstance(x, bool) else x for x in (call(self.S), call(self.I))]
        if got[0] != got[1]:
            raise Mismatch(f"spec {got[0]!r}, implementation {got[1]!r}")
        return got[0]

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # ---------------------------------------------------------- the ops

    def admit(self) -> None:
        slot = self.both(lambda c: c.alloc_state(1))
        prompt = self.rng.randint(1, 3 * PS)
        tokens = self.both(lambda c: c.alloc_extend([0], [prompt], [-1])) if slot is not None else None
        if tokens is None and slot is not None:
            ok = self.both(lambda c: c.relieve(prompt, 0, self._evictor(c)))
            self.count("relieved" if ok else "relief failed")
            tokens = self.both(lambda c: c.alloc_extend([0], [prompt], [-1])) if ok else None
        if tokens is None:
            if slot is not None:
                self.both(lambda c: c.free_state(slot))
            self.count("admission refused")
            return
        self.reqs.append({"tokens": tokens, "slot": slot, "freed": 0})
        self.count("admitted")

    def _evictor(self, c):
        """Retract the newest request, in ``c`` only; the other twin's
        evictor retracts the same one (both run in turn, so the request list
        is only dropped after the spec's round and the implementation's)."""
        spec_side = c is self.S
        queue = list(range(len(self.reqs) - 1, -1, -1))

        def evict(shortfall: int) -> int:
            if not queue:
                return 0
            r = self.reqs[queue.pop(0)]
            c.free(r["tokens"])
            if r["slot"] is not None:
                c.free_state(r["slot"])
            if not spec_side:  # both twins have retracted it now
                r["retracted"] = True
                self.count("retracted")
            return len(r["tokens"])

        return evict

    def extend(self, r: dict[str, Any]) -> None:
        seq = len(r["tokens"])
        k = min(LONGEST - seq, self.rng.randint(1, 2 * PS))
        if k > 0:
            new = self.both(lambda c: c.alloc_extend([seq], [seq + k], [r["tokens"][-1]]))
            if new is not None:
                r["tokens"] += new
                self.count("extended")

    def decode(self) -> None:
        growing = [r for r in self.reqs if len(r["tokens"]) < LONGEST]
        batch = self.rng.sample(growing, min(len(growing), self.rng.randint(1, 8)))
        if batch:
            seqs, lasts = [len(r["tokens"]) + 1 for r in batch], [r["tokens"][-1] for r in batch]
            new = self.both(lambda c: c.alloc_decode(seqs, lasts))
            if new is not None:
                for r, t in zip(batch, new):
                    r["tokens"].append(t)
                self.count("decoded")

    def slide(self) -> None:
        for r in self.reqs:
            end = spec.swa_window_end(len(r["tokens"]), WINDOW, PS)
            if end > r["freed"]:
                chunk, start = r["tokens"][r["freed"] : end], r["freed"]
                self.both(lambda c, chunk=chunk, start=start: c.free_swa(chunk, start))
                r["freed"] = end
                self.count("window freed")

    def finish(self, r: dict[str, Any]) -> None:
        self.reqs.remove(r)
        for c in (self.S, self.I):
            c.free(r["tokens"])
            if r["slot"] is not None:
                c.free_state(r["slot"])
        self.count("finished")

    def step(self) -> None:
        self.reqs = [r for r in self.reqs if not r.get("retracted")]
        roll = self.rng.random()
        if roll < 0.25 or not self.reqs:
            self.admit()
        elif roll < 0.45:
            self.extend(self.rng.choice(self.reqs))
        elif roll < 0.75:
            self.decode()
        elif roll < 0.85:
            self.slide()
        else:
            self.finish(self.rng.choice(self.reqs))

    def agree(self) -> None:
        if self.S.arena.snapshot() != self.I.arena.snapshot():
            raise Mismatch("the arenas' snapshots differ")
        for view in ("available_size", "full_available_size", "swa_available_size", "state_available_size"):
            if getattr(self.S, view)() != getattr(self.I, view)():
                raise Mismatch(f"{view} differs")
        self.S.verify()
        self.I.verify()


def soak(
    ops: int,
    check_every: int = 1000,
    samples: int = 20,
    seed: int = 0,
    device: str = "cpu",
    policies: tuple[str, ...] = POLICIES,
    progress=None,
) -> dict[str, Any]:
    """``ops`` operations per policy; a JSON-able summary.  Raises
    ``Mismatch`` (or the spec's ``AccountingError``) on the first disagreement."""
    out: dict[str, Any] = {"ops_per_policy": ops, "check_every": check_every, "seed": seed, "device": device}
    every = max(1, ops // samples)
    for policy in policies:
        t0 = time.perf_counter()
        twins = Twins(policy, seed, device)
        trace = []
        for k in range(1, ops + 1):
            twins.step()
            if k % check_every == 0 or k == ops:
                twins.agree()
            if k % every == 0 or k == ops:
                trace.append({"op": k, "rss_bytes": resident_bytes(), "tensors": live_tensors()})
                if progress:
                    progress(policy, k, ops)
        base = trace[0]
        out[policy] = {
            "seconds": round(time.perf_counter() - t0, 1),
            "samples": trace,
            "rss_first_mib": round(base["rss_bytes"] / 2**20, 1),
            "rss_last_mib": round(trace[-1]["rss_bytes"] / 2**20, 1),
            "rss_growth_mib": round(max(s["rss_bytes"] for s in trace) / 2**20 - base["rss_bytes"] / 2**20, 1),
            "tensors_first": base["tensors"],
            "tensors_last": trace[-1]["tensors"],
            "tensors_growth": max(s["tensors"] for s in trace) - base["tensors"],
            "events": dict(sorted(twins.counts.items())),
        }
    return out
