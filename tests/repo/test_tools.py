"""The shell tools in ``tools/`` parse and can be run as commands (none runs in CI)."""

import os
import subprocess
from pathlib import Path

import pytest

TOOLS = sorted((Path(__file__).resolve().parents[2] / "tools").glob("*.sh"))


def test_there_are_tools():
    assert any(t.name == "suite_soak.sh" for t in TOOLS), [t.name for t in TOOLS]


@pytest.mark.parametrize("tool", TOOLS, ids=lambda t: t.name)
def test_a_tool_parses_and_is_executable(tool):
    out = subprocess.run(["bash", "-n", str(tool)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert os.access(tool, os.X_OK), f"{tool.name} is not executable"
    assert tool.read_text().startswith("#!/usr/bin/env bash\n"), tool.name
    assert "set -euo pipefail" in tool.read_text(), f"{tool.name} does not stop at its first failure"
