"""Obligations: a name, a statement, a z3 time limit, hypotheses and a goal.

``run_obligation`` asks z3 whether ``hypotheses and not goal`` is
satisfiable:

- ``unsat``   -> ``proved``;
- ``sat``     -> ``counterexample`` (the model, as concrete values);
- otherwise   -> ``unknown`` (a spent budget included), which counts as failure.

Budgets are counted in z3's own resource units (``rlimit``), not in
seconds, so that a verdict depends on nothing but the query: not on the
machine's speed, nor its load, nor what else ran in the process.  An
obligation's ``timeout_s`` buys ``timeout_s * UNITS_PER_S`` units; a clock
of ``WALL_GUARD`` times as many seconds only stops a runaway.  Run each
obligation in a fresh process (``kvarena prove`` does): z3's search also
depends on the terms a process built before, and a process forked from
one that built others searched differently (composite.hybrid.joint_tight
went from 3 million units to past its budget).

Every obligation also gets a **vacuity check**: its hypotheses (and each
listed witness set, e.g. each variant of an operation) must be satisfiable,
or the proof would be empty.  A *refutation* obligation (``expect =
"counterexample"``) states a property we claim is false; it passes when z3
finds the counterexample, which is a documented finding.

Every obligation also gets a cheap **tautology check** (a short budget,
``TAUTOLOGY_S`` by default): is its goal, or any top-level conjunct of it,
valid with *no* hypotheses at all?  A goal that is valid alone proves
nothing about the state (docs/design.md §7: a telescoping sum is not
conservation).  The result is reported as ``tautology``:

- ``"none"``      neither the goal nor any conjunct is valid alone;
- ``"conjuncts"`` some top-level conjuncts are valid alone (listed, at most
  a few, in ``tautological_conjuncts``): facts that hold by construction,
  e.g. ``max_(x, m) >= m``;
- ``"goal"``      the whole goal is valid alone (for a case split: every
  case's goal is; a single case's goal valid alone counts as a conjunct);
- ``"unknown"``   the budget ran out before every query was decided;
- ``"n/a"``       a refutation, or an encoding error.

``Obligation.tautology`` says what is allowed: ``"conjuncts"`` (the
default: a conjunct may hold by construction, the goal may not), ``"none"``
(no conjunct either: the invariants, each of whose conjuncts must be able to
fail) or ``"any"`` (a lemma of arithmetic, valid by design).  A verdict
beyond what is allowed fails the obligation; ``unknown`` never does.

A verdict can come from the **proof cache** (``proofs.cache``): it is
keyed by the SMT-LIB text of every query above as the solver receives it
(``query_texts``), the z3 version, the budget and this module's source,
so a changed formula never meets an old verdict (``cache_key``).  The
key is computed in a process of its own (``cache_lookup``), so the
process that proves builds exactly what it builds with no cache.
"""

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import z3


@dataclass
class Built:
    """``hyps`` and, when ``cases`` is given, one of the cases, imply ``goal``.

    Each case (e.g. one variant of an operation) is proved on its own, which
    z3 finds much easier than one disjunction; each case must also be
    satisfiable with ``hyps`` (vacuity), as must every ``witnesses`` set.
    """

    hyps: list
    goal: object
    cases: list | None = None
    witnesses: list = field(default_factory=list)
    hints: list = field(default_factory=list)  # extra constraints that only speed up model search
    case_goals: list | None = None  # optional: a goal per case instead of ``goal``
    lemmas: object = False  # add ``arith_lemmas`` to each proof query: True, or "floor" (no ceiling instances)


@dataclass
class Obligation:
    name: str
    group: str
    statement: str
    build: Callable[[], Built]
    timeout_s: float = 20.0
    expect: str = "proved"  # or "counterexample" for a refutation (a finding)
    tautology: str = "conjuncts"  # what may be valid with no hypotheses: "none" | "conjuncts" | "any"
    kind: str = "property"  # see KINDS
    source: str = "spec"  # see SOURCES

    @property
    def lemma(self):
        return self.kind == "lemma"


