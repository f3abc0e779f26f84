"""The two settings a drop-in allocator is built with: its policy and its
kernels, what each may be and where the kernels are read from.

Neither imports sglang or torch, so ``factories.py`` (which validates
``install``'s arguments) and ``dropin.py`` (which reads them when an
allocator is built) both import this, and neither imports the other.
"""

import os

POLICIES = ("planner", "anchor")
KERNELS_ENV = "KVARENA_KERNELS"  # "torch" or "triton": the composites' kernels (kvarena.impl.kernels.ENV)


def kernels_from_env(value: str | None) -> str | None:
    """The kernels ``KVARENA_KERNELS`` asks for, or None when it is unset or
    empty (the device's default): ``kvarena.impl.kernels.from_env``."""
    from kvarena.impl.kernels import from_env

    return from_env(value)


def kernels_choice(kernels: str | None = None) -> str | None:
    """The kernels an allocator is built with: ``kernels`` when given, else
    what ``KVARENA_KERNELS`` asks for, else None (the device's default)."""
    return kernels if kernels is not None else kernels_from_env(os.environ.get(KERNELS_ENV))
