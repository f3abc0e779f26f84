"""The anchor's Triton paths against kvarena's composites, on a GPU.

``python -m kvarena.anchor.gpu [--steps N] [--seed S]`` needs a CUDA
device and the anchor installed (``pip install -e ".[anchor]" && pip
install --no-deps sglang==0.5.23``); ``tools/cuda_checks.sh`` runs it when
both are there.  It drives the anchor's composites (``HybridSWA``,
``MambaHybrid``, ``TriPool`` counterparts, built on ``cuda``) and
kvarena's spec composites with the same serving calls: new requests
(``alloc_extend`` with an empty prefix), extensions of live requests
(``alloc_extend`` with a prefix and its ``last_loc``), decode batches
(``alloc_decode``), window frees (``free_swa`` of whole pages), request
frees and state slots.  The anchor runs its paged alloc kernels (Triton) in
virtual space; the returned token ids, every pool's page-level state and
the composite views are compared after each call and every difference is
classified as on CPU (``composites.classify_call``).  Exits non-zero on an
unclassified difference.
"""

import argparse
import copy
import json
import random
import sys
from collections import Counter

import torch

from .composites import AnchorComposite, classify_call, keep, random_composite, spec_views
from .observe import adopt_anchor_state, observe_anchor, observe_spec


class PagedAnchor(AnchorComposite):
    """The anchor composite driven through its paged (Triton) calls."""

    def _t(self, xs):
        return torch.tensor(xs, dtype=torch.int64, device=self.device)

    def extend(self, prefix, seq, last):
        out = self.c.alloc_extend(
            self._t(prefix),
            torch.tensor(prefix, dtype=torch.int64),
            self._t(seq),
            torch.tensor(seq, dtype=torch.int64),
            self._t(last),
            sum(seq) - sum(prefix),
        )
        return None if out is None else self._written([int(t) for t in out.tolist()])

    def decode(self, seq, last):
        out = self.c.alloc_decode(self._t(seq), torch.tensor(seq, dtype=torch.int64), self._t(last))
        return None if out is None else self._written([int(t) for t in out.tolist()])

    def _written(self, toks):
        ps = self.page_size["full"]
        pages = sorted({t // ps for t in toks})
        for name in ("full", "swa"):
            if name in self.alloc_of:
                live = [p for p in pages if int(self.alloc_of[name].virtual_to_physical[p]) > 0]
                self._record_writes(name, live)
        return toks


def _call(rng, spec, reqs, slots):
    r = rng.random()
    if r < 0.3 or not reqs:
        return "extend", {"new": True, "n": rng.randint(1, 3 * spec.page_size + 1)}
    if r < 0.45:
        return "extend", {"new": False, "req": rng.randrange(len(reqs)), "n": rng.randint(1, 2 * spec.page_size)}
    if r < 0.75:
        return "decode", {"reqs": sorted(rng.sample(range(len(reqs)), rng.randint(1, len(reqs))))}
    if r < 0.85 and hasattr(spec, "free_swa"):
        return "free_swa", {"req": rng.randrange(len(reqs))}
    if r < 0.92 and hasattr(spec, "alloc_state"):
        return (
            ("free_state", {"slot": rng.randrange(len(slots))}) if slots and rng.random() < 0.4 else ("alloc_state", {})
        )
    return "free", {"req": rng.randrange(len(reqs))}


def _apply(spec, anchor, call, args, reqs, slots):
    """Both sides; (spec result, anchor result).  ``reqs`` are token lists
    per request; the spec's result drives the bookkeeping when they agree."""
    ps = spec.page_size
    if call == "extend":
        toks = [] if args["new"] else reqs[args["req"]]
        prefix, seq = len(toks), len(toks) + args["n"]
        last = toks[-1] if toks else -1
        try:
            rs = spec.alloc_extend([prefix], [seq], [last])
            rs = None if rs is None else [int(t) for t in rs]
        except ValueError:
            rs = "ValueError"
        return rs, anchor.extend([prefix], [seq], [last])
    if call == "decode":
        seq = [len(reqs[i]) + 1 for i in args["reqs"]]
        last = [reqs[i][-1] for i in args["reqs"]]
        rs = spec.alloc_decode(seq, last)
        return (None if rs is None else [int(t) for t in rs]), anchor.decode(seq, last)
    if call == "free_swa":
        toks = reqs[args["req"]]
        k = (len(toks) // ps) * ps
        spec.free_swa(toks[:k], 0)
        anchor.free_swa(toks[:k])
        return None, None
    if call == "free":
        toks = reqs.pop(args["req"])
        spec.free(toks)
        anchor.free_tokens(toks)
        return None, None
    if call == "alloc_state":
        rs = spec.alloc_state(1)
        return (None if rs is None else [int(s) for s in rs]), anchor.alloc_state()
    slot = slots.pop(args["slot"])
    spec.free_state([slot])
    anchor.free_state([slot])
    return None, None


def _track(call, args, result, reqs, slots):
    if call == "extend" and isinstance(result, list):
        if args["new"]:
            reqs.append(result)
        else:
            reqs[args["req"]] = reqs[args["req"]] + result
    elif call == "decode" and isinstance(result, list):
        for i, t in zip(args["reqs"], result):
            reqs[i] = reqs[i] + [t]
    elif call == "alloc_state":
        keep(call, result, [], slots)


def run(steps=1000, seed=0, device="cuda", walk_steps=40):
    rng = random.Random(seed)
    ops, by_class, unclassified, done = Counter(), Counter(), [], 0
    while done < steps:
        kind, kw = random_composite(rng)
        try:
            spec = __import__("kvarena.spec", fromlist=[kind]).__dict__[kind](**kw)
        except ValueError:
            continue
        anchor = PagedAnchor(kind, device=device, **kw)
        reqs, slots = [], []
        for _ in range(min(walk_steps, steps - done)):
            call, args = _call(rng, spec, reqs, slots)
            pre = copy.deepcopy(spec)
            r_s, r_a = _apply(spec, anchor, call, args, reqs, slots)
            done += 1
            ops[f"{kind}.{call}"] += 1
            obs_s, obs_a = observe_spec(spec.arena), observe_anchor(anchor)
            views_s, views_a = spec_views(spec), anchor.views()
            bad = anchor.violations()
            if not bad and r_s == r_a and obs_s == obs_a and views_s == views_a:
                _track(call, args, r_s, reqs, slots)
                continue
            lookup = "alloc" if call == "extend" and args["new"] else call
            classes = [] if bad else classify_call(pre, lookup, r_s, r_a, obs_s, obs_a, views_s, views_a, spec, anchor)
            if not classes:
                unclassified.append(
                    {
                        "kind": kind,
                        "config": kw,
                        "call": [call, args],
                        "spec": r_s,
                        "anchor": r_a,
                        "violations": bad[:3],
                    }
                )
                break
            by_class.update(classes)
            adopt_anchor_state(spec.arena, anchor)
            _track(call, args, r_a, reqs, slots)
    return {
        "steps": done,
        "operations": dict(ops),
        "by_class": dict(by_class),
        "unclassified": len(unclassified),
        "unclassified_cases": unclassified[:5],
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m kvarena.anchor.gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("kvarena.anchor.gpu: no CUDA device; the anchor's Triton paths were not checked", file=sys.stderr)
        return 2
    report = run(args.steps, args.seed)
    print(json.dumps(report, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if report["unclassified"] else 0


if __name__ == "__main__":
    sys.exit(main())
