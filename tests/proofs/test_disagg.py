"""PD's SWA-tail preallocation in the proofs (``proofs/disagg.py``): the
obligations prove on the spec's own ``arith.swa_tail_pages``; the two
planted tails (one page short, one page long) are refuted by the
obligation that speaks to them; and the function under proof counts what a
brute force over the request's tokens counts (the encoding's fidelity)."""

import pytest

from kvarena.impl import capacity
from kvarena.proofs import cli
from kvarena.proofs import disagg as D
from kvarena.proofs.core import Obligation, run_obligation
from kvarena.spec import arith

REG = cli.registry()
NAMES = ("disagg.tail.within", "disagg.tail.covers", "disagg.tail.exact")


def short(prefix, seq, tail, ps):
    """A tail one page short: it starts a page late."""
    first = arith.max_(arith.cdiv(prefix, ps), arith.fdiv(seq - tail, ps) + 1)
    return arith.ite(tail > 0, arith.max_(0, arith.cdiv(seq, ps) - first), 0)


def long(prefix, seq, tail, ps):
    """A tail one page long: it binds the page before its first token."""
    first = arith.max_(arith.cdiv(prefix, ps), arith.fdiv(seq - tail, ps) - 1)
    return arith.ite(tail > 0, arith.cdiv(seq, ps) - first, 0)


@pytest.mark.parametrize("name", NAMES)
def test_each_obligation_proves_and_is_not_vacuous(name):
    r = run_obligation(REG[name])
    assert r["result"] == "proved" and r["vacuity"] == "sat" and r["tautology"] == "none", r


@pytest.mark.parametrize(
    "planted,refuted_by,proved_by",
    [(short, "covers", ("within", "exact")), (long, "exact", ("within", "covers"))],
    ids=["one-page-short", "one-page-long"],
)
def test_a_planted_tail_is_refuted(planted, refuted_by, proved_by):
    """Each plant breaks exactly the statement about it, with a concrete
    request as the counterexample; the other statements still hold for it."""
    ob = Obligation("plant", "disagg", "", getattr(D, f"build_{refuted_by}")(planted), expect="counterexample")
    r = run_obligation(ob)
    assert r["result"] == "counterexample", r
    cx = r["counterexample"]
    p, s, t, ps = (cx[k] for k in ("prefix", "seq", "tail", "ps"))
    assert planted(p, s, t, ps) != brute(p, s, t, ps)  # the model is a real request the plant gets wrong
    for b in proved_by:
        ob = Obligation("plant", "disagg", "", getattr(D, f"build_{b}")(planted))
        assert run_obligation(ob)["result"] == "proved"


def brute(prefix, seq, tail, ps):
    """The new pages that hold a tail token, counted token by token."""
    new = set(range(-(-prefix // ps), -(-seq // ps)))
    return len(new & {t // ps for t in range(seq - tail, seq)})


def test_the_function_counts_what_the_tokens_say():
    for ps in (1, 2, 3, 4, 16):
        for prefix in range(3 * ps + 2):
            for seq in range(prefix, prefix + 4 * ps + 2):
                for tail in range(seq - prefix + 1):
                    want = brute(prefix, seq, tail, ps)
                    assert arith.swa_tail_pages(prefix, seq, tail, ps) == want, (prefix, seq, tail, ps)
                    assert capacity.swa_tail_pages(prefix, seq, tail, ps) == want, (prefix, seq, tail, ps)


@pytest.mark.parametrize("fn", [arith.swa_tail_pages, capacity.swa_tail_pages], ids=["spec", "impl"])
@pytest.mark.parametrize("args", [(0, 4, 5, 2), (3, 2, 0, 2), (-1, 4, 1, 2), (0, 4, 1, 0), (0, 4, -1, 2)])
def test_outside_the_domain_is_a_value_error(fn, args):
    with pytest.raises(ValueError, match="swa_tail_pages"):
        fn(*args)
