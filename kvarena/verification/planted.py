"""``kvarena planted``: named bugs planted one at a time, and who catches them.

Each ``Mutation`` is a small text edit of one source file of the spec or
the implementation that recreates one of the anchor's bugs (docs/design.md
§9) or another plausible slip.  For each, a fresh copy of the package is
made with the edit applied (``kvarena/`` with ``spec/``, ``impl/`` and
``proofs/`` inside, first on ``PYTHONPATH``), and the suites run against
that copy in a subprocess, cheapest first:

- ``vectors``: the shipped conformance vectors replayed on the spec and on
  the implementation;
- ``differential``: a fixed-seed pass of each differential machine (as
  ``kvarena fuzz`` runs it, then as the tests run it, host transfers and all);
- ``unit``: the mutation's pytest files (the anchor-bug, hardening and
  implementation tests unless it names others);
- ``proofs``: the z3 obligations of the mutation's groups (spec mutations
  only: the proofs reason about the spec's own functions).

First every suite runs on the unmutated package (the baseline): a suite
that fails anyway would "catch" everything, so the run stops there.  A
suite *catches* a mutation when it fails.  By default the run stops at
the first suite that catches it (``--all-suites`` runs every suite, for
the full matrix).  ``kvarena planted`` fails unless every mutation is
caught; a mutation whose text no longer matches its file is an error, not
a pass.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]  # the repository
PACKAGES = {"kvarena": "kvarena", "spec": "kvarena/spec", "impl": "kvarena/impl", "proofs": "kvarena/proofs"}
SUITES = ("vectors", "differential", "unit", "proofs")
DEFAULT_UNIT = (
    "tests/spec/test_anchor_bugs.py",
    "tests/impl/test_anchor_bugs.py",
    "tests/api/test_arena.py",
    "tests/impl/test_arena.py",
)


@dataclass
class Mutation:
    name: str
    what: str  # the bug it recreates
    file: str  # relative to the repository root
    edits: list  # [(old, new)]: each old must occur exactly once
    unit: tuple = DEFAULT_UNIT
    proof_groups: tuple = ()  # z3 groups to run (spec mutations)
    proof_only: tuple = ()  # or: obligation-name prefixes, run as `kvarena prove --only` (the proofs must catch it)


@dataclass
class Outcome:
    name: str
    what: str
    caught_by: list = field(default_factory=list)
    missed_by: list = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def caught(self):
        return bool(self.caught_by) and not self.error


MUTATIONS = [
    Mutation(
        "sink-off-by-one",
        "min_page floors the sink: a pool's first page can overlap the padding sink",
        "spec/arith.py",
        [("    return cdiv(sink_bytes, epp)", "    return fdiv(sink_bytes, epp)")],
        proof_groups=("layout",),
    ),
    Mutation(
        "float-region-floor-spec",
        "anchor bug 1: the float region's low edge floors an off-grid frontier (spec)",
        "spec/arith.py",
        [("lo = max_(cdiv(below, epp), lowest)", "lo = max_(fdiv(below, epp), lowest)")],
        proof_groups=("layout", "capacity"),
    ),
    Mutation(
        "float-region-floor-impl",
        "anchor bug 1: the float region's low edge floors an off-grid frontier (impl)",
        "impl/capacity.py",
        [("    lo = _ceil(below, epp)", "    lo = _floor(below, epp)")],
    ),
    Mutation(
        "end-gap-ceil",
        "anchor bug 5: an END prices a partial page of an off-grid gap as whole",
        "impl/capacity.py",
        [("    ext = _floor(gap, epp)", "    ext = _ceil(gap, epp)")],
    ),
    Mutation(
        "move-src-dst-swapped",
        "anchor bug 4: a relocation copies destination onto source",
        "impl/arena.py",
        [
            (
                "self._copy_pages(b.name, dst, src, disjoint)",
                "self._copy_pages(b.name, src, dst, disjoint)",
            )
        ],
    ),
    Mutation(
        "memo-field-mutated-in-place",
        "alloc writes holes and live around their epoch descriptors: an alloc served from holes leaves a stale memo",
        "impl/arena.py",
        [
            ("        b.holes = b.holes[k:]\n", '        b.__dict__["holes"] = b.holes[k:]\n'),
            ("        b.live = b.live + n\n", '        b.__dict__["live"] += n\n'),
        ],
        unit=("tests/impl/test_memo.py", "tests/impl/test_arena.py"),
    ),
    Mutation(
        "holes-not-credited",
        "an END's view forgets its lazy holes",
        "impl/arena.py",
        [
            (
                "return cap.end_available(self._gap(b), g.epp, room, b.n_holes)",
                "return cap.end_available(self._gap(b), g.epp, room, 0)",
            )
        ],
    ),
    Mutation(
        "lazy-frees-overwrite",
        "anchor bug 8: a batch of lazy frees replaces the earlier batches' holes (pages lost)",
        "impl/arena.py",
        [("            b.append_holes(pages)\n", "            b.holes = pages\n")],
    ),
    Mutation(
        "sentinel-passes-free-check",
        "anchor bug 9: a -1 sentinel passes free's validation",
        "impl/arena.py",
        [("            if not first <= v < end:", "            if v != -1 and not first <= v < end:")],
    ),
    Mutation(
        "sink-freed-on-segment-free",
        "anchor bug 10: the window free takes page 0 (the sink) as a live entry",
        "impl/composites.py",
        [
            (
                "live = self.arena.v2p_at(SWA, torch.clamp(page, min=0)) > 0",
                "live = self.arena.v2p_at(SWA, torch.clamp(page, min=0)) >= 0",
            )
        ],
        unit=("tests/api/test_composites.py", "tests/impl/test_composites.py"),
    ),
    Mutation(
        "coupled-alloc-keeps-one-side",
        "a coupled allocation gated on full's own view keeps full's pages "
        "when swa is short (the anchor's static SWA allocator leaked this way)",
        "impl/composites.py",
        [
            (
                "            if n > self.joint_pages():\n"
                "                self.relieve(tokens=n * self.page_size)\n"
                "                if n > self.joint_pages():",
                "            if n > self.arena.available_pages(FULL):\n"
                "                self.relieve(tokens=n * self.page_size)\n"
                "                if n > self.arena.available_pages(FULL):",
            ),
            (
                "        return self.arena.bind_with_borrowers(FULL, n, slots)\n",
                "        ids = self.arena.alloc(FULL, n)\n"
                "        if self._has(SWA) and self.arena.alloc(SWA, n, ids=ids, check=False) is None:\n"
                "            return None\n"
                "        return ids\n",
            ),
        ],
        unit=("tests/api/test_composites.py", "tests/impl/test_composites.py"),
    ),
    Mutation(
        "borrowed-id-freed-in-lender",
        "a lender frees an id its borrower still holds",
        "impl/arena.py",
        [("for other in self.borrowers(b.name) if freeing else ():", "for other in ():")],
    ),
    Mutation(
        "joint-view-per-side",
        "anchor bug 7: the two-END joint view prices a coupled page at one side's bytes",
        "impl/capacity.py",
        [("p = hi + _floor(gap - solo, epp_a + epp_b)", "p = hi + _floor(gap - solo, max(epp_a, epp_b))")],
        unit=("tests/api/test_composites.py", "tests/impl/test_composites.py"),
    ),
    Mutation(
        "no-slide-before-evict",
        "anchor bug 6: the ladder never asks the float to give ground",
        "impl/arena.py",
        [("                    self.open_short_side(f, {name: need})\n", "                    pass\n")],
    ),
    Mutation(
        "three-kinds-keep-swa",
        "anchor bug 2: a three-kind composite never frees SWA on the window",
        "impl/composites.py",
        [
            (
                "        if count:\n            self.arena.free(SWA, key if",
                "        if count and not self._has(STATE):\n            self.arena.free(SWA, key if",
            )
        ],
        unit=("tests/api/test_composites.py", "tests/impl/test_composites.py"),
    ),
    Mutation(
        "flush-cap-ignored",
        "a capped lazy flush moves every survivor",
        "impl/arena.py",
        [("k = k if max_moves is None else min(k, max_moves)", "k = k")],
    ),
    Mutation(
        "relief-flushes-whole",
        "the composite ladder flushes each END whole: one page short moves every "
        "stray survivor (the churn the steps removed)",
        "impl/composites.py",
        [
            (
                "self.arena.flush(name, max_moves=min(k, surplus)):",
                "self.arena.flush(name):",
            )
        ],
        unit=("tests/api/test_relief_steps.py",),
    ),
    Mutation(
        "relief-compacts-short-end",
        "the composite ladder compacts an END whose holes its own demand "
        "takes: its frontier's pages are the ones its extension then needs (moves for nothing)",
        "impl/composites.py",
        [
            (
                "while (surplus := self.arena.counts(name).holes - demand[name]) > 0:",
                "while (surplus := self.arena.counts(name).holes) > 0:",
            )
        ],
        unit=("tests/api/test_relief_steps.py",),
    ),
    Mutation(
        "park-off-centre",
        "a parked float's new span rounds its centre up",
        "impl/capacity.py",
        [("    return lo + _floor(hi - lo - n, 2)", "    return lo + _ceil(hi - lo - n, 2)")],
    ),
    Mutation(
        "relieve-verdict-early",
        "hardening bug 1: relieve reports False after an evictor that freed pages but returned 0",
        "impl/arena.py",
        [("        return short() <= 0\n\n", "        return False\n\n")],
    ),
    Mutation(
        "tombstone-translates-to-minus-one",
        "translate hands out -1 for a freed id instead of the sink",
        "impl/arena.py",
        [(".clamp_min(0).reshape(ids.shape)", ".reshape(ids.shape)")],
    ),
    Mutation(
        "decode-misses-shared-page",
        "the checked alloc_decode no longer sees two requests continuing one page",
        "impl/composites.py",
        [
            (
                "return held, aligned, in_range, owner.index_select(0, target) != idx",
                "return held, aligned, in_range, idx < 0",
            )
        ],
        unit=("tests/api/test_composite_inputs.py",),
    ),
    Mutation(
        "window-free-repeats-a-page",
        "free_swa keeps a page named by two representatives twice: it frees it twice",
        "impl/band.py",
        [("rest.masked_fill_(rest == key[:-1], end)  # a repeat", "rest  # a repeat")],
        unit=("tests/api/test_composites.py",),
    ),
    Mutation(
        "fault-bind-not-undone",
        "a bind records no undo: a fault after it leaves the ids bound (impl/journal.py)",
        "impl/arena.py",
        [("        journal.on_undo(_unbind, b, ids, pages)\n", "")],
        unit=("tests/impl/test_faults.py",),
    ),
    Mutation(
        "fault-freed-pages-not-kept",
        "a scope that freed pages keeps none of their bytes: an undone eager free brings back garbage",
        "impl/journal.py",
        [("        if self.freed:\n", "        if False:\n")],
        unit=("tests/impl/test_faults.py",),
    ),
    Mutation(
        "fault-undo-loses-the-forwards-write",
        "a free keeps its pages' bytes when it frees them, not when they are overwritten: an undo after the "
        "free waited for the forward in flight puts back what a page held before the forward wrote it (issue 52)",
        "impl/arena.py",
        [
            (
                "        journal.freed = True\n        b.v2p.index_fill_(0, ids, -1)",
                "        journal.freed = True\n        rows = self._page_rows(name)\n"
                "        journal.on_undo(rows.index_copy_, 0, pages, rows.index_select(0, pages))\n"
                "        b.v2p.index_fill_(0, ids, -1)",
            )
        ],
        unit=("tests/impl/test_faults.py", "tests/verification/test_fault_in_flight.py"),
    ),
    Mutation(
        "make-room-need-floor",
        "make_room clears one page too few when the target is off-grid (spec)",
        "spec/arith.py",
        [("    return cdiv(min_bytes - band_side, epp)", "    return fdiv(min_bytes - band_side, epp)")],
        proof_groups=("make_room", "policy"),
    ),
    Mutation(
        "policy-moves-when-both-short",
        "the demand-vector policy slides a float when both sides are short (spec)",
        "spec/policy.py",
        [("    both_short = ite(low_short, high_short, False)", "    both_short = False")],
        proof_groups=("policy",),
    ),
]


# Spec bugs in the frontier and count logic that only the proofs need to see:
# each one is in the code the arena runs (spec/chain.py, spec/transitions.py,
# spec/bands.py) or in a closed form the implementation's gate is proved
# equal to (spec/arith.py), and `kvarena prove` must refute an obligation for each
# (tests/proofs/test_planted.py).  docs/design.md §7: a bug planted in the arena
# must fail an obligation, not only a test.
PROOF_PLANTS = [
    Mutation(
        "schedulable-credits-float-holes",
        "the anchor's bug class (float-own-ladder): an END's schedulable view credits an opaque float "
        "neighbour's holes, which no flush hands over (an over-promise)",
        "spec/chain.py",
        [
            (
                'return ite(q.lazy, s.bands[j].holes * q.epp, 0) if q.grow != "float" else 0',
                'return ite(q.lazy, s.bands[j].holes * q.epp, 0) if q.grow != "float" else s.bands[j].holes * q.epp',
            )
        ],
        proof_only=("views.schedulable.up.n3.sound",),
    ),
    Mutation(
        "schedulable-credits-nothing",
        "an END's schedulable view forgets the lazy END's holes a flush hands over (an under-promise: a false OOM)",
        "spec/chain.py",
        [
            (
                'return ite(q.lazy, s.bands[j].holes * q.epp, 0) if q.grow != "float" else 0',
                "return 0",
            )
        ],
        proof_only=("views.schedulable.down.n2.tight",),
    ),
    Mutation(
        "joint-view-one-page-over",
        "the composites' joint view (arith.two_end_joint_pages, HybridSWA's available_size) promises one page "
        "more than the coupled bind takes (an over-promise: alloc_extend of available_size() tokens fails)",
        "spec/arith.py",
        [
            (
                "    return min_(min_(one_side, both), min_(holes_a + room_a, holes_b + room_b))",
                "    return min_(min_(one_side, both), min_(holes_a + room_a, holes_b + room_b)) + 1",
            )
        ],
        proof_only=("composite.hybrid.joint_sound",),
    ),
    Mutation(
        "joint-view-one-page-under",
        "the composites' joint view promises one page less than the coupled bind takes (a false OOM)",
        "spec/arith.py",
        [
            (
                "    return min_(min_(one_side, both), min_(holes_a + room_a, holes_b + room_b))",
                "    return min_(min_(one_side, both), min_(holes_a + room_a, holes_b + room_b)) - 1",
            )
        ],
        proof_only=("composite.hybrid.joint_tight",),
    ),
    Mutation(
        "view-drops-holes",
        "the capacity view forgets an END's lazy holes",
        "spec/chain.py",
        [
            (
                "return arith.end_available(gap(s, i), p.epp, end_room(s, i), b.holes)",
                "return arith.end_available(gap(s, i), p.epp, end_room(s, i), 0)",
            )
        ],
        proof_only=("capacity.end_up.tight.n4",),
    ),
    Mutation(
        "float-free-loses-a-hole",
        "a float's free records one hole too few",
        "spec/transitions.py",
        [
            (
                "return pick(a.live == k, park(s, i), holes)",
                "return pick(a.live == k, park(s, i), Counts(a.lo, a.hi, a.live - k, a.holes + k - 1))",
            )
        ],
        proof_only=("inv.free_float.conservation.n3",),
    ),
    Mutation(
        "float-extends-toward-smaller-gap",
        "the side choice flipped: a float extends toward its smaller gap",
        "spec/transitions.py",
        [("return hi - a.hi >= a.lo - lo", "return hi - a.hi <= a.lo - lo")],
        proof_only=("inv.alloc_float_extend_low.order.n3",),
    ),
    Mutation(
        "eager-free-retreats-one-short",
        "an eager END's frontier retreats one page less than it freed",
        "spec/transitions.py",
        [("Counts(a.lo, a.hi - k, a.live - k, a.holes)", "Counts(a.lo, a.hi - k + 1, a.live - k, a.holes)")],
        proof_only=("inv.free_eager.conservation.n2",),
    ),
    Mutation(
        "walk-sees-parked-floats",
        "the chain walk stops at a parked float",
        "spec/chain.py",
        [("        r = ite(opaque(s, j), value(j), r)", "        r = value(j)")],
        proof_only=("golden.up_gap.n3", "golden.down_gap.n3"),
    ),
    Mutation(
        "leapfrog-lands-one-high",
        "a leapfrog packs one page past the region's edge",
        "spec/transitions.py",
        [("Counts(r_hi - a.live, r_hi, a.live, 0)", "Counts(r_hi - a.live + 1, r_hi + 1, a.live, 0)")],
        proof_only=("inv.make_room_leapfrog.order.n3",),
    ),
    Mutation(
        "make-room-cost-miscounted",
        "make_room's page count charges one page more than the cleared live pages",
        "spec/transitions.py",
        [("s.bands[i].live - spared, need - spared)", "s.bands[i].live - spared, need - spared + 1)")],
        proof_only=("policy.cost_bound",),
    ),
    Mutation(
        "move-keeps-the-source",
        "a move leaves the source page mapped to its id",
        "spec/bands.py",
        [("    for s in src:\n        p2v[s] = -1\n", "")],
        proof_only=("integrity.move.k1.bounded",),
    ),
    Mutation(
        "uneven-gate-ignores-swa-holes",
        "the uneven joint gate (full Pf pages, swa Ps of them) prices all of swa's demand as extension, "
        "ignoring its lazy holes",
        "spec/arith.py",
        [("    m_b = max_(0, pages_b - holes_b)\n", "    m_b = max_(0, pages_b)\n")],
        proof_only=("composite.hybrid.uneven_tight",),
    ),
    Mutation(
        "pd-tail-one-page-short",
        "a PD decode node's preallocation binds one SWA page too few: the window's first tail token has no entry",
        "spec/arith.py",
        [
            (
                "    first_tail = fdiv(seq_len - swa_tail_len, page_size)\n",
                "    first_tail = fdiv(seq_len - swa_tail_len, page_size) + 1\n",
            )
        ],
        proof_only=("disagg.tail.covers",),
    ),
    Mutation(
        "pd-tail-one-page-long",
        "a PD decode node's preallocation binds one SWA page too many: a page of no tail token takes SWA bytes",
        "spec/arith.py",
        [
            (
                "    first_tail = fdiv(seq_len - swa_tail_len, page_size)\n",
                "    first_tail = fdiv(seq_len - swa_tail_len, page_size) - 1\n",
            )
        ],
        proof_only=("disagg.tail.exact",),
    ),
]
MUTATIONS += PROOF_PLANTS

# In-flight forwards (docs/design.md §12, issue 40): a race planted in the
# spec's guards.  `kvarena prove` refutes each (an `inflight.*` obligation, or
# the CrossHair run of the non-urgent walk: tests/proofs/test_inflight.py); the
# three that change what the arena does (a pinned page moved, a pending page
# handed out, an alloc taking a guarded hole) also break the spec's own
# assertions and Band.check, which the forward tests and, once they launch
# forwards, the differential machines run into.  The other two weaken only
# the guard the arena asserts, which the proofs alone can see.
INFLIGHT_UNIT = ("tests/spec/test_forward.py",)
INFLIGHT_PLANTS = [
    Mutation(
        "inflight-walk-moves-a-pin",
        "the non-urgent flush walks past a pinned survivor: it moves a page an in-flight forward still writes "
        "(the late write is lost)",
        "spec/moves.py",
        [("        if p in stop:\n            break\n", "")],
        unit=INFLIGHT_UNIT,
        proof_only=("crosshair.check.kvarena.proofs.inflight_plans",),
    ),
    Mutation(
        "inflight-pending-handed-out",
        "forward.guarded forgets pending pages: an alloc hands out a hole an in-flight forward still reads",
        "spec/forward.py",
        [("    return or_(pinned[p] >= 0, pending[p] >= 0)\n", "    return or_(pinned[p] >= 0)\n")],
        unit=INFLIGHT_UNIT,
        proof_only=("inflight.bind.unguarded.k1.bounded",),
    ),
    Mutation(
        "inflight-alloc-takes-guarded-holes",
        "alloc_settles ignores guarded holes: an alloc that needs a pending or pinned hole does not settle "
        "(the view counts pending pages as free without settling)",
        "spec/transitions.py",
        [
            (
                "    return and_(guarded > 0, n > s.bands[i].holes - guarded)\n",
                "    return and_(guarded > 0, n > s.bands[i].holes)\n",
            )
        ],
        unit=INFLIGHT_UNIT,
        proof_only=("inflight.alloc.up.n2",),
    ),
    Mutation(
        "inflight-move-clear-reads-a-pin",
        "forward.move_clear forgets pinned sources: the guard the arena asserts passes a move of a page the "
        "forward writes late",
        "spec/forward.py",
        [("and_(*[pinned[s] < 0 for s in src], *[pinned[d] < 0", "and_(*[pinned[d] < 0")],
        unit=INFLIGHT_UNIT,
        proof_only=("inflight.move.k1.bounded",),
    ),
    Mutation(
        "inflight-bind-clear-blind-to-pending",
        "forward.bind_clear forgets pending pages: the guard the arena asserts passes a hand-out of a page the "
        "forward reads",
        "spec/forward.py",
        [
            (
                "return and_(*[pinned[p] < 0 for p in pages], *[pending[p] < 0 for p in pages])",
                "return and_(*[pinned[p] < 0 for p in pages])",
            )
        ],
        unit=INFLIGHT_UNIT,
        proof_only=("inflight.bind.k1.bounded",),
    ),
]
MUTATIONS += INFLIGHT_PLANTS

# Host transfers (docs/design.md §13): a hold broken in the implementation.
# A queued transfer addresses pages by physical id, so a page that moves
# under it loses the load (or the bytes the transfer reads); a reservation
# the counts forget is a page handed out twice.  The differential machine
# catches each (its placement oracle, the byte read-back of loads, the
# views, verify), and so do the unit tests.
HOLD_UNIT = ("tests/impl/test_hold.py",)
HOLD_PLANTS = [
    Mutation(
        "hold-flush-moves",
        "a flush ignores the hold: it moves pages a host transfer in flight addresses by physical page",
        "impl/arena.py",
        [("max_moves = 0  # a host transfer holds the pages where they are: absorb only", "pass  # the hold ignored")],
        unit=HOLD_UNIT,
    ),
    Mutation(
        "hold-plan-moves",
        "the planner repacks the floats while moves are held",
        "impl/arena.py",
        [("        if self.moves_held() and any(src.numel() for _, _, src in repacks):\n", "        if False:\n")],
        unit=HOLD_UNIT,
    ),
    Mutation(
        "hold-reserve-uncounted",
        "reserve does not count its pages live: the views offer them again, and a reserved page is handed out twice",
        "impl/arena.py",
        [
            (
                "        b.live = b.live + pages.numel()  # live in every view",
                "        b.live = b.live  # live in every view",
            )
        ],
        unit=HOLD_UNIT,
    ),
    Mutation(
        "hold-gate-around-the-memo",
        "the gate is written around its capacity field: a memoised schedulable view outlives a close or an open",
        "impl/arena.py",
        [("            self.closed_gates = gates\n", '            self.__dict__["closed_gates"] = gates\n')],
        unit=HOLD_UNIT,
    ),
    Mutation(
        "hold-schedulable-credits",
        "an END's schedulable view credits its neighbour's holes while moves are held: a flush that only absorbs "
        "never delivers them (an over-promise)",
        "impl/arena.py",
        [("        if not b.is_end or self.moves_held():  # a held flush", "        if not b.is_end:  # a held flush")],
        unit=HOLD_UNIT,
    ),
    Mutation(
        "hold-ignored-on-the-up-end",
        "the gate is ignored on one member: the up END (SWA's or the state's) compacts while a transfer "
        "(HiCache's or PD's) addresses its pages by physical page",
        "impl/arena.py",
        [
            (
                "        if self.moves_held():\n            max_moves = 0  # a host transfer",
                '        if self.moves_held() and b.grow != "up":\n            max_moves = 0  # a host transfer',
            )
        ],
        unit=HOLD_UNIT,
    ),
]
MUTATIONS += HOLD_PLANTS


def by_name(name):
    for m in MUTATIONS:
        if m.name == name:
            return m
    raise ValueError(f"mutation {name!r}: unknown")


# --------------------------------------------------------------- copies


def mutated_copy(m, dest, root=ROOT):
    """Lay the package out under ``dest`` with ``m`` applied; raise
    ``ValueError`` when an edit's text does not occur exactly once."""
    for src, rel in PACKAGES.items():
        shutil.copytree(
            root / src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
        )
    if not m.edits:  # the baseline: the package as it is
        return dest
    top, _, rest = m.file.partition("/")
    target = dest / PACKAGES[top] / rest
    text = target.read_text()
    for old, new in m.edits:
        n = text.count(old)
        if n != 1:
            raise ValueError(f"mutation {m.name!r}: {old[:60]!r} occurs {n} times in {m.file}")
        text = text.replace(old, new)
    target.write_text(text)
    return dest


