#!/usr/bin/env bash
# Every figure in docs/results/simulator.md and simulator-tables.md, by the
# commands the page names (about an hour on two cores).  Usage:
#
#   tools/sim_results.sh OUT_DIR [MOONCAKE_TRACE]
#
# MOONCAKE_TRACE: Mooncake's published conversation_trace.jsonl
# (github.com/kvcache-ai/Mooncake, FAST25-release/traces); without it the
# replay is skipped.  Each command writes OUT_DIR/NAME.json and its printed
# reports to OUT_DIR/NAME.txt; the pictures go to docs/results/, and
# tools/sim_tables.py writes docs/results/simulator-tables.md from the reports.
set -euo pipefail
out=${1:?usage: tools/sim_results.sh OUT_DIR [MOONCAKE_TRACE]}
trace=${2:-}
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
run grid --preset all --trace balanced,long,short,mooncake,lmsys --requests 1000 --seeds 3
run sweep --preset tri-synthetic --trace balanced --requests 1000 --seeds 3 --rates 10,20,30,40,60,80,160 \
  --plot docs/results/sim-sweep.png
cp "$out/sweep.json" docs/results/sim-sweep-tri-synthetic.json
rm -f docs/results/sim-sweep.png  # the sweep's band picture: the page shows the curves only
if [ -n "$trace" ]; then
  head -1000 "$trace" >"$out/mooncake-1000.jsonl"
  run replay --preset all --trace-file "$out/mooncake-1000.jsonl" --prefix-cache both \
    --setups unified,unified-uncapped,static-default,static-best,vllm-padded
fi
python "$(dirname "$0")/sim_tables.py" "$out"  # docs/results/simulator-tables.md from the reports