KINDS = {
    "property": "a fact about the arena, proved from its invariants and the operation's precondition",
    "lemma": "valid by construction or by arithmetic alone (its goal holds with no hypotheses): a tool, "
    "not a property of the arena",
    "finding": "refuted on purpose: the counterexample is a documented finding about the spec",
    "demo": "refuted on purpose: a bug class of the anchor, encoded as the anchor computed it, not the spec",
}
SOURCES = {
    "spec": "every state, view and transition the goal speaks of is the spec's own code (spec.arith, "
    "spec.chain, spec.transitions, spec.bands, spec.planner, spec.policy, spec.geometry), run on z3 terms",
    "anchor": "a bug-class demo: the goal is the anchor's formula, encoded as the anchor computed it (the spec "
    "computes it differently), refuted on purpose",
}


REGISTRY: dict[str, Obligation] = {}
TAUTOLOGY_S = 2.0  # seconds per obligation for the tautology check, all its queries together
# z3 resource units per second of a limit.  This project's queries spend 0.2 to 10 million units a
# second on the 2-core reference machine (median 0.7 million), and each obligation's limit leaves a
# margin of at least four times what it spends (kvarena prove prints both).
UNITS_PER_S = 1_000_000
WALL_GUARD = 5.0  # the clock stops a query after this many times its limit, in seconds
_TAUT_ALLOWED = {"none": ("none",), "conjuncts": ("none", "conjuncts"), "any": ("none", "conjuncts", "goal")}


def add(
    name, group, statement, build, timeout_s=20.0, expect="proved", tautology="conjuncts", kind=None, source="spec"
):
    """Register an obligation.  ``kind`` defaults to "finding" for a
    refutation and "property" otherwise; a lemma is declared (and may have
    a goal valid alone: ``tautology="any"``), and nothing else may."""
    if name in REGISTRY:
        raise ValueError(f"obligation {name!r} registered twice")
    if tautology not in _TAUT_ALLOWED:
        raise ValueError(f"obligation {name!r}: tautology must be one of {tuple(_TAUT_ALLOWED)}")
    kind = kind or ("finding" if expect == "counterexample" else "property")
    if kind not in KINDS or source not in SOURCES:
        raise ValueError(f"obligation {name!r}: kind must be one of {tuple(KINDS)}, source one of {tuple(SOURCES)}")
    if (kind in ("finding", "demo")) != (expect == "counterexample"):
        raise ValueError(f"obligation {name!r}: a refutation is a finding or a demo, and only a refutation is")
    if (kind == "demo") != (source == "anchor"):
        raise ValueError(f"obligation {name!r}: a bug-class demo encodes the anchor's formula, and only a demo does")
    if (tautology == "any") != (kind == "lemma"):
        raise ValueError(f"obligation {name!r}: a goal that may hold with no hypotheses is a lemma, and a lemma's may")
    REGISTRY[name] = Obligation(name, group, statement, build, timeout_s, expect, tautology, kind, source)


class Fresh:
    """Fresh z3 constants with readable, unique names."""

    def __init__(self, prefix=""):
        self.prefix, self.k = prefix, 0

    def int(self, name):
        return z3.Int(f"{self.prefix}{name}")

    def bool(self, name):
        return z3.Bool(f"{self.prefix}{name}")


def _as_bool(x):
    if isinstance(x, bool):
        return z3.BoolVal(x)
    return x


def _model_dict(model, limit=120):
    out = {}
    for d in sorted(model.decls(), key=lambda d: d.name()):
        if d.arity() != 0:
            continue
        v = model[d]
        try:
            out[d.name()] = v.as_long() if z3.is_int_value(v) else (z3.is_true(v) if z3.is_bool(v) else str(v))
        except Exception:  # pragma: no cover - defensive
            out[d.name()] = str(v)
        if len(out) >= limit:
            break
    return out


def _subterms(exprs):
    seen, out, stack = set(), [], [_as_bool(e) for e in exprs]
    while stack:
        e = stack.pop()
        if e.get_id() not in seen:
            seen.add(e.get_id())
            out.append(e)
            stack.extend(e.children())
    return out