# ----------------------------------------------------- suites (in the child)


def suite_vectors(m):
    from kvarena.verification import vectors

    for target in ("spec", "impl"):
        for c in vectors.load_cases(vectors.default_dir()):
            r = vectors.replay_case(c, target)
            if r.status == "fail":
                return True, f"{target}: {r.name}: {r.detail[:200]}"
    return False, "every case passes on spec and impl"


def suite_differential(m, examples=60):
    from kvarena.verification import differential, differential_composites, fuzz

    for label, policy in fuzz.targets():
        r = fuzz.run_round(label, policy, examples=examples, shrink=False, derandomize=True)
        if r["failure"]:
            return True, f"{label} ({r['policy']}): {r['failure']['error'][:200]}"
    # the machines as the tests run them, in the CI profile, too
    for mod in (differential, differential_composites):
        try:
            mod.run_machine("cpu", derandomize=True, database=None)
        except Exception as e:
            return True, f"{mod.__name__.rsplit('.', 1)[-1]} with host transfers: {type(e).__name__}: {str(e)[:200]}"
    return False, f"{examples} fixed-seed examples per machine agree, and the CI profile"


def suite_unit(m):
    """The mutation's test files, from the checkout (not the scratch copy)."""
    root = Path(os.environ.get("KVARENA_PLANTED_ROOT", ROOT))
    files = [str(root / f) for f in m.unit]
    # --import-mode=append: the tests are the package ``tests`` under the
    # checkout, whose root the default mode would put ahead of the mutated
    # copy on sys.path (its unmutated kvarena/ would be tested instead)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--import-mode=append", *files],
        capture_output=True,
        text=True,
        cwd=os.getcwd(),
    )
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode not in (0, 1):  # pytest could not run them: that is no verdict at all
        return None, f"pytest exit {proc.returncode}: {tail} {proc.stderr.strip()[-200:]}"
    return proc.returncode == 1, f"{' '.join(m.unit)}: {tail}"


