"""The wheels a GPU run carries (issue 57): build them here, install them there.

The GPU machine (Python 3.12, torch and Triton, no network) has no sglang
and another Hypothesis than the one pinned, and a run there carries up to
64 MiB of git-ignored files from the working tree.  So:

    python tools/gpu_wheels.py build      # here, with a network: fills wheels/ (git-ignored)
    python tools/gpu_wheels.py install    # there (tools/cuda_checks.sh runs it): what the image lacks
    python tools/gpu_wheels.py probe      # there (tools/cuda_checks.sh runs it): does the drop-in import?
    python tools/gpu_wheels.py pins       # the versions both read

``build`` downloads, ``--no-deps``, the cp312 wheels of sglang
(``kvarena.anchor.loader.ANCHOR_VERSION``) and of Hypothesis at the pin of
pyproject's ``[test]`` extra (read from the file, so the two cannot drift),
pyproject's ``[build-system]`` requirement (setuptools: kvarena's editable
install there builds with it), and any ``--extra NAME[==VERSION]`` (a bare
name at the version installed in the Python that runs the build), drops the
folder's other wheels, and fails if the folder passes ``--limit-mib`` (64).  It must run on Linux
x86-64 (pip picks the wheels for this machine's platform).

``install`` installs with ``pip install --no-deps --no-index``, from the
folder, sglang where this Python lacks that version, Hypothesis where its
version is not the pin, every other wheel in the folder whose distribution
this Python lacks, and kvarena itself (editable, ``--no-build-isolation``)
where ``kvarena.impl`` does not import from this checkout.  A wheel it needs
and the folder lacks is a refusal (exit 1) naming the wheel and the command
that builds it, before anything is installed.  ``--dry-run`` prints the
commands instead.

``probe`` imports what the drop-in's CUDA tests, the SGLang-stack timings
and the anchor's GPU check import, on this machine's device, and says which
modules fail: the first, with the sglang file and line that imports it,
then the ones further down the import path (each missing module is stubbed
out to find the next; a stub can break an import that would pass, so the
list after the first is a guide).  It also lists the modules of pyproject's
``[anchor]`` extra (what ``kvarena conform`` installs on a CPU machine) that
this Python cannot find, with the ``build --extra`` command that carries
them.  Exit 1 when the drop-in does not import.
"""

import argparse
import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import platform
import re
import subprocess
import sys
import sysconfig
import tomllib
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.12"  # the GPU image's
LIMIT_MIB = 64  # what a run carries of git-ignored files
BUILD = "python tools/gpu_wheels.py build"
# The anchor extra's distributions whose import name is not the distribution's name with "_" for "-"
IMPORT_NAMES = {"pillow": "PIL", "pyzmq": "zmq", "ipython": "IPython", "apache-tvm-ffi": "tvm_ffi"}
# What a missing module is, where its wheel cannot simply be carried
HINTS = {
    "sgl_kernel": "sglang-kernel's CUDA build (0.4.10: a 373 MB wheel built against torch 2.14, too large to carry)",
}
# What the drop-in's CUDA tests (tests/sglang/), the SGLang-stack timings and the anchor's GPU check import
PROBED = [
    "kvarena.sglang.allocators",
    "kvarena.sglang.dropin",
    "kvarena.sglang.settings",
    "kvarena.sglang.stacks",
    "kvarena.sglang.surface",
    "kvarena.sglang.views",
    "kvarena.sglang.workload",
    "kvarena.sglang.bench",
    "kvarena.anchor.gpu",
]


class Refusal(Exception):
    """What the wheels folder or pyproject lacks, said so that a person can fix it."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def anchor_version(root: Path = ROOT) -> str:
    """``ANCHOR_VERSION`` of kvarena/anchor/loader.py, read without importing kvarena."""
    tree = ast.parse((root / "kvarena" / "anchor" / "loader.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ANCHOR_VERSION" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise Refusal("kvarena/anchor/loader.py defines no ANCHOR_VERSION string")


def extra(pyproject: Path, name: str) -> list[str]:
    with pyproject.open("rb") as f:
        extras = tomllib.load(f).get("project", {}).get("optional-dependencies", {})
    if name not in extras:
        raise Refusal(f"{pyproject}: no [{name}] extra in [project.optional-dependencies]")
    return list(extras[name])


def exact_pin(requirement: str) -> tuple[str, str | None]:
    """``(canonical name, version)`` of ``name==version`` (a marker allowed), else ``(name, None)``."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*?)\s*(?:;.*)?", requirement)
    if m is None:
        return canonical(requirement), None
    pin = re.fullmatch(r"==\s*([A-Za-z0-9.+!_-]+)", m.group(2))
    return canonical(m.group(1)), (pin.group(1) if pin else None)


