#!/usr/bin/env bash
# Mutation testing of spec/ and impl/ with mutmut (README "Suite strength").
#
#   tools/mutmut.sh [MODULE ...]     e.g. tools/mutmut.sh spec/arith.py impl/capacity.py
#
# mutmut names each mutant after its file's path and the trampoline compares
# that name with the module's import name, so the paths must match the import
# names.  In this repo they do not (spec/ is installed as kvarena.spec), so
# the script lays the package out as it is installed, in a scratch folder
# (KVARENA_MUTMUT_DIR, default /tmp/kvarena-mutmut), copies the tests and
# pyproject.toml ([tool.mutmut] holds the configuration), and runs mutmut
# there under `nice`.  With MODULE arguments only those files are mutated
# (the default is [tool.mutmut] source_paths).  KVARENA_MUTMUT_PYTEST_ARGS
# adds pytest arguments for one run (e.g. a --deselect while a test is being
# rewritten).  Results: `mutmut results` in that folder; this script prints
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
extra = shlex.split(os.environ.get("KVARENA_MUTMUT_PYTEST_ARGS", ""))
if extra:
    new = new.replace(json.dumps(cfg["pytest_add_cli_args"]), json.dumps(cfg["pytest_add_cli_args"] + extra))
assert (new != block) == bool(only or extra), "write source_paths and pytest_add_cli_args on one line each"
open(dst, "w").write(text.replace(block, new))
PY
cd "$STAGE"
# mutmut keeps results and its test-coverage stats in mutants/; the stats of a
# run over other modules do not cover these, so start afresh when the set changes
MODULES="$(grep '^source_paths' pyproject.toml)"
if [ "$(cat .modules 2>/dev/null)" != "$MODULES" ]; then rm -rf mutants; fi
echo "$MODULES" > .modules
KVARENA_VECTORS="$REPO/tests/vectors" nice -n 10 mutmut run --max-children 2 || true
mutmut results --all true > "$STAGE/results.txt" 2>&1 || true
python - "$STAGE/results.txt" <<'PY'
import collections, sys
counts = collections.Counter(line.rsplit(":", 1)[-1].strip() for line in open(sys.argv[1]) if ":" in line)
killed = counts.get("killed", 0)
total = sum(counts.values())
print(dict(counts))
print(f"mutation score: {killed}/{total} killed" + (f" = {100 * killed / total:.1f}%" if total else ""))
PY
