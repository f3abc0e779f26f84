"""Lint and type-check kvarena, as the test suite does (``tests/repo/test_checks.py``).

    python tools/check.py            # both
    python tools/check.py ruff       # ruff check and ruff format --check
    python tools/check.py mypy       # mypy --strict on spec/ and impl/, the default mode on the rest

The settings are pyproject's ``[tool.ruff]`` and ``[tool.mypy]``.  mypy finds
modules by their paths, and in this repository ``spec/`` is imported as
``kvarena.spec`` (likewise ``impl/`` and ``proofs/``), so the package is laid
out as installed in a scratch folder of symbolic links and checked there.
Exits non-zero on any finding.  ``KVARENA_MYPY_CACHE`` names mypy's cache
folder (default ``.mypy_cache``).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"spec": "spec", "impl": "impl", "proofs": "proofs"}  # kvarena.<name> -> folder
STRICT = ["kvarena.spec", "kvarena.impl"]


def installed_layout(dest: Path, extra: dict[str, str] | None = None) -> Path:
    """``dest/kvarena`` as installed: links to ``kvarena/*`` and to ``spec/``, ``impl/``, ``proofs/``.

    ``extra`` maps a path under ``dest/kvarena`` to a file's text, added to the
    layout only (the tests plant a finding this way): the folder it lands in
    is made of links file by file, so nothing is written into the repository."""
    pkg = dest / "kvarena"
    sources = {entry.name: entry for entry in (ROOT / "kvarena").iterdir() if entry.name != "__pycache__"}
    sources |= {name: ROOT / folder for name, folder in PARTS.items()}
    _link_tree(pkg, sources, extra or {})
    return dest


def _link_tree(at: Path, sources: dict[str, Path], extra: dict[str, str]) -> None:
    """Link each source into ``at``; a folder that receives an extra file is made, not linked."""
    at.mkdir(parents=True)
    for name, source in sources.items():
        inside = {rel.partition("/")[2]: text for rel, text in extra.items() if rel.partition("/")[0] == name}
        if inside and source.is_dir():
            children = {e.name: e for e in source.iterdir() if e.name != "__pycache__"}
            _link_tree(at / name, children, inside)
        else:
            (at / name).symlink_to(source)
    for rel, text in extra.items():
        if "/" not in rel:
            (at / rel).write_text(text)


def run(cmd: list[str], cwd: Path) -> int:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, check=False).returncode


def ruff() -> int:
    return run([sys.executable, "-m", "ruff", "check", "."], ROOT) | run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], ROOT
    )


def mypy(extra: dict[str, str] | None = None) -> int:
    cache = Path(os.environ.get("KVARENA_MYPY_CACHE", str(ROOT / ".mypy_cache")))
    # The layout is rebuilt at one fixed path, and each mode keeps its own
    # cache, so a second run re-checks only what changed.
    layout = cache / "layout"
    shutil.rmtree(layout, ignore_errors=True)
    installed_layout(layout, extra)
    config = ["--config-file", str(ROOT / "pyproject.toml")]
    strict = [x for p in STRICT for x in ("-p", p)]
    return run(
        [sys.executable, "-m", "mypy", *config, "--cache-dir", str(cache / "strict"), "--strict", *strict], layout
    ) | run([sys.executable, "-m", "mypy", *config, "--cache-dir", str(cache / "default"), "-p", "kvarena"], layout)


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "all"
    if which not in ("ruff", "mypy", "all"):
        print(__doc__)
        return 2
    os.environ.setdefault("MYPY_FORCE_COLOR", "0")
    rc = 0
    if which in ("ruff", "all"):
        rc |= ruff()
    if which in ("mypy", "all"):
        rc |= mypy()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
