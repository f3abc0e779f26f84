#!/usr/bin/env bash
# Mutation testing of spec/ and impl/ with mutmut (docs/results/suite-strength.md).
#
#   tools/mutmut.sh [MODULE ...]     e.g. tools/mutmut.sh spec/arith.py impl/capacity.py
#
# mutmut names each mutant after its file's path and the trampoline compares
# that name with the module's import name, so the paths must match the import
# names.  In this repo they do not (spec/ is installed as kvarena.spec), so
# the script lays the package out as it is installed, in a scratch folder
# (KVARENA_MUTMUT_DIR, default /tmp/kvarena-mutmut), copies the tests (the
# package `tests`, its __init__.py files and tests/support.py with it) and
# pyproject.toml ([tool.mutmut] holds the configuration: a mutant runs the
# tests marked `mutation`), and runs mutmut there under `nice`.  With MODULE
# arguments only those files are mutated (the default is [tool.mutmut]
# source_paths).  KVARENA_MUTMUT_PYTEST_ARGS
# adds pytest arguments for one run (e.g. a --deselect while a test is being
# rewritten); a small plugin always runs a mutant's tests fastest first.  KVARENA_MUTMUT_CHILDREN (default 2) sets mutmut's --max-children
# (1 on a loaded machine).  KVARENA_MUTMUT_NAMES (names or globs) runs only
# those mutants; KVARENA_MUTMUT_SAMPLE=N a seeded sample of N per module.  Results: `mutmut results` in that folder; this script prints
# the totals.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
STAGE=${KVARENA_MUTMUT_DIR:-/tmp/kvarena-mutmut}
mkdir -p "$STAGE"
rm -rf "$STAGE/kvarena" "$STAGE/tests"
cp -r kvarena "$STAGE/kvarena"
for part in spec impl proofs; do cp -r "$part" "$STAGE/kvarena/$part"; done
cp -r tests "$STAGE/tests"
test -f "$STAGE/tests/__init__.py" -a -f "$STAGE/tests/support.py"  # the tests import tests.support
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
python - "$REPO/pyproject.toml" "$STAGE/pyproject.toml" "$@" <<'PY'
import json, os, shlex, sys, tomllib
src, dst, only = sys.argv[1], sys.argv[2], sys.argv[3:]
text = open(src).read()
cfg = tomllib.loads(text)["tool"]["mutmut"]
start = text.index("[tool.mutmut]")
end = text.find("\n[", start + 1)
block = text[start:end if end != -1 else len(text)]
new = block
if only:  # spec/arith.py -> kvarena/spec/arith.py
    paths = ["kvarena/" + p if not p.startswith("kvarena/") else p for p in only]
    new = new.replace(json.dumps(cfg["source_paths"]), json.dumps(paths))
extra = ["-p", "kvarena_fastfirst"] + shlex.split(os.environ.get("KVARENA_MUTMUT_PYTEST_ARGS", ""))
new = new.replace(json.dumps(cfg["pytest_add_cli_args"]), json.dumps(cfg["pytest_add_cli_args"] + extra))
assert new.count("kvarena_fastfirst") == 1 and (json.dumps(cfg["source_paths"]) in new) != bool(only), \
    "write source_paths and pytest_add_cli_args on one line each"
open(dst, "w").write(text.replace(block, new))
PY
# A mutant's tests run fastest first (the durations of mutmut's stats run), so
# that -x stops at the first, usually cheap, test that kills it.
mkdir -p "$STAGE/plugins"
cat > "$STAGE/plugins/kvarena_fastfirst.py" <<'PY'
import json


def pytest_collection_modifyitems(session, config, items):
    try:
        with open("mutmut-stats.json") as f:  # pytest runs in mutants/
            took = json.load(f)["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return  # the stats run itself: no durations yet
    items.sort(key=lambda item: took.get(item.nodeid, float("inf")))
PY
export PYTHONPATH="$STAGE/plugins${PYTHONPATH:+:$PYTHONPATH}"
cd "$STAGE"
# mutmut keeps verdicts and test-coverage stats in mutants/ and lets an old
# verdict stand even when a test that would now kill the mutant was edited in,
# so start afresh whenever the modules, the configuration, the tests or the
# package changed since the last run here
KEY="$(cat pyproject.toml; find kvarena tests -type f ! -name '*.pyc' | sort | xargs cat)"
KEY="$(printf '%s' "$KEY" | sha256sum)"
if [ "$(cat .key 2>/dev/null)" != "$KEY" ]; then rm -rf mutants; fi
echo "$KEY" > .key
# KVARENA_MUTMUT_SAMPLE=N: a seeded random sample of N mutants of each module
# (docs/results/suite-strength.md "Mutation score").  mutmut makes every mutant, and its per-test
# stats, before it filters by name, so a name that matches nothing prepares
# the folder without running a mutant; the sample is then drawn from the
# mutants it made.
if [ -n "${KVARENA_MUTMUT_SAMPLE:-}" ]; then
    [ -d mutants ] || nice -n 15 mutmut run "no-such-mutant" > /dev/null 2>&1 || true
    KVARENA_MUTMUT_NAMES="$(python - "$KVARENA_MUTMUT_SAMPLE" <<'PY'
import glob, json, random, sys
n = int(sys.argv[1])
for meta in sorted(glob.glob("mutants/kvarena/**/*.py.meta", recursive=True)):
    keys = sorted(json.load(open(meta))["exit_code_by_key"])
    print(*random.Random(0).sample(keys, min(n, len(keys))))
PY
)"
fi
# KVARENA_MUTMUT_NAMES: run only the mutants these names or globs match (one
# module of a folder, or chosen survivors)
# shellcheck disable=SC2086
KVARENA_VECTORS="$REPO/tests/vectors" nice -n 15 mutmut run --max-children "${KVARENA_MUTMUT_CHILDREN:-2}" \
    ${KVARENA_MUTMUT_NAMES:-} || true
mutmut results --all true > "$STAGE/results.txt" 2>&1 || true
python - "$STAGE/results.txt" <<'PY'
import collections, sys
counts = collections.Counter(line.rsplit(":", 1)[-1].strip() for line in open(sys.argv[1]) if ":" in line)
unrun = counts.pop("not checked", 0)  # outside KVARENA_MUTMUT_NAMES, or an interrupted run
killed = counts.get("killed", 0)
total = sum(counts.values())
print(dict(counts), f"(and {unrun} not run)" if unrun else "")
print(f"mutation score: {killed}/{total} killed" + (f" = {100 * killed / total:.1f}%" if total else ""))
PY
