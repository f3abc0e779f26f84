#!/usr/bin/env bash
# CUDA checks for kvarena.impl and the SGLang drop-in; run on a machine with a GPU, from anywhere.
#   tools/cuda_checks.sh            (uses $PYTHON, else python)
# Sized to finish within 10 minutes on one H200.  The machine needs no network:
# on a networked Linux x86-64 machine first run `python tools/gpu_wheels.py build`,
# which fills the git-ignored wheels/ (sglang 0.5.23 and Hypothesis at pyproject's
# [test] pin, cp312, under 64 MiB), and carry wheels/ with the run.
# 0. installs from $WHEELS (default wheels/), `pip install --no-deps --no-index`,
#    what this Python lacks: sglang 0.5.23, Hypothesis at the pin where its own
#    differs, any other carried wheel whose distribution it lacks, and kvarena
#    itself (editable) where it is not installed from this checkout; or refuses,
#    naming the missing wheel and the command that builds it (tools/gpu_wheels.py);
# 1. refuses to "pass" without a CUDA device (the CUDA tests would only skip);
# then runs each step below, records it (passed or FAILED, and its seconds) and
# goes on to the next, so that one run reports on every step:
# 2. the probe: does the drop-in import sglang on this device, and if not, which
#    modules are missing (tools/gpu_wheels.py probe);
# 3. the SGLang drop-in's CUDA tests (tests/sglang/: the byte-checked workload on
#    SGLang's three stacks, kvarena's allocator and SGLang's own with its Triton
#    kernels; the drop-in's step path and its frees under sync-debug mode), on the
#    default kernels (Triton on CUDA), then again on torch's kernels
#    (KVARENA_KERNELS=torch, the default of every arena and drop-in built without
#    a choice; checked before those tests run);
# 4. the side-by-side benchmarks on the device (kvarena bench --device cuda), every
#    number in JSON under $CUDA_CHECKS_OUT (default cuda-checks/): bench.json, the
#    decode step against a static free list (lazy and eager, on the default
#    kernels: Triton) and the launches a decode step makes (ops: both kernel
#    choices and the static twin) at batch 1, 64, 256 and 1,024, the memo, and
#    make_room's relocation copy against a plain copy_ of the same bytes at 1 GiB
#    (the torch path and the Triton relocation kernel); bench-copy-256.json, the
#    same copy at 256 MiB; bench-sglang.json, one decode step in SGLang's own
#    stack, kvarena on Triton, kvarena on torch and SGLang's allocator, timed with
#    CUDA events at batch 1, 64, 256 and 1,024, with their launches: figures to
#    put in docs/results/bench.md with the date and the GPU, not a pass/fail;
# 5. the anchor's Triton paths against kvarena's composites (anchor-gpu.json);
# 6. every other CUDA-marked test, on the default kernels: the differential
#    machines on cuda (both draw torch or the compiled Triton kernels for each
#    call, against the spec; their seeded examples reach every required event
#    under two seeds), the relocation kernel compiled against torch's slide, the
#    impl unit tests on cuda, the composites, and the
#    decode paths (alloc, borrowed alloc(check=False), free(check=False),
#    translate; a composite's alloc_decode + free_swa + translate) under
#    torch.cuda.set_sync_debug_mode("error"), so the sync-debug check runs over the
#    Triton path; then the unit, composite and sync-debug tests on torch's kernels;
#    a test run fails if any CUDA test in it was skipped;
# 7. prints one table of the results (tools/cuda_table.py: the steps, the decode
#    step's ratio, the launches, the relocation copy's share of copy_ bandwidth,
#    the SGLang-stack step times, the anchor's check), also written, after every
#    step, to $CUDA_CHECKS_OUT/table.md, so a run cut short still leaves its rows.
# Exits non-zero if any step failed, naming them.
set -euo pipefail
shopt -s nullglob  # "$OUT"/*.json: the JSONs there, none before the first is written
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
WHEELS="${WHEELS:-wheels}"
OUT="${CUDA_CHECKS_OUT:-cuda-checks}"

# 0. what the image lacks, from the carried wheels (or a refusal naming the wheel)
"$PY" tools/gpu_wheels.py install --wheels "$WHEELS"