def arith_lemmas(exprs, ceiling=True):
    """Instances of three facts of integer arithmetic, for the terms of ``exprs``.

    Byte positions are ``pages * epp`` with a symbolic ``epp``, which makes
    the queries nonlinear; z3 then times out on facts any reader takes for
    granted.  For every divisor ``b`` of an integer division ``q = n / b``
    in the query and every term ``x`` multiplied by ``b``, add, each guarded
    by ``b > 0`` (so every instance is valid and the proof stays sound):

    - division bounds: ``q*b <= n < q*b + b``;
    - Galois connection: ``x <= q  <=>  x*b <= n`` and ``q <= x  <=>  n < x*b + b``,
      and the same for the ceiling ``-q`` of ``-n / b`` (the shim's ``cdiv``);
    - monotonicity: ``x <= y  <=>  x*b <= y*b`` for two such terms, and
      ``n1 <= n2  =>  n1/b <= n2/b`` for two divisions by ``b``.

    Only the proof query gets them: the vacuity and tautology checks see the
    obligation as stated.  ``ceiling=False`` leaves out the ceiling's
    connection: more instances are not always faster, and the completeness
    obligations need only the floor's.
    """
    terms = _subterms(exprs)
    by_factor = {}  # divisor/epp id -> (term, {id: multiplicand})
    for t in terms:
        if z3.is_mul(t) and t.num_args() == 2:
            a, b = t.children()
            for x, y in ((a, b), (b, a)):
                if z3.is_const(y) and not z3.is_int_value(y):
                    by_factor.setdefault(y.get_id(), (y, {}))[1][x.get_id()] = x
    out = []
    for t in terms:
        if z3.is_app_of(t, z3.Z3_OP_IDIV):
            n, b = t.children()
            facts = [t * b <= n, n < t * b + b]
            for x in by_factor.get(b.get_id(), (b, {}))[1].values():
                facts += [(x <= t) == (x * b <= n), (t <= x) == (n < x * b + b)]
                if ceiling:  # the shim's ceiling division is -((-a) / b): its connection too
                    facts += [(-t <= x) == (-n <= x * b), (x <= -t) == (x * b < b - n)]
            out.append(z3.Implies(b > 0, z3.And(*facts)))
    divs = {}  # divisor id -> (divisor, [division terms])
    for t in terms:
        if z3.is_app_of(t, z3.Z3_OP_IDIV):
            divs.setdefault(t.arg(1).get_id(), (t.arg(1), []))[1].append(t)
    for b, ts in divs.values():
        facts = [z3.Implies(t1.arg(0) <= t2.arg(0), t1 <= t2) for t1 in ts for t2 in ts if t1 is not t2]
        if facts:
            out.append(z3.Implies(b > 0, z3.And(*facts)))
    for b, xs in by_factor.values():
        xs = list(xs.values())
        facts = [(x1 <= x2) == (x1 * b <= x2 * b) for i, x1 in enumerate(xs) for x2 in xs[i + 1 :]]
        facts += [(x2 <= x1) == (x2 * b <= x1 * b) for i, x1 in enumerate(xs) for x2 in xs[i + 1 :]]
        if facts:
            out.append(z3.Implies(b > 0, z3.And(*facts)))
    return out


def _solver():
    return z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()


