"""``install()`` / ``uninstall()``: which allocator SGLang's factories build.

SGLang's configurator imports its three factories from
``sglang.srt.mem_cache.unified_memory_pool`` when it builds the pools, and
each factory imports its allocator class from the allocator module when it
runs.  ``install`` replaces the three factories in that module by wrappers
that, for the duration of the call only, put kvarena's class where the
factory looks for SGLang's; nothing else of SGLang changes, and
``uninstall`` puts the original factories back.

Which kernels run the composites' step calls (``"torch"`` or ``"triton"``,
docs/design.md §14): ``install(kernels=...)`` when given; else the
environment variable ``KVARENA_KERNELS`` (``torch`` or ``triton``; another
value is a ``ValueError`` naming it), read when an allocator is built; else
the device's default (Triton on CUDA, torch elsewhere): ``settings.py``.

This module imports neither sglang nor the allocator classes when it loads;
``install`` imports the classes (``allocators.py``), which never import it.
"""

import functools
import logging
import os

from kvarena.anchor.loader import import_sglang

from .settings import POLICIES

ENV = "KVARENA_SGLANG"  # "1" or "planner", or "anchor": the policy; read by the startup hook
POOL_MODULE = "sglang.srt.mem_cache.unified_memory_pool"
FACTORIES = {
    "init_unified_swa_pools": ("sglang.srt.mem_cache.allocator.unified_hybrid_swa", "UnifiedSWATokenToKVPoolAllocator"),
    "init_unified_mamba_pools": ("sglang.srt.mem_cache.allocator.unified_mamba", "UnifiedMambaTokenToKVPoolAllocator"),
    "init_unified_mamba_swa_pools": (
        "sglang.srt.mem_cache.allocator.unified_hybrid_swa",
        "UnifiedMambaSWATokenToKVPoolAllocator",
    ),
}
_ORIGINAL: dict[str, object] = {}  # factory name -> SGLang's function, while installed


def policy_from_env(value: str | None) -> str | None:
    """The policy ``KVARENA_SGLANG`` asks for, or None when it is unset or off."""
    if value is None or value.strip().lower() in ("", "0", "off", "false", "no"):
        return None
    v = value.strip().lower()
    if v in ("1", "on", "true", "yes", "planner"):
        return "planner"
    if v == "anchor":
        return "anchor"
    raise ValueError(f"{ENV}={value!r}: use 1 (the planner), planner or anchor; 0 or unset for SGLang's allocator")


def install(policy: str = "planner", kernels: str | None = None) -> None:
    """From now on SGLang's three factories build kvarena's allocators
    (``policy``: ``"planner"`` or ``"anchor"``; ``kernels``: ``"torch"`` or
    ``"triton"`` for the composites' step calls, None for ``KVARENA_KERNELS``
    or else the device's default).  Installing again changes both."""
    from kvarena.impl.kernels import KERNELS

    from . import allocators

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if kernels is not None and kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {kernels!r}")
    pool_module = import_sglang(POOL_MODULE)
    for name, (module_name, class_name) in FACTORIES.items():
        original = _ORIGINAL.get(name, getattr(pool_module, name))
        members = {"DEFAULT_POLICY": policy, "DEFAULT_KERNELS": kernels, "__module__": __name__}
        ours = type(class_name, (getattr(allocators, class_name),), members)
        setattr(pool_module, name, _building(original, import_sglang(module_name), class_name, ours))
        _ORIGINAL[name] = original


def uninstall() -> None:
    """SGLang's factories build SGLang's allocators again."""
    if not _ORIGINAL:
        return
    pool_module = import_sglang(POOL_MODULE)
    for name, original in _ORIGINAL.items():
        setattr(pool_module, name, original)
    _ORIGINAL.clear()


def installed() -> bool:
    return bool(_ORIGINAL)


def _building(original, module, class_name, ours):
    """``original`` with ``module.class_name`` bound to ``ours`` while it runs."""

    @functools.wraps(original)
    def factory(*args, **kwargs):
        theirs = getattr(module, class_name)
        setattr(module, class_name, ours)
        try:
            return original(*args, **kwargs)
        finally:
            setattr(module, class_name, theirs)

    return factory


def plugin() -> None:
    """SGLang's plugin hook (entry point group ``sglang.srt.plugins``, which
    every scheduler process loads before it builds its pools): installs
    kvarena when ``KVARENA_SGLANG`` asks for it; when ``KVARENA_SGLANG_STATS``
    names a file, records the engine's counters there and puts in the
    planted bug ``KVARENA_SGLANG_PLANT`` names, if any (``engine.py``, the
    A/B runs); else does nothing."""
    install_from_env()
    from . import engine

    engine.plant_from_env()
    if os.environ.get(engine.STATS_ENV):
        engine.record(os.environ[engine.STATS_ENV])


def install_from_env() -> str | None:
    """``install`` with the policy ``KVARENA_SGLANG`` names, if it names one."""
    policy = policy_from_env(os.environ.get(ENV))
    if policy is not None:
        install(policy)
        # a warning, so SGLang's default log level shows it (tools/sglang_server_check.sh looks for it)
        logging.getLogger(__name__).warning(
            "kvarena.sglang: SGLang's unified-memory allocators are kvarena's (%s policy; %s=%s)",
            policy,
            ENV,
            os.environ.get(ENV),
        )
    return policy