# 1. a CUDA device, or nothing is checked
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("cuda_checks: no CUDA device visible to torch; nothing was checked")
print("cuda_checks: device", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT/steps.tsv" "$OUT/table.md"
steps="$OUT/steps.tsv"
: >"$steps"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
failed=()

table() {
  "$PY" tools/cuda_table.py --steps "$steps" "$OUT"/*.json >"$OUT/table.md" 2>&1 || true
}

# step NAME COMMAND...: runs it, records its status and seconds; a failure is recorded and the run goes on
step() {
  local name="$1" t0=$SECONDS status=passed
  shift
  echo "cuda_checks: === $name" >&2
  if ! "$@"; then
    status=FAILED
    failed+=("$name")
  fi
  printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" >>"$steps"
  table
}

# cuda_tests KERNELS FILE...: the CUDA-marked tests of FILEs, on KERNELS ("default": Triton on
# CUDA; "torch": KVARENA_KERNELS=torch, checked to be the default first); fails on a skipped one
cuda_tests() {
  local kernels="$1"
  shift
  if [[ "$kernels" == torch ]]; then
    KVARENA_KERNELS=torch "$PY" -c "
import sys, torch
from kvarena.impl import Arena, SubPool
a = Arena(4096, [SubPool('U', 8, 1, 'up'), SubPool('D', 8, 1, 'down')], device='cuda')
sys.exit(0 if a.kernels == 'torch' else 'cuda_checks: KVARENA_KERNELS=torch did not make torch the default')
" || return 1
    KVARENA_KERNELS=torch "$PY" -m pytest -m cuda -q -rs "$@" | tee "$log" || return 1
  else
    "$PY" -m pytest -m cuda -q -rs "$@" | tee "$log" || return 1
  fi
  if grep -qiE '[0-9]+ skipped' "$log"; then
    echo "cuda_checks: some CUDA tests were skipped ($kernels kernels)" >&2
    return 1
  fi
}

bench() {
  "$PY" -m kvarena.cli bench --device cuda --repeats 5 "$@"
}

DROPIN=(tests/sglang/test_workload.py tests/sglang/test_host_sync.py tests/sglang/test_step_frees.py)
CORE=(tests/verification/test_differential.py tests/impl/test_arena.py tests/impl/test_host_sync.py
  tests/verification/test_differential_composites.py tests/impl/test_composites.py
  tests/verification/test_coverage_seeds.py tests/impl/test_relocation.py)
CORE_TORCH=(tests/impl/test_arena.py tests/impl/test_host_sync.py tests/impl/test_composites.py)
BATCHES=1,64,256,1024

# 2. does the drop-in import sglang here (which modules are missing, if not)
step "probe: the drop-in imports sglang" "$PY" tools/gpu_wheels.py probe
# 3. the drop-in's CUDA tests on both kernel choices
step "drop-in CUDA tests, default kernels (Triton)" cuda_tests default "${DROPIN[@]}"
step "drop-in CUDA tests, torch kernels" cuda_tests torch "${DROPIN[@]}"
# 4. the benchmarks: the relocation copy at 1 GiB and 256 MiB, and SGLang's stack
step "bench: decode, ops, memo, copy at 1 GiB" bench --only decode,ops,memo,copy --copy-mb 1024 \
  --decode-batches "$BATCHES" --ops-batches "$BATCHES" --json "$OUT/bench.json"
step "bench: copy at 256 MiB" bench --only copy --copy-mb 256 --json "$OUT/bench-copy-256.json"
step "bench: SGLang-stack decode step" bench --only sglang --sglang-batches "$BATCHES" --json "$OUT/bench-sglang.json"
# 5. the anchor's Triton paths (alloc_extend/alloc_decode of its composites) against kvarena's
#    composites (docs/results/conformance.md); classified like the CPU campaign
step "anchor's Triton paths" "$PY" -m kvarena.anchor.gpu --steps "${ANCHOR_GPU_STEPS:-1000}" --json "$OUT/anchor-gpu.json"
# 6. the differential machines, the unit and composite tests, sync-debug: Triton, then torch
step "CUDA tests, default kernels (Triton)" cuda_tests default "${CORE[@]}"
step "CUDA tests, torch kernels" cuda_tests torch "${CORE_TORCH[@]}"

# 7. one table of every result
table
cat "$OUT/table.md"
if ((${#failed[@]})); then
  printf 'cuda_checks: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "cuda_checks: OK"
