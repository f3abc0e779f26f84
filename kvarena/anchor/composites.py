"""The composite level: kvarena's ``HybridSWA``, ``MambaHybrid`` and
``TriPool`` (spec) against the anchor's ``UnifiedSWATokenToKVPoolAllocator``,
``UnifiedMambaTokenToKVPoolAllocator`` and
``UnifiedMambaSWATokenToKVPoolAllocator``, on CPU.

The anchor's paged ``alloc_extend``/``alloc_decode`` launch Triton kernels
(GPU only: ``tools/cuda_checks.sh`` runs ``kvarena.anchor.gpu``).  On CPU
the coupled allocation is the composite's ``alloc(n)`` (n a multiple of the
page size: one request of ``n`` new tokens with an empty prefix), which runs
the same joint gate and ladder; kvarena's counterpart is
``alloc_extend([0], [n], [-1])``.  ``free``, ``free_swa`` (whole pages,
``start_pos = 0``), the state slots (``prepare_mamba_allocation(1)`` then
the mamba END's ``alloc(1)``, as the engine's slot allocator does; ``free``)
and the views run as they are.

Pool names: kvarena's ``"state"`` is the anchor's ``"mamba"``; ``full`` and
``swa`` are the same.  The observation is the page-level one of every pool
(``observe.py``, by kvarena's names) plus the composite views.
"""

import copy
import random
import time
from collections import Counter, defaultdict

from kvarena import spec as kspec

from .adapter import ENTRY_ALIGN, AnchorArena, _tensor
from .campaign import differences, report_head
from .classify import same_up_to_labels, same_up_to_placement
from .fake_cache import FakeKVCache
from .loader import anchor_modules
from .observe import observe_anchor, observe_spec

KINDS = ("HybridSWA", "MambaHybrid", "TriPool")
ANCHOR_NAME = {"state": "mamba", "full": "full", "swa": "swa"}


class _FakePools:
    """The ``kvcache`` a composite takes: one fake per sub-pool, plus the
    hooks the anchor's composites call on it."""

    def __init__(self, caches):
        self.full_kv_pool = caches.get("full")
        self.swa_kv_pool = caches.get("swa")
        self.mamba_pool = caches.get("state")

    def attach_allocators(self, full_allocator, swa_allocator):
        pass


_DCP = None


def _single_rank():
    """State a decode-context-parallel width of 1 (one GPU), which the
    anchor's mamba composite reads from its runtime context."""
    global _DCP
    if _DCP is None:
        from sglang.srt.runtime_context import get_parallel

        _DCP = get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0)
        _DCP.__enter__()


