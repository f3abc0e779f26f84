"""SGLang on kvarena: kvarena's composites as the allocator of sglang 0.5.23's
unified-memory stack (docs/design.md §11).

``install()`` makes SGLang's three factories (``init_unified_swa_pools``,
``init_unified_mamba_pools``, ``init_unified_mamba_swa_pools``, which a
server started with ``--enable-unified-memory`` calls) build kvarena's
allocators over SGLang's own pools; ``uninstall()`` restores SGLang's.  A
server started from the command line turns it on with the environment
variable ``KVARENA_SGLANG=1`` (``kvarena sglang enable`` installs the
startup hook that reads it; docs/guides/integrating.md "SGLang on kvarena").

The allocator classes (``allocators.py``) import sglang, so they load on
first use: ``kvarena.sglang.UnifiedSWATokenToKVPoolAllocator`` and its two
siblings.

``engine.py`` runs SGLang's own ``Engine`` and HTTP server on SGLang's
allocator and on kvarena's and compares their greedy tokens (``kvarena
sglang check --engine``); on a CPU, ``cpu_ops.py`` stands in for
``sgl_kernel``'s CPU build, put in every engine process by
``cpu_boot/sitecustomize.py``.

May import: ``kvarena.spec``, ``kvarena.impl``, ``kvarena.anchor`` (the sglang loader).
"""

from .factories import ENV, install, installed, uninstall

__all__ = [
    "ENV",
    "UnifiedMambaSWATokenToKVPoolAllocator",
    "UnifiedMambaTokenToKVPoolAllocator",
    "UnifiedSWATokenToKVPoolAllocator",
    "install",
    "installed",
    "uninstall",
]

_CLASSES = {
    "UnifiedSWATokenToKVPoolAllocator",
    "UnifiedMambaSWATokenToKVPoolAllocator",
    "UnifiedMambaTokenToKVPoolAllocator",
}


def __getattr__(name: str) -> object:
    if name in _CLASSES:
        from . import allocators

        return getattr(allocators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
