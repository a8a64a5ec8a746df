#!/usr/bin/env bash
# The main job end to end on the embedded default, SmolLM2-135M-Instruct: convert it once from the GGUF file
# its Python package ships (lmi model smollm2), serve it with `lmi serve` (DJLServing's HTTP API, rolling
# batch) and ask it with curl: a plain completion, the same one streamed, and an OpenAI-style chat question; then
# print the line that serves the chat page. The model goes to ~/.cache/lmi ($LMI_CACHE), about 540 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
export PATH="${VENV_BIN:-$PWD/.venv/bin}:$PATH"
OUT=${OUT:-out/demo}
PORT=${PORT:-8080}

MODEL=$(python -c 'from lmi_tools.models.smollm2 import default_dir; print(default_dir())')
lmi model smollm2 "$MODEL"
mkdir -p "$OUT/model"
cat > "$OUT/model/serving.properties" <<PROPS
engine=Python
option.entryPoint=lmi_handlers.entrypoint
option.model_id=$MODEL
option.rolling_batch=scheduler
option.max_new_tokens=64
PROPS

lmi serve "$OUT/model" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ping")" = 200 ] && break
  sleep 0.5
done

echo "--- POST /predictions/model (plain completion, stopping at the end of the line)"
curl -s -X POST "http://127.0.0.1:$PORT/predictions/model" -H 'Content-Type: application/json' \
  -d '{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 16, "stop": ["\n"]}}'
echo
echo "--- POST /predictions/model (streamed, one JSON line per token)"
curl -sN -X POST "http://127.0.0.1:$PORT/predictions/model" -H 'Content-Type: application/json' \
  -d '{"inputs": "The capital of France is", "stream": true, "parameters": {"max_new_tokens": 16, "stop": ["\n"]}}'
echo "--- POST /v1/chat/completions (OpenAI chat, the model's chat template, ends on its <|im_end|>)"
curl -s -X POST "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'
echo
echo "--- server log: $OUT/serve.log"
echo "--- the chat page: run this, then open http://127.0.0.1:$PORT/ in a browser (Ctrl-C stops it)"
echo "$(command -v lmi) serve $(realpath "$OUT/model") --port $PORT"
