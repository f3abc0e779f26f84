"""Import the anchor's allocator (sglang 0.5.23) on a CPU-only machine.

``pip install -e ".[anchor]"`` brings what the allocator's import path
needs; sglang itself must go in with ``--no-deps`` (its requirements pull a
CUDA build of torch), which an extra cannot say, so ``ensure_installed``
runs that one pip command when sglang is missing and the caller allows it.

One module on that path, ``sglang.srt.multimodal.internvl_utils``, imports
``torchvision`` at the top for image preprocessing that the allocator never
runs; torchvision's wheels pull a CUDA torch.  ``_TorchvisionStub`` answers
that import with an empty module, and only for importers inside sglang, so
transformers (which probes for torchvision itself) still sees it absent.
"""

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import subprocess
import sys
import types

ANCHOR_VERSION = "0.5.23"
INSTALL = [sys.executable, "-m", "pip", "install", "--no-deps", f"sglang=={ANCHOR_VERSION}"]
INSTALL_LINE = f'pip install -e ".[anchor]" && pip install --no-deps sglang=={ANCHOR_VERSION}'


class AnchorUnavailable(RuntimeError):
    """The anchor cannot be imported here; the message says how to install it."""


def _importer_is_sglang():
    """Whether the module executing the ``import`` statement is part of sglang."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if not (f.f_code.co_filename.startswith("<frozen") or name.startswith("importlib") or name == __name__):
            return name.startswith("sglang.")
        f = f.f_back
    return False


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if (name == "torchvision" or name.startswith("torchvision.")) and _importer_is_sglang():
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name, "empty stand-in: the allocator never preprocesses images")
        mod.__path__ = []
        mod.__getattr__ = lambda attr: None  # `from torchvision.x import Name` binds None
        return mod

    def exec_module(self, module):
        pass


def install_torchvision_standin() -> None:
    """For the rest of this process, the empty module answers sglang's own
    imports of ``torchvision`` when the real one is not installed (an SGLang
    engine's processes on CPU: ``kvarena/sglang/cpu_boot``)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None and not any(
        isinstance(f, _TorchvisionStub) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _TorchvisionStub())


def installed_version():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_installed(allow_install, out=print):
    """Make sure sglang ANCHOR_VERSION is installed; install it ``--no-deps``
    if allowed.  Processes that ask at once (parallel test workers) take
    turns on a lock file in the environment, so one installs and the others
    find it installed."""
    if installed_version() == ANCHOR_VERSION:
        return
    if not allow_install:
        have = installed_version()
        raise AnchorUnavailable(f"sglang {ANCHOR_VERSION} is not installed (found {have}); run: {INSTALL_LINE}")
    import fcntl
    import os

    with open(os.path.join(sys.prefix, ".kvarena-anchor-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        importlib.invalidate_caches()
        if installed_version() == ANCHOR_VERSION:  # another process installed it while we waited
            return
        out(f"kvarena: installing the anchor: {' '.join(INSTALL[2:])}")
        subprocess.run(INSTALL, check=True)
        importlib.invalidate_caches()


_MODULES = None


@contextlib.contextmanager
def sglang_imports():
    """While the block runs, sglang's modules import on this machine (the
    torchvision stand-in answers their import of it); ``AnchorUnavailable``
    says how to install sglang when it is missing or does not import."""
    have = installed_version()
    if have != ANCHOR_VERSION:
        raise AnchorUnavailable(f"sglang {ANCHOR_VERSION} is not installed (found {have}); run: {INSTALL_LINE}")
    stub = _TorchvisionStub()
    sys.meta_path.insert(0, stub)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except ImportError as e:
        raise AnchorUnavailable(f"sglang does not import ({e}); run: {INSTALL_LINE}") from e
    finally:
        sys.meta_path.remove(stub)
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            if isinstance(sys.modules[mod].__spec__.loader, _TorchvisionStub):
                del sys.modules[mod]  # sglang keeps its reference; nobody else sees the stand-in


def import_sglang(name):
    """One of sglang's modules, imported under ``sglang_imports``."""
    if name in sys.modules:
        return sys.modules[name]
    with sglang_imports():
        return importlib.import_module(name)


def anchor_modules():
    """The anchor's allocator modules, imported once: a namespace with
    ``UnifiedKVPool``, ``MHASubPoolSpec``, ``MambaSubPoolSpec``,
    ``MultiEndedAllocator``, ``FloatMultiEndedAllocator``, ``relieve``
    (``_relieve_for_alloc``), ``open_short_side`` (``_float_open_short_side``)
    and ``chain_violations`` (``_chain_byte_accounting_violations``)."""
    global _MODULES
    if _MODULES is not None:
        return _MODULES
    have = installed_version()
    if have != ANCHOR_VERSION:
        raise AnchorUnavailable(f"sglang {ANCHOR_VERSION} is not installed (found {have}); run: {INSTALL_LINE}")
    sub = import_sglang("sglang.srt.mem_cache.allocator.unified_sub_pool")
    pool = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
    _MODULES = types.SimpleNamespace(
        UnifiedKVPool=pool.UnifiedKVPool,
        MHASubPoolSpec=pool.MHASubPoolSpec,
        MambaSubPoolSpec=pool.MambaSubPoolSpec,
        MultiEndedAllocator=sub.MultiEndedAllocator,
        FloatMultiEndedAllocator=sub.FloatMultiEndedAllocator,
        relieve=sub._relieve_for_alloc,
        open_short_side=sub._float_open_short_side,
        chain_violations=sub._chain_byte_accounting_violations,
        version=have,
    )
    return _MODULES