def hypothesis_pin(pyproject: Path) -> str:
    """The Hypothesis version pyproject's ``[test]`` extra pins (``hypothesis==X.Y.Z``)."""
    for requirement in extra(pyproject, "test"):
        name, version = exact_pin(requirement)
        if name == "hypothesis":
            if version is None:
                raise Refusal(
                    f"{pyproject}: the [test] extra has {requirement!r}, not an exact pin (hypothesis==X.Y.Z)"
                )
            return version
    raise Refusal(f"{pyproject}: the [test] extra pins no Hypothesis (expected an entry hypothesis==X.Y.Z)")


def pins(root: Path = ROOT, pyproject: Path | None = None) -> dict[str, str]:
    """The two wheels every run needs: ``{"sglang": version, "hypothesis": version}``."""
    return {"sglang": anchor_version(root), "hypothesis": hypothesis_pin(pyproject or root / "pyproject.toml")}


def download_command(specs: list[str], dest: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--python-version",
        PYTHON_VERSION,
        "--only-binary=:all:",
        "-d",
        str(dest),
        *specs,
    ]


# ------------------------------------------------------------------ wheels


def parse_wheel(path: Path) -> tuple[str, str, str, str, str] | None:
    """``(canonical name, version, python tags, abi tag, platform tags)`` of a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-") if path.name.endswith(".whl") else []
    if len(parts) not in (5, 6):
        return None
    return canonical(parts[0]), parts[1], parts[-3], parts[-2], parts[-1]


def installable(path: Path, version: tuple[int, int] | None = None, machine: str | None = None) -> bool:
    """Whether this Python (``version``, ``machine``: this interpreter's by default) can install the wheel."""
    parsed = parse_wheel(path)
    if parsed is None:
        return False
    _, _, py, abi, plat = parsed
    major, minor = version or sys.version_info[:2]
    machine = machine or platform.machine()

    def py_ok(tag: str) -> bool:
        if tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"):
            return True
        m = re.fullmatch(rf"cp{major}(\d+)", tag)
        return abi == "abi3" and m is not None and int(m.group(1)) <= minor

    plat_ok = plat == "any" or any(
        p.endswith(machine) and p.startswith(("manylinux", "linux")) for p in plat.split(".")
    )
    return any(py_ok(t) for t in py.split(".")) and plat_ok


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(wheels: Path, need: dict[str, str], have=installed) -> list[Path]:
    """The wheels to install from ``wheels``: each of ``need`` (name -> version)
    whose installed version differs, then every other wheel there whose
    distribution is not installed.  Raises ``Refusal`` naming each needed
    wheel the folder lacks."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    out, missing = [], []
    for name, version in need.items():
        if have(name) == version:
            continue
        same = [w for w in found if (p := parse_wheel(w)) is not None and p[0] == canonical(name) and p[1] == version]
        ok = [w for w in same if installable(w)]
        if ok:
            out.append(ok[0])
            continue
        tag = f"cp{sys.version_info[0]}{sys.version_info[1]}, {platform.machine()}"
        why = f"{wheels}/ has no {name} {version} wheel for this Python ({tag})"
        if same:
            why += f"; it holds {', '.join(w.name for w in same)}, which this Python cannot install"
        has = have(name)
        missing.append(f"{why} (this Python has {f'{name} {has}' if has else f'no {name}'})")
    if missing:
        raise Refusal(
            "\n".join(["cannot install what this Python lacks:", *(f"  - {m}" for m in missing)])
            + f"\nBuild the folder on a networked Linux x86-64 machine, at the repository root:\n  {BUILD}\n"
            + f"(it runs: pip download --no-deps --python-version {PYTHON_VERSION} --only-binary=:all: "
            + " ".join(f"{n}=={v}" for n, v in need.items())
            + f" -d {wheels.name})\nand carry {wheels.name}/ with the run."
        )
    needed = {canonical(n) for n in need}
    for w in found:
        p = parse_wheel(w)
        if p is not None and p[0] not in needed and have(p[0]) is None and installable(w):
            out.append(w)
    return out


def pip_install(args: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", *args]
    marker = Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED"
    if marker.exists() and sys.prefix == sys.base_prefix:  # a distribution's own Python (PEP 668), not a venv
        cmd.append("--break-system-packages")
    return cmd


def kvarena_here(root: Path) -> bool:
    """Whether ``kvarena.impl`` imports from this checkout (kvarena installed, editable, from ``root``)."""
    try:
        spec = importlib.util.find_spec("kvarena.impl")
    except ModuleNotFoundError:
        return False
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent == root / "impl"


def cmd_install(args: argparse.Namespace) -> int:
    need = pins(ROOT, args.pyproject)
    todo = plan(args.wheels, need)
    commands = [pip_install([str(w) for w in todo])] if todo else []
    if not kvarena_here(ROOT):  # after the wheels: they may bring the build backend (setuptools)
        commands.append(pip_install(["--no-build-isolation", "-e", str(ROOT)]))
    for name, version in need.items():
        print(f"gpu_wheels: {name}: this Python has {installed(name) or 'none'}, the run needs {version}")
    if not commands:
        print("gpu_wheels: nothing to install")
    for cmd in commands:
        print("gpu_wheels: $", " ".join(cmd), flush=True)
        if args.dry_run:
            continue
        if subprocess.run(cmd, check=False).returncode != 0:
            why = f"gpu_wheels: the install failed: {' '.join(cmd)}"
            if "-e" in cmd:
                backend = ", ".join(build_requires(args.pyproject))
                why += f"\nkvarena's editable install builds with {backend} from this Python; carry it: {BUILD}"
            print(why, file=sys.stderr)
            return 1
    if args.dry_run:
        return 0
    importlib.invalidate_caches()
    wrong = {n: installed(n) for n, v in need.items() if installed(n) != v}
    if wrong:
        print(f"gpu_wheels: after the install: {wrong}, expected {need}", file=sys.stderr)
        return 1
    # Hypothesis went in --no-deps: its own dependencies must be here already (sglang's: tools/gpu_wheels.py probe)
    check = subprocess.run([sys.executable, "-c", "import hypothesis"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        print(f"gpu_wheels: Hypothesis does not import: {check.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------- build


def build_requires(pyproject: Path) -> list[str]:
    """pyproject's ``[build-system] requires``: what kvarena's editable install builds with."""
    with pyproject.open("rb") as f:
        return list(tomllib.load(f).get("build-system", {}).get("requires", []))


def resolve_extra(spec: str) -> str:
    """``NAME`` (or a range) -> ``NAME==version``: the version installed in this Python, else the spec as given."""
    name, version = exact_pin(spec)
    if version is not None:
        return spec
    version = installed(name)
    return f"{name}=={version}" if version else spec


def cmd_build(args: argparse.Namespace) -> int:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Refusal(f"build on Linux x86-64 (pip picks the wheels for this platform), not {platform.platform()}")
    need = pins(ROOT, args.pyproject)
    # the two every run needs, kvarena's build backend (installed there only where missing), and the extras
    specs = [f"{n}=={v}" for n, v in need.items()]
    specs += [resolve_extra(e) for e in build_requires(args.pyproject) + args.extra]
    dest = args.dest
    dest.mkdir(parents=True, exist_ok=True)
    cmd = download_command(specs, dest)
    print("gpu_wheels: $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    wanted = dict(exact_pin(s) for s in specs)
    for w in sorted(dest.glob("*.whl")):
        p = parse_wheel(w)
        if p is None or p[0] not in wanted or wanted[p[0]] not in (None, p[1]):
            print(f"gpu_wheels: dropping {w.name} (not asked for this time)")
            w.unlink()
    return report_size(dest, args.limit_mib)


def report_size(dest: Path, limit_mib: float) -> int:
    files = sorted(p for p in dest.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"  {p.stat().st_size / 2**20:8.1f} MiB  {p.relative_to(dest)}")
    print(f"gpu_wheels: {dest}/ holds {total / 2**20:.1f} MiB in {len(files)} files (limit {limit_mib} MiB)")
    if total > limit_mib * 2**20:
        print(f"gpu_wheels: {dest}/ is over {limit_mib} MiB: a run cannot carry it", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------- probe


class _Any(type):
    """A missing module's every name: a class whose attributes, items and calls are classes like it."""

    def __new__(mcs, name, bases=(), namespace=None, **kwargs):  # a subclass's keywords are swallowed
        return super().__new__(mcs, name, bases, dict(namespace or {}))

    def __init__(cls, *args, **kwargs):
        pass

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name, (), {})

    def __getitem__(cls, key):
        return cls

    def __call__(cls, *args, **kwargs):
        return cls


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of each of ``names`` (and their submodules) with a module of ``_Any``."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name, "gpu_wheels probe: a stand-in for a missing module")
        mod.__path__ = []
        mod.__getattr__ = lambda name: getattr(_Any(spec.name, (), {}), name)  # type: ignore[method-assign]
        return mod

    def exec_module(self, module):
        pass


