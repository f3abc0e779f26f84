"""CrossHair runs: ``crosshair check`` over the spec's PEP 316 contracts, and
``crosshair diffbehavior`` between spec helpers and the implementation's
torch-free twins (``kvarena.impl.capacity``).

Budgets are stated and reported: every condition gets
``--per_condition_timeout`` seconds; each subprocess also has a wall-clock
cap.  A result is

- ``confirmed``      CrossHair exhausted every path: the contract holds;
- ``no_counterexample``  none found within the budget (not a proof);
- ``counterexample`` a failing input (a finding: fix it, keep a test);
- ``skipped``        only when the implementation module is missing;
- ``error``          anything else (counts as a failure).
"""

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# ``kvarena.spec.arena`` is not in the default list: CrossHair cannot build a
# valid symbolic ``Arena`` (it reports "Unable to meet precondition" for the
# class and the module run exceeds a 150 s cap on 2 cores), so the Arena's
# PEP 316 contracts are checked at run time by the tests instead.
CHECK_MODULES = ("kvarena.spec.arith", "kvarena.spec.policy", "kvarena.proofs.inflight_plans")
PER_CONDITION_S = 2.0
# Harnesses of list-level spec code whose claims are plain asserts (CrossHair's
# ``asserts`` analysis: leading asserts are preconditions), with the seconds
# per condition each needs: CrossHair may assume a PEP 316 callee's
# postconditions instead of running it, so a harness must not be PEP 316 when
# the code it checks carries a contract of its own.  ``inflight_plans``
# builds a band from a symbolic list; 2 s finds no planted walk past a pin,
# 4 s did in every run, 6 s with three runs at once on 2 cores.
ASSERT_HARNESSES = {"kvarena.proofs.inflight_plans": 8.0}
MODULE_WALL_S = 150
IMPL_MODULE = "kvarena.impl.capacity"
DIFF_PAIRS = (
    ("kvarena.spec.arith.end_available", f"{IMPL_MODULE}.end_available"),
    ("kvarena.spec.arith.float_available", f"{IMPL_MODULE}.float_available"),
    ("kvarena.spec.arith.float_region", f"{IMPL_MODULE}.float_region"),
    ("kvarena.spec.arith.park_start", f"{IMPL_MODULE}.park_start"),
    ("kvarena.spec.arith.make_room_need", f"{IMPL_MODULE}.make_room_need"),
    ("kvarena.spec.arith.make_room_feasible", f"{IMPL_MODULE}.make_room_feasible"),
    ("kvarena.spec.policy.short_side_decision", f"{IMPL_MODULE}.short_side_decision"),
    ("kvarena.spec.arith.two_end_joint_pages", f"{IMPL_MODULE}.two_end_joint_pages"),
    ("kvarena.spec.arith.two_end_uneven_fits", f"{IMPL_MODULE}.two_end_uneven_fits"),
    ("kvarena.spec.arith.swa_tail_pages", f"{IMPL_MODULE}.swa_tail_pages"),
)
DIFF_PER_CONDITION_S = 4.0
DIFF_WALL_S = 90

_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>info|error|warning): (?P<msg>.*)$")


# CrossHair blocks file writes while it loads the code under analysis.  Importing
# torch imports dill where it is installed (the [anchor] extra needs it), and dill
# asks tempfile for the temp dir, which probes it by writing a file.  Asking first,
# before CrossHair starts, caches the answer, so the import writes nothing.
_LAUNCH = (
    "import sys, tempfile; tempfile.gettempdir(); "
    "from crosshair.main import main; sys.argv[0] = 'crosshair'; sys.exit(main())"
)


def _crosshair():
    return [sys.executable, "-c", _LAUNCH]


# CPython 3.11 keeps one AST-construction depth counter per interpreter, and
# a thread switch inside ast.parse (a garbage collection running a finalizer)
# lets another thread's parse move it: "SystemError: AST constructor
# recursion depth mismatch" (CPython gh-106905).  kvarena verify runs
# check_module on two threads; it failed a clean-clone CI run so.
AST_LOCK = threading.Lock()


