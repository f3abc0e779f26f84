"""The non-urgent flush's plan with a forward in flight (docs/design.md §12), for CrossHair.

``moves.guarded_flush_plan`` is list code (sets, sorting, a walk that stops
early), which z3 does not run; CrossHair does.  ``walk`` lays out a lazy
END from a symbolic description, one kind per page of its span, and calls
the spec's plan on it as ``Arena.flush(urgent=False)`` does;
``non_urgent_walk``'s asserts say what the arena relies on, each stated on
the band and not on the plan's text:

- no source is pinned and no destination guarded (the plan's own
  contract), and ``forward.move_clear`` holds on the band's guard tables,
  so the arena's assertion never fires;
- the plan is a move ``bands.move_ok`` accepts whose destinations are holes
  (``inflight.move.kK``'s hypothesis: it proves such a move keeps every
  write landing and every read intact) and whose sources lie beyond the
  packed edge and destinations inside it;
- the walk stops at the first pinned survivor from the frontier (no source
  lies deeper than a pin) and is otherwise as long as the unguarded holes
  and the cap allow;
- with nothing pinned or guarded it is ``moves.flush_plan``.

``kvarena prove`` runs ``non_urgent_walk`` (``crosshair_runs.CHECK_MODULES``,
analysis kind ``asserts``); the planted ``inflight-walk-moves-a-pin`` is
refuted there.
"""

from typing import NamedTuple

from kvarena.spec import forward, moves
from kvarena.spec.bands import move_ok

LIVE, PINNED, HOLE, PENDING, FREED = range(5)  # a page's kind: live; live and pinned; a hole; pending; pinned FREED


class Walk(NamedTuple):
    """A lazy END's band and the plan the non-urgent flush makes for it."""

    up: bool
    live: list[int]  # ascending
    holes: list[int]  # in hole order
    edge: int  # where the packed band would end
    pinned: list[int]  # live pages pinned with their id
    pending: list[int]  # holes a move vacated
    freed: list[int]  # holes pinned FREED
    dst: list[int]
    src: list[int]

    @property
    def guarded(self) -> list[int]:
        """The guarded holes: pending or pinned ``FREED``."""
        return self.pending + self.freed


def plan_for(up: bool, live, holes, edge, pinned, pending, freed, max_moves: int) -> Walk:
    """``moves.guarded_flush_plan`` on a band, called as ``Arena.flush(urgent=False)``
    calls it (``max_moves`` ``-1``: no cap)."""
    cap = None if max_moves < 0 else max_moves
    dst, src = moves.guarded_flush_plan("up" if up else "down", live, holes, edge, cap, pinned, pending + freed)
    return Walk(up, live, holes, edge, pinned, pending, freed, dst, src)


def walk(up: bool, kinds: list[int], max_moves: int) -> Walk:
    """A lazy END whose span is pages ``1 .. len(kinds)`` (page ``p`` of kind
    ``kinds[p - 1]``), and its plan (``plan_for``).

    Holes are listed in page order, newest first when ``up`` (the plan must
    not depend on the order).
    """
    pages = list(range(1, len(kinds) + 1))
    live = [p for p, k in zip(pages, kinds) if k in (LIVE, PINNED)]
    holes = [p for p, k in zip(pages, kinds) if k not in (LIVE, PINNED)]
    holes = holes[::-1] if up else holes
    edge = 1 + len(live) if up else len(kinds) + 1 - len(live)
    pinned = [p for p, k in zip(pages, kinds) if k == PINNED]
    pending = [p for p, k in zip(pages, kinds) if k == PENDING]
    freed = [p for p, k in zip(pages, kinds) if k == FREED]
    return plan_for(up, live, holes, edge, pinned, pending, freed, max_moves)


