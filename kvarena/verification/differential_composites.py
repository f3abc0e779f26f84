"""Differential fuzzing of the composites: a small scheduler on both twins.

A Hypothesis state machine boots a spec composite and an impl composite of
one random kind (``HybridSWA``, ``MambaHybrid`` or ``TriPool``), page size,
entry sizes, window and laziness, and drives both as a serving scheduler
would (docs/design.md §6): admit a request (a state slot, then
``alloc_extend`` of its prompt), extend it, decode a batch
(``alloc_decode``), free the SWA tokens that left the window (``free_swa``
up to ``swa_window_end``; the impl's decode-path calls drawn checked or on
the trusted path, ``check=False``, as a scheduler that vouches for its
input calls them), finish a request (``free``, ``free_state``), and
on a shortfall ``relieve`` with an evictor that retracts the newest
request; and it asks both for an uneven demand (full tokens, a tail of
them in SWA, state slots: ``fits`` and ``relieve`` with ``swa_tokens``).
Each run draws the relief policy (``"anchor"`` or ``"planner"``).  The
spec's contracts are checked on every call.

After every step the two agree on the arena snapshots (page tables,
frontiers, holes, FIFOs), every view (the joint one included), the
translation of every live token, and the bytes of every live token, each
page stamped with a pattern when it was allocated and every token's entry
read back through ``translate`` after whatever relocation relief did.

Every call made on both twins draws which kernels run the
implementation's device work (docs/design.md §14): torch's operations, or
Triton's fused kernels where they run here (on the CPU under Triton's
interpreter).  A Triton step must leave what the spec leaves, as a torch
step must.  The draws come from a generator seeded by the example's own
boot draws (``kernel_draws``), not from Hypothesis's stream, so the
examples a seed draws are those it drew before the kernels existed.

Faults (docs/design.md §9c): ``faulted`` makes an admission or a finish
fail at a drawn operation on the implementation alone; ``fault_in_flight``
launches a forward over one request first, so that a finish whose free
waits for the forward (an eager END) may fail after the forward's write
landed, and its undo binds the written pages again (issue 52).

HiCache's move gate (docs/design.md §13) closes and opens on the
composite's arena (``host_gate``, before a relief): while it is closed the ladder, the
flushes between steps and every slide must move nothing, so relief
finds only what absorbing and the views give; an arena with an eager END
refuses to close it.
"""

from collections import Counter
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvarena import impl, spec
from kvarena.spec.contracts import unchecked
from kvarena.verification.differential import (
    NO_SHRINK,
    event,
    fuzz_rows,
    kernel_draws,
    kernel_events,
    pattern,
    placement,
    profile,
    raises_value_error,
    run_as_test,
)
from kvarena.verification.faults import fault_at, record_fault, unfaulted
from kvarena.verification.inflight import Flight, walk

PROFILES = {
    "ci": {"max_examples": 100, "stateful_step_count": 40, "phases": NO_SHRINK},
    "long": {"max_examples": 2000, "stateful_step_count": 60},
}

CASES: Counter[str] = Counter()
REQUIRED = (
    "window-slide free",
    "joint-view exhaustion",
    "state starvation relieved without eviction",
    "extend crosses a page",
    "decode opens a page",
    "trusted decode",
    "retraction",
    "hybrid",
    "mamba",
    "tri",
    "policy anchor",
    "policy planner",
    "relief met an END with holes but no surplus",
    "uneven fits where the coupled demand does not",
    "uneven relief",
    "uneven bad input",
    "extend with host copies",
    "decode with a host copy",
    "window free with the host count",
    "window free with a wrong host count",
    "lent buffer",
    "composite fault undone",
    "composite urgent settle",
    "composite walk stopped by a pin",
    "composite pending page reused",
    "PD preallocation binds the tail",
    "PD preallocation continues a request",
)
# Counted, not required: since the ladder compacts only surplus holes, a fit part-way is rare in
# a fixed-seed run and its count moved with Hypothesis's version and the test order (0 to 18);
# tests/api/test_relief_steps.py and the vectors (composites/relief-*) pin that path on both packages.
OBSERVED = ("relief stopped before the ENDs were packed",)
# The move gate's own events (docs/design.md §13), counted by tests/verification/test_differential_composites.py.
HOLDS = (
    "composite gate closed by host",
    "composite gate closed by disagg",
    "composite gate opened by host",
    "composite gate opened by disagg",
    "composite gate refused",
    "composite relief under the gate",
)
# The in-flight rules' own events, counted by tests/verification/test_differential_composites.py.
IN_FLIGHT = (
    "composite launch",
    "composite launch while in flight",
    "composite launch refused",
    "composite settle",
    "composite moves in flight",
    "composite fault in flight",
    "composite fault undone after the forward landed",
)
KINDS = ("hybrid", "mamba", "tri")


def required(device: str) -> tuple[str, ...]:
    """The events a run on ``device`` must reach: ``REQUIRED``, and a step on
    each kernel choice that runs there."""
    return REQUIRED + kernel_events(device)


def note(case):
    CASES[case] += 1
    event(case)


def build(pkg, kind, total, full, swa, state, ps, lazy, device, policy="anchor"):
    if kind == "hybrid":
        return pkg.HybridSWA(total, full, swa, ps, lazy=lazy, policy=policy, **device)
    if kind == "mamba":
        return pkg.MambaHybrid(total, full, state, ps, lazy=lazy, policy=policy, **device)
    return pkg.TriPool(total, full, swa, state, ps, lazy=lazy, policy=policy, **device)


