#!/usr/bin/env bash
# The main job end to end on the embedded default: build a tiny model locally, serve it with `lmi serve`
# (DJLServing's HTTP API) and query it with curl, once plain and once streaming.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=${OUT:-out/demo}
PORT=${PORT:-8080}

lmi tiny-model "$OUT/tiny-model"
mkdir -p "$OUT/model"
cat > "$OUT/model/serving.properties" <<PROPS
engine=Python
option.entryPoint=lmi_handlers.entrypoint
option.model_id=$PWD/$OUT/tiny-model
option.rolling_batch=scheduler
option.max_new_tokens=32
PROPS

lmi serve "$OUT/model" --port "$PORT" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/ping")" = 200 ] && break
  sleep 0.5
done

echo "--- POST /predictions/model (plain)"
curl -s -X POST "http://127.0.0.1:$PORT/predictions/model" -H 'Content-Type: application/json' \
  -d '{"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 24}}'
echo
echo "--- POST /predictions/model (streaming, one JSON line per token)"
curl -sN -X POST "http://127.0.0.1:$PORT/predictions/model" -H 'Content-Type: application/json' \
  -d '{"inputs": "The quick brown fox", "stream": true, "parameters": {"max_new_tokens": 24}}'
echo "--- server log: $OUT/serve.log"
