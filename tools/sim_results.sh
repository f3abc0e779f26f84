#!/usr/bin/env bash
# Every figure in docs/results/simulator.md and simulator-tables.md, by the
# commands the page names (about 70 minutes on two cores).  Usage:
#
#   tools/sim_results.sh OUT_DIR
#
# Each command writes OUT_DIR/NAME.json and its printed
# reports to OUT_DIR/NAME.txt; the pictures go to docs/results/, and
# tools/sim_tables.py writes docs/results/simulator-tables.md from the reports.
set -euo pipefail
out=${1:?usage: tools/sim_results.sh OUT_DIR}
mkdir -p "$out"
run() {  # NAME ARGS...: one documented command
  local name=$1
  shift
  echo "== $name: kvarena simulate $*" >&2
  kvarena simulate "$@" --json "$out/$name.json" >"$out/$name.txt"
}
run phases --preset all --trace phases --requests 1000 --seeds 3
run phase-bands --preset qwen3-next-80b-a3b --trace phases --requests 1000 --seeds 1 \
  --setups unified,static-default,static-best --plot docs/results/sim-phase-bands.png
run grid --preset gpt-oss-120b,gemma-3-27b,qwen3-next-80b-a3b --trace mooncake --requests 1000 --seeds 3
python "$(dirname "$0")/sim_tables.py" "$out"  # docs/results/simulator-tables.md from the reports