class LentBuffer:
    """An engine's buffer and page copy, lent to the implementation's arena
    (``Arena(buffer=, mover=)``): the copy refuses overlapping sets, the
    mover's contract, so a move the arena should have split is caught."""

    def __init__(self, total, device):
        self.buffer = torch.zeros(total, dtype=torch.uint8, device=device)
        self.arena = None

    def __call__(self, name, dst, src):
        with unfaulted():  # the check is the harness's: only the copy is the engine's, and may fail
            moving = dst != src
            d, s = set(dst[moving].tolist()), set(src[moving].tolist())
        assert not d & s, f"{name}: the mover was handed overlapping sets"
        view = self.arena.page_view(name)
        view[dst] = view[src]


def host(x):
    """A result as a host list (the impl returns tensors), or None."""
    return None if x is None else (x.tolist() if isinstance(x, torch.Tensor) else list(x))


@st.composite
def setups(draw):
    kind = draw(st.sampled_from(KINDS))
    ps = draw(st.sampled_from([1, 2, 4, 16, 64]))
    full = draw(st.integers(1, 6))
    swa = draw(st.integers(1, 6))
    # a state slot of one to eight full pages, so state and KV trade ground
    state = draw(st.integers(1, 8)) * full * ps + draw(st.integers(0, full * ps - 1))
    pages = draw(st.integers(8, 24))  # full pages' worth of buffer: small, so walls are met
    total = pages * (full + (swa if kind != "mamba" else 0)) * ps + state * draw(st.integers(2, 6))
    lazy = draw(st.sampled_from([False, True]))
    window = draw(st.integers(1, 2 * ps))  # the engine's window: sliding_window - 1
    return kind, total, full, swa, state, ps, lazy, window


