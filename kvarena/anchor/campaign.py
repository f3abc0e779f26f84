"""``kvarena conform``: the differential campaign against the anchor.

Seeded random walks (``walk.py``) drive a ``kvarena.spec.Arena`` and an
``AnchorArena`` with the same calls.  After every step both results and
both observations are compared, and the anchor's own accounting check
(``_chain_byte_accounting_violations``) must stay empty.  A difference is
classified (``classify.py``); after one the walk adopts the anchor's state
when the spec accepts it (``verify()``) and goes on, else it ends.  An
unclassified difference ends its walk and fails the campaign.

Each class keeps its first case: the configuration and the calls from
boot, shrunk by dropping earlier calls while the last one still shows the
same class.  ``replay(case)`` runs one.
"""

import copy
import random
import time
from collections import Counter, defaultdict

from kvarena.spec import AccountingError

from .adapter import AnchorArena
from .classify import CLASSES, Step, classify
from .observe import adopt_anchor_state, observe_anchor, observe_spec
from .walk import build_spec, config_from_json, config_json, random_config, random_op, run_op

WALK_STEPS = 60


def boot(config):
    spec = build_spec(config)
    anchor = AnchorArena(config["total_bytes"], config["pools"], set(config["lazy"]), config["borrow"])
    return spec, anchor


def step(spec, anchor, op, args):
    """Run one call on both sides; ``(classes, detail)``: ``None`` when they
    agree, ``[]`` for an unclassified difference.  The spec adopts the
    anchor's state after a classified one."""
    pre = copy.deepcopy(spec)
    r_spec = run_op(spec, op, args)
    try:
        r_anchor = run_op(anchor, op, args)
    except Exception as e:  # the anchor asserting is a difference like any other
        return [], {"anchor_raised": f"{type(e).__name__}: {e}"[:300]}
    obs_s, obs_a = observe_spec(spec), observe_anchor(anchor)
    violations = anchor.violations()
    if violations:
        return [], {"anchor_violations": violations[:5]}
    if r_spec == r_anchor and obs_s == obs_a:
        return None, None
    classes = classify(Step(pre, op, args, r_spec, r_anchor, obs_s, obs_a, spec, anchor))
    detail = {
        "spec": r_spec,
        "anchor": r_anchor,
        "fields": sorted({f"{n}.{k}" for n in obs_s for k in obs_s[n] if obs_s[n][k] != obs_a[n].get(k)}),
    }
    if classes:
        try:
            adopt_anchor_state(spec, anchor)
        except AccountingError as e:
            detail["not_adopted"] = str(e)
    return classes, detail


def replay(case):
    """Run a case's calls; the classes of its last step (``None``: no difference)."""
    spec, anchor = boot(config_from_json(case["config"]))
    classes = None
    for op, args in case["ops"]:
        classes, detail = step(spec, anchor, op, args)
        if classes == []:
            return classes, detail, spec, anchor
    return classes, detail, spec, anchor


def shrink(case, cls):
    """Drop earlier calls while the last call still shows ``cls``."""
    ops = list(case["ops"])
    i = len(ops) - 2
    while i >= 0:
        trial = dict(case, ops=ops[:i] + ops[i + 1 :])
        try:
            classes, _, _, _ = replay(trial)
        except (ValueError, AssertionError, KeyError, IndexError):
            classes = None
        if classes and cls in classes:
            ops = trial["ops"]
        i -= 1
    return dict(case, ops=ops)


def run(steps=2000, seed=0, walk_steps=WALK_STEPS, out=print, shrink_cases=True):
    """The campaign; returns the JSON report."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    ops, by_class, by_op = Counter(), Counter(), defaultdict(Counter)
    cases, unclassified, geometries = {}, [], Counter()
    done = walks = steps_after_difference = 0
    while done < steps:
        config = random_config(rng)
        spec, anchor = boot(config)
        walks += 1
        geometries[f"{len(config['pools'])} pools, page size {config['pools'][-1].page_size}"] += 1
        history = []
        for _ in range(min(walk_steps, steps - done)):
            op, args = random_op(rng, spec)
            history.append([op, args])
            classes, detail = step(spec, anchor, op, args)
            done += 1
            ops[op] += 1
            if classes is None:
                continue
            case = {"config": config_json(config), "ops": copy.deepcopy(history), "detail": detail}
            if not classes:
                unclassified.append(case)
                break
            for c in classes:
                by_class[c] += 1
                by_op[c][op] += 1
                if c not in cases or len(history) < len(cases[c]["ops"]):
                    cases[c] = dict(case, **{"class": c})
            if "not_adopted" in detail:
                break
            steps_after_difference += 1
    if shrink_cases:
        cases = {c: shrink(case, c) for c, case in cases.items()}
    by_kind = Counter()
    for c, n in by_class.items():
        by_kind[CLASSES[c][0]] += n
    return {
        **report_head(seed, done, walks, t0, ops),
        "geometries": dict(geometries),
        "differences": differences(by_class, by_op, unclassified, dict(by_kind), CLASSES.__getitem__),
        "cases": cases,
        "unclassified_cases": unclassified[:5],
    }


def report_head(seed, done, walks, t0, ops):
    """The first entries of a campaign's report: what ran, and for how long."""
    return {
        "anchor": "sglang 0.5.23",
        "seed": seed,
        "steps": done,
        "walks": walks,
        "seconds": round(time.perf_counter() - t0, 1),
        "operations": dict(ops),
    }


def differences(by_class, by_op, unclassified, by_kind, class_entry):
    """A report's ``differences``: counts by kind and by class; ``class_entry(name)`` is ``(kind, what)``."""
    return {
        "total": sum(by_class.values()) + len(unclassified),
        "by_kind": by_kind,
        "by_class": {
            c: {"kind": class_entry(c)[0], "count": n, "by_operation": dict(by_op[c]), "what": class_entry(c)[1]}
            for c, n in sorted(by_class.items())
        },
        "unclassified": len(unclassified),
    }