def non_urgent_walk(up: bool, kinds: list[int], max_moves: int) -> None:
    """The claims, for ``crosshair check --analysis_kind=asserts``: the
    leading asserts are the preconditions (a band of at most 8 pages, a cap
    or none), each later one a claim CrossHair tries to break.

    Asserts, not PEP 316 lines: CrossHair may assume a contracted callee's
    postconditions instead of running it, and ``guarded_flush_plan``
    carries its own, so a PEP 316 harness cannot see a bug its contract
    denies (the planted walk past a pin went unreported that way).
    """
    assert len(kinds) <= 8
    assert all(LIVE <= k <= FREED for k in kinds)
    assert max_moves >= -1
    w = walk(up, kinds, max_moves)
    assert not set(w.src) & set(w.pinned), "a pinned page moves: the forward's late write is lost"
    assert not set(w.dst) & set(w.guarded), "a guarded hole is written: a read is corrupted or a write lost"
    assert clear(w), "forward.move_clear refuses the plan: the arena's assertion fires"
    assert packs(w, max_moves), "not a packing move into holes"
    assert stops_at_pins(w), "a source deeper than a pin"
    assert as_long_as_allowed(w, max_moves), "the walk stops short"
    assert w.pinned or w.guarded or plan(w) == flush(w, max_moves), "not the flush with nothing in flight"


def plan(w: Walk) -> tuple[list[int], list[int]]:
    """The plan ``(dst, src)``."""
    return w.dst, w.src


def flush(w: Walk, max_moves: int) -> tuple[list[int], list[int]]:
    """``moves.flush_plan`` on the same band: the flush with nothing in flight."""
    return moves.flush_plan("up" if w.up else "down", w.live, w.holes, w.edge, None if max_moves < 0 else max_moves)


def tables(w: Walk) -> tuple[list[int], list[int], list[int]]:
    """The band's ``p2v``, ``pinned`` and ``pending`` tables (live page ``p`` holds id ``p``)."""
    n = max(w.live + w.holes + [w.edge, 0]) + 1
    p2v, pinned, pending = [-1] * n, [-1] * n, [-1] * n
    for p in w.live:
        p2v[p] = p
    for p in w.pinned:
        pinned[p] = p
    for p in w.freed:
        pinned[p] = forward.FREED
    for p in w.pending:
        pending[p] = p
    return p2v, pinned, pending


def clear(w: Walk) -> bool:
    """``forward.move_clear`` holds: the arena's assertion does not fire."""
    _, pinned, pending = tables(w)
    return bool(forward.move_clear(pinned, pending, w.dst, w.src))


def packs(w: Walk, max_moves: int) -> bool:
    """A move ``bands.move_ok`` accepts, paired in ascending order, within the
    cap, from beyond the packed edge into holes inside it."""
    p2v, _, _ = tables(w)
    beyond = [p >= w.edge if w.up else p < w.edge for p in w.src]
    inside = [p < w.edge if w.up else p >= w.edge for p in w.dst]
    return (
        len(w.dst) == len(w.src)
        and w.dst == sorted(w.dst)
        and w.src == sorted(w.src)
        and move_ok(p2v, w.dst, w.src)
        and all(p2v[d] < 0 for d in w.dst)
        and all(beyond)
        and all(inside)
        and (max_moves < 0 or len(w.src) <= max_moves)
    )


def stops_at_pins(w: Walk) -> bool:
    """No source lies deeper than a pinned survivor beyond the edge."""
    if w.up:
        return all(s > p for s in w.src for p in w.pinned if p >= w.edge)
    return all(s < p for s in w.src for p in w.pinned if p < w.edge)


def as_long_as_allowed(w: Walk, max_moves: int) -> bool:
    """The walk moves every survivor nearer the frontier than the first pin,
    unless the unguarded holes inside the edge or the cap run out first."""
    beyond = [p for p in w.live if (p >= w.edge if w.up else p < w.edge)]
    pins = [p for p in beyond if p in w.pinned]
    if w.up:
        movable = [p for p in beyond if not pins or p > max(pins)]
    else:
        movable = [p for p in beyond if not pins or p < min(pins)]
    free = [h for h in w.holes if (h < w.edge if w.up else h >= w.edge) and h not in w.guarded]
    most = min(len(movable), len(free))
    return len(w.src) == (most if max_moves < 0 else min(most, max_moves))
