"""SGLang's scheduler-level code over kvarena's drop-in and over SGLang's own
allocator, side by side (issue 22 item 6; docs/design.md §11).

Each case builds two stacks with SGLang's own factories (``stacks.build``):
one after ``kvarena.sglang.install()``, one after ``uninstall()``, SGLang's
allocator running its paged calls on the CPU (``stacks.cpu_kernels``).  One
script drives both through SGLang's own classes: the req-to-token pool and
its mamba slots, ``UnifiedRadixCache`` (insert, match, locks, eviction, SWA
tombstones) and the ``ScheduleBatch`` helpers the scheduler calls each step
(``prepare_for_extend``, ``prepare_for_decode``, ``check_decode_mem``,
``retract_decode``, ``release_kv_cache``, chunked prefill's checkpoint).

Where the script decides (what a prefill round may admit, which requests a
decode step retracts) it reads SGLang's side, and both sides do the same.
After every step the two sides' results and observations (counts, views,
the tree's sizes and ids, every request's ``req_to_token`` row, the bands'
physical layout, ``verify_byte_accounting``) are compared.  A difference is
explained by a class of ``CLASSES`` whose rule is checked on the
observations (as ``kvarena.anchor.classify`` does for the spec and the
anchor), or the test fails (``Unclassified``; the last test plants bugs to
show it does).  After ``reclaim-amount`` both caches drop every evictable
entry and the walk goes on; an allocation only SGLang's side refused
(``policy-relief``) ends it (``Pair.diverged``).
"""

import contextlib
from array import array
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from kvarena import sglang as ks
from kvarena.anchor.loader import import_sglang
from kvarena.sglang import stacks

CLASSES = {
    "id-labels": (
        "design",
        "the allocators hand out other virtual ids (kvarena's free ids are a FIFO, SGLang's free list "
        "is sorted), and every id agrees under one page relabelling kept for the run",
    ),
    "placement": (
        "design",
        "the bands hold their live pages at other physical pages (kvarena's relief moves and packs "
        "otherwise), so the views that price the layout differ; every count, the tree and every result agree",
    ),
    "policy-relief": (
        "design",
        "kvarena's relief (the chain planner) makes room where SGLang's ladder cannot: SGLang's decode "
        "check fails and it retracts, or its allocation runs out, while kvarena's side fits",
    ),
    "reclaim-amount": (
        "design",
        "the tree evicted another amount: each allocator sizes the reclaim with its own gates over its own "
        "layout (views that differ by placement; on the tri-pool kvarena's stop test asks whether the demand "
        "fits now, SGLang's credits what its relief can still open), so the caches keep other entries; the "
        "protected sizes and, per pool, live minus evictable agree",
    ),
}

CASES = [(kind, ps) for kind in ("swa", "mamba_swa", "mamba") for ps in (1, 4)]
# and the mamba stacks with SGLang's mamba extra buffer (ping-pong tracking slots), which its "auto" mamba
# radix cache strategy turns on for Qwen3-Next at its defaults (issue 40)
EXTRA_CASES = [(kind, ps, False) for kind, ps in CASES] + [(kind, ps, True) for kind, ps in CASES if kind != "swa"]


def _extra_id(case) -> str:
    kind, ps, extra = case
    return f"{kind}-{ps}" + ("-extra-buffer" if extra else "")


BIG = 1 << 30


def _mods():
    names = {
        "sb": "sglang.srt.managers.schedule_batch",
        "urc": "sglang.srt.mem_cache.unified_radix_cache",
        "cip": "sglang.srt.mem_cache.cache_init_params",
        "comp": "sglang.srt.mem_cache.unified_cache.components",
        "mp": "sglang.srt.mem_cache.memory_pool",
        "spp": "sglang.srt.sampling.sampling_params",
        "spec": "sglang.srt.speculative.spec_info",
        "common": "sglang.srt.mem_cache.common",
        "allocation": "sglang.srt.mem_cache.allocation",
        "bpc": "sglang.srt.mem_cache.base_prefix_cache",
        "radix": "sglang.srt.mem_cache.radix_cache",
    }
    return SimpleNamespace(**{k: import_sglang(v) for k, v in names.items()})


# ------------------------------------------------------------------ one stack