def suite_proofs(m):
    if m.proof_only:
        return _kvarena_prove(m.proof_only)
    if not m.proof_groups:
        return None, "not run: the proofs reason about the spec, this mutation is in the implementation"
    from kvarena.proofs import cli

    # each in a fresh solver process, as kvarena prove runs them: a verdict
    # must not depend on the obligations this process ran before
    names = [n for n in cli.registry() if n.split(".")[0] in m.proof_groups]
    unknown = []
    for r in cli.run_fresh(names, jobs=2):
        if r["result"] == "unknown":  # a time-out is no verdict, either way
            unknown.append(r["name"])
        elif not r["ok"]:
            return True, f"{r['name']}: {r['result']}"
    return False, (
        f"{len(names) - len(unknown)} obligations of {', '.join(m.proof_groups)} hold"
        + (f"; {len(unknown)} timed out: {', '.join(unknown[:3])}" if unknown else "")
    )


def _kvarena_prove(prefixes):
    """``kvarena prove --only PREFIXES --no-crosshair`` on the (mutated)
    package, and ``kvarena prove --only P`` for each CrossHair run ``P``
    (``crosshair.…``) named; caught when it exits non-zero with an
    obligation refuted (a counterexample) or found vacuous, or a CrossHair
    counterexample: a time-out alone is no verdict."""
    import contextlib
    import io

    from kvarena.proofs import cli

    z3_only = [p for p in prefixes if not p.startswith("crosshair.")]
    runs = [["--only", ",".join(z3_only), "--no-crosshair"]] if z3_only else []
    runs += [["--only", p] for p in prefixes if p.startswith("crosshair.")]
    rc, rows = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for k, args in enumerate(runs):
            out = Path(tmp) / f"prove{k}.json"
            with contextlib.redirect_stdout(io.StringIO()):
                rc = max(rc, cli.main([*args, "--jobs", "1", "--json", str(out)]))
            rows += json.loads(out.read_text())["results"]

    def refutes(r):
        if r.get("kind", "").startswith("crosshair"):
            return r["result"] == "counterexample"
        return (r["result"] != r["expect"] and r["result"] != "unknown") or r.get("vacuity") == "unsat"

    refuted = [r for r in rows if not r["ok"] and refutes(r)]
    if rc and refuted:
        r = refuted[0]
        return True, f"kvarena prove exits {rc}: {r['name']}: {r['result']}, vacuity {r.get('vacuity')}"
    unknown = [r["name"] for r in rows if r["result"] == "unknown"]
    return False, (
        f"kvarena prove exits {rc}: {len(rows) - len(unknown)} obligations hold"
        + (f"; {len(unknown)} timed out: {', '.join(unknown[:3])}" if unknown else "")
    )


