#!/usr/bin/env bash
# CUDA checks for kvarena.impl; run on a machine with a GPU, from anywhere.
#   tools/cuda_checks.sh            (uses $PYTHON, else /work/venv/bin/python, else python)
# 1. refuses to "pass" without a CUDA device (the CUDA tests would only skip);
# 2. runs every CUDA-marked test: the differential machine on cuda, the impl
#    unit tests on cuda, the composites (their differential machine and unit
#    tests), and the decode paths (alloc, borrowed alloc(check=False),
#    free(check=False), translate; a composite's alloc_decode + free_swa +
#    translate) under torch.cuda.set_sync_debug_mode("error");
# 3. fails if any CUDA test was skipped.  Exits non-zero on any failure.
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
  tests/test_differential.py tests/test_impl.py tests/test_host_sync.py \
  tests/test_differential_composites.py tests/test_impl_composites.py | tee "$log"
if grep -qiE '[0-9]+ skipped' "$log"; then
  echo "cuda_checks: some CUDA tests were skipped" >&2
  exit 1
fi
echo "cuda_checks: OK"
