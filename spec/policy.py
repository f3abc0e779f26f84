"""The demand-vector policy: which side of a float to open, and how far.

``short_side_decision`` is a pure function of integers, written over the
shim in ``arith`` so that z3 reasons about this very code.  The arena
gathers the integers (``Arena.open_short_side``) and applies the decision
with ``make_room``.

Inputs, all in bytes except where said:

- ``sides_low``/``sides_high``: what the END pools facing each side of the
  float still need beyond their own lazy holes (the up END faces the low
  side, the down END the high side);
- ``band_low``/``band_high``: the free bytes between the float and its
  opaque neighbours;
- ``float_bytes``: what the float itself needs beyond its holes;
- ``slack``: the largest ``epp`` among the demanded pools, a margin that
  absorbs grid rounding on the far side of a move.

The result is ``(act, side_is_low, target)``: when ``act`` holds, call
``make_room(float, "low" if side_is_low else "high", target)``.
"""

from .arith import ite, max_


def short_side_decision(
    sides_low: int, sides_high: int, band_low: int, band_high: int, float_bytes: int, slack: int
) -> tuple[bool, bool, int]:
    """Decide one float's move for a demand vector (docs/design.md §4, step 7).

    With ``surplus[s] = band[s] - sides[s]`` (step 4), the plain decision:

    ============================  ======  ==========  =========================================
    case                          act     side        target (bytes on that side)
    ============================  ======  ==========  =========================================
    both sides short              no      --          -- (relocation is zero-sum: evict)
    low side short only           if the  low         ``sides_low + max(0, float_bytes -
                                  target                max(0, surplus_high)) + slack``
                                  exceeds
                                  band_low
    high side short only          same    high        the mirror image
    no side short, float short    yes     larger      ``sides[s] + float_bytes + slack``
    (``float_bytes >                      surplus
    max(surplus)``)                       (low wins
                                          ties)
    nobody short                  no      --          --
    ============================  ======  ==========  =========================================

    The code below is that table over the shim's ``ite``, so z3 can read it.

    Args:
        sides_low: what the END facing the low side needs beyond its lazy
            holes, in bytes.
        sides_high: the same for the END facing the high side.
        band_low: free bytes between the float and its low neighbour.
        band_high: free bytes between the float and its high neighbour.
        float_bytes: what the float needs beyond its holes, in bytes.
        slack: the largest ``epp`` among the demanded pools.

    Returns:
        ``(act, side_is_low, target)``: whether to call ``make_room``, on
            which side, and the bytes that side should then hold.

    pre: sides_low >= 0 and sides_high >= 0 and band_low >= 0 and band_high >= 0
    pre: float_bytes >= 0 and slack >= 0
    post: not (__return__[0] and sides_low > band_low and sides_high > band_high)
    post: not __return__[0] or __return__[2] > 0
    """
    surplus_low = band_low - sides_low
    surplus_high = band_high - sides_high
    low_short = surplus_low < 0
    high_short = surplus_high < 0
    both_short = ite(low_short, high_short, False)

    # One side short: open it to its demand, plus whatever of the float's
    # own need the far side cannot cover (the float grows into the short
    # side after it slides), plus slack.
    far_surplus = ite(low_short, surplus_high, surplus_low)
    short_sides = ite(low_short, sides_low, sides_high)
    short_band = ite(low_short, band_low, band_high)
    one_target = short_sides + max_(0, float_bytes - max_(0, far_surplus)) + slack

    # Only the float short: gather the free bytes on the side with the
    # larger surplus (low wins ties) so that one extension fits.
    open_low = surplus_low >= surplus_high
    f_target = ite(open_low, sides_low, sides_high) + float_bytes + slack
    float_short = float_bytes > max_(surplus_low, surplus_high)

    one_short = ite(low_short, True, high_short)
    act = ite(
        both_short,
        False,
        ite(one_short, one_target > short_band, float_short),
    )
    side_is_low = ite(one_short, low_short, open_low)
    target = ite(one_short, one_target, f_target)
    return act, side_is_low, target
