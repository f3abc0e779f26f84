"""The chain planner: kvarena's relief policy (docs/design.md §4b).

The anchor's policy (``policy.short_side_decision``) looks at one float and
its two sides.  The planner makes one decision over the whole chain: where
every float should sit so that a demand vector fits, moving as little as it
can, and nothing when no placement fits.  ``plan_chain`` is a pure
function of integers over the shim in ``arith``, so the arena runs it on
ints and ``kvarena.proofs.planner`` runs the same code on z3 terms.

Vocabulary.  Each float has a **block**: its live pages packed together,
followed by a **room** of ``demand`` free pages on its own grid.  An END
asks for an **extension**: ``ext = max(0, demand - lazy holes)`` pages
beyond its frontier.  A demand vector fits by placement iff the blocks fit,
in chain order and each on its own grid, between the up END's extended
frontier (the **floor**) and the down END's (the **ceiling**).

The decision, in three passes:

1. **Highest placement** (top down).  Pack every block as high as it goes:
   a float's highest block end is the ceiling (or the next block's highest
   start) rounded down onto its grid.  The demand is **feasible** iff every
   highest start is on the grid (``>= min_page``), the floor lies at or
   below the lowest block's highest start, and each demanded pool has the
   virtual ids (``demand <= index_room``; the ENDs' ``ext <= room``):
   bytes cannot fix a shortage of ids.  Any placement that fits has every
   block at or below its highest (induction from the top, rounding down is
   monotone), so this test is exact: no false OOM.
2. **Placement** (bottom up).  Carry ``p``, the bytes taken so far (the
   floor at first).  A float's lowest start is ``lb = max(ceil(p / epp),
   min_page)``.  A float **stays** exactly as it is (holes and all) when
   its span lies in ``[lb, highest end)`` with room for what its holes do
   not cover (``need = max(0, demand - holes)``) below it, or else above
   it; room below is preferred, as it leaves more above.  Otherwise it is
   **repacked** at ``start = clamp(lo, lb, highest start)``, the nearest
   feasible position, its room above its live pages.  A parked float
   (no live page) never moves; a demanded one reserves its room at ``lb``.
   Since ``lb <= highest start`` at every float (the highest placement
   leaves room for everything above it), every block lands in its range.
3. **Order** (``move_order``).  Floats that move up go first, highest
   first, then the rest, lowest first: no repack then writes over a float
   that has not moved yet (``planner.order_safe``).

The demand vector is met when the ENDs bind before the floats (as the
composites do: state and full, then swa): each END grows into its own
extension, and each float then extends into one of its adjacent gaps,
both of which hold its room.  Transparent floats with no demand take no
space and are skipped.
"""

from typing import NamedTuple

from .arith import and_, cdiv, fdiv, ite, max_, min_, not_, or_


class End(NamedTuple):
    """An END's input to the planner (docs/design.md §4b).

    Its frontier facing the floats, in bytes (the up END's high frontier,
    the down END's low one), its ``epp``, the pages it must extend
    (``ext``) and the pages left on its grid (``room``).
    """

    frontier: int
    epp: int
    ext: int
    room: int


class Float(NamedTuple):
    """A float's input to the planner (docs/design.md §4b).

    Its grid, its span ``[lo, hi)`` in pages, its live pages and holes, the
    pages demanded of it, and its ``index_room``.
    """

    epp: int
    min_page: int
    num_pages: int
    lo: int
    hi: int
    live: int
    holes: int
    demand: int
    index_room: int


class Plan(NamedTuple):
    """The planner's decision (docs/design.md §4b).

    ``feasible``; per float, whether it is repacked (``moves``), the page
    its live pages then start at (``starts``; ``lo`` for a float that
    stays), and whether its room is below it (``room_below``: a float that
    stays with its room below; otherwise the room is above).
    """

    feasible: bool
    moves: list[bool]
    starts: list[int]
    room_below: list[bool]


def plan_chain(up: End, floats: list[Float], down: End) -> Plan:
    """Decide where the floats go for a demand vector (module docstring; docs/design.md §4b).

    Args:
        up: the up END.
        floats: the floats, in chain order.
        down: the down END.

    Returns:
        The ``Plan``; when it is not feasible, nothing moves.
    """
    k = len(floats)
    active = [f.live + f.demand > 0 for f in floats]

    # 1. highest placement, top down
    hend: list[int] = [0] * k  # each float's highest block end, all set below
    high: list[int] = [0] * k  # and its highest start
    on_grid: list[bool] = []
    q = down.frontier - down.ext * down.epp  # the ceiling
    for i in reversed(range(k)):
        f = floats[i]
        hend[i] = min_(fdiv(q, f.epp), f.num_pages)
        high[i] = hend[i] - f.live - f.demand
        on_grid.append(or_(not_(active[i]), high[i] >= f.min_page))
        q = ite(active[i], high[i] * f.epp, q)
    floor = up.frontier + up.ext * up.epp
    feasible = and_(
        up.ext <= up.room, down.ext <= down.room, floor <= q, *on_grid, *[f.demand <= f.index_room for f in floats]
    )

    # 2. placement, bottom up
    moves: list[bool] = []
    starts: list[int] = []
    room_below: list[bool] = []
    p = floor
    for i, f in enumerate(floats):
        opaque = f.live > 0
        lb = max_(cdiv(p, f.epp), f.min_page)
        need = max_(0, f.demand - f.holes)
        stay_low = and_(opaque, f.lo - need >= lb, f.hi <= hend[i])
        stay_high = and_(opaque, f.lo >= lb, f.hi + need <= hend[i])
        stays = or_(stay_low, stay_high)
        start = min_(max_(f.lo, lb), high[i])
        move = and_(feasible, opaque, not_(stays))
        end = ite(stay_low, f.hi, ite(stay_high, f.hi + need, ite(opaque, start, lb) + f.live + f.demand))
        p = ite(active[i], end * f.epp, p)
        moves.append(move)
        starts.append(ite(move, start, f.lo))
        room_below.append(stay_low)
    return Plan(feasible, moves, starts, room_below)


def move_rank(floats: list[Float], plan: Plan, i: int) -> int:
    """Float ``i``'s place in the repack order, lower first (docs/design.md §4b).

    Floats moving up (``start > lo``) go from the highest down, then the
    others from the lowest up.  A float moving up can only land on floats
    above it that also move up, which have gone; one moving down only on
    floats below it that have gone too (``planner.order_safe`` proves it
    for two floats).

    Args:
        floats: the floats, in chain order.
        plan: the decision of ``plan_chain``.
        i: the float's index among ``floats``.

    Returns:
        Its rank.
    """
    k = len(floats)
    return ite(plan.starts[i] > floats[i].lo, k - 1 - i, k + i)


def move_order(floats: list[Float], plan: Plan) -> list[int]:
    """The floats to repack, in ``move_rank`` order (ints only; docs/design.md §4b).

    Args:
        floats: the floats, in chain order.
        plan: the decision of ``plan_chain``.

    Returns:
        Indices into ``floats`` of those the plan moves.
    """
    return sorted((i for i in range(len(floats)) if plan.moves[i]), key=lambda i: move_rank(floats, plan, i))
