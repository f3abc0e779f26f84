#!/usr/bin/env bash
# The whole test suite RUNS times in a row from one clean clone: the check that nothing in it
# varies from run to run or with the order of its files (docs/guides/verifying.md, "Flaky tests").
#
# Clones COMMIT of this repository into a fresh folder, makes the venv the README's blocks make
# (torch's CPU wheel, then the [test] extra) plus pytest-randomly, and runs the README's own test
# command RUNS times: odd runs in file order (-p no:randomly), even runs shuffled with the seed
# SEED + run (pytest-randomly shuffles the files and the tests in each, and reseeds `random`).
# Between runs `git clean -xdf` (the venv kept) puts the clone back to a clean checkout.  Stops at
# the first failing run; fails too if two runs' tallies differ.  Not in CI: about 8 minutes a run
# on two cores.  Usage: tools/suite_soak.sh [RUNS] [COMMIT] [SEED]   (default 10, HEAD, 20261200)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
commit=$(git rev-parse "${2:-HEAD}")
seed=${3:-20261200}
test_cmd=$(python3 - <<'PY'
import re
m = re.search(r"<!-- ci: test -->\s*```bash\n(.*?)```", open("README.md").read(), re.S)
print(m.group(1).strip())
PY
)
work=$(mktemp -d /tmp/kvarena-soak.XXXXXX)
echo "== $runs runs of $commit in $work: $test_cmd"
git clone -q "$PWD" "$work/repo" && cd "$work/repo" && git checkout -q "$commit"
python3 -m venv .venv && . .venv/bin/activate
# pip's own output (a mirror's warnings among it) goes to a file, not the soak's log
{ pip install torch==2.13.0 && pip install -e ".[test]" && pip install pytest-randomly; } > "$work/install.log" 2>&1 \
    || { echo "suite_soak: the install failed; see $work/install.log"; exit 1; }
first=""
for ((i = 1; i <= runs; i++)); do
    if ((i % 2)); then order="-p no:randomly"; else order="-p randomly --randomly-seed=$((seed + i))"; fi
    git clean -xdfq -e .venv
    start=$(date +%s)
    if eval "$test_cmd $order" > "$work/run$i.log" 2>&1; then rc=0; else rc=$?; fi
    tally=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$work/run$i.log" | tail -1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*//')
    echo "run $i ($order): rc $rc, $tally, $(( $(date +%s) - start )) s"
    if ((rc)); then echo "suite_soak: run $i failed; its log is $work/run$i.log"; exit 1; fi
    first=${first:-$tally}
    if [[ "$tally" != "$first" ]]; then echo "suite_soak: run $i's tally differs from run 1's ($first)"; exit 1; fi
done
echo "== ok: $runs runs of $commit, each $first"
