"""The GPU run's preparation and report, on the CPU (issue 57).

``tools/gpu_wheels.py`` reads the pins it downloads from the sources the
rest of the project reads, refuses, naming the wheel and the command that
builds it, when the carried folder lacks one this Python needs (a throwaway
venv without sglang, never the project's), and names a missing module on
the drop-in's import path; ``tools/cuda_checks.sh`` refuses before anything
else; ``tools/cuda_table.py`` prints a row for every measurement of a real
``kvarena bench`` JSON, and says what did not run.  Nothing is installed.
"""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from tests.support import ROOT

TOOLS = ROOT / "tools"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"kvarena_{name}", TOOLS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wheels():
    return _load("gpu_wheels")


@pytest.fixture(scope="module")
def table():
    return _load("cuda_table")


def _pyproject_with_pin(tmp_path, version="6.170.27"):
    """A copy of pyproject.toml whose [test] extra pins Hypothesis at ``version``, the pin replaced if it has one."""
    text = re.sub(r'"hypothesis==[^"]*",\s*', "", (ROOT / "pyproject.toml").read_text())
    text = text.replace('test = ["', f'test = ["hypothesis=={version}", "', 1)
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    return path


@pytest.fixture
def bare_python(tmp_path):
    """A throwaway venv's Python, without pip, sglang or Hypothesis."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def _wheel(folder, name):
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"")  # a name is all the plan reads


# ------------------------------------------------------------------ the pins


def test_the_scripts_parse():
    out = subprocess.run(["bash", "-n", str(TOOLS / "cuda_checks.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for tool in ("gpu_wheels.py", "cuda_table.py"):
        compile((TOOLS / tool).read_text(), tool, "exec")


def test_the_pins_are_the_projects(wheels):
    """Hypothesis at pyproject's [test] pin, read here independently; sglang at the anchor's version."""
    from kvarena.anchor.loader import ANCHOR_VERSION

    with (ROOT / "pyproject.toml").open("rb") as f:
        test_extra = [Requirement(r) for r in tomllib.load(f)["project"]["optional-dependencies"]["test"]]
    pinned = [str(s.version) for r in test_extra if r.name == "hypothesis" for s in r.specifier if s.operator == "=="]
    assert len(pinned) == 1, f"pyproject's [test] extra should pin Hypothesis exactly once: {test_extra}"
    assert wheels.pins() == {"sglang": ANCHOR_VERSION, "hypothesis": pinned[0]}
    cmd = wheels.download_command([f"{n}=={v}" for n, v in wheels.pins().items()], ROOT / "wheels")
    assert f"hypothesis=={pinned[0]}" in cmd and f"sglang=={ANCHOR_VERSION}" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--no-deps" in cmd


def test_a_pyproject_without_an_exact_pin_is_refused(wheels, tmp_path):
    path = _pyproject_with_pin(tmp_path, "6.1.2")
    assert wheels.hypothesis_pin(path) == "6.1.2"
    path.write_text(path.read_text().replace('"hypothesis==6.1.2", ', '"hypothesis>=6.1", '))
    with pytest.raises(wheels.Refusal, match="not an exact pin"):
        wheels.hypothesis_pin(path)
    path.write_text(path.read_text().replace('"hypothesis>=6.1", ', ""))
    with pytest.raises(wheels.Refusal, match="pins no Hypothesis"):
        wheels.hypothesis_pin(path)


# ---------------------------------------------------------------- the install


def test_a_wheel_installs_only_on_a_python_it_fits(wheels):
    from pathlib import Path

    cp312 = Path("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl")
    assert wheels.installable(cp312, (3, 12), "x86_64")
    assert not wheels.installable(cp312, (3, 11), "x86_64")
    assert not wheels.installable(cp312, (3, 12), "aarch64")
    abi3 = Path("sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl")
    assert wheels.installable(abi3, (3, 12), "x86_64") and not wheels.installable(abi3, (3, 9), "x86_64")
    assert wheels.installable(Path("requests-2.34.2-py3-none-any.whl"), (3, 12), "x86_64")
    assert not wheels.installable(Path("not-a-wheel.tar.gz"), (3, 12), "x86_64")


def test_the_plan_installs_what_this_python_lacks(wheels, tmp_path):
    folder = tmp_path / "wheels"
    for name in (
        "sglang-0.5.23-py3-none-any.whl",
        "hypothesis-6.170.27-py3-none-any.whl",
        "orjson-3.13.0-py3-none-any.whl",
    ):
        _wheel(folder, name)
    need = {"sglang": "0.5.23", "hypothesis": "6.170.27"}
    names = lambda ws: [w.name.split("-")[0] for w in ws]  # noqa: E731
    bare = {"hypothesis": "6.168.3"}  # the image: an older Hypothesis, no sglang, no orjson
    assert names(wheels.plan(folder, need, bare.get)) == ["sglang", "hypothesis", "orjson"]
    done = {"sglang": "0.5.23", "hypothesis": "6.170.27", "orjson": "3.11.0"}
    assert wheels.plan(folder, need, done.get) == []  # an extra goes in only where its distribution is missing
    (folder / "sglang-0.5.23-py3-none-any.whl").unlink()
    with pytest.raises(wheels.Refusal) as e:
        wheels.plan(folder, need, bare.get)
    assert "no sglang 0.5.23 wheel" in str(e.value) and "hypothesis 6.170.27 wheel" not in str(e.value)
    assert wheels.BUILD in str(e.value)


def test_install_refuses_naming_the_missing_wheel(bare_python, tmp_path):
    pyproject = _pyproject_with_pin(tmp_path)
    folder = tmp_path / "wheels"
    _wheel(folder, "hypothesis-6.170.27-py3-none-any.whl")
    cmd = [
        str(bare_python),
        str(TOOLS / "gpu_wheels.py"),
        "--pyproject",
        str(pyproject),
        "install",
        "--wheels",
        str(folder),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "has no sglang 0.5.23 wheel" in out.stderr and "this Python has no sglang" in out.stderr, out.stderr
    assert "python tools/gpu_wheels.py build" in out.stderr and "hypothesis 6.170.27 wheel" not in out.stderr
    assert "pip install" not in out.stdout  # refused before anything was installed
    _wheel(folder, "sglang-0.5.23-py3-none-any.whl")
    out = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    pip = [line for line in out.stdout.splitlines() if "pip install --no-deps --no-index" in line]
    assert len(pip) == 2, out.stdout  # the two wheels, then kvarena itself (editable): this Python has neither
    assert "sglang-0.5.23-py3-none-any.whl" in pip[0] and "hypothesis-6.170.27-py3-none-any.whl" in pip[0]
    assert pip[1].endswith(f"--no-build-isolation -e {ROOT}")


def test_cuda_checks_refuses_before_anything_else(bare_python, tmp_path):
    """The script itself, in a copy of the files it needs, on a Python without sglang and an empty folder."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    (repo / "kvarena" / "anchor").mkdir(parents=True)
    for rel in ("tools/cuda_checks.sh", "tools/gpu_wheels.py", "kvarena/anchor/loader.py"):
        shutil.copy(ROOT / rel, repo / rel)
    shutil.copy(_pyproject_with_pin(tmp_path), repo / "pyproject.toml")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(bare_python), "WHEELS": str(tmp_path / "empty")}
    out = subprocess.run(["bash", str(repo / "tools" / "cuda_checks.sh")], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "has no sglang 0.5.23 wheel" in out.stderr and "has no hypothesis 6.170.27 wheel" in out.stderr, out.stderr
    assert "python tools/gpu_wheels.py build" in out.stderr
    assert "CUDA" not in out.stdout + out.stderr  # it stopped at the wheels, before the device check


def test_the_probe_names_a_missing_module(wheels):
    """With orjson blocked, the probe names it, where sglang imports it, and the command that carries it."""
    cmd = [sys.executable, str(TOOLS / "gpu_wheels.py"), "probe", "--block", "orjson", "--rounds", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "does NOT import sglang" in out.stdout, out.stdout
    first = re.search(r"no module 'orjson', imported at (\S+):\d+", out.stdout)
    assert first and first.group(1).startswith("sglang/"), out.stdout
    assert f"{wheels.BUILD} --extra orjson" in out.stdout


def test_the_anchor_extras_import_names(wheels):
    """Each entry of the [anchor] extra installed here provides the module the probe looks for."""
    import importlib.metadata as md

    provided = md.packages_distributions()
    checked = 0
    for module, requirement in wheels.anchor_imports(ROOT / "pyproject.toml").items():
        name = Requirement(requirement).name
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        assert wheels.canonical(name) in [wheels.canonical(d) for d in provided.get(module, [])], (module, name)
        checked += 1
    assert checked >= 20


# ------------------------------------------------------------------- the table


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    """A real ``kvarena bench`` JSON of every section the table reads (small: seconds on the CPU)."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    cmd = [sys.executable, "-m", "kvarena.cli", "bench", "--only", "decode,ops,copy,sglang", "--repeats", "1"]
    cmd += ["--steps", "2", "--warmup", "1", "--decode-batches", "1,64", "--ops-batches", "1", "--sglang-batches", "1"]
    cmd += ["--copy-mb", "1", "--copy-page-kib", "4,64", "--json", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return path


def test_the_table_prints_every_row(table, bench_json, tmp_path):
    core = bench_json
    doc = json.loads(core.read_text())
    envelopes = doc["copy"]["envelopes"]
    # the same copy at a second size, with the Triton relocation kernel's keys (a CUDA run's JSON has them)
    second = json.loads(json.dumps({k: doc[k] for k in ("device", "torch", "repeats", "triton", "copy")}))
    second["copy"]["paths"] = ["torch", "triton"]
    for r in second["copy"]["envelopes"].values():
        r["bytes"] *= 256
        r["kernel_share_of_copy_bandwidth"] = {"min": 0.8, "median": 0.9, "max": 1.0, "spread": 0.2}
        r["kernel_GBps"] = {"min": 1500.0, "median": 1700.0, "max": 1800.0, "spread": 300.0}
    (tmp_path / "copy-256.json").write_text(json.dumps(second))
    anchor = {
        "steps": 1000,
        "operations": {},
        "by_class": {"placement": 3},
        "unclassified": 0,
        "unclassified_cases": [],
    }
    (tmp_path / "anchor.json").write_text(json.dumps(anchor))
    (tmp_path / "steps.tsv").write_text("CUDA tests, Triton\tpassed\t12\nbench\tFAILED\t3\n")
    paths = [core, tmp_path / "copy-256.json", tmp_path / "anchor.json"]
    out = subprocess.run(
        [sys.executable, str(TOOLS / "cuda_table.py"), "--steps", str(tmp_path / "steps.tsv"), *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "| result | at | value |" and all(line.startswith("| ") for line in lines)
    rows = [tuple(c.strip() for c in line.strip("|").split(" | ")) for line in lines[2:]]
    have = {(a, b) for a, b, _ in rows}
    assert ("step: CUDA tests, Triton", "") in have and ("step: bench", "") in have
    assert "FAILED (3 s)" in out and "passed (12 s)" in out
    assert sum(a == "device" for a, _ in have) == 1  # two files from one machine: one device row
    for batch in ("batch 1", "batch 64"):
        assert (f"decode step / static free list, lazy trusted ({doc['decode_kernels']})", batch) in have
    assert ("launches a decode step (with host copies)", "batch 1") in have
    launches = next(c for a, b, c in rows if a.startswith("launches") and b == "batch 1")
    assert all(side in launches for side in ("Triton 4", "torch", "checked (torch)", "static free list"))
    for r in envelopes.values():
        small = f"1 MiB, {r['page_bytes'] // 1024} KiB pages"
        large = f"256 MiB, {r['page_bytes'] // 1024} KiB pages"
        assert ("relocation copy / copy_ bandwidth, torch path", small) in have
        assert ("relocation copy / copy_ bandwidth, torch path", large) in have
        assert ("relocation copy / copy_ bandwidth, Triton kernel", large) in have
    assert any(a == "relocation copy, Triton kernel" and c.startswith("NOT RUN") for a, _, c in rows)  # CPU: torch only
    assert "0.90 (min 0.80): 1,700 against" in out
    step = next(c for a, b, c in rows if a == "SGLang-stack decode step" and b == "batch 1")
    assert all(s in step for s in ("kvarena (Triton)", "kvarena (torch)", "SGLang's allocator", "x SGLang's"))
    assert ("SGLang-stack launches a step", "batch 1") in have
    assert ("anchor's Triton paths against kvarena's composites", "1,000 steps") in have
    assert "0 unclassified; classified differences: placement 3" in out
    assert "NOT RUN" not in out.replace("NOT RUN: bench ran the torch path only", "")


def test_the_table_says_what_did_not_run(table, tmp_path):
    (tmp_path / "broken.json").write_text("{")
    out = table.render(table.rows([tmp_path / "broken.json", tmp_path / "absent.json"], tmp_path / "steps.tsv"))
    for what in ("decode step", "launches a decode step", "relocation copy", "SGLang-stack decode step", "anchor"):
        assert re.search(rf"\| {what}[^|]* \|[^|]*\| NOT RUN", out), (what, out)
    assert out.count("NOT READ") == 2 and "no record of the steps" in out