class Budget:
    """What a group of queries may spend: ``seconds * UNITS_PER_S`` z3
    resource units, and a wall-clock guard of ``WALL_GUARD`` times the
    seconds."""

    def __init__(self, seconds):
        self.units = int(seconds * UNITS_PER_S)
        self.spent = 0
        self.deadline = time.perf_counter() + seconds * WALL_GUARD

    def left(self, share=1.0):
        """Units for the next query: ``share`` of what is left, at least a twentieth of a second's."""
        return max(UNITS_PER_S // 20, int((self.units - self.spent) * share))


def _units(solver):
    """z3's resource count so far, in this process (a solver reports the context's)."""
    try:
        return solver.statistics().get_key_value("rlimit count")
    except z3.Z3Exception:  # absent while it is 0
        return 0


def _check(constraints, budget, share=1.0):
    s = _solver()
    s.set("rlimit", budget.left(share))
    s.set("timeout", max(50, int((budget.deadline - time.perf_counter()) * 1000)))
    s.add(*[_as_bool(c) for c in constraints])
    before = _units(s)
    r = s.check()
    budget.spent += _units(s) - before
    return r, (s.model() if r == z3.sat else None), s.reason_unknown() if r == z3.unknown else ""


def conjuncts(goal):
    """The top-level conjuncts of ``goal`` (nested ``And`` flattened)."""
    g = _as_bool(goal)
    if z3.is_and(g):
        return [c for a in g.children() for c in conjuncts(a)]
    return [g]


def tautology_check(goals, budget_s=TAUTOLOGY_S):
    """Which of ``goals`` (one per case), and which of their top-level
    conjuncts, are valid with no hypotheses.

    Returns ``(verdict, examples)``: ``verdict`` as in the module docstring,
    ``examples`` a few of the valid goals or conjuncts, as text.  All the
    queries share ``budget_s``; one still open when it runs out makes the
    verdict ``unknown`` (unless something valid was already found).
    """
    budget = Budget(budget_s)
    seen, valid_conj, decided = set(), [], True
    whole = []  # per distinct goal: valid alone?

    def valid(e):
        nonlocal decided
        if budget.spent >= budget.units:
            decided = False
            return False
        r, _, _ = _check([z3.Not(e)], budget)
        if r == z3.unknown:
            decided = False
        return r == z3.unsat

    for goal in goals:
        g = _as_bool(goal)
        key = g.sexpr()
        if key in seen:
            continue
        seen.add(key)
        whole.append(valid(g))
        if whole[-1]:
            valid_conj.append(g)
            continue
        cs = conjuncts(g)
        if len(cs) < 2:
            continue
        for c in cs:
            ck = c.sexpr()
            if ck in seen:
                continue
            seen.add(ck)
            if valid(c):
                valid_conj.append(c)
    if whole and all(whole):
        verdict = "goal"
    elif valid_conj:
        verdict = "conjuncts"
    else:
        verdict = "none" if decided else "unknown"
    examples = [" ".join(str(c).split())[:80] for c in valid_conj[:3]]
    return verdict, examples


def smt2(constraints):
    """The SMT-LIB text z3 prints for a query of ``constraints``."""
    s = z3.Solver()
    s.add(*[_as_bool(c) for c in constraints])
    return s.to_smt2()


def split(built):
    """``(hyps, cases, goals)``: the hypotheses, each case as a list, and each case's goal."""
    cases = [list(c) if isinstance(c, (list, tuple)) else [c] for c in (built.cases or [[]])]
    return list(built.hyps), cases, built.case_goals or [built.goal] * len(cases)


def proof_queries(built):
    """Each case's proof query as the solver receives it: the hypotheses,
    the case, the negated goal and, when ``built`` asks for them, the
    arithmetic lemmas."""
    hyps, cases, goals = split(built)
    queries = []
    for case, goal in zip(cases, goals):
        query = hyps + case + [z3.Not(_as_bool(goal))]
        if built.lemmas:
            query += arith_lemmas(query, ceiling=built.lemmas is True)
        queries.append(query)
    return queries


def _vacuity_sets(built, cases):
    """The distinct extra sets the vacuity check pairs with the hypotheses: each case, then each witness set."""
    distinct = []
    for extra in cases + list(built.witnesses):
        if not any(extra is d or (not extra and not d) for d in distinct):
            distinct.append(extra)
    return distinct


def query_texts(built, queries):
    """The SMT-LIB text of every query ``run_obligation`` may send for
    ``built``: each proof query (and with its hints), each vacuity query
    (and with its hints), and each goal the tautology check negates (its
    conjunct queries are parts of that goal)."""
    hyps, cases, goals = split(built)
    hints = list(built.hints)
    texts = []
    for q in queries:
        texts += [smt2(q)] + ([smt2(q + hints)] if hints else [])
    for extra in _vacuity_sets(built, cases):
        texts += [smt2(hyps + list(extra))] + ([smt2(hyps + list(extra) + hints)] if hints else [])
    texts += [smt2([z3.Not(_as_bool(g))]) for g in goals]
    return texts


@functools.cache
def _procedure():
    """This module's source: how each query is checked (tactics, hint order, lemmas, budgets)."""
    return Path(__file__).read_text()


def key_text(ob, tautology_s):
    """The budget part of a cache key: what the obligation may spend."""
    return (
        f"timeout_s={ob.timeout_s!r} units_per_s={UNITS_PER_S} wall_guard={WALL_GUARD} "
        f"tautology_s={tautology_s!r} z3={z3.get_full_version()}"
    )


def cache_key(ob, built, queries, tautology_s=TAUTOLOGY_S):
    """The proof cache's key for ``ob`` as ``built`` (``proofs.cache``): the
    format, the budget and z3 version, this module's source, the
    obligation's name and rules, and the SMT-LIB text of every query."""
    from . import cache as proof_cache

    return proof_cache.digest(
        proof_cache.FORMAT,
        key_text(ob, tautology_s),
        _procedure(),
        ob.name,
        ob.expect,
        ob.tautology,
        *query_texts(built, queries),
    )


def passes(ob, res):
    """Whether a result row (or a cached verdict) passes ``ob`` as it is stated now."""
    taut = res.get("tautology")
    taut_ok = taut in ("unknown", "n/a") or taut in _TAUT_ALLOWED[ob.tautology]
    return res.get("result") == ob.expect and res.get("vacuity") == "sat" and taut_ok


def cache_lookup(ob, store, tautology_s=None):
    """``(key, row, warning)``: ``ob``'s cache key, its trusted verdict in
    ``store`` (or None) and why an entry found was not trusted (or None).

    It builds the obligation and prints its queries, and z3's search
    depends on the terms a process built before (the module docstring), so
    run it in a process of its own (``cache.in_child``), never in the one
    that then proves: a verdict must not depend on whether a cache was asked."""
    from . import cache as proof_cache

    built = ob.build()
    key = cache_key(ob, built, proof_queries(built), TAUTOLOGY_S if tautology_s is None else tautology_s)
    row, warning = proof_cache.load(store, key, ob.name, lambda r: passes(ob, r))
    return key, row, warning


def describe(ob):
    """The fields of a result row that describe ``ob`` itself, not a verdict."""
    return {
        "name": ob.name,
        "group": ob.group,
        "kind": "z3",
        "statement": ob.statement,
        "limit_s": ob.timeout_s,
        "expect": ob.expect,
        "obligation_kind": ob.kind,
        "source": ob.source,
    }


def run_obligation(ob, tautology_s=None):
    """Run one obligation; returns a JSON-able result dict."""
    t0 = time.perf_counter()
    res = describe(ob)
    try:
        built = ob.build()
        hyps = list(built.hyps)
        cases = [list(c) if isinstance(c, (list, tuple)) else [c] for c in (built.cases or [[]])]
        budget = Budget(ob.timeout_s)
        res["result"] = "proved"
        goals = built.case_goals or [built.goal] * len(cases)
        for case, goal in zip(cases, goals):
            query = hyps + case + [z3.Not(_as_bool(goal))]
            if built.lemmas:
                query += arith_lemmas(query, ceiling=built.lemmas is True)
            r = z3.unknown
            if ob.expect == "counterexample" and built.hints:
                # a refutation: look for the counterexample on the hinted layout first
                r, model, why = _check(query + list(built.hints), budget, share=0.5)
                if r != z3.sat:
                    r = z3.unknown
            if r == z3.unknown:
                r, model, why = _check(query, budget)
            if r == z3.unknown and built.hints:
                # a model found under the hints is a genuine counterexample
                r2, model2, _ = _check(query + list(built.hints), budget)
                if r2 == z3.sat:
                    r, model = r2, model2
            if r == z3.sat:
                res["result"] = "counterexample"
                res["counterexample"] = _model_dict(model)
                break
            if r != z3.unsat:
                res["result"] = "unknown"
                res["reason"] = why or "budget spent"
                break
        res["units"], res["limit_units"] = budget.spent, budget.units
        # vacuity: the hypotheses with each case, and every witness set, are satisfiable
        vac = "sat"
        vacuity_s = max(1.0, ob.timeout_s / 2)  # for each set
        distinct = []
        for extra in cases + list(built.witnesses):
            if not any(extra is d or (not extra and not d) for d in distinct):
                distinct.append(extra)
        for extra in distinct:
            # A model under extra hint constraints (a concrete layout, say) is
            # a model of the hypotheses too; only fall back to none if needed.
            vr = None
            for hint in ([list(built.hints)] if built.hints else []) + [[]]:
                vr, _, _ = _check(hyps + list(extra) + hint, Budget(vacuity_s))
                if vr == z3.sat:
                    break
            if vr != z3.sat:
                vac = "unsat" if vr == z3.unsat else "unknown"
                break
        res["vacuity"] = vac
        # tautology: does a goal (or a conjunct of one) hold with no hypotheses at all?
        if ob.expect == "counterexample":
            res["tautology"] = "n/a"
        else:
            verdict, examples = tautology_check(goals, TAUTOLOGY_S if tautology_s is None else tautology_s)
            res["tautology"] = verdict
            if examples:
                res["tautological_conjuncts"] = examples
        res["cases"] = len(cases)
        res["witnesses"] = len(cases) + len(built.witnesses)
    except Exception as e:  # an encoding error is a failure, not a crash
        res["result"] = "error"
        res["reason"] = f"{type(e).__name__}: {e}"
        res["vacuity"] = "n/a"
        res["tautology"] = "n/a"
    res["time_s"] = round(time.perf_counter() - t0, 3)
    res["ok"] = passes(ob, res)
    return res