class _Blocker(importlib.abc.MetaPathFinder):
    """``--block``: the named modules fail to import, as on a machine that lacks them (the probe's own test)."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (--block)", name=name)
        return None


def _probe_once() -> None:
    from kvarena.anchor import loader

    for name in PROBED:
        importlib.import_module(name)
    loader.anchor_modules()
    from kvarena.sglang import stacks

    stacks.runtime_context()


def _importer(exc: BaseException) -> str:
    """The last frame of sglang's (else kvarena's) where ``exc`` was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    for marks in (("sglang",), ("kvarena", "site-packages")):
        hits = [f for f in frames if any(m in f.filename for m in marks) and "importlib" not in f.filename]
        if hits:
            return f"{hits[-1].filename.split('site-packages/')[-1]}:{hits[-1].lineno}"
    return "?"


def _missing_module(exc: BaseException) -> ModuleNotFoundError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def anchor_imports(pyproject: Path) -> dict[str, str]:
    """Import name -> requirement, for each entry of pyproject's ``[anchor]`` extra."""
    out = {}
    for requirement in extra(pyproject, "anchor"):
        name, _ = exact_pin(requirement)
        out[IMPORT_NAMES.get(name, name.replace("-", "_"))] = requirement
    return out


def probe(rounds: int, block: set[str]) -> tuple[list[tuple[str, str]], str | None]:
    """Import ``PROBED``; each time a module is missing, record it and where
    it was imported, stub it out and try again (at most ``rounds`` times).
    Returns the missing modules and the error that ended the search (None
    when the imports passed)."""
    stub = _Stub()
    sys.meta_path[:0] = [stub, _Blocker(block)]
    found: list[tuple[str, str]] = []
    for _ in range(rounds):
        for mod in [m for m in sys.modules if m.startswith(("sglang", "kvarena.sglang", "kvarena.anchor"))]:
            del sys.modules[mod]
        try:
            _probe_once()
            return found, None
        except Exception as exc:
            missing = _missing_module(exc)
            top = missing.name.split(".")[0] if missing is not None and missing.name else None
            if missing is None or top is None or top in stub.names:
                return found, f"{type(exc).__name__}: {exc} (at {_importer(exc)})"
            found.append((missing.name, _importer(missing)))
            stub.names.add(top)
    return found, f"more than {rounds} modules missing"


