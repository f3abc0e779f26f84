#!/usr/bin/env bash
# CUDA checks for kvarena.impl; run on a machine with a GPU, from anywhere.
#   tools/cuda_checks.sh            (uses $PYTHON, else python)
# 1. refuses to "pass" without a CUDA device (the CUDA tests would only skip);
# 2. runs every CUDA-marked test: the differential machine on cuda, the impl
#    unit tests on cuda, the composites (their differential machine and unit
#    tests), and the decode paths (alloc, borrowed alloc(check=False),
#    free(check=False), translate; a composite's alloc_decode + free_swa +
#    translate) under torch.cuda.set_sync_debug_mode("error");
#    and the SGLang drop-in (tests/sglang/: the byte-checked workload on
#    SGLang's three stacks, kvarena's allocator and SGLang's own with its
#    Triton kernels; the drop-in's step path under sync-debug mode);
# 3. fails if any CUDA test was skipped;
# 4. runs the side-by-side benchmarks on the device (kvarena bench --device
#    cuda: the decode step against a static free list, lazy and eager, the
#    memo, and make_room's copy bandwidth against a plain device copy) and
#    writes their numbers to $BENCH_JSON (default bench-cuda.json): ratios to
#    read and put in docs/results/bench.md with the date and the GPU, not a pass/fail.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  PY=python
fi

"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("cuda_checks: no CUDA device visible to torch; nothing was checked")
print("cuda_checks: device", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$PY" -m pytest -m cuda -q -rs \
  tests/verification/test_differential.py tests/impl/test_arena.py tests/impl/test_host_sync.py \
  tests/verification/test_differential_composites.py tests/impl/test_composites.py \
  tests/sglang/test_workload.py tests/sglang/test_host_sync.py | tee "$log"
if grep -qiE '[0-9]+ skipped' "$log"; then
  echo "cuda_checks: some CUDA tests were skipped" >&2
  exit 1
fi
"$PY" -m kvarena.cli bench --device cuda --only decode,ops,memo,copy --copy-mb 1024 \
  --json "${BENCH_JSON:-bench-cuda.json}"
# 5. the anchor's Triton paths (alloc_extend/alloc_decode of its composites)
#    against kvarena's composites, when the anchor is installed here (docs/results/conformance.md); classified like the CPU campaign.
if "$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23'" 2>/dev/null; then
  "$PY" -m kvarena.anchor.gpu --steps "${ANCHOR_GPU_STEPS:-1000}" --json "${ANCHOR_GPU_JSON:-anchor-gpu.json}"
else
  echo "cuda_checks: the anchor (sglang 0.5.23) is not installed: its Triton paths were NOT checked" >&2
fi
echo "cuda_checks: OK"
