"""ruff and mypy run inside the test suite (``tools/check.py``), and each can fail.

``mypy --strict`` covers ``kvarena.spec`` and ``kvarena.impl``; the default
mode covers the rest of the package.  Each check is first shown to catch a
planted finding, so a configuration that quietly checks nothing fails here.
"""

import importlib.util
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def check():
    """``tools/check.py``, loaded when a test asks (a staged copy of the tests, as mutmut's, has no tools/)."""
    spec = importlib.util.spec_from_file_location("kvarena_check", ROOT / "tools" / "check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ruff_catches_a_planted_finding():
    planted = "import os\n\n\ndef f(l):\n    return l\n"  # an unused import, an ambiguous name
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--stdin-filename", "spec/planted.py", "-"],
        input=planted,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 1 and "F401" in out.stdout and "E741" in out.stdout, out.stdout


def test_ruff_check_and_format_are_clean(check, capfd):
    assert check.ruff() == 0, capfd.readouterr().out


def test_mypy_catches_planted_findings(check, capfd):
    """An unannotated function in the spec fails the strict run; a wrong type in the tooling fails the default one."""
    planted = {
        "spec/planted_untyped.py": "def pages(n):\n    return n\n",
        "verification/planted_wrong.py": 'count: int = "three"\n',
    }
    assert check.mypy(planted) != 0
    out = capfd.readouterr().out
    assert "kvarena/spec/planted_untyped.py:1: error: Function is missing a type annotation" in out, out
    assert "kvarena/verification/planted_wrong.py:1: error: Incompatible types in assignment" in out, out


def test_mypy_is_clean(check, capfd):
    assert check.mypy() == 0, capfd.readouterr().out