def cmd_probe(args: argparse.Namespace) -> int:
    try:
        from kvarena.impl import kernels
    except ImportError as e:
        print(f"probe: kvarena does not import here ({e}); install it: python tools/gpu_wheels.py install")
        return 1
    kernels.interpret_without_cuda()  # on a machine without CUDA, before anything imports triton
    import torch

    where = f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"
    absent = {m: r for m, r in anchor_imports(args.pyproject).items() if m in args.block or not _findable(m)}
    found, other = probe(args.rounds, set(args.block))
    for mod, req in sorted(absent.items()):
        print(f"probe: the anchor extra's {req!r} does not import here ({mod})")
    if not found and other is None:
        print(f"probe: kvarena's drop-in imports sglang {installed('sglang')} here, on {where}")
        return 0
    print(f"probe: kvarena's drop-in does NOT import sglang here, on {where}:")
    for i, (mod, at) in enumerate(found):
        later = "" if i == 0 else " (found with the ones above stubbed out)"
        hint = f": {HINTS[mod.split('.')[0]]}" if mod.split(".")[0] in HINTS else ""
        print(f"  - no module {mod!r}, imported at {at}{later}{hint}")
    if other is not None:
        lead = "then, with the modules above stubbed out, " if found else ""
        print(f"  - {lead}{other}")
    if absent:
        carry = sorted(r if exact_pin(r)[1] else exact_pin(r)[0] for r in absent.values())
        print(f"probe: to carry the anchor's missing wheels: {BUILD} --extra " + " ".join(carry))
    return 1


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cmd_pins(args: argparse.Namespace) -> int:
    for name, version in pins(ROOT, args.pyproject).items():
        print(f"{name}=={version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tools/gpu_wheels.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml", help="where the pins are read")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download the wheels (networked Linux x86-64)")
    b.add_argument("--dest", type=Path, default=ROOT / "wheels")
    b.add_argument("--extra", nargs="*", default=[], metavar="NAME[==VERSION]", help="more wheels to carry, --no-deps")
    b.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    b.set_defaults(run=cmd_build)
    i = sub.add_parser("install", help="install from the wheels what this Python lacks (--no-deps --no-index)")
    i.add_argument("--wheels", type=Path, default=ROOT / "wheels")
    i.add_argument("--dry-run", action="store_true", help="print the pip commands, run none")
    i.set_defaults(run=cmd_install)
    r = sub.add_parser("probe", help="does the drop-in import sglang here; which modules fail")
    r.add_argument("--rounds", type=int, default=12, help="missing modules to stub out, at most, to find the next")
    r.add_argument("--block", nargs="*", default=[], metavar="MODULE", help="pretend these are missing (a test)")
    r.set_defaults(run=cmd_probe)
    sub.add_parser("pins", help="print the pinned versions").set_defaults(run=cmd_pins)
    args = p.parse_args(argv)
    try:
        return int(args.run(args))
    except Refusal as e:
        print(f"gpu_wheels: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