class AnchorComposite(AnchorArena):
    """One of the anchor's composite allocators, with ``AnchorArena``'s
    page-level views over its members (by kvarena's pool names)."""

    def __init__(
        self,
        kind,
        total_bytes,
        full_entry_bytes,
        swa_entry_bytes=None,
        state_bytes=None,
        page_size=1,
        lazy=False,
        device="cpu",
    ):
        A = anchor_modules()
        from sglang.srt.mem_cache.allocator import unified_hybrid_swa as hs
        from sglang.srt.mem_cache.allocator import unified_mamba as um

        self.A, self.kind, self.total_bytes = A, kind, total_bytes
        pools = {"full": kspec.SubPool("full", full_entry_bytes, page_size, "down")}
        if kind == "HybridSWA":
            pools["swa"] = kspec.SubPool("swa", swa_entry_bytes, page_size, "up")
        if kind == "TriPool":
            pools["swa"] = kspec.SubPool("swa", swa_entry_bytes, page_size, "float")
        if kind in ("MambaHybrid", "TriPool"):
            pools["state"] = kspec.SubPool("state", state_bytes, 1, "up", "state")
        self.chain = tuple(n for n in ("state", "swa", "full") if n in pools and pools[n].grow != "down") + ("full",)
        if kind == "HybridSWA":
            self.chain = ("swa", "full")
        self.borrow = {"swa": "full"} if "swa" in pools else {}
        self.page_size = {n: p.page_size for n, p in pools.items()}
        specs = [self._spec(pools[n], ANCHOR_NAME[n]) for n in self.chain]
        self.device = device
        self.buffer = A.UnifiedKVPool(
            total_bytes=total_bytes, sub_pool_specs=specs, device=device, enable_memory_saver=False, page_size=page_size
        )
        self.cache = {
            n: FakeKVCache(self.buffer.max_slots(ANCHOR_NAME[n]) // pools[n].page_size, pools[n].page_size)
            for n in self.chain
        }
        fake = _FakePools(self.cache)
        kw = {
            "unified_buffer": self.buffer,
            "kvcache": fake,
            "device": device,
            "page_size": page_size,
            "lazy_compaction": lazy,
        }
        if kind == "HybridSWA":
            self.c = hs.UnifiedSWATokenToKVPoolAllocator(**kw)
        elif kind == "TriPool":
            self.c = hs.UnifiedMambaSWATokenToKVPoolAllocator(
                mamba_kvcache=self.cache["state"],
                full_max_total_num_tokens=self.buffer.max_slots("full") - 1,
                swa_max_total_num_tokens=self.buffer.max_slots("swa") - 1,
                **kw,
            )
        else:
            _single_rank()
            self.c = um.UnifiedMambaTokenToKVPoolAllocator(**kw)
        self.alloc_of = {"full": self.c.full_attn_allocator}
        if "swa" in pools:
            self.alloc_of["swa"] = self.c.swa_attn_allocator
        if "state" in pools:
            self.alloc_of["state"] = self.c.mamba_allocator

    # ------------------------------------------------------------ calls

    def alloc_tokens(self, n):
        toks = self.c.alloc(n)
        if toks is None:
            return None
        pages = self._pages_of("full", toks)
        for name in ("full", "swa"):
            if name in self.alloc_of:
                self._record_writes(name, pages)
        return [int(t) for t in toks.tolist()]

    def free_tokens(self, tokens):
        self.c.free(_tensor(tokens, self.device))

    def free_swa(self, tokens):
        self.c.free_swa(_tensor(tokens, self.device))

    def alloc_state(self):
        """One state slot as the engine asks for it: the composite's
        ``prepare_mamba_allocation(1)`` (flush full, then the state END's
        ladder), then the state END's ``alloc(1)`` (the slot allocator's)."""
        self.c.prepare_mamba_allocation(1)
        out = self.alloc_of["state"].alloc(1)
        if out is None:
            return None
        self._record_writes("state", [int(out[0])])
        return [int(out[0])]

    def free_state(self, slots):
        self.alloc_of["state"].free(_tensor(slots, self.device))

    def views(self):
        out = {"available_size": int(self.c.available_size()), "full_available_size": int(self.c.full_available_size())}
        if "swa" in self.alloc_of:
            out["swa_available_size"] = int(self.c.swa_available_size())
        if "state" in self.alloc_of:
            out["state_available_size"] = int(self.alloc_of["state"].available_size())
        return out


def spec_views(c):
    out = {"available_size": c.available_size(), "full_available_size": c.full_available_size()}
    if hasattr(c, "swa_available_size"):
        out["swa_available_size"] = c.swa_available_size()
    if hasattr(c, "state_available_size"):
        out["state_available_size"] = c.state_available_size()
    return out


def random_composite(rng):
    kind = rng.choice(KINDS)
    ps = rng.choice((1, 1, 2, 4, 8, 16))
    kw = {"full_entry_bytes": ENTRY_ALIGN * rng.randint(1, 8), "page_size": ps, "lazy": rng.random() < 0.5}
    if kind != "MambaHybrid":
        kw["swa_entry_bytes"] = ENTRY_ALIGN * rng.randint(1, 8)
    if kind != "HybridSWA":
        kw["state_bytes"] = rng.randint(2, 24 * ENTRY_ALIGN * ps)
    epp = max(kw["full_entry_bytes"] * ps, kw.get("swa_entry_bytes", 0) * ps, kw.get("state_bytes", 0))
    kw["total_bytes"] = (rng.randint(8, 40) * epp) // 2 * 2
    return kind, kw


def boot_composite(kind, kw):
    spec = getattr(kspec, kind)(**kw)
    return spec, AnchorComposite(kind, **kw)


# ------------------------------------------------------------------ the walk


def random_call(rng, spec, requests, slots):
    """One composite call drawn from the spec's state; ``requests`` are the
    token lists handed out so far, ``slots`` the state slots."""
    ps = spec.page_size
    r = rng.random()
    if r < 0.4 or not (requests or slots):
        k = rng.choice(
            [
                1,
                1,
                2,
                3,
                max(1, spec.available_size() // ps // 2),
                spec.available_size() // ps,
                spec.available_size() // ps + 1,
            ]
        )
        return "alloc", {"n": max(1, k) * ps}
    if r < 0.6 and requests:
        return "free", {"request": rng.randrange(len(requests))}
    if r < 0.8 and requests and hasattr(spec, "free_swa"):
        i = rng.randrange(len(requests))
        pages = len(requests[i]) // ps
        return "free_swa", {"request": i, "pages": rng.randint(1, pages)}
    if hasattr(spec, "alloc_state"):
        if slots and rng.random() < 0.4:
            return "free_state", {"slot": rng.randrange(len(slots))}
        return "alloc_state", {}
    return "alloc", {"n": ps}


def run_call(spec, anchor, call, args, requests, slots):
    """Apply one call to both; ``(spec result, anchor result)``.  A free
    takes its request or slot out of the bookkeeping; ``keep`` adds what an
    alloc handed out."""
    if call == "alloc":
        n = args["n"]
        try:
            rs = spec.alloc_extend([0], [n], [-1])
            rs = None if rs is None else [int(t) for t in rs]
        except ValueError:  # more than the arena could ever hold (see "oversized-request")
            rs = "ValueError"
        return rs, anchor.alloc_tokens(n)
    if call == "free":
        toks = requests.pop(args["request"])
        spec.free(toks)
        anchor.free_tokens(toks)
        return None, None
    if call == "free_swa":
        toks = requests[args["request"]][: args["pages"] * spec.page_size]
        spec.free_swa(toks, 0)
        anchor.free_swa(toks)
        return None, None
    if call == "alloc_state":
        rs = spec.alloc_state(1)
        rs = None if rs is None else [int(s) for s in rs]
        return rs, anchor.alloc_state()
    if call == "free_state":
        slot = slots.pop(args["slot"])
        spec.free_state([slot])
        anchor.free_state([slot])
        return None, None
    raise ValueError(call)


def keep(call, result, requests, slots):
    """Record what an alloc handed out (a list), for later frees."""
    if call == "alloc" and isinstance(result, list):
        requests.append(result)
    if call == "alloc_state" and isinstance(result, list):
        slots.extend(result)


# ------------------------------------------------------------ classification


def _anchor_component_views(adopted, anchor):
    """The anchor's per-component views from the spec's formulas on the
    anchor's state: each is ``min(conserve, schedulable)``, conserve being
    its boot capacity less the tokens it holds (a lazy END's holes are not
    held), schedulable the pool's view with a lazy neighbour's holes
    credited (a float: the anchor's float rule)."""
    from .classify import _anchor_float_schedulable

    c = anchor.c
    if anchor.kind == "MambaHybrid":  # both are the full END's schedulable view
        sched = adopted.schedulable_available_size("full")
        return {"available_size": sched, "full_available_size": sched}
    out = {}
    for name, cap in (("full", c._full_max_total_num_tokens), ("swa", getattr(c, "_swa_max_total_num_tokens", None))):
        if name not in anchor.alloc_of or cap is None:
            continue
        b = adopted.bands[name]
        held = (b.live if (b.lazy or not b.is_end) else b.span) * b.pool.page_size
        sched = adopted.schedulable_available_size(name) if b.is_end else _anchor_float_schedulable(adopted, name)
        out[f"{name}_available_size"] = min(cap - held, sched)
    return out


COMPOSITE_CLASSES = {
    "oversized-request": (
        "design",
        "a request longer than the arena could ever hold: kvarena's composites raise "
        "ValueError (bad input, nothing changed); the anchor's return None like a shortfall",
    ),
    "composite-refusal-flushes": (
        "design",
        "a coupled alloc that fails either way, each ladder having compacted "
        "another part of the members: kvarena's only the ENDs' surplus holes "
        "(beyond their own demand; all of them before the anchor policy's slide "
        "on TriPool), the anchor's two-END composite none unless the compacted "
        "state would fit, its mamba + full one the state END.  Flushing every "
        "member of both gives the same state",
    ),
    "relief-steps": (
        "design",
        "an allocation that needed relief: kvarena's ladder compacts only the ENDs' surplus "
        "holes (beyond their own demand), in doubling steps, and stops at the fit, leaving "
        "the rest; the anchor flushes its members whole.  Flushing every member of "
        "kvarena's state gives the anchor's (up to which page holds which id)",
    ),
    "tripool-ladder-finds-more": (
        "design",
        "a coupled alloc on TriPool that kvarena's ladder under policy 'anchor' "
        "refuses in one call and the anchor's three-pool ladder makes: sglang's "
        "TriPool ensure_capacity has rungs beyond the seed's demand-vector policy "
        "(END-only flushes under a reclaim certificate, a high-side make_room target "
        "for the float), which kvarena's 'anchor' policy reproduces as docs/design.md "
        "§4 states it (one ladder run; docs/findings.md, policy finding 6); the spec accepts "
        "the anchor's result, and kvarena's policy 'planner' makes the call at once",
    ),
    "state-slot-ladder": (
        "design",
        "a state slot: the anchor flushes full, then runs the state END's single-band "
        "ladder (flush its neighbour, ask the float for {state: 1}); kvarena's composite "
        "runs its ladder with the demand vector (absorb, compact in steps, slide)",
    ),
    "tripool-ladder": (
        "design",
        "the anchor's three-pool composite runs its own ladder (END-only flushes, a high-side "
        "make_room target from its certificate, then the generic ladder); kvarena's runs the "
        "arena ladder with the demand vector: the same outcome by another relocation path, or "
        "a refusal that the anchor's generic ladder under its page-level rules reproduces",
    ),
    "component-views": (
        "design",
        "the anchor's full_available_size()/swa_available_size() are scheduling views: "
        "min(boot capacity - tokens held, the schedulable view crediting a lazy neighbour's "
        "holes); kvarena's are each pool's available view now (the joint available_size() "
        "is the gate on both sides).  The anchor's mamba + full composite reports the full "
        "END's schedulable view as available_size() too; kvarena's MambaHybrid the joint view",
    ),
}


def flushed_whole(arena):
    """A copy of ``arena`` with every member flushed whole."""
    out = copy.deepcopy(arena)
    for n in out.chain:
        out.flush(n)
    return out


def classify_call(spec_pre, call, r_spec, r_anchor, obs_s, obs_a, views_s, views_a, spec, anchor):
    """The classes explaining a composite step's difference (``[]``: none)."""
    classes = []
    views_a = dict(views_a)
    adopted = copy.deepcopy(spec.arena)
    from .observe import adopt_anchor_state

    adopt_anchor_state(adopted, anchor)
    want = _anchor_component_views(adopted, anchor)
    if any(views_a.get(k) != views_s.get(k) for k in want) and all(views_a[k] == v for k, v in want.items()):
        for k in want:
            views_a[k] = views_s[k]
        classes.append("component-views")
    obs_a = copy.deepcopy(obs_a)
    for n, o in obs_a.items():  # the float schedulable view: the page-level rule
        if (
            not adopted.bands[n].is_end
            and o["schedulable_available_size"] != obs_s[n]["schedulable_available_size"]
            and o["schedulable_available_size"] == _anchor_float_schedulable_of(adopted, n)
        ):
            o["schedulable_available_size"] = adopted.schedulable_available_size(n)
            classes.append("float-schedulable-credit")
    for n in obs_a:  # one batch of freed ids in another order (one side's is sorted)
        s, a = obs_s[n]["free_ids"], obs_a[n]["free_ids"]
        if call == "free" and s != a and len(s) == len(a):
            k = next(i for i in range(len(s)) if s[i] != a[i])
            if s[:k] == a[:k] and sorted(s[k:]) == sorted(a[k:]) and sorted(s[k:]) in (s[k:], a[k:]):
                obs_a[n]["free_ids"] = list(s)
                classes.append("free-order")
    if r_spec == "ValueError" and r_anchor is None and obs_s == obs_a and views_s == views_a:
        return classes + ["oversized-request"]
    # both refuse, having compacted different parts: flushing every member of both gives the same state
    if (
        r_spec is None
        and r_anchor is None
        and call == "alloc"
        and same_up_to_labels(observe_spec(flushed_whole(adopted)), observe_spec(flushed_whole(spec.arena)))
    ):
        return classes + ["composite-refusal-flushes"]
    if call == "alloc" and anchor.kind == "TriPool" and r_spec is None and isinstance(r_anchor, list):
        # the anchor's three-pool ladder found room the spec's ladder did not;
        # the spec accepts the anchor's resulting state (adopted above): it was feasible
        return classes + ["tripool-ladder-finds-more"]
    if call == "alloc" and anchor.kind == "TriPool" and isinstance(r_spec, list) and r_anchor is None:
        rebuilt = _anchor_tripool_generic(spec_pre, len(r_spec), obs_a)
        if rebuilt is not None:
            return classes + rebuilt
    if call == "alloc_state" and r_spec != r_anchor:
        rebuilt = _anchor_state_path(spec_pre, r_anchor, obs_a)
        if rebuilt is not None:
            return classes + rebuilt
    if (
        r_spec == r_anchor
        and call in ("alloc", "alloc_state")
        and anchor.kind == "TriPool"
        and (views_s != views_a or not same_up_to_placement(obs_s, obs_a))
    ):
        # the same outcome by another relocation path; the spec accepts the anchor's state
        return classes + ["tripool-ladder"]
    if views_a == views_s:
        if r_spec == r_anchor and obs_s == obs_a:
            return classes
        if r_spec == r_anchor and same_up_to_labels(obs_s, obs_a):
            return classes + ["move-pairing"]
        if r_spec == r_anchor and call in ("alloc", "alloc_state") and same_up_to_placement(obs_s, obs_a):
            return classes + ["hole-reuse-order"]
    # kvarena's ladder compacted its ENDs in steps and stopped at the fit; the anchor
    # flushed them whole: flushing the rest of the spec's gives the anchor's (the views follow the state)
    if (
        r_spec == r_anchor
        and isinstance(r_spec, list)
        and call in ("alloc", "alloc_state")
        and same_up_to_placement(observe_spec(flushed_whole(spec.arena)), obs_a)
    ):
        return classes + ["relief-steps"]
    return []


def _anchor_state_path(spec_pre, r_anchor, obs_a):
    """The anchor's state slot path rebuilt on the spec: flush full, then the
    state END's own ladder (``_relieve_for_alloc``: flush its growth-side
    neighbour, ask the float to open its low side for ``{state: 1}``), then
    ``alloc(1)``, under the page-level rules; the classes, or None."""
    from .classify import RULE_SETS, _ladder

    for rules in RULE_SETS:
        if not rules.ladder:
            continue
        c = copy.deepcopy(spec_pre.arena)
        c.flush("full")
        out = c.alloc("state", 1)
        if out is None and _ladder(c, "state", 1, rules):
            out = c.alloc("state", 1)
        if out == r_anchor and same_up_to_placement(observe_spec(c), obs_a):
            names = {
                "grid": "make-room-on-grid",
                "placement": "make-room-placement",
                "index_span": "policy-index-counts-holes",
            }
            return ["state-slot-ladder"] + [v for k, v in names.items() if getattr(rules, k)]
    return None


def _anchor_tripool_generic(spec_pre, n, obs_a):
    """A three-pool refusal where the spec allocates, rebuilt on the spec's
    TriPool.  The anchor's ``ensure_capacity`` first tries certificate
    rungs, then its generic ladder: flush swa, full, state; recheck; the
    policy on the float for ``{full: pages, swa: pages, state: 0}``;
    recheck.  That ladder is rebuilt with the anchor's page-level rules
    (``Rules``), the fewest that reproduce the refusal and the anchor's
    state first.  Classes, or None."""
    from .classify import RULE_SETS, Rules, _open_short_side

    pages = -(-n // spec_pre.page_size)
    names = {"grid": "make-room-on-grid", "placement": "make-room-placement", "index_span": "policy-index-counts-holes"}

    def generic(rules):
        c = copy.deepcopy(spec_pre)
        for m in ("swa", "full", "state"):
            c.arena.flush(m)
        if not c.fits(n):
            _open_short_side(c.arena, "swa", {"full": pages, "swa": pages, "state": 0}, rules)
        return c

    baseline = generic(Rules(False, False, False, False))
    if not baseline.fits(n):  # the generic ladder refuses whatever the rules
        return ["tripool-ladder"] if same_up_to_placement(observe_spec(baseline.arena), obs_a) else None
    for rules in [r for r in RULE_SETS if not r.ladder]:  # the rules that make it refuse
        c = generic(rules)
        if not c.fits(n) and same_up_to_placement(observe_spec(c.arena), obs_a):
            return ["tripool-ladder"] + [v for k, v in names.items() if getattr(rules, k)]
    return None


def _anchor_float_schedulable_of(adopted, n):
    from .classify import _anchor_float_schedulable

    return _anchor_float_schedulable(adopted, n)


def composite_class(name):
    """``(kind, what)`` of a composite class or of a page-level one."""
    from .classify import CLASSES

    return COMPOSITE_CLASSES.get(name) or CLASSES[name]


def composite_step(spec, anchor, call, args, requests, slots):
    """One call on both composites; ``(classes, detail)`` as ``campaign.step``:
    ``None`` when they agree, ``[]`` unclassified; the spec adopts the
    anchor's state after a classified difference."""
    from kvarena.spec import AccountingError

    from .observe import adopt_anchor_state

    pre = copy.deepcopy(spec)
    r_s, r_a = run_call(spec, anchor, call, args, requests, slots)
    obs_s, obs_a = observe_spec(spec.arena), observe_anchor(anchor)
    views_s, views_a = spec_views(spec), anchor.views()
    bad = anchor.violations()
    if not bad and r_s == r_a and obs_s == obs_a and views_s == views_a:
        keep(call, r_s, requests, slots)
        return None, None
    classes = [] if bad else classify_call(pre, call, r_s, r_a, obs_s, obs_a, views_s, views_a, spec, anchor)
    case = {
        "spec": r_s,
        "anchor": r_a,
        "views": [views_s, views_a],
        "violations": bad[:3],
        "fields": sorted({f"{n}.{k}" for n in obs_s for k in obs_s[n] if obs_s[n][k] != obs_a[n].get(k)}),
    }
    if classes:
        try:
            adopt_anchor_state(spec.arena, anchor)
            keep(call, r_a, requests, slots)  # the walk goes on from the anchor's state
        except AccountingError as e:
            case["not_adopted"] = str(e)
    return classes, case


def replay_composite(case):
    """Run a composite case's calls; ``(classes, detail, spec, anchor)`` of its last call."""
    spec, anchor = boot_composite(case["kind"], case["config"])
    requests, slots = [], []
    classes = detail = None
    for call, args in case["calls"]:
        classes, detail = composite_step(spec, anchor, call, args, requests, slots)
        if classes == []:
            break
    return classes, detail, spec, anchor


def run_composites(steps=600, seed=0, walk_steps=40):
    """The composite campaign; a report shaped like ``campaign.run``'s."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    ops, by_class, by_op, kinds = Counter(), Counter(), defaultdict(Counter), Counter()
    unclassified, cases = [], {}
    done = walks = 0
    while done < steps:
        kind, kw = random_composite(rng)
        try:
            spec, anchor = boot_composite(kind, kw)
        except ValueError:
            continue
        walks += 1
        kinds[kind] += 1
        requests, slots, history = [], [], []
        for _ in range(min(walk_steps, steps - done)):
            call, args = random_call(rng, spec, requests, slots)
            history.append([call, args])
            classes, case = composite_step(spec, anchor, call, args, requests, slots)
            done += 1
            ops[f"{kind}.{call}"] += 1
            if classes is None:
                continue
            case.update(kind=kind, config=kw, calls=copy.deepcopy(history))
            if not classes:
                unclassified.append(case)
                break
            for c in classes:
                by_class[c] += 1
                by_op[c][call] += 1
                cases.setdefault(c, case)
            if case.get("not_adopted"):
                break
    by_kind = {
        kd: sum(n for c, n in by_class.items() if composite_class(c)[0] == kd)
        for kd in sorted({composite_class(c)[0] for c in by_class})
    }
    return {
        **report_head(seed, done, walks, t0, ops),
        "composites": dict(kinds),
        "differences": differences(by_class, by_op, unclassified, by_kind, composite_class),
        "cases": cases,
        "unclassified_cases": unclassified[:5],
    }