RUNNERS = {"vectors": suite_vectors, "differential": suite_differential, "unit": suite_unit, "proofs": suite_proofs}


def child(name, suites, first):
    """Run ``suites`` against the (mutated) package this process imports."""
    m = by_name(name)
    out = {}
    for s in suites:
        t = time.perf_counter()
        try:
            caught, detail = RUNNERS[s](m)
        except Exception as e:  # a crash of the mutated code inside a suite is that suite catching it
            caught, detail = True, f"{type(e).__name__}: {str(e)[:200]}"
        out[s] = {"caught": caught, "detail": detail, "seconds": round(time.perf_counter() - t, 1)}
        if caught and first:
            break
    print("PLANTED-RESULT " + json.dumps(out))


# ------------------------------------------------------------- the parent


def run_mutation(m, suites=SUITES, first=True, root=ROOT, timeout=900, vectors_dir=None):
    """Apply ``m`` in a scratch copy and run the suites there; an ``Outcome``."""
    t = time.perf_counter()
    out = Outcome(m.name, m.what)
    with tempfile.TemporaryDirectory(prefix="kvarena-planted-") as tmp:
        try:
            mutated_copy(m, Path(tmp), root)
        except ValueError as e:
            out.error = str(e)
            return out
        env = {
            **os.environ,
            "PYTHONPATH": tmp + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "KVARENA_VECTORS": str(vectors_dir or root / "tests" / "vectors"),
            "KVARENA_PLANTED_ROOT": str(root),
            "KVARENA_PLANTED_DEF": json.dumps(m.__dict__),
        }
        cmd = [sys.executable, "-m", "kvarena.verification.planted", "--child", m.name, "--suites", ",".join(suites)]
        if first:
            cmd.append("--first")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            out.error = f"suites ran past {timeout}s"
            return out
        line = next((x for x in proc.stdout.splitlines() if x.startswith("PLANTED-RESULT ")), None)
        if line is None:
            out.error = f"the suites did not report (exit {proc.returncode}): {proc.stderr.strip()[-400:]}"
            return out
        res = json.loads(line[len("PLANTED-RESULT ") :])
    out.details = res
    out.caught_by = [s for s, r in res.items() if r["caught"] is True]
    out.missed_by = [s for s, r in res.items() if r["caught"] is False]
    out.seconds = time.perf_counter() - t
    return out