def _contracted_functions(module):
    """{qualified name: (first line, last line)} of functions whose docstring
    carries PEP 316 ``pre:``/``post:`` lines (in an ``ASSERT_HARNESSES``
    module: functions whose body starts with an ``assert``)."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin) as f:
        src = f.read()
    with AST_LOCK:
        tree = ast.parse(src)
    out = {}

    def visit(node, prefix):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ClassDef):
                visit(ch, prefix + ch.name + ".")
            elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(ch) or ""
                if module in ASSERT_HARNESSES:
                    body = ch.body[1:] if ast.get_docstring(ch) is not None else ch.body
                    if body and isinstance(body[0], ast.Assert):
                        out[prefix + ch.name] = (ch.lineno, ch.end_lineno)
                elif re.search(r"^\s*(pre|post)(\[.*\])?:", doc, re.M):
                    out[prefix + ch.name] = (ch.lineno, ch.end_lineno)

    visit(tree, "")
    return spec.origin, out


def check_module(module, per_condition_s=None, wall_s=MODULE_WALL_S):
    """``crosshair check --analysis_kind=PEP316`` over one module (``asserts`` for
    an ``ASSERT_HARNESSES`` one); a result per function.  ``per_condition_s``:
    None for the module's own (``PER_CONDITION_S``, or its harness's)."""
    t0 = time.perf_counter()
    kind = "asserts" if module in ASSERT_HARNESSES else "PEP316"
    if per_condition_s is None:
        per_condition_s = ASSERT_HARNESSES.get(module, PER_CONDITION_S)
    try:
        path, funcs = _contracted_functions(module)
    except Exception as e:
        return [
            {
                "name": f"crosshair.check.{module}",
                "group": "crosshair",
                "kind": "crosshair-check",
                "result": "error",
                "reason": str(e),
                "ok": False,
                "time_s": 0.0,
            }
        ]
    if not funcs:
        return []
    cmd = _crosshair() + [
        "check",
        f"--analysis_kind={kind}",
        "--report_all",
        f"--per_condition_timeout={per_condition_s}",
        module,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=wall_s)
        out, timed_out = proc.stdout, False
    except subprocess.TimeoutExpired as e:
        out, timed_out = (e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")), True
    elapsed = round(time.perf_counter() - t0, 3)
    per = {name: {"confirmed": 0, "unconfirmed": 0, "errors": []} for name in funcs}
    for line in out.splitlines():
        m = _LINE.match(line.strip())
        if not m or os.path.realpath(m["file"]) != os.path.realpath(path):
            continue
        ln = int(m["line"])
        owner = next((n for n, (a, b) in funcs.items() if a <= ln <= b), None)
        if owner is None:
            continue
        if m["level"] == "error":
            per[owner]["errors"].append(f"line {ln}: {m['msg']}")
        elif "Confirmed over all paths" in m["msg"]:
            per[owner]["confirmed"] += 1
        else:
            per[owner]["unconfirmed"] += 1
    results = []
    for name, r in per.items():
        if r["errors"]:
            result, reason = "counterexample", "; ".join(r["errors"])
        elif timed_out and not (r["confirmed"] or r["unconfirmed"]):
            result, reason = "error", f"crosshair run exceeded its {wall_s}s wall-clock cap"
        elif r["unconfirmed"] or not r["confirmed"]:
            result, reason = "no_counterexample", "no counterexample within the budget"
        else:
            result, reason = "confirmed", "all paths exhausted"
        results.append(
            {
                "name": f"crosshair.check.{module}.{name}",
                "group": "crosshair",
                "kind": "crosshair-check",
                "statement": f"{'the asserts' if kind == 'asserts' else 'PEP 316 contracts'} of {module}.{name} hold "
                f"({per_condition_s}s per condition, {wall_s}s cap per module)",
                "result": result,
                "reason": reason,
                "limit_s": per_condition_s,
                "ok": result in ("confirmed", "no_counterexample"),
                "time_s": elapsed,
                "vacuity": "n/a",
            }
        )
    return results


def impl_available():
    try:
        return importlib.util.find_spec(IMPL_MODULE) is not None
    except ModuleNotFoundError:
        return False


def diff_pair(f1, f2, per_condition_s=DIFF_PER_CONDITION_S, wall_s=DIFF_WALL_S):
    short = f1.rsplit(".", 1)[1]
    res = {
        "name": f"crosshair.diff.{short}",
        "group": "crosshair",
        "kind": "crosshair-diffbehavior",
        "statement": f"{f1} and {f2} behave the same ({per_condition_s}s per condition)",
        "limit_s": per_condition_s,
        "vacuity": "n/a",
    }
    t0 = time.perf_counter()
    if not impl_available():
        res.update(result="skipped", reason=f"module {IMPL_MODULE} is missing", ok=True, time_s=0.0)
        return res
    cmd = _crosshair() + ["diffbehavior", f"--per_condition_timeout={per_condition_s}", f1, f2]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=wall_s)
        out = proc.stdout + proc.stderr
        if "No differences found" in proc.stdout:
            exhausted = "All paths exhausted" in proc.stdout
            res.update(
                result="confirmed" if exhausted else "no_counterexample", reason=proc.stdout.strip().splitlines()[0]
            )
        elif proc.returncode != 0 and ("Given" in proc.stdout or "returns" in proc.stdout):
            res.update(result="counterexample", reason=proc.stdout.strip()[:800])
        else:
            res.update(result="error", reason=out.strip()[-800:])
    except subprocess.TimeoutExpired:
        res.update(result="error", reason=f"exceeded its {wall_s}s wall-clock cap")
    res["time_s"] = round(time.perf_counter() - t0, 3)
    res["ok"] = res["result"] in ("confirmed", "no_counterexample", "skipped")
    return res


def run_crosshair(modules=CHECK_MODULES, pairs=DIFF_PAIRS, jobs=2, only=None):
    """Every check and diff, ``jobs`` subprocesses at a time; results in a stable order."""
    tasks = [("check", m) for m in modules] + [("diff", p) for p in pairs]
    if only:

        def keep(t):
            names = [f"crosshair.check.{t[1]}"] if t[0] == "check" else [f"crosshair.diff.{t[1][0].rsplit('.', 1)[1]}"]
            return any(n.startswith(only) or only.startswith(n) for n in names)

        tasks = [t for t in tasks if keep(t)]

    def run(t):
        return check_module(t[1]) if t[0] == "check" else [diff_pair(*t[1])]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        out = list(ex.map(run, tasks))
    results = [r for rs in out for r in rs]
    if only:
        results = [r for r in results if r["name"].startswith(only)]
    return results
