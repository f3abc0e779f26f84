#!/usr/bin/env bash
# A small SGLang server on kvarena, end to end: needs a GPU, SGLang's full
# install (its CUDA kernels and server dependencies) and a local model
# directory of a hybrid model (config and tokenizer; --load-format dummy
# needs no weights).  Starts the server with KVARENA_SGLANG=1 (the plugin
# hook installs kvarena's allocators in every scheduler process) at SGLang's
# defaults (overlap scheduling on), waits for it, sends generate requests,
# and checks that the scheduler logged kvarena's allocator and that every
# request was answered.
#   tools/sglang_server_check.sh MODEL_DIR [PORT]      (uses $PYTHON, else python)
set -euo pipefail
MODEL="${1:?usage: tools/sglang_server_check.sh MODEL_DIR [PORT]}"
PORT="${2:-30123}"
PY="${PYTHON:-python}"
log="$(mktemp)"
KVARENA_SGLANG=1 "$PY" -m sglang.launch_server --model-path "$MODEL" --load-format dummy \
  --enable-unified-memory --mem-fraction-static 0.3 --port "$PORT" >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "sglang_server_check: the server exited" >&2; exit 1; fi
  sleep 2
done
for i in $(seq 1 8); do
  curl -sf "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
    -d "{\"text\": \"request $i: the same long shared prefix, then a tail\", \"sampling_params\": {\"max_new_tokens\": 64, \"temperature\": 0}}" \
    >/dev/null || { cat "$log"; echo "sglang_server_check: request $i failed" >&2; exit 1; }
done
if ! grep -q "kvarena.sglang: SGLang's unified-memory allocators are kvarena's" "$log"; then
  cat "$log"; echo "sglang_server_check: the scheduler did not install kvarena" >&2; exit 1
fi
echo "sglang_server_check: OK (8 requests answered by a server on kvarena)"