BASELINE = Mutation(
    "baseline",
    "no mutation: every suite must pass on the package as it is",
    "",
    [],
    unit=tuple(sorted({f for m in MUTATIONS for f in m.unit})),
    proof_groups=tuple(sorted({g for m in MUTATIONS for g in m.proof_groups})),
)
PROOF_BASELINE = Mutation(
    "proof-baseline",
    "no mutation: the planted proofs' obligations hold",
    "",
    [],
    proof_only=tuple(sorted({g for m in PROOF_PLANTS + INFLIGHT_PLANTS for g in m.proof_only})),
)


def check_baseline(suites=SUITES, vectors_dir=None):
    """Run the suites on the unmutated package; a ``ValueError`` naming the
    suites that fail, since a suite that fails anyway catches nothing."""
    runs = [run_mutation(BASELINE, suites, first=False, vectors_dir=vectors_dir)]
    if "proofs" in suites:
        runs.append(run_mutation(PROOF_BASELINE, ("proofs",), first=False, vectors_dir=vectors_dir))
    for o in runs:
        if o.error or o.caught_by:
            bad = o.error or "; ".join(f"{s}: {o.details[s]['detail']}" for s in o.caught_by)
            raise ValueError(f"the suites fail without any mutation, so no catch would mean anything: {bad}")
    runs[0].seconds = sum(o.seconds for o in runs)
    return runs[0]


