"""``kvarena``'s subcommands come from one registry (``kvarena.cli.COMMANDS``):
``--help`` lists each, the module docstring names each with the same help
line, every command module adds its arguments and runs the same way, and
``kvarena --help`` imports none of them (no torch, no z3)."""

import importlib
import re
import subprocess
import sys

import pytest

from kvarena import cli

NAMES = [c.name for c in cli.COMMANDS]


def _help(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_every_registered_command_is_in_help(capsys):
    out = _help(["--help"], capsys)
    assert "{" + ",".join(NAMES) + "}" in out
    listed = " ".join(out.split())  # argparse wraps the help lines
    for c in cli.COMMANDS:
        assert f"{c.name} {c.help}" in listed, c.name


def test_the_docstring_lists_every_command_with_its_help_line():
    documented = dict(re.findall(r"^- ``kvarena (\w+)``: (.*)$", cli.__doc__, re.M))
    assert documented == {c.name: c.help for c in cli.COMMANDS}
    assert list(documented) == NAMES  # in the registry's order


@pytest.mark.parametrize("name", NAMES)
def test_each_command_module_declares_and_runs_alike(name, capsys):
    module = importlib.import_module(next(c.module for c in cli.COMMANDS if c.name == name))
    assert callable(module.add_arguments) and callable(module.run)
    assert f"usage: kvarena {name} " in _help([name, "--help"], capsys)


def test_help_imports_no_command_module():
    code = (
        "import sys\nfrom kvarena import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'z3', 'hypothesis', *(c.module for c in cli.COMMANDS)) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
