"""PD disaggregation: the decode node's SWA-tail preallocation (issue 55).

A PD decode node preallocates a transferred request with full slots for
every new position and SWA entries only for the new pages that hold the
window's tail (``spec.composites._WithSWA.alloc_extend_swa_tail``).  How
many pages that is, ``arith.swa_tail_pages(prefix, seq, tail, ps)``, is
arithmetic with a symbolic page size; these obligations run that function
on z3 terms, for every ``ps >= 1``, ``0 <= prefix <= seq`` and ``0 <= tail
<= seq - prefix``:

- ``disagg.tail.within``: ``0 <= m <= P_f``, ``P_f`` the new pages.  So the
  tail's demand is an uneven demand (swa binds the last ``m <= P_f`` of
  full's new ids), which the composites' gate prices: the uneven
  obligations (``composite.hybrid.uneven_sound``/``uneven_tight``,
  ``golden.tripool_empty_float.uneven``, ``views.joint.*.uneven_down_closed``)
  make the views sound and tight for it, and ``alloc_extend_swa_tail`` asks
  that same gate (its contract: ``fits_tail`` => it succeeds);
- ``disagg.tail.covers``: every tail token on a new page lies on one of the
  last ``m`` new pages: no tail token is left without its SWA entry (a
  tail one page short is refuted here);
- ``disagg.tail.exact``: each of the last ``m`` new pages holds a tail
  token: no SWA page is bound that the window does not read (a tail one
  page long is refuted here).

Nothing moves while the hold is on: PD's gate is a second source of the one
hold (``Arena.close_gate(source)``), so ``proofs/hold.py``'s obligations
cover it as they stand; the preallocation itself takes holes and frontiers
only, as every allocation does.

``build_*`` take the function under proof, so a test can hand them a
planted variant and see it refuted (``tests/proofs/test_disagg.py``).
"""

from kvarena.spec import arith

from .core import Built, Fresh, add


def _setup(f):
    ps, prefix, seq, tail = f.int("ps"), f.int("prefix"), f.int("seq"), f.int("tail")
    hyps = [ps >= 1, prefix >= 0, seq >= prefix, tail >= 0, tail <= seq - prefix]
    return ps, prefix, seq, tail, hyps


def build_within(tail_pages=arith.swa_tail_pages):
    def build():
        f = Fresh()
        ps, prefix, seq, tail, hyps = _setup(f)
        m = tail_pages(prefix, seq, tail, ps)
        new = arith.cdiv(seq, ps) - arith.cdiv(prefix, ps)
        return Built(hyps, arith.and_(m >= 0, m <= new), lemmas=True, hints=[ps == 4])

    return build


def build_covers(tail_pages=arith.swa_tail_pages):
    def build():
        f = Fresh()
        ps, prefix, seq, tail, hyps = _setup(f)
        t = f.int("t")  # a tail token on a new page
        hyps += [t >= seq - tail, t < seq, arith.fdiv(t, ps) >= arith.cdiv(prefix, ps)]
        m = tail_pages(prefix, seq, tail, ps)
        return Built(hyps, arith.fdiv(t, ps) >= arith.cdiv(seq, ps) - m, lemmas=True, hints=[ps == 4])

    return build


def build_exact(tail_pages=arith.swa_tail_pages):
    def build():
        f = Fresh()
        ps, prefix, seq, tail, hyps = _setup(f)
        q = f.int("q")  # one of the last m new pages
        m = tail_pages(prefix, seq, tail, ps)
        hyps += [q >= arith.cdiv(seq, ps) - m, q < arith.cdiv(seq, ps)]
        # a new page, and a token of it in [seq - tail, seq)
        goal = arith.and_(q >= arith.cdiv(prefix, ps), q * ps < seq, q * ps + ps > seq - tail)
        return Built(hyps, goal, lemmas=True, hints=[ps == 4])

    return build


add(
    "disagg.tail.within",
    "disagg",
    "PD preallocation: 0 <= swa_tail_pages(prefix, seq, tail, ps) <= the new pages cdiv(seq, ps) - "
    "cdiv(prefix, ps): the tail is an uneven demand the composites' gate prices",
    build_within(),
    timeout_s=20.0,
)
add(
    "disagg.tail.covers",
    "disagg",
    "PD preallocation: every token of the last `tail` on a new page lies on one of the last "
    "swa_tail_pages new pages (no tail token without its SWA entry)",
    build_covers(),
    timeout_s=20.0,
)
add(
    "disagg.tail.exact",
    "disagg",
    "PD preallocation: each of the last swa_tail_pages new pages is a new page holding a token of the "
    "last `tail` (no SWA page bound that the window does not read)",
    build_exact(),
    timeout_s=20.0,
)
