"""The eviction callback a scheduler hands to ``relieve``, and its contract.

docs/design.md §4 (relieve, its rung 3) and docs/design.md §9c (a callback
that raises, or returns no count).

``evict(shortfall)`` is asked, at most ``MAX_EVICT_ROUNDS`` times, to free
about ``shortfall`` units (pages for ``Arena.relieve``, tokens for a
composite's) and returns how many it freed.  What the ladder accepts:

- the return is a count: an int >= 0, or anything an int can be read from
  exactly (``operator.index``: a numpy int, a one-element integer tensor);
  0 ends the rounds;
- anything else (a negative count, a float, a bool, None, a string) is a
  ``ValueError`` naming the call, raised after the round that returned it:
  the arena is as that round left it, and consistent;
- an exception from ``evict`` is the caller's: it propagates, and the arena
  is as the callback left it, and consistent;
- the callback may call the arena back (free, allocate, relieve, any view)
  and free pages of any pool: the ladder holds nothing across the call and
  reads every view afresh after it; the count only says whether to go on
  (a count that overstates what was freed buys a round, no more).

The verdict is always read from the state after the last step.
"""

import operator
from collections.abc import Callable

MAX_EVICT_ROUNDS = 4  # how often one relieve may call evict

Evictor = Callable[[int], int]


def evicted(result: object, where: str) -> int:
    """The count an evictor returned, checked: an int >= 0 or a ``ValueError`` naming ``where``.

    The ladder reads the count only to decide whether to go on
    (docs/design.md §4, relieve); a count it cannot read is a fault of the
    callback, reported by name (docs/design.md §9c).

    Args:
        result: what ``evict(shortfall)`` returned.
        where: the call to name in the error, e.g. ``"pool 'full': relieve"``.

    Returns:
        The count, as an int >= 0; 0 ends the rounds.

    Raises:
        TypeError: never escapes: a bool is refused as a count through it,
            and it is caught at once and turned into the ``ValueError``.
        ValueError: ``result`` is not a count: negative, a float, a bool,
            None, a string, or anything ``operator.index`` refuses.
    """
    try:
        if isinstance(result, bool):  # an int to Python, but no count
            raise TypeError
        n = operator.index(result)  # type: ignore[arg-type]
    except TypeError:
        n = -1
    if n < 0:
        raise ValueError(f"{where}: evict must return the count it freed, an int >= 0; it returned {result!r}")
    return n