class Side:
    """One stack (kvarena's allocator or SGLang's), its req-to-token pool and
    its radix cache, and the requests and running batch of the script."""

    def __init__(self, name: str, kind: str, g: stacks.Geometry, ps: int, lazy: bool, extra: bool = False) -> None:
        m = self.m = _mods()
        self.name, self.kind, self.ps = name, kind, ps
        if name == "kvarena":
            ks.install()
        try:
            self.bundle = stacks.build(kind, g, ps, lazy, extra_buffer=extra)
        finally:
            ks.uninstall()
        self.alloc = self.bundle.token_to_kv_pool_allocator
        self.has_swa, self.has_state = kind != "mamba", kind != "swa"
        if self.has_state:
            self.rtp = self.bundle.req_to_token_pool
        else:
            self.rtp = m.mp.ReqToTokenPool(
                size=g.max_reqs, max_context_len=g.context_len * ps, device="cpu", enable_memory_saver=False
            )
        # SGLang's MAMBA tree component needs page size 1 (no extra buffer): at 4
        # the tree caches KV only and the script frees each request's state slot.
        self.tree_state = self.has_state and ps == 1
        ct = m.comp.ComponentType
        components = (ct.FULL,) + ((ct.SWA,) if self.has_swa else ()) + ((ct.MAMBA,) if self.tree_state else ())
        self.cache = m.urc.UnifiedRadixCache(
            m.cip.CacheInitParams(
                disable=False,
                req_to_token_pool=self.rtp,
                token_to_kv_pool_allocator=self.alloc,
                page_size=ps,
                sliding_window_size=g.window if self.has_swa else None,
                tree_components=components,
            )
        )
        self.model = SimpleNamespace(vocab_size=1000, is_encoder_decoder=False, context_len=g.context_len * ps)
        self.calls: Counter[str] = Counter()  # what the script reached, for the coverage checks
        for method in ("evict_for_alloc", "evict_sliding_windows"):
            setattr(self.cache, method, self._counted(method, getattr(self.cache, method)))
        self.reqs: dict[str, object] = {}
        self.running = None

    def _counted(self, name: str, method):
        def call(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call

    def ctx(self):
        return stacks.cpu_kernels() if self.name == "sglang" else contextlib.nullcontext()

    # ------------------------------------------------------------ observe

    def observe(self) -> dict:
        a, c = self.alloc, self.cache
        bands = {"full": a.full_attn_allocator}
        if self.has_swa:
            bands["swa"] = a.swa_attn_allocator
        if self.has_state:
            bands["state"] = a.mamba_allocator
        counts = {f"{n}_live": b.allocated_count() for n, b in bands.items()}
        counts["req_rows"] = self.rtp.available_size()
        views = {"available": a.available_size(), "full": a.full_available_size(), "size": a.size}
        tree = {"full_evictable": c.full_evictable_size(), "full_protected": c.full_protected_size()}
        if self.has_swa:
            views["swa"] = a.swa_available_size()
            tree |= {"swa_evictable": c.swa_evictable_size(), "swa_protected": c.swa_protected_size()}
        if self.has_state:
            views["state"] = self.rtp.mamba_allocator.schedulable_available_size()
        if self.tree_state:
            tree |= {"state_evictable": c.mamba_evictable_size(), "state_protected": c.mamba_protected_size()}
        layout = {}
        for n, b in bands.items():
            v2p = b.virtual_to_physical
            layout[n] = (sorted(v2p[v2p > 0].tolist()), int(b.watermark_physical))
        rows = {}
        for r in self.reqs.values():
            if r.kv.holds_kv:
                rows[r.rid] = self.rtp.req_to_token[r.kv.req_pool_idx, : r.kv.kv_allocated_len].tolist()
        return {
            "counts": counts,
            "tree": tree,
            "tree_ids": sorted(c.all_values_flatten().tolist(), key=lambda t: (False, str(t).zfill(12))),
            "rows": rows,
            "views": views,
            "layout": layout,
            "audit": a.verify_byte_accounting(),
        }

    def flush_cache(self) -> None:
        """Evict every evictable entry (SWA tombstones included)."""
        self.cache.evict(self.m.bpc.EvictParams(num_tokens=BIG, swa_num_tokens=BIG, mamba_num=BIG))

    # ------------------------------------------------------------ requests

    def new_req(self, rid: str, ids: list[int], max_new: int):
        sp = self.m.spp.SamplingParams(max_new_tokens=max_new)
        sp.normalize(None)
        r = self.m.sb.Req(
            rid=rid, origin_input_text="", origin_input_ids=array("q", ids), sampling_params=sp, vocab_size=1000
        )
        self.reqs[rid] = r
        return r


# ------------------------------------------------------------ relabelling


class Labels:
    """kvarena's virtual ids as SGLang's: a page relabelling for token ids
    and a slot relabelling for state slots, learnt from the ids each step
    hands out and kept for the run.  A token at offset 0 opens a page (the
    page's label is learnt or replaced); any other continues one whose label
    must already be known, at the same offset."""

    def __init__(self, ps: int) -> None:
        self.ps = ps
        self.pages: dict[int, int] = {0: 0}
        self.slots: dict[int, int] = {}

    def learn_tokens(self, kv_ids: list[int], sg_ids: list[int]) -> bool:
        if len(kv_ids) != len(sg_ids):
            return False
        ps, opened, opens = self.ps, {}, 0
        for k, s in zip(kv_ids, sg_ids, strict=True):
            if k % ps != s % ps:
                return False
            if k % ps == 0:
                opened[k // ps] = s // ps
                opens += 1
            elif opened.get(k // ps, self.pages.get(k // ps)) != s // ps:
                return False
        if not opens == len(opened) == len(set(opened.values())):  # one page opened twice: not a relabelling
            return False
        self.pages.update(opened)
        return True

    def learn_slots(self, kv_ids: list[int], sg_ids: list[int]) -> bool:
        if len(kv_ids) != len(sg_ids) or len(set(sg_ids)) != len(sg_ids):
            return False
        self.slots.update(zip(kv_ids, sg_ids, strict=True))
        return True

    def token(self, t: int) -> object:
        page = self.pages.get(t // self.ps)
        return ("unlabelled", t) if page is None else page * self.ps + t % self.ps

    def tokens(self, ids: list[int]) -> list:
        return [self.token(t) for t in ids]


TOKEN_KEYS = ("loc",)  # fresh ids: the labels are learnt from them
MAPPED_KEYS = ("prefix_ids",)  # ids already handed out
SLOT_KEYS = ("state_idx",)


# ------------------------------------------------------------ the pair


class Unclassified(AssertionError):
    pass


class Pair:
    """The two sides, the labels, and the classified differences so far."""

    def __init__(self, kind: str, ps: int, g: stacks.Geometry, lazy: bool = True, extra: bool = False) -> None:
        self.kv = Side("kvarena", kind, g, ps, lazy, extra)
        self.sg = Side("sglang", kind, g, ps, lazy, extra)
        self.labels = Labels(ps)
        self.seen: Counter[str] = Counter()
        self.steps = 0
        self.diverged: tuple[str, str] | None = None  # (step, class) once the sides no longer compare

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.kv, self.sg

    def each(self, fn) -> tuple[dict, dict]:
        """``fn(side, ref)`` on SGLang's side (``ref`` None), then on kvarena's
        with SGLang's result as ``ref``: where the script follows a decision
        (which requests to retract), it is SGLang's."""
        out = {}
        for s in (self.sg, self.kv):
            with s.ctx():
                try:
                    res = fn(s, out.get("sglang"))
                except RuntimeError as e:  # SGLang's OOM (alloc_token_slots, alloc_req_slots, ...)
                    res = {"error": str(e).splitlines()[0]}
            out[s.name] = res or {}
        return out["kvarena"], out["sglang"]

    def step(self, label: str, fn) -> tuple[dict, dict]:
        """Run ``fn`` on both sides, compare, classify; the results (kvarena's
        ids as they are)."""
        assert self.diverged is None, f"step {label!r} after the sides diverged at {self.diverged}"
        res_kv, res_sg = self.each(fn)
        self.steps += 1
        for c in judge(self, label, res_kv, res_sg):
            assert c in CLASSES
            self.seen[c] += 1
        for key in ("admitted", "retracted", "aborted", "finished"):
            self.kv.calls[key] += len(res_kv.get(key, []))
        counts = self.kv.observe()["counts"]
        self.kv.calls["window freed"] += counts.get("swa_live", counts["full_live"]) < counts["full_live"]
        return res_kv, res_sg


def _mapped_result(labels: Labels, res: dict) -> dict:
    out = dict(res)
    for k in TOKEN_KEYS + MAPPED_KEYS:
        if k in out:
            out[k] = labels.tokens(out[k])
    for k in SLOT_KEYS:
        if k in out:
            out[k] = [labels.slots.get(t, ("unlabelled", t)) for t in out[k]]
    return out


def _mapped_obs(labels: Labels, obs: dict) -> dict:
    out = dict(obs)
    out["tree_ids"] = sorted(labels.tokens(obs["tree_ids"]), key=lambda t: (isinstance(t, tuple), str(t).zfill(12)))
    out["rows"] = {rid: labels.tokens(row) for rid, row in obs["rows"].items()}
    return out


def _diff(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def judge(pair: Pair, label: str, res_kv: dict, res_sg: dict) -> list[str]:
    """The classes that explain this step's differences; ``Unclassified``
    when one is left unexplained."""
    kv, sg = pair.kv.observe(), pair.sg.observe()
    where = f"{pair.kv.kind} ps={pair.kv.ps} step {pair.steps} {label!r}"

    def fail(why: str, **detail) -> None:
        raise Unclassified(f"{where}: {why}: " + "; ".join(f"{k}={v}" for k, v in detail.items()))

    for side, obs in (("kvarena", kv), ("sglang", sg)):
        if obs["audit"]:
            fail(f"{side}'s verify_byte_accounting", audit=obs["audit"])
    classes = []
    labels = pair.labels
    if "error" in res_kv and "error" in res_sg:
        fail("both sides refused: the script overran the pool", kvarena=res_kv["error"], sglang=res_sg["error"])
    ids = TOKEN_KEYS + MAPPED_KEYS + SLOT_KEYS
    plain_kv, plain_sg = ({k: v for k, v in r.items() if k not in ids} for r in (res_kv, res_sg))
    if plain_kv != plain_sg:
        if not _policy_relief(pair, label, plain_kv, plain_sg):
            fail("results differ", diff=_diff(plain_kv, plain_sg))
        classes.append("policy-relief")
        if pair.diverged:
            return classes
        res_kv = dict(res_kv, fits=res_sg["fits"])
    learnt = all(labels.learn_tokens(res_kv.get(k, []), res_sg.get(k, [])) for k in TOKEN_KEYS)
    learnt &= all(labels.learn_slots(res_kv.get(k, []), res_sg.get(k, [])) for k in SLOT_KEYS)
    if not learnt:
        fail("the ids handed out do not relabel", kvarena=res_kv, sglang=res_sg)
    mres, mobs = _mapped_result(labels, res_kv), _mapped_obs(labels, kv)
    if mres != res_sg:
        fail("results differ", diff=_diff(mres, res_sg))
    if mobs["rows"] != sg["rows"]:
        fail("req_to_token rows differ", diff=_diff(mobs["rows"], sg["rows"]))
    relabelled = mobs["tree_ids"] == sg["tree_ids"] and kv["tree_ids"] != sg["tree_ids"]
    if res_kv != res_sg or kv["rows"] != sg["rows"] or relabelled:
        classes.append("id-labels")

    if mobs["tree_ids"] != sg["tree_ids"] or kv["tree"] != sg["tree"] or kv["counts"] != sg["counts"]:
        _reclaim_amount(fail, kv, sg)
        classes.append("reclaim-amount")
        for s in pair.sides:
            with s.ctx():
                s.flush_cache()
        kv, sg = pair.kv.observe(), pair.sg.observe()
        mobs = _mapped_obs(labels, kv)
        if mobs["tree_ids"] != sg["tree_ids"] or kv["tree"] != sg["tree"] or kv["counts"] != sg["counts"]:
            fail(
                "the caches differ after both dropped every evictable entry",
                tree=_diff(kv["tree"], sg["tree"]),
                counts=_diff(kv["counts"], sg["counts"]),
                tree_ids=(mobs["tree_ids"], sg["tree_ids"]),
            )
    if kv["views"] != sg["views"]:
        if kv["layout"] == sg["layout"]:
            fail("views differ over the same layout", views=_diff(kv["views"], sg["views"]))
        classes.append("placement")
    return classes


def _policy_relief(pair: Pair, label: str, kv: dict, sg: dict) -> bool:
    """The rule of ``policy-relief``: SGLang's side refused and kvarena's
    did not, nothing else differs.  A decode check that failed on SGLang's
    side only (``fits``; both then retract as SGLang did) keeps the walk in
    step; a refused allocation (``error`` on SGLang's side only) ends it."""
    if "error" in sg and "error" not in kv:
        pair.diverged = (label, "policy-relief")
        return True
    rest_kv, rest_sg = ({k: v for k, v in r.items() if k != "fits"} for r in (kv, sg))
    return kv.get("fits") is True and sg.get("fits") is False and rest_kv == rest_sg


def _reclaim_amount(fail, kv: dict, sg: dict) -> None:
    """The rule of ``reclaim-amount``: only the cache's evictable part differs."""
    for pool in ("full", "swa", "state"):
        if f"{pool}_protected" in kv["tree"] and kv["tree"][f"{pool}_protected"] != sg["tree"][f"{pool}_protected"]:
            fail("protected sizes differ", tree=_diff(kv["tree"], sg["tree"]))
        if f"{pool}_evictable" not in kv["tree"]:
            if kv["counts"].get(f"{pool}_live") != sg["counts"].get(f"{pool}_live"):
                fail("counts differ", counts=_diff(kv["counts"], sg["counts"]))
            continue
        held = [o["counts"][f"{pool}_live"] - o["tree"][f"{pool}_evictable"] for o in (kv, sg)]
        if held[0] != held[1]:
            fail(f"{pool}: live minus evictable differ", held=held, counts=_diff(kv["counts"], sg["counts"]))
    rest = [k for k in kv["counts"] if not k.endswith("_live")]
    if any(kv["counts"][k] != sg["counts"][k] for k in rest):
        fail("counts differ", counts=_diff(kv["counts"], sg["counts"]))


# ------------------------------------------------- the scheduler's calls


def _sample(b) -> None:
    """What the forward and ``process_batch_result`` leave: one new token per
    request, and the finish check."""
    for r in b.reqs:
        r.output_ids.append(7 + len(r.output_ids))
        r.update_finish_state()
    b.output_ids = torch.tensor([r.output_ids[-1] for r in b.reqs], dtype=torch.int64)


def _free_state_slots(s: Side, slots: dict) -> None:
    """Without a MAMBA tree component nobody frees a released request's state
    slot (``HybridReqToTokenPool.free`` frees the row only): the script does."""
    for idx in slots.values():
        if idx is not None:
            s.rtp.mamba_allocator.free(idx.reshape(1))


def _state_of(s: Side, reqs) -> dict:
    if not s.has_state or s.tree_state:
        return {}
    return {r.rid: r.kv.mamba_pool_idx for r in reqs}


def _finish(s: Side, b) -> list[str]:
    """Release the finished requests into the tree inside one free group, as
    ``process_batch_result_decode`` does, and drop them from the batch."""
    done = [r for r in b.reqs if r.finished()]
    if not done:
        return []
    _free_state_slots(s, _state_of(s, done))
    s.alloc.free_group_begin()
    for r in done:
        s.m.common.release_kv_cache(r, s.cache, checkpoint=True)
    s.alloc.free_group_end()
    b.filter_batch(keep_indices=[i for i, r in enumerate(b.reqs) if not r.finished()])
    return [r.rid for r in done]


def _run_running(s: Side, b) -> None:
    if s.running is None or s.running.is_empty():
        s.running = b
    else:
        s.running.merge_batch(b)


def _extend(s: Side, reqs: list) -> dict:
    b = s.m.sb.ScheduleBatch.init_new(reqs, s.rtp, s.alloc, s.cache, s.model, False, s.m.spec.SpeculativeAlgorithm.NONE)
    b.prepare_for_extend()
    res = {"loc": b.out_cache_loc.tolist(), "rows_at": b.req_pool_indices_cpu.tolist()}
    if s.has_state:
        res["state_idx"] = [int(r.kv.mamba_pool_idx) for r in reqs]
    return res | {"batch": b}


def budget(s: Side) -> dict:
    """What a prefill round may take, read off one side (SGLang's: the script
    is the same on both): free plus evictable tokens per KV pool, free rows,
    and free plus evictable state slots."""
    a, c = s.alloc, s.cache
    out = {"tokens": a.available_size() + c.full_evictable_size(), "rows": s.rtp.available_size()}
    if s.has_swa:
        out["tokens"] = min(out["tokens"], a.swa_available_size() + c.swa_evictable_size())
    if s.has_state:
        out["slots"] = s.rtp.mamba_allocator.schedulable_available_size()
        out["slots"] += c.mamba_evictable_size() if s.tree_state else 0
        out["slot_tokens"] = a.mamba_slot_full_token_cost()  # a new request's slot takes this much of the pool
    return out


def admit(s: Side, rids: list[str], room: dict) -> dict:
    """One prefill round for waiting requests: match each against the tree,
    admit it while its new tokens (plus two pages and its state slot's
    share) fit ``room`` (SGLang's ``budget``, so both sides admit alike),
    lock its prefix, then ``prepare_for_extend``, sample and merge into the
    running batch."""
    reqs, tokens = [], room["tokens"]
    for rid in rids:
        r = s.reqs[rid]
        r.init_next_round_input(s.cache)
        r.extend_end = len(r.full_untruncated_fill_ids)
        need = r.extend_end - r.prefix_len + 2 * s.ps + room.get("slot_tokens", 0)
        if need > tokens or len(reqs) == room["rows"] or len(reqs) == room.get("slots", BIG):
            break
        before = s.cache.full_evictable_size()
        r.lock = s.cache.lock(r.last_node)
        tokens -= need + before - s.cache.full_evictable_size()  # a locked prefix is no longer evictable
        reqs.append(r)
    res = {"admitted": [r.rid for r in reqs], "prefix": [r.prefix_len for r in reqs]}
    res["prefix_ids"] = [t for r in reqs for t in s.cache.prefix_device_indices(r).tolist()]
    if not reqs:
        return res
    out = _extend(s, reqs)
    b = out.pop("batch")
    _sample(b)
    res |= out | {"finished": _finish(s, b)}
    _run_running(s, b)
    return res


def prefill_chunk(s: Side, rid: str, chunk: int) -> dict:
    """One chunk of a chunked prefill: the first matches the tree and locks,
    a middle one is checkpointed (``checkpoint_kv_cache``, as
    ``stash_chunked_request`` does), the last one joins the running batch."""
    r = s.reqs[rid]
    if not r.kv.holds_kv:
        r.init_next_round_input(s.cache)
        r.lock = s.cache.lock(r.last_node)
    else:
        r.init_next_round_input()
    total = len(r.full_untruncated_fill_ids)
    r.extend_end = min(r.prefix_len + chunk, total)
    res = {"prefix": r.prefix_len, "end": r.extend_end}
    out = _extend(s, [r])
    b = out.pop("batch")
    res |= out
    if r.extend_end < total:
        s.m.common.checkpoint_kv_cache(r, s.cache)
    else:
        _sample(b)
        res["finished"] = _finish(s, b)
        _run_running(s, b)
    return res


def decode(s: Side, ref: dict | None) -> dict:
    """One decode step of the running batch: ``check_decode_mem``, and
    ``retract_decode`` when it fails (on kvarena's side: when SGLang's
    did); ``prepare_for_decode``; sample; release the finished."""
    b, res = s.running, {}
    res["fits"] = b.check_decode_mem()
    if not res["fits"] or (ref is not None and "retracted" in ref):
        slots = _state_of(s, b.reqs)
        retracted, _, aborted = b.retract_decode()
        res["retracted"] = [r.rid for r in retracted]
        res["aborted"] = [r.rid for r in aborted]
        _free_state_slots(s, {rid: slots[rid] for rid in res["retracted"] + res["aborted"] if rid in slots})
    if b.is_empty():
        return res
    b.prepare_for_decode()
    res["loc"] = b.out_cache_loc.tolist()
    _sample(b)
    res["finished"] = _finish(s, b)
    return res


# ------------------------------------------------------------ the scripts


def _geometry(ps: int, **kw) -> stacks.Geometry:
    """A pool of 64 pages at page size 1 and of 28 at 4 (so both run full)."""
    return stacks.Geometry(**({"tokens": 64 if ps == 1 else 28, "max_reqs": 6, "mamba_slots": 12} | kw))


def _prompts(pair: Pair, n: int, ps: int, new=lambda i: 4 + 3 * (i % 4)) -> None:
    """``n`` requests: a shared prefix of two pages, then a tail of their
    own; request ``i`` generates ``new(i)`` tokens."""
    shared = list(range(900, 900 + 8 * ps))
    for s in pair.sides:
        for i in range(n):
            s.new_req(f"r{i}", shared + list(range(100 * i, 100 * i + 3 * ps + 2 * i + 1)), new(i))


def serve(pair: Pair, n: int, rounds: int, chunk: int | None = None) -> None:
    """A scheduler's loop: every third step a prefill round for the head of
    the queue (``r0`` in chunks of ``chunk`` first), else one decode step;
    retracted requests go back to the head of the queue."""
    kv, _ = pair.sides
    waiting = [f"r{i}" for i in range(n)]
    if chunk is not None:
        rid = waiting.pop(0)
        while True:
            res, _ = pair.step(f"chunk {rid}", lambda s, _, rid=rid: prefill_chunk(s, rid, chunk))
            if pair.diverged or "finished" in res:
                break
    for k in range(rounds):
        if pair.diverged or (not waiting and (kv.running is None or kv.running.is_empty())):
            return
        if waiting and (k % 3 == 0 or kv.running is None or kv.running.is_empty()):
            head, room = waiting[:3], budget(pair.sg)
            res, _ = pair.step(f"admit {head}", lambda s, _, head=head, room=room: admit(s, head, room))
            waiting = [w for w in waiting if w not in res.get("admitted", [])]
            continue
        res, _ = pair.step("decode", decode)
        waiting = res.get("retracted", []) + waiting


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize(("kind", "ps", "extra"), EXTRA_CASES, ids=[_extra_id(c) for c in EXTRA_CASES])
def test_schedule_batch(kind, ps, extra, lazy, monkeypatch):
    """Prefill rounds over a shared prefix, a chunked prefill, decode steps
    with window frees, retraction under pressure, and finished requests
    released into the tree, on a pool that runs full."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")  # window frees every other token, not every 128
    pair = Pair(kind, ps, _geometry(ps), lazy, extra)
    _prompts(pair, 12, ps)
    serve(pair, 12, rounds=120, chunk=5 * ps + 1)
    print(kind, ps, lazy, pair.steps, dict(pair.seen), pair.diverged, dict(pair.kv.calls))
    calls = pair.kv.calls
    assert pair.diverged or calls["finished"] == 12, "the script ends when every request has finished"
    assert calls["evict_for_alloc"] and (calls["window freed"] or kind == "mamba")


@pytest.mark.parametrize(("kind", "ps"), CASES)
def test_decode_pressure(kind, ps, monkeypatch):
    """Long generations that outgrow the pool: ``check_decode_mem`` fails
    again and again, ``retract_decode`` picks the requests to retract, and
    they come back through the tree."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    pair = Pair(kind, ps, _geometry(ps))
    _prompts(pair, 6, ps, new=lambda i: (16 + 4 * i) * (1 if ps == 1 else 2))
    serve(pair, 6, rounds=200)
    print(kind, ps, pair.steps, dict(pair.seen), pair.diverged, dict(pair.kv.calls))
    assert pair.kv.calls["retracted"] >= 1


# ------------------------------------------------------ the radix cache


def _key(s: Side, ids: list[int]):
    return s.m.radix.RadixKey(array("q", ids))


def match(s: Side, ids: list[int]) -> tuple[dict, object]:
    """``match_prefix``: the device prefix, its ids, the SWA branching point."""
    r = s.cache.match_prefix(s.m.bpc.MatchPrefixParams(key=_key(s, ids)))
    prefix = s.cache.path_device_indices(r.last_device_node).tolist()[: r.device_prefix_len]
    return {"prefix": r.device_prefix_len, "prefix_ids": prefix, "swa_branch": r.swa_branching_seqlen}, r


def insert(s: Side, ids: list[int]) -> dict:
    """What a request's checkpoint does for ``ids``: match, allocate the
    rest (``alloc_token_slots``, which evicts first), insert with the matched
    length as ``prev_prefix_len`` (the tree frees what it already holds), and
    give the tree a state slot where it caches state."""
    res, _ = match(s, ids)
    new = s.m.allocation.alloc_token_slots(s.cache, len(ids) - res["prefix"])
    value = torch.cat([torch.tensor(res["prefix_ids"], dtype=torch.int64), new.to(torch.int64)])
    params = s.m.bpc.InsertParams(key=_key(s, ids), value=value, prev_prefix_len=res["prefix"])
    if s.tree_state:
        params.mamba_value = s.rtp.mamba_allocator.alloc(1)
        res["state_idx"] = params.mamba_value.tolist()
    out = s.cache.insert(params)
    if s.tree_state and out.mamba_exist:
        s.rtp.mamba_allocator.free(params.mamba_value)
    return res | {"loc": new.tolist(), "inserted": out.prefix_len}


def evict(s: Side, tokens: int = 0, swa: int = 0, state: int = 0, for_alloc: bool = False) -> dict:
    params = s.m.bpc.EvictParams(num_tokens=tokens, swa_num_tokens=swa, mamba_num=state)
    r = s.cache.evict_for_alloc(params) if for_alloc else s.cache.evict(params)
    return {"evicted": (r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted)}


@pytest.mark.parametrize(("kind", "ps"), CASES)
def test_radix_cache(kind, ps):
    """SGLang's ``UnifiedRadixCache`` over each allocator: inserts over a
    shared trunk (the tree frees duplicates), matches, locks, eviction of
    unlocked leaves, SWA tombstones and a re-insert over them, eviction to
    make room for an allocation."""
    pair = Pair(kind, ps, _geometry(ps, window=4 * ps))  # a window shorter than the trunk: tombstones
    P = ps  # a page
    trunk = list(range(1000, 1000 + 6 * P))
    keys = [trunk + list(range(2000 + 100 * i, 2000 + 100 * i + (2 + i) * P)) for i in range(5)]
    keys.append(keys[1][: 7 * P] + list(range(3000, 3000 + 3 * P)))  # a branch off a branch
    for i, k in enumerate(keys):
        pair.step(f"insert {i}", lambda s, _, k=k: insert(s, k))
    locks: dict[str, list] = {"kvarena": [], "sglang": []}

    def lock(s: Side, _, i: int) -> dict:
        res, r = match(s, keys[i])
        locks[s.name].append(s.cache.lock(r.last_device_node))
        return res

    def unlock(s: Side, _) -> dict:
        for held in locks[s.name]:
            s.cache.unlock(held)
        locks[s.name].clear()
        return {}

    for i in range(len(keys)):
        pair.step(f"match {i}", lambda s, _, i=i: match(s, keys[i])[0])
    pair.step("lock 2", lambda s, _: lock(s, _, 2))
    pair.step("lock 5", lambda s, _: lock(s, _, 5))
    pair.step("evict 3 pages", lambda s, _: evict(s, tokens=3 * P))
    if pair.kv.has_swa:
        pair.step("tombstone 4 SWA pages", lambda s, _: evict(s, swa=4 * P))
        for i in range(len(keys)):
            pair.step(f"match {i} after tombstones", lambda s, _, i=i: match(s, keys[i])[0])
        pair.step("re-insert 0 over tombstones", lambda s, _: insert(s, keys[0]))
    if pair.kv.tree_state:
        pair.step("evict 2 states", lambda s, _: evict(s, state=2))
    big = trunk[: 2 * P] + list(range(5000, 5000 + 14 * P))
    pair.step("insert under pressure", lambda s, _: insert(s, big))
    pair.step("evict_for_alloc", lambda s, _: evict(s, tokens=4 * P, swa=2 * P if s.has_swa else 0, for_alloc=True))
    pair.step("unlock", unlock)
    for i in range(len(keys)):
        pair.step(f"match {i} at the end", lambda s, _, i=i: match(s, keys[i])[0])
    pair.step("evict all", lambda s, _: evict(s, tokens=BIG, swa=BIG, state=BIG))
    print(kind, ps, pair.steps, dict(pair.seen), pair.diverged, dict(pair.kv.calls))
    assert pair.diverged is None


# ------------------------------------------------- the req-to-token pool


@pytest.mark.parametrize(("kind", "ps", "extra"), EXTRA_CASES, ids=[_extra_id(c) for c in EXTRA_CASES])
def test_req_to_token_pool(kind, ps, extra):
    """Request rows and state slots as the scheduler takes them
    (``alloc_req_slots`` inside the slot allocator's group, as a prefill
    round does), and gives them back (``free_mamba_cache``, ``free``); then
    the same with the pool's bytes held by cached KV, so that the slots come
    from the cache (``ensure_mamba_capacity`` evicts for them).  With the
    extra buffer each request also takes its tracking slots."""
    pair = Pair(kind, ps, _geometry(ps), extra=extra)
    for s in pair.sides:
        for i in range(8):
            s.new_req(f"q{i}", [i], 1)

    def take(s: Side, _, rids: list[str]) -> dict:
        reqs = [s.reqs[r] for r in rids]
        if s.has_state:
            s.rtp.mamba_allocator.alloc_group_begin(len(reqs))
        try:
            rows = s.m.allocation.alloc_req_slots(s.rtp, reqs, s.cache)
        finally:
            if s.has_state:
                s.rtp.mamba_allocator.alloc_group_end()
        res = {"rows_at": list(rows)}
        if s.has_state:
            res["state_idx"] = [int(r.kv.mamba_pool_idx) for r in reqs]
        return res

    def give(s: Side, _, rids: list[str]) -> dict:
        for rid in rids:
            r = s.reqs[rid]
            if s.has_state:
                s.rtp.free_mamba_cache(r)
            s.rtp.free(r)
        return {}

    def slots(s: Side, _, n: int) -> dict:
        """State slots straight from the slot allocator, and back."""
        if not s.has_state:
            return {}
        ids = s.rtp.mamba_allocator.alloc(n)
        s.rtp.mamba_allocator.free(ids)
        return {"state_idx": ids.tolist()}

    pair.step("take q0..q3", lambda s, _: take(s, _, ["q0", "q1", "q2", "q3"]))
    if pair.kv.has_state:  # a state slot each, and with the extra buffer its tracking slots
        per_req = 1 + (pair.kv.rtp.mamba_initial_tracking_slots if extra else 0)
        assert pair.kv.observe()["counts"]["state_live"] == 4 * per_req == pair.sg.observe()["counts"]["state_live"]
    pair.step("3 state slots and back", lambda s, _: slots(s, _, 3))
    pair.step("give q1 q2", lambda s, _: give(s, _, ["q1", "q2"]))
    pair.step("take q4 q5", lambda s, _: take(s, _, ["q4", "q5"]))
    pair.step("give q0 q3 q4 q5", lambda s, _: give(s, _, ["q0", "q3", "q4", "q5"]))
    n = 0
    while pair.sg.alloc.available_size() >= 4 * ps:  # SGLang's side decides when the pool is full
        key = list(range(10000 + 100 * n, 10000 + 100 * n + 4 * ps))
        pair.step(f"cache {n}", lambda s, _, key=key: insert(s, key))
        n += 1
    pair.step("take q6 q7 from a full pool", lambda s, _: take(s, _, ["q6", "q7"]))
    pair.step("give q6 q7", lambda s, _: give(s, _, ["q6", "q7"]))
    print(kind, ps, pair.steps, dict(pair.seen), pair.diverged, dict(pair.kv.calls))
    assert pair.diverged is None and n > 3


# ------------------------------------------------------- the harness can fail


def _duplicate_last(alloc):
    def call(n):
        out = alloc(n)
        if out is not None and out.numel() > 1:
            out = out.clone()
            out[-1] = out[0]
        return out

    return call


PLANTS = {
    # kvarena's window frees do nothing: its SWA pages leak
    "leak": lambda a: {"free_swa_segment": lambda *args, **kwargs: None},
    # kvarena's joint view one page too high over the same layout
    "view": lambda a: {"available_size": lambda orig=a.available_size: orig() + a.page_size},
    # kvarena hands out one id twice
    "ids": lambda a: {"alloc": _duplicate_last(a.alloc)},
    # kvarena's decode check refuses where SGLang's fits: kvarena worse, not a policy class
    "refuse": lambda a: {"check_decode_capacity": lambda **kwargs: False},
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_is_unclassified(plant, monkeypatch):
    """Each plant in kvarena's allocator makes the comparison fail."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "2")
    pair = Pair("swa", 1, _geometry(1))
    for name, fn in PLANTS[plant](pair.kv.alloc).items():
        monkeypatch.setattr(pair.kv.alloc, name, fn)
    _prompts(pair, 12, 1)
    with pytest.raises(Unclassified):
        serve(pair, 12, rounds=120, chunk=6)