def run_all(mutations=None, suites=SUITES, first=True, jobs=2, progress=None):
    """Every mutation, ``jobs`` at a time; outcomes in the mutations' order."""
    from concurrent.futures import ThreadPoolExecutor

    mutations = list(MUTATIONS if mutations is None else mutations)
    done = []

    def one(m):
        o = run_mutation(m, suites, first)
        done.append(o)
        if progress:
            progress(o, len(done), len(mutations))
        return o

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(one, mutations))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvarena.verification import command_line as cl

    cl.add_json(parser, "also write the results as JSON")
    parser.add_argument("--only", metavar="NAME", help="only mutations whose name starts with NAME")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--all-suites",
        action="store_true",
        help="run every suite on every mutation (the full matrix), not only until one catches it",
    )


def run(args: argparse.Namespace) -> int:
    """``kvarena planted`` on the commands' console."""
    from kvarena.verification import command_line as cl

    return main(args, cl.console())


def main(args: argparse.Namespace, console: "Console") -> int:
    """``kvarena planted``: the table, the JSON, the exit code."""
    from rich.table import Table

    ms = [m for m in MUTATIONS if not args.only or m.name.startswith(args.only)]
    if args.list:
        for m in ms:
            console.print(f"{m.name}\t{m.file}\t{m.what}")
        return 0
    t = time.perf_counter()
    try:
        base = check_baseline()
    except ValueError as e:
        console.print(f"[red]kvarena planted: {e}[/red]")
        return 1
    console.print(f"baseline: every suite passes unmutated ({base.seconds:.0f}s)")
    first = not getattr(args, "all_suites", False)
    outcomes = run_all(
        ms,
        first=first,
        progress=lambda o, k, n: console.print(
            f"[{k}/{n}] {o.name}: "
            + (
                "[green]caught by " + ", ".join(o.caught_by) + "[/green]"
                if o.caught
                else f"[red]MISSED[/red] {o.error}"
            )
        ),
    )
    tab = Table(title=f"kvarena planted: {len(outcomes)} mutations, {time.perf_counter() - t:.0f}s")
    for col in ("mutation", "recreates", "caught by", "evidence"):
        tab.add_column(col, overflow="fold")
    for o in outcomes:
        catcher = o.caught_by[0] if o.caught_by else None
        evidence = o.error or (
            o.details[catcher]["detail"] if catcher else "; ".join(f"{s}: {r['detail']}" for s, r in o.details.items())
        )
        tab.add_row(o.name, o.what, ", ".join(o.caught_by) or "[red]none[/red]", evidence[:240])
    console.print(tab)
    missed = [o for o in outcomes if not o.caught]
    if args.json:
        Path(args.json).write_text(json.dumps([o.__dict__ for o in outcomes], indent=1) + "\n")
    colour = "red" if missed else "green"
    console.print(
        f"[{colour}]kvarena planted: {len(outcomes) - len(missed)} caught, {len(missed)} missed"
        f"{' (' + ', '.join(o.name for o in missed) + ')' if missed else ''}[/{colour}]"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--first", action="store_true")
    a = ap.parse_args()
    if a.child not in {x.name for x in MUTATIONS}:  # a mutation defined by the caller (tests)
        d = json.loads(os.environ["KVARENA_PLANTED_DEF"])
        MUTATIONS.append(
            Mutation(
                **{
                    **d,
                    "unit": tuple(d["unit"]),
                    "proof_groups": tuple(d["proof_groups"]),
                    "proof_only": tuple(d["proof_only"]),
                }
            )
        )
    child(a.child, a.suites.split(","), a.first)