class CompositeMachine(RuleBasedStateMachine):
    device = "cpu"
    host_transfers = False  # whether it closes the gate: as ``differential.DiffMachine.host_transfers``

    @initialize(setup=setups(), policy=st.sampled_from(spec.POLICIES), lent=st.booleans())
    def boot(self, setup, policy, lent):
        kind, total, full, swa, state, ps, lazy, window = setup
        self.kernels = kernel_draws(self.device, setup, policy, lent)
        self.kind, self.ps, self.window, self.lazy = kind, ps, window, lazy
        self.gates: set[str] = set()  # the arena's closed gate sources, by the machine's own model
        S = build(spec, kind, total, full, swa, state, ps, lazy, {}, policy)
        extra = {"device": self.device}
        self.lent = lent  # before ``self.S``: a traced machine records it with the spec object
        if lent:  # the implementation over an engine's buffer and page copy
            note("lent buffer")
            mover = LentBuffer(total, self.device)
            extra.update(buffer=mover.buffer, mover=mover)
        self.I = build(impl, kind, total, full, swa, state, ps, lazy, extra, policy)
        if lent:
            mover.arena = self.I.arena
        note(f"policy {policy}")
        self.has_swa, self.has_state = kind != "mamba", kind != "hybrid"
        g = S.arena.geometry("full")
        self.most = (g.num_pages - g.min_page) * ps  # longer requests are bad input, not shortfalls
        self.pools = ["full"] + (["swa"] if self.has_swa else [])
        self.reqs = {}  # request id -> {"tokens", "slot", "freed"} (freed: SWA positions released)
        self.next_rid = 0
        self.gen = 0
        # live vpage (a state pool: slot) -> generation of its bytes
        self.expected = {p: {} for p in self.pools + (["state"] if self.has_state else [])}
        self.batch = []  # the tokens of the last allocation: what a forward writes
        events = {"urgent": "composite urgent settle", "reused": "composite pending page reused"}
        index = {p: i for i, p in enumerate(self.expected)}
        self.flight = Flight(S.arena, self.I.arena, self.expected, index, pattern, self.next_gen, note, events)
        self.S = S  # after the hooks: a traced machine records what it is handed here
        self.holds = self.host_transfers and lazy
        note(kind)

    # ---------------------------------------------------------- helpers

    def next_gen(self):
        self.gen += 1
        return self.gen

    def stamp(self, tokens):
        """Stamp the pages of ``tokens`` that are new in each pool."""
        ps = self.ps
        self.batch = list(tokens)
        for pool in self.pools:
            v2p = self.S.arena.v2p(pool)
            pages = sorted({t // ps for t in tokens if v2p[t // ps] > 0} - set(self.expected[pool]))
            if not pages:
                continue
            self.flight.born(pool, pages)
            self.flight.handed_out(pool, [v2p[v] for v in pages])
            self.gen += 1
            for v in pages:
                self.expected[pool][v] = self.gen
            epp = self.S.arena.geometry(pool).epp
            self.I.arena.write_pages(pool, pages, pattern(self.pools.index(pool), pages, [self.gen] * len(pages), epp))

    def stamp_state(self, slots):
        """Stamp fresh state slots."""
        if not slots:
            return
        v2p = self.S.arena.v2p("state")
        self.flight.born("state", slots)
        self.flight.handed_out("state", [v2p[v] for v in slots])
        gen = self.next_gen()
        for v in slots:
            self.expected["state"][v] = gen
        epp = self.S.arena.geometry("state").epp
        self.I.arena.write_pages("state", slots, pattern(len(self.pools), slots, [gen] * len(slots), epp))

    def forget_dead(self):
        """Drop the expected bytes of pages the spec no longer holds."""
        for pool in self.expected:
            v2p = self.S.arena.v2p(pool)
            for v in [v for v in self.expected[pool] if v2p[v] < 0]:
                del self.expected[pool][v]

    def both(self, call, impl_call=None):
        """``call(composite)`` on both twins (``impl_call`` on the impl when
        given), the impl on the kernels drawn for the call; the results must agree."""
        a = call(self.S)
        choice = self.kernels()
        self.I.arena.kernels = choice
        note(f"kernels {choice}")
        b = (impl_call or call)(self.I)
        assert host(a) == host(b), (a, b)
        return host(a)

    def tensor(self, xs):
        return torch.tensor(xs, dtype=torch.int64, device=self.I.arena.device)

    def last(self, rid):
        return self.reqs[rid]["tokens"][-1]

    # ------------------------------------------------------------ rules

    @rule(data=st.data())
    def admit(self, data):
        self.admit_one(min(self.most, data.draw(st.integers(1, 5 * self.ps + 2))))

    @rule(data=st.data())
    def admit_past_the_joint_view(self, data):
        """A prompt every component view admits but the joint view does not
        (anchor bug 7): the gate is the joint view, so only relief can help."""
        if not self.has_swa:
            return
        joint = self.S.available_size()
        parts = min(self.S.full_available_size(), self.S.swa_available_size())
        if parts > joint:
            self.admit_one(data.draw(st.integers(joint + 1, parts)))

    @rule(data=st.data())
    def starve_state(self, data):
        """Fill the buffer with KV until no state slot fits, retire one
        request, then admit: the state allocation must take ground from the
        other side (flush, slide) before any eviction (anchor bug 6)."""
        if not self.has_state:
            return
        for _ in range(4):
            if self.S.state_available_size() == 0 or self.S.available_size() == 0:
                break
            self.admit_one(self.S.available_size(), with_state=False)
        if self.S.state_available_size() == 0 and self.reqs:
            self.finish(data)
        self.admit_one(data.draw(st.integers(1, self.ps)))

    @rule(data=st.data())
    def pd_prealloc(self, data):
        """A PD decode node admits a transferred request (docs/design.md
        §13): full slots for its whole length, SWA entries only for the
        pages that hold its window's tail (SGLang's tail, now and then any
        tail).  ``fits_tail`` before it is the verdict without relief."""
        if not self.has_swa:
            return
        if data.draw(st.booleans()):  # PD's gate: closed while the node's transfers are in flight
            self.host_gate("disagg")
        seq = min(self.most, data.draw(st.integers(1, 8 * self.ps + 3)))
        if data.draw(st.booleans()):  # SGLang's: from the page that holds the window's first token
            tail = seq - max(0, seq - self.window) // self.ps * self.ps
        else:
            tail = data.draw(st.integers(0, seq))
        self.admit_one(seq, tail=tail, trusted=data.draw(st.booleans()))

    def admit_one(self, prompt, with_state=True, tail=None, trusted=False):
        """Admit one request of ``prompt`` tokens (a state slot first, where
        there is a state pool); with ``tail``, as a PD decode node
        preallocates it (``alloc_extend_swa_tail``, ``trusted``: the
        implementation on its trusted path with the host copies)."""
        slot = None
        if self.has_state and with_state:
            starving = self.S.state_available_size() == 0
            slot = self.both(lambda c: c.alloc_state(1))
            if slot is None:
                return
            self.stamp_state(slot)
            if starving:
                note("state starvation relieved without eviction")
        joint = self.S.available_size()
        parts = [self.S.full_available_size()] + ([self.S.swa_available_size()] if self.has_swa else [])
        if tail is None:
            tokens = self.both(lambda c: c.alloc_extend([0], [prompt], [-1]))
        else:
            tokens = self.tail_both(0, prompt, -1, tail, trusted)
        if tokens is None:
            if joint < prompt <= min(parts):
                note("joint-view exhaustion")
            if slot is not None:
                self.both(lambda c: c.free_state(slot))
                self.forget_dead()
            return
        # the window starts at the tail's page: every page before it has no swa entry
        freed = 0 if tail is None else (prompt - tail) // self.ps * self.ps
        self.reqs[self.next_rid] = {"tokens": tokens, "slot": slot, "freed": freed}
        self.next_rid += 1
        self.stamp(tokens)

    def tail_both(self, prefix, seq, last, tail, trusted):
        """``alloc_extend_swa_tail`` of one request on both twins, checked
        against what ``fits_tail`` promised and against the pages the tail
        needs: swa binds exactly the new pages that hold a tail token."""
        promised = self.S.fits_tail(prefix, seq, tail)
        assert promised == self.I.fits_tail(prefix, seq, tail), (prefix, seq, tail)
        copies = {"prefix_lens_cpu": torch.tensor([prefix]), "seq_lens_cpu": torch.tensor([seq])}
        tokens = self.both(
            lambda c: c.alloc_extend_swa_tail([prefix], [seq], [last], swa_tail_len=tail),
            (
                lambda c: c.alloc_extend_swa_tail(
                    self.tensor([prefix]), self.tensor([seq]), self.tensor([last]), False, swa_tail_len=tail, **copies
                )
            )
            if trusted
            else None,
        )
        if promised:
            assert tokens is not None, "fits_tail promised what alloc_extend_swa_tail refused"
        if tokens is None:
            note("PD preallocation short")
            return None
        ps, swa = self.ps, self.S.arena.v2p("swa")
        new = sorted({t // ps for t in tokens} - ({(last // ps)} if prefix % ps else set()))
        want = sorted({t // ps for t in tokens[len(tokens) - tail :]} & set(new)) if tail else []
        assert [v for v in new if swa[v] > 0] == want, (prefix, seq, tail, new, want)
        note("PD preallocation binds the tail" if want != new else "PD preallocation binds every new page")
        return tokens

    @rule(data=st.data())
    def extend(self, data):
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        seq = len(self.reqs[rid]["tokens"])
        k = min(self.most - seq, data.draw(st.integers(1, 4 * self.ps + 1)))
        if k <= 0:
            return
        if self.has_swa and data.draw(st.integers(0, 3)) == 0:  # a PD preallocation continuing a load-back
            new = self.tail_both(seq, seq + k, self.last(rid), data.draw(st.integers(0, k)), data.draw(st.booleans()))
            if new is not None:
                note("PD preallocation continues a request")
                self.reqs[rid]["tokens"] += new
                self.stamp(new)
            return
        if data.draw(st.booleans()):  # the engine's host copies: checked on the spec, sizing the impl's trusted path
            note("extend with host copies")
            copies = {"prefix_lens_cpu": [seq], "seq_lens_cpu": [seq + k], "extend_num_tokens": k}
            new = self.both(
                lambda c: c.alloc_extend([seq], [seq + k], [self.last(rid)], **copies),
                lambda c: c.alloc_extend(
                    self.tensor([seq]),
                    self.tensor([seq + k]),
                    self.tensor([self.last(rid)]),
                    check=False,
                    prefix_lens_cpu=torch.tensor([seq]),
                    seq_lens_cpu=torch.tensor([seq + k]),
                    extend_num_tokens=k,
                ),
            )
        else:
            new = self.both(lambda c: c.alloc_extend([seq], [seq + k], [self.last(rid)]))
        if new is not None:
            if (seq - 1) // self.ps != (seq + k - 1) // self.ps:
                note("extend crosses a page")
            self.reqs[rid]["tokens"] += new
            self.stamp(new)

    @rule(data=st.data())
    def decode(self, data, among=None):
        """A decode step of some requests (of ``among`` when given)."""
        if not self.reqs:
            return
        growing = sorted(r for r, q in self.reqs.items() if len(q["tokens"]) < self.most and r in (among or self.reqs))
        if not growing:
            return
        rids = data.draw(st.lists(st.sampled_from(growing), min_size=1, max_size=4, unique=True))
        seqs = [len(self.reqs[r]["tokens"]) + 1 for r in rids]
        lasts = [self.last(r) for r in rids]
        trusted = data.draw(st.booleans())
        if trusted:
            note("trusted decode")
        copy = data.draw(st.booleans())  # the engine's host copy of seq_lens
        if copy:
            note("decode with a host copy")
        cpu = {"seq_lens_cpu": torch.tensor(seqs)} if copy else {}
        new = self.both(
            lambda c: c.alloc_decode(seqs, lasts, **({"seq_lens_cpu": seqs} if copy else {})),
            (lambda c: c.alloc_decode(self.tensor(seqs), self.tensor(lasts), check=False, **cpu)) if trusted else None,
        )
        if new is None:
            return
        for r, s, t in zip(rids, seqs, new):
            if (s - 1) % self.ps == 0:
                note("decode opens a page")
            self.reqs[r]["tokens"].append(t)
        self.stamp(new)

    @rule(data=st.data())
    def slide_window(self, data):
        """Free every request's SWA tokens that left the window (the anchor's rule)."""
        if not self.has_swa:
            return
        trusted = data.draw(st.booleans())
        copy = data.draw(st.sampled_from(["none", "right", "wrong"]))  # the engine's host count
        for r in self.reqs.values():
            end = spec.swa_window_end(len(r["tokens"]), self.window, self.ps)
            assert end == impl.swa_window_end(len(r["tokens"]), self.window, self.ps)
            if end > r["freed"]:
                chunk, start = r["tokens"][r["freed"] : end], r["freed"]
                live = self.live_swa_pages(chunk[:: self.ps])
                if copy == "wrong":
                    self.wrong_count_refused(chunk, start, live + data.draw(st.sampled_from([-1, 1])))
                kw = {"num_live": live} if copy == "right" else {}
                if kw:
                    note("window free with the host count")
                self.both(
                    lambda c, chunk=chunk, start=start, kw=kw: c.free_swa(chunk, start, **kw),
                    (lambda c, chunk=chunk, start=start, kw=kw: c.free_swa(self.tensor(chunk), start, False, **kw))
                    if trusted
                    else None,
                )
                r["freed"] = end
                note("window-slide free")
        self.forget_dead()

    def live_swa_pages(self, reps):
        """What the engine's host bookkeeping knows: how many distinct pages
        of these representatives still hold a live swa entry."""
        v2p = self.S.arena.v2p("swa")
        return len({t // self.ps for t in reps if t >= self.ps and v2p[t // self.ps] > 0})

    def wrong_count_refused(self, chunk, start, n):
        """A window free whose host count is wrong is a ``ValueError``
        naming swa in both twins (checked path), and changes nothing."""
        before = self.S.arena.snapshot()
        for c in (self.S, self.I):
            with raises_value_error("swa"):
                c.free_swa(chunk, start, num_live=n)
        assert self.S.arena.snapshot() == before == self.I.arena.snapshot()
        note("window free with a wrong host count")

    @rule(data=st.data())
    def finish(self, data, rids=None):
        """A request ends: its tokens and its state slot are freed (one of
        ``rids`` when given)."""
        rids = sorted(self.reqs) if rids is None else rids
        if not rids:
            return
        r = self.reqs.pop(data.draw(st.sampled_from(rids)))
        for c in (self.S, self.I):
            c.free(r["tokens"])
            if r["slot"] is not None:
                c.free_state(r["slot"])
        self.forget_dead()

    @rule(data=st.data())
    def finish_segment(self, data):
        """A request ends as SGLang's engine frees it (``free_kv_row_segments``):
        its row as one segment from position 0, with the engine's count of
        its live window pages or without, checked or on the trusted path
        (nothing read back), then its state slot (trusted too).  A wrong
        count is a ``ValueError`` naming swa in both twins, nothing changed."""
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        toks, slot = self.reqs[rid]["tokens"], self.reqs[rid]["slot"]
        live = self.live_swa_pages(toks[:: self.ps]) if self.has_swa else 0
        how = data.draw(
            st.sampled_from(["checked", "count", "trusted", "wrong"] if self.has_swa else ["checked", "trusted"])
        )
        if how == "wrong":
            before = self.S.arena.snapshot()
            for c in (self.S, self.I):
                with raises_value_error("swa"):
                    c.free_segment(toks, 0, num_live=live + 1)
            assert self.S.arena.snapshot() == before == self.I.arena.snapshot()
            note("segment free with a wrong host count")
            return
        self.reqs.pop(rid)
        kw = {} if how == "checked" else {"num_live": live}
        trusted = how == "trusted"
        note(f"segment free ({how})")
        self.both(
            lambda c: c.free_segment(toks, 0, **kw),
            (lambda c: c.free_segment(self.tensor(toks), 0, False, **kw)) if trusted else None,
        )
        if slot is not None:
            self.both(
                lambda c: c.free_state(slot),
                (lambda c: c.free_state(self.tensor(slot).reshape(-1), check=False)) if trusted else None,
            )
        self.forget_dead()

    # ----------------------------------------------- in-flight forwards

    def live_slots(self):
        return sorted(self.expected.get("state", {}))

    def launch_both(self, data, tokens=None):
        """Launch a forward on both twins over ``tokens`` (default: some of
        the last allocation's that are still live), with padding now and
        then, and the state slots it writes (some live slots, or None: all)."""
        live = {t for r in self.reqs.values() for t in r["tokens"]}
        if tokens is None:
            batch = [t for t in self.batch if t in live]
            tokens = data.draw(st.sampled_from([batch, batch, batch[: len(batch) // 2 + 1], []]))
        tokens = tokens + data.draw(st.sampled_from([[], [], [-1], [-1, 0]]))
        slots = None
        if self.has_state and data.draw(st.booleans()):
            mine = self.live_slots()
            slots = data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=4)) if mine else []
        ps, a = self.ps, self.S.arena
        pages = sorted({t // ps for t in tokens if t >= ps})
        writes = {"full": pages}
        if self.has_swa:
            writes["swa"] = [v for v in pages if a.v2p("swa")[v] > 0]
        if self.has_state:
            writes["state"] = self.live_slots() if slots is None else slots
        note("composite launch while in flight" if a.in_flight else "composite launch")
        before = {n: set(a.pinned(n)) for n in a.chain}
        as_tensor = data.draw(st.booleans())
        self.S.launch(tokens, slots)
        self.I.launch(self.tensor(tokens) if as_tensor else tokens, slots)
        self.flight.launch(writes)
        for n in a.chain:  # an oracle of the pins: those before, and the launch pages of what it writes
            want = before[n] | set(a.translate(n, writes.get(n, [])))
            assert set(a.pinned(n)) == want, (n, sorted(want), a.pinned(n))

    @rule(data=st.data())
    def launch(self, data):
        """A forward launched over the last batch: it writes the batch's
        pages late and reads every live page."""
        self.launch_both(data)

    @rule(data=st.data())
    def launch_bad(self, data):
        """A launch over a token that is not allocated, below -1 or not an
        int, or a state slot that is not live, is a ``ValueError`` in both
        twins, and changes nothing."""
        free = [v for v, p in enumerate(self.S.arena.v2p("full")) if v > 0 and p < 0]
        bad = [([-2], None), (["x"], None)]
        if free:
            bad.append(([free[0] * self.ps], None))
        if self.has_state:
            bad.append(([], [self.S.arena.geometry("state").num_pages + 5]))
        tokens, slots = data.draw(st.sampled_from(bad))
        before = self.S.arena.snapshot()
        for c in (self.S, self.I):
            try:
                c.launch(tokens, slots)
            except ValueError:
                continue
            raise AssertionError(f"launch({tokens}, {slots}) was accepted")
        assert self.S.arena.snapshot() == before == self.I.arena.snapshot()
        note("composite launch refused")

    @rule()
    def settle(self):
        """The forward's done event fired, or the scheduler waits for it."""
        if self.S.arena.in_flight:
            note("composite settle")
        self.flight.settle(self.S, self.I)

    @rule(data=st.data())
    def flush_opportunistic(self, data):
        """Compaction between steps (``flush_opportunistic``): it never
        settles, and while a forward is in flight each lazy END moves what a
        walk from its frontier to its first pinned survivor reaches."""
        a = self.S.arena
        cap = data.draw(st.one_of(st.none(), st.integers(0, 4)))
        flying = a.in_flight
        ends = [n for n in (a.chain[0], a.chain[-1]) if a.is_lazy(n)]
        walks = [walk(a, n, 0 if self.gate else cap) for n in ends] if flying else []  # the gate: absorb only
        moved = self.S.flush_opportunistic(cap)
        assert self.I.flush_opportunistic(cap) == moved
        assert not self.gate or moved == 0, f"{moved} pages moved under the gate"
        assert a.in_flight == self.I.arena.in_flight == flying, "a non-urgent flush settled"
        if flying:
            assert moved == sum(m for m, _ in walks), (moved, walks)
            if any(stopped for _, stopped in walks):
                note("composite walk stopped by a pin")
            if moved:
                note("composite moves in flight")
        if not self.S.arena.is_lazy(a.chain[0]) and not self.S.arena.is_lazy(a.chain[-1]):
            assert moved == 0

    @rule(data=st.data())
    def overlap(self, data):
        """One step of an overlapped scheduler: decode a batch and launch its
        forward, then prepare the next batch while it runs (finish a
        request, free the window, compact between steps, admit), and
        sometimes wait for it."""
        while len(self.reqs) < 3 and self.S.available_size() > 4 * self.ps:  # requests to decode and finish
            self.admit_one(data.draw(st.integers(1, 3 * self.ps)))
        # the batch: any requests, or all but the newest (whose pages, nearest
        # full's frontier, a compaction between steps may then move)
        newest = max(self.reqs, default=None)
        older = [r for r in self.reqs if r != newest]
        self.decode(data, older if older and data.draw(st.booleans()) else None)
        batch = set(self.batch)
        self.launch_both(data)
        others = sorted(r for r, q in self.reqs.items() if not batch & set(q["tokens"]) and r != newest)
        if data.draw(st.booleans()):  # a request ends: one the forward runs (its pages pend) or an older one
            self.finish(data, others if others and data.draw(st.booleans()) else None)
        if data.draw(st.booleans()):
            self.slide_window(data)
        if data.draw(st.integers(0, 3)):  # compaction between steps
            self.flush_opportunistic(data)
        if data.draw(st.booleans()):
            self.flight.settle(self.S, self.I)
        # the next batch: a prompt of a page or two, or one that takes every hole of full and more
        holes = len(self.S.arena.holes("full"))
        pages = data.draw(st.sampled_from([1, 2, holes, holes + 1]))
        self.admit_one(max(1, min(self.most, pages * self.ps)))

    @rule(data=st.data())
    def fault_in_flight(self, data):
        """A forward launched over one request's tokens, then, while it runs,
        a faulted call (``faulted``): that request's finish, whose free waits
        for the forward where an END is eager, so the fault may come after
        the forward's write landed and the undo binds its pages again
        (issue 52), or, a third of the time, an admission."""
        if not self.reqs:
            return
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.launch_both(data, list(self.reqs[rid]["tokens"]))
        self.faulted(data, None if data.draw(st.integers(0, 2)) == 0 else rid)

    @rule(data=st.data())
    def faulted(self, data, finish=None):
        """An admission (relief when short) or a finish on the implementation
        with its ``k``-th torch operation failing (``impl/journal.py``).  If
        the fault comes out, the spec does not make the call and every
        comparison must still hold; else both make it.  ``finish``: the
        request to finish (no draw for the kind of call)."""
        k = data.draw(st.one_of(st.integers(0, 40), st.integers(0, 800)))  # a call makes tens to hundreds
        if self.S.arena.in_flight:
            note("composite fault in flight")
        if finish is not None or (self.reqs and data.draw(st.booleans())):
            rid = finish if finish is not None else data.draw(st.sampled_from(sorted(self.reqs)))
            tokens = self.reqs[rid]["tokens"]
            with self.flight.impl_only():
                raised, _ = fault_at(k, lambda: self.I.free(tokens))
            if raised:
                note("composite fault undone")
                if any(f.impl_done and not f.spec_done for f in self.flight.forwards):
                    note("composite fault undone after the forward landed")  # issue 52's state
                record_fault(self.S, "free", k, self.I.arena.kernels, tokens)
                return
            self.S.free(tokens)
            slot = self.reqs.pop(rid)["slot"]
            if slot is not None:
                self.both(lambda c: c.free_state(slot))
            self.forget_dead()
            return
        prompt = min(self.most, data.draw(st.integers(1, 5 * self.ps + 2)))
        with self.flight.impl_only():
            raised, got = fault_at(k, lambda: self.I.alloc_extend([0], [prompt], [-1]))
        if raised:
            note("composite fault undone")
            record_fault(self.S, "alloc_extend", k, self.I.arena.kernels, [0], [prompt], [-1])
            return
        tokens = host(self.S.alloc_extend([0], [prompt], [-1]))
        assert tokens == host(got), (tokens, got)
        if tokens is not None:
            self.reqs[self.next_rid] = {"tokens": tokens, "slot": None, "freed": 0}
            self.next_rid += 1
            self.stamp(tokens)

    @property
    def gate(self) -> bool:
        return bool(self.gates)

    def host_gate(self, source: str = "host"):
        """A source's move gate (docs/design.md §13: HiCache's host
        transfers, PD's KV transfers): a transfer starts (its gate closes)
        or every one has ended (it opens).  While any source holds it
        closed no page may move; an arena with an eager END refuses it in
        both twins, naming the END, and nothing changes."""
        a, b = self.S.arena, self.I.arena
        if not self.lazy:
            before = a.snapshot()
            for arena in (a, b):
                with raises_value_error(a.chain[0]):
                    arena.close_gate(source)
            assert a.snapshot() == before == b.snapshot()
            note("composite gate refused")
            return
        if not self.holds:  # host_transfers off
            return
        call = "open_gate" if source in self.gates else "close_gate"
        for arena in (a, b):
            getattr(arena, call)(source)
        record = getattr(self.S, "record_arena_call", None)  # kvarena fuzz's traced machine: a vector step
        if record is not None:
            record(call, source=source)
        self.gates ^= {source}
        note(f"composite gate {'closed' if source in self.gates else 'opened'} by {source}")
        if len(self.gates) > 1:
            note("composite gate closed by both sources")

    @rule(data=st.data())
    def too_long(self, data):
        """A request no arena of this size could ever hold is bad input in
        both twins, and changes nothing."""
        before = self.S.arena.snapshot()
        for c in (self.S, self.I):
            try:
                c.alloc_extend([0], [self.most + data.draw(st.integers(1, 2**62))], [-1])
            except ValueError:
                continue
            raise AssertionError("a request longer than the arena was accepted")
        assert self.S.arena.snapshot() == before == self.I.arena.snapshot()

    @rule(data=st.data())
    def relieve(self, data):
        """The ladder for a demand around what fits now; now and then a host
        transfer starts or ends first (``host_gate``), so relief runs under
        the gate as often as not (a transfer in flight ends sooner than one starts)."""
        if data.draw(st.integers(0, 2 if self.gate else 5)) == 0:
            self.host_gate("host")
        if data.draw(st.booleans()):  # around what fits now
            tokens = self.S.available_size() + data.draw(st.integers(-self.ps, 6 * self.ps + 4))
            slots = data.draw(st.integers(0, 2)) if self.has_state else 0
        else:  # a little past what fits now, no slot (every state hole is surplus): the ladder stops on the way
            tokens = self.S.available_size() + data.draw(st.integers(1, self.ps))
            slots = 0
        self.relieve_both(data, max(0, tokens), slots)

    @rule(data=st.data())
    def uneven_demand(self, data):
        """An uneven demand (docs/design.md §11, SGLang's admission): full
        tokens around what fits now and a bit past (up to past full's own
        view), SWA tokens a tail of them.  ``fits`` agrees in both twins;
        then, drawn (a third of the time), ``relieve`` for it agrees (verdict and the shortfalls
        ``evict`` is asked for).  A ``swa_tokens`` the composite refuses
        (more than ``tokens``; on ``MambaHybrid`` anything but 0 or
        ``tokens``) is a ``ValueError`` in both, nothing changed."""
        ps, joint = self.ps, self.S.available_size()
        top = max(joint, self.S.full_available_size()) + 2 * ps
        tokens = data.draw(st.integers(max(0, joint - ps), top))
        slots = data.draw(st.integers(0, 2)) if self.has_state else 0
        if data.draw(st.integers(0, 5)) == 0:  # bad input
            swa = tokens + data.draw(st.integers(1, 2 * ps))
            before = self.S.arena.snapshot()
            for c in (self.S, self.I):
                for call in (lambda c=c: c.fits(tokens, slots, swa), lambda c=c: c.relieve(tokens, slots, None, swa)):
                    try:
                        call()
                    except ValueError:
                        continue
                    raise AssertionError(f"swa_tokens={swa} > tokens={tokens} was accepted")
            assert self.S.arena.snapshot() == before == self.I.arena.snapshot()
            note("uneven bad input")
            return
        swa = data.draw(st.integers(0, tokens)) if self.has_swa else data.draw(st.sampled_from([0, tokens]))
        ok = self.S.fits(tokens, slots, swa)
        assert ok == self.I.fits(tokens, slots, swa), (tokens, slots, swa)
        even = self.S.fits(tokens, slots)
        assert even <= ok, (tokens, slots, swa)  # swa binds a subset: never harder than the coupled demand
        if ok and not even:
            note("uneven fits where the coupled demand does not")
        if data.draw(st.integers(0, 2)) == 0:  # relief is the costly part: a third of the draws
            self.relieve_both(data, tokens, slots, swa)

    def relieve_both(self, data, tokens, slots, swa=None):
        """``relieve`` on both twins (``evict``, drawn, retracts the newest
        requests); verdicts and evict logs agree, and the verdict is the fit."""
        evicting = data.draw(st.booleans())
        newest_first = sorted(self.reqs, reverse=True)
        logs = {}

        def evictor(c, key):
            queue, log = list(newest_first), logs.setdefault(key, [])

            def evict(shortfall):  # retract the newest request; its tokens are recomputed later
                if not queue:
                    return 0
                rid = queue.pop(0)
                r = self.reqs[rid]
                c.free(r["tokens"])
                if r["slot"] is not None:
                    c.free_state(r["slot"])
                log.append((rid, shortfall))
                return len(r["tokens"])

            return evict

        short = not self.S.fits(tokens, slots, swa)
        ends = (self.S.arena.chain[0], self.S.arena.chain[-1])
        if short:
            pages = -(-tokens // self.S.page_size)
            own = {"state": slots}  # full and swa are asked for the token pages
            if swa is not None:
                own["swa"] = -(-swa // self.S.page_size)  # swa for its own tail
                note("uneven relief")
            if any(0 < len(self.S.arena.holes(n)) <= own.get(n, pages) for n in ends):
                note("relief met an END with holes but no surplus")
        before = {"spec": placement(self.S.arena), "impl": placement(self.I.arena)} if self.gate else {}
        ok = self.S.relieve(tokens, slots, evictor(self.S, "spec") if evicting else None, swa)
        got = self.I.relieve(tokens, slots, evictor(self.I, "impl") if evicting else None, swa)
        assert ok == got and logs.get("spec") == logs.get("impl"), (ok, got, logs)
        for twin, pools in before.items():  # the gate: relief allocates nothing, so a page that stays bound stays put
            now = placement((self.S if twin == "spec" else self.I).arena)
            for n, (ids, _) in pools.items():
                moved = {v: (p, now[n][0][v]) for v, p in ids.items() if now[n][0].get(v, p) != p}
                assert not moved, f"{twin}: pool {n!r}: ids moved under the gate: {moved}"
            note("composite relief under the gate")
        # an oracle sharing no code with either ladder: the verdict is the fit
        # a trial on a copy finds now
        assert ok == self.S.fits(tokens, slots, swa), (ok, tokens, slots, swa)
        # rung 1 absorbed every frontier hole, so a hole left lies below a survivor: not packed
        if short and ok and any(self.S.arena.holes(n) for n in ends):
            note(OBSERVED[0])
        for rid, _ in logs.get("spec", []):
            del self.reqs[rid]
            note("retraction")
        self.forget_dead()

    # -------------------------------------------------------- invariant

    @invariant()
    def agree(self):
        if not hasattr(self, "S"):
            return
        with unchecked():
            self._agree()

    def _agree(self):
        S, Im = self.S, self.I
        assert S.arena.snapshot() == Im.arena.snapshot()
        assert S.arena.moves_held() == Im.arena.moves_held() == self.gate
        views = ["available_size", "full_available_size"]
        views += ["swa_available_size"] if self.has_swa else []
        views += ["state_available_size", "state_slot_token_cost"] if self.has_state else []
        for v in views:
            assert getattr(S, v)() == getattr(Im, v)(), v
        self.flight.check()
        S.verify()
        Im.verify()
        slots = sorted(self.expected.get("state", {}))
        if slots:  # every live state slot's bytes
            gens = [self.expected["state"][v] for v in slots]
            want = pattern(len(self.pools), slots, gens, S.arena.geometry("state").epp)
            assert torch.equal(Im.arena.read_pages("state", slots).cpu(), want), "state"
        live = [t for r in self.reqs.values() for t in r["tokens"]]
        if live:
            for pool in self.pools:
                want = host(S.translate(live, pool))
                assert want == host(Im.translate(torch.tensor(live), pool)), pool
                assert want == host(Im.translate(self.tensor(live), pool, check=False)), pool
        ps = self.ps
        for pool in self.pools:
            pages = self.expected[pool]
            if not pages:
                continue
            # every live token's bytes, read back through the composite's translate
            toks = [t for t in live if t // ps in pages]
            if not toks:
                continue
            entry = S.arena.pool(pool).entry_bytes
            want = pattern(
                self.pools.index(pool),
                [t // ps for t in toks],
                [pages[t // ps] for t in toks],
                S.arena.geometry(pool).epp,
            ).view(len(toks), ps, entry)
            want = want[torch.arange(len(toks)), torch.tensor([t % ps for t in toks])]
            slots = Im.translate(torch.tensor(toks, device=Im.arena.device), pool)
            got = Im.arena.kv_view(pool).reshape(-1, entry).index_select(0, slots).cpu()
            assert torch.equal(got, want), pool


def machine_for(device, host_transfers=False):
    """The machine on ``device``; ``host_transfers``: it closes the gate too (``CompositeMachine.host_transfers``)."""
    attrs = {"device": device, "host_transfers": host_transfers}
    return type(f"CompositeMachine_{device}", (CompositeMachine,), attrs)


def run_machine(device: str = "cpu", **overrides: Any) -> None:
    """Run the machine once, host transfers and all; raises on the first disagreement."""
    run_as_test(machine_for(device, host_transfers=True), profile(PROFILES), EXAMPLES, **overrides)


def run_differential(examples: int = 60, steps: int = 30) -> list[dict[str, Any]]:
    """``kvarena verify``'s composite fuzz rows (``differential.fuzz_rows``)."""
    return fuzz_rows("composites impl vs spec", run_machine, CASES, required("cpu"), examples, steps)


# Explicit examples (issue 57), as ``differential.EXAMPLES``: every event the tests require
# (``required``, ``IN_FLIGHT``, ``HOLDS``) is reached by one of these, replayed before Hypothesis's
# own examples in every ``run_machine``; the comment names the events only it reaches.
# fmt: off
EXAMPLES: list[tuple[dict[str, Any], list[tuple[str, list[Any] | None]]]] = [
    # composite gate opened by host, composite launch refused, composite launch while in flight, composite settle,
    # extend crosses a page, extend with host copies, relief met an END with holes but no surplus, state starvation
    # relieved without eviction, tri, window free with a wrong host count, window free with the host count
    ({"setup": ("tri", 1536, 5, 4, 156, 4, True, 5), "policy": "planner", "lent": False}, [
        ("admit", [14]),
        ("decode", [[0], False, True]),
        ("launch_bad", [([-2], None)]),
        ("starve_state", [0, 2]),
        ("admit", [2]),
        ("relieve", [0, True, 13, 2, True]),
        ("pd_prealloc", [True, 14, True, False]),
        ("launch", [[], [], True, [], True]),
        ("settle", None),
        ("relieve", [0, True, 28, 2, False]),
        ("starve_state", [5, 1]),
        ("admit", [5]),
        ("faulted", [0, True, 7]),
        ("admit", [15]),
        ("launch", [[], [-1, 0], True, [], True]),
        ("fault_in_flight", [6, [], True, [5, 7], True, 0, 0, True, 6]),
        ("finish", [8]),
        ("extend", [6, 9, 2, True]),
        ("extend", [6, 14, 2, False]),
        ("slide_window", [False, "wrong", -1]),
        ("faulted", [800, False, 17]),
        ("slide_window", [False, "right"]),
    ]),
    # PD preallocation continues a request, composite gate opened by disagg, composite moves in flight, composite
    # pending page reused, joint-view exhaustion, uneven relief
    ({"setup": ("hybrid", 1424, 2, 1, 164, 16, True, 7), "policy": "anchor", "lent": False}, [
        ("overlap", [26, 30, 41, True, [1, 0], False, False, [78, 42], [-1, 0], True, False, True, True, "none", 2, 2,
            True, 0]),
        ("relieve", [0, False, 3, True]),
        ("overlap", [False, [0, 1, 2], False, False, [43, 79, 121], [-1, 0], True, False, True, True, "none", 1, 0,
            True, 2]),
        ("finish", [1]),
        ("pd_prealloc", [True, 62, False, 20, False]),
        ("finish", [2]),
        ("admit_past_the_joint_view", [490]),
        ("decode", [[0, 4, 5], False, False]),
        ("pd_prealloc", [True, 61, True, False]),
        ("extend", [6, 25, 0, 11, False]),
        ("pd_prealloc", [True, 120, True, True]),
        ("decode", [[7, 5], True, False]),
        ("pd_prealloc", [True, 82, False, 77, False]),
        ("pd_prealloc", [False, 131, False, 93, True]),
        ("pd_prealloc", [True, 121, False, 48, True]),
        ("uneven_demand", [156, 2, 103, 0, True]),
    ]),
    # composite walk stopped by a pin, mamba
    ({"setup": ("mamba", 188, 6, 4, 28, 2, True, 3), "policy": "planner", "lent": True}, [
        ("overlap", [4, 3, True, [0], True, True, [14], [-1, 0], False, False, True, 1, False, 2, 2, True, 1]),
    ]),
    # uneven bad input, uneven fits where the coupled demand does not
    ({"setup": ("hybrid", 14086, 3, 5, 899, 64, False, 19), "policy": "anchor", "lent": True}, [
        ("uneven_demand", [2351, 2, 7, 2]),
        ("uneven_demand", [2736, 0, 106]),
    ]),
    # composite fault undone after the forward landed, composite gate refused
    ({"setup": ("hybrid", 212, 6, 4, 24, 1, False, 2), "policy": "anchor", "lent": False}, [
        ("faulted", [800, 3]),
        ("pd_prealloc", [False, 8, False, 5, True]),
        ("pd_prealloc", [False, 7, True, False]),
        ("overlap", [False, [0, 2], False, False, [19, 20], [-1], True, True, True, 1, False, 0, True, 0]),
        ("fault_in_flight", [3, [-1], False, 1, 44]),
        ("pd_prealloc", [True, 2, False, 1, True]),
    ]),
]
# fmt: on
