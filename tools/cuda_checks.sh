#!/usr/bin/env bash
# CUDA checks for kvarena.impl; run on a machine with a GPU, from anywhere.
#   tools/cuda_checks.sh            (uses $PYTHON, else python)
# Sized to finish within 10 minutes on one H200.
# 1. refuses to "pass" without a CUDA device (the CUDA tests would only skip);
# 2. runs every CUDA-marked test on the default kernels, Triton on CUDA: the
#    differential machines on cuda (both draw torch or the compiled Triton
#    kernels for each call, against the spec), the impl unit tests on
#    cuda, the composites, and the decode
#    paths (alloc, borrowed alloc(check=False), free(check=False),
#    translate; a composite's alloc_decode + free_swa + translate) under
#    torch.cuda.set_sync_debug_mode("error"), so the sync-debug check runs
#    over the Triton path; and the SGLang drop-in (tests/sglang/: the
#    byte-checked workload on SGLang's three stacks, kvarena's allocator and
#    SGLang's own with its Triton kernels; the drop-in's step path under
#    sync-debug mode);
# 3. runs the same unit, sync-debug and drop-in CUDA tests again on torch's
#    kernels (KVARENA_KERNELS=torch: the default of every arena and drop-in
#    built without a choice; checked before any test runs);
# 4. fails if any CUDA test was skipped, in either run;
# 5. runs the side-by-side benchmarks on the device (kvarena bench --device
#    cuda) and writes every number to $BENCH_JSON (default bench-cuda.json):
#    the decode step against a static free list (lazy and eager, on the
#    default kernels: Triton), the launches a decode step makes (ops: both
#    kernel choices and the static twin), the memo, make_room's relocation
#    copy against a plain copy_ of the same bytes, and one decode step in
#    SGLang's own stack, kvarena on torch, kvarena on Triton and SGLang's
#    allocator, timed with CUDA events at batch 1, 64, 256 and 1,024, with
#    their launches: ratios and counts to put in docs/results/bench.md with
#    the date and the GPU, not a pass/fail;
# 6. the anchor's Triton paths against kvarena's composites, when the anchor
#    is installed.
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
no_skips() {
  if grep -qiE '[0-9]+ skipped' "$log"; then
    echo "cuda_checks: some CUDA tests were skipped ($1)" >&2
    exit 1
  fi
}

# 2. the default kernels: Triton on CUDA
"$PY" -m pytest -m cuda -q -rs \
  tests/verification/test_differential.py tests/impl/test_arena.py tests/impl/test_host_sync.py \
  tests/verification/test_differential_composites.py tests/impl/test_composites.py \
  tests/sglang/test_workload.py tests/sglang/test_host_sync.py tests/sglang/test_step_frees.py | tee "$log"
no_skips "default kernels"

# 3. torch's kernels: the same unit, sync-debug and drop-in tests (KVARENA_KERNELS is the
#    default of every arena and drop-in built without a choice; checked first)
KVARENA_KERNELS=torch "$PY" -c "
import sys, torch
from kvarena.impl import Arena, SubPool
a = Arena(4096, [SubPool('U', 8, 1, 'up'), SubPool('D', 8, 1, 'down')], device='cuda')
sys.exit(0 if a.kernels == 'torch' else 'cuda_checks: KVARENA_KERNELS=torch did not make torch the default')
"
KVARENA_KERNELS=torch "$PY" -m pytest -m cuda -q -rs \
  tests/impl/test_arena.py tests/impl/test_host_sync.py tests/impl/test_composites.py \
  tests/sglang/test_workload.py tests/sglang/test_host_sync.py tests/sglang/test_step_frees.py | tee "$log"
no_skips "torch kernels"

# 5. the benchmarks, every number in one JSON
"$PY" -m kvarena.cli bench --device cuda --only decode,ops,memo,copy,sglang --repeats 5 --copy-mb 1024 \
  --sglang-batches 1,64,256,1024 --json "${BENCH_JSON:-bench-cuda.json}"

# 6. the anchor's Triton paths (alloc_extend/alloc_decode of its composites)
#    against kvarena's composites, when the anchor is installed here (docs/results/conformance.md); classified like the CPU campaign.
if "$PY" -c "import importlib.metadata as m; assert m.version('sglang') == '0.5.23'" 2>/dev/null; then
  "$PY" -m kvarena.anchor.gpu --steps "${ANCHOR_GPU_STEPS:-1000}" --json "${ANCHOR_GPU_JSON:-anchor-gpu.json}"
else
  echo "cuda_checks: the anchor (sglang 0.5.23) is not installed: its Triton paths were NOT checked" >&2
fi
echo "cuda_checks: OK"
