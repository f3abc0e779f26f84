#!/usr/bin/env bash
# Every figure in docs/results/simulator.md and simulator-tables.md, by the
# commands the page names (about half an hour on two cores).  Usage:
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
run grid --preset all --trace all --requests 1000
run lmsys-cache --preset all --trace lmsys --requests 1000 --prefix-cache on
run lmsys-no-buffer --preset qwen3-next-80b-a3b,nemotron-h-8b,tri-synthetic --trace lmsys --requests 1000 \
  --prefix-cache on --mamba-radix-cache-strategy no_buffer --setups unified,static-best,vllm-padded
run mixed --preset all --trace balanced,mooncake --requests 1000 --enable-mixed-chunk \
  --setups unified,static-best,vllm-padded
run bands --preset tri-synthetic --trace shift --requests 2000 --seeds 1 --plot docs/results/sim-bands.png
run sweep --preset tri-synthetic --trace balanced --requests 1000 --seeds 3 --rates 10,20,30,40,60,80,160 \
  --plot docs/results/sim-sweep.png
cp "$out/sweep.json" docs/results/sim-sweep-tri-synthetic.json
rm -f docs/results/sim-sweep.png  # the sweep's band picture: the page shows the curves only
if [ -n "$trace" ]; then
  head -1000 "$trace" >"$out/mooncake-1000.jsonl"
  run replay --preset all --trace-file "$out/mooncake-1000.jsonl" --prefix-cache both \
    --setups unified,static-default,static-best,static-shipped,vllm-padded
  run replay-no-buffer --preset qwen3-next-80b-a3b,nemotron-h-8b,tri-synthetic --trace-file "$out/mooncake-1000.jsonl" \
    --prefix-cache on --mamba-radix-cache-strategy no_buffer --setups unified,static-default,vllm-padded
fi
python "$(dirname "$0")/sim_tables.py" "$out"  # docs/results/simulator-tables.md from the reports
