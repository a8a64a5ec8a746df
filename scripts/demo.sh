#!/usr/bin/env bash
# The main job end to end on the embedded default, SmolLM2-135M-Instruct: convert it once from the GGUF file
# its Python package ships (lmi model smollm2), serve it with `lmi serve` (DJLServing's HTTP API, rolling
# batch) and ask it with curl: a plain completion, the same one streamed, and an OpenAI-style chat question; then
# print the line that serves the chat page. The model goes to ~/.cache/lmi ($LMI_CACHE), 540 MB.
# PORT (default 8080) is where it serves, PORT + 1 its management API; READY_TIMEOUT (default 300) the seconds the
# server has to load the model and answer.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/demo}
PORT=${PORT:-8080}
READY_TIMEOUT=${READY_TIMEOUT:-300}

# Something already answers on this port: a port lmi serve cannot have, and a server whose pages are not ours.
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$PORT" "$((PORT + 1))"; do
  if busy "$port"; then
    free=$((PORT + 2))
    while busy "$free" || busy "$((free + 1))"; do free=$((free + 2)); done
    echo "error: port $port is busy (another server answers on it); the demo needs $PORT and $((PORT + 1))" \
         "(lmi serve's management API). Take others: PORT=$free scripts/demo.sh" >&2
    exit 1
  fi
done

[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
export PATH="${VENV_BIN:-$PWD/.venv/bin}:$PATH"

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
deadline=$((SECONDS + READY_TIMEOUT))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ping")" = 200 ]; do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "error: lmi serve stopped before it answered; the end of $OUT/serve.log:" >&2
    grep -v "GET /ping" "$OUT/serve.log" | tail -15 >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "error: lmi serve did not answer GET /ping with 200 on port $PORT within $READY_TIMEOUT s" \
         "(READY_TIMEOUT=N gives it longer); the end of $OUT/serve.log:" >&2
    grep -v "GET /ping" "$OUT/serve.log" | tail -15 >&2
    exit 1
  fi
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
