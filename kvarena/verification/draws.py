"""Pinned Hypothesis runs that draw from their seed alone (``same_draws``).

Used by every derandomized or seeded run: the differential machines, the
seeded rounds of ``kvarena fuzz`` (so ``kvarena verify`` and ``kvarena
planted``), and the spec machine's planted-bug test.
"""

import contextlib


@contextlib.contextmanager
def same_draws(pinned=True):
    """While open, a pinned Hypothesis run draws from its seed alone.

    Hypothesis (6.131 on) draws about one value in twenty from the literals
    of every local module imported so far, so a derandomized run's examples
    depended on what else its process had imported: under pytest-xdist, the
    test files collected beside it.  The differential test's required cases
    were reached or not by the worker's company.  While this is open, no
    local module lends its constants; Hypothesis's own still do.

    Args:
        pinned: whether the run is derandomized or seeded; a run drawing
            fresh examples keeps the constants (they find edge cases).
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # an old Hypothesis: no providers, no constants
        providers = None
    real = getattr(providers, "_get_local_constants", None)
    if not pinned or providers is None or real is None:  # before 6.131 Hypothesis drew no local constants
        yield
        return
    providers.CONSTANTS_CACHE.cache.clear()  # it holds the local constants each draw type allows
    providers._get_local_constants = providers.Constants
    try:
        yield
    finally:
        providers._get_local_constants = real
        providers.CONSTANTS_CACHE.cache.clear()
