#!/usr/bin/env bash
# A load-test sweep against `lmi serve` on the tiny model: `lmi bench` starts the server itself, runs
# concurrency 1, 4 and 16, and writes report.json, report.md, per-request logs and PNG plots to $OUT/report.
# Extra arguments go to `lmi bench` (e.g. scripts/bench.sh --duration 20). See docs/benchmarking.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/lmi ] || scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=${OUT:-out/bench}

lmi tiny-model "$OUT/tiny-model"
mkdir -p "$OUT/model"
cat > "$OUT/model/serving.properties" <<PROPS
engine=Python
option.entryPoint=lmi_handlers.entrypoint
option.model_id=$(cd "$OUT/tiny-model" && pwd)
option.rolling_batch=scheduler
option.max_rolling_batch_size=16
PROPS

# 0.7582 $/h is inf2.xlarge's on-demand price (the AWS inf2 example's): it only shows the cost columns here.
lmi bench --serve "$OUT/model" --sweep 1,4,16 --requests 64 --prompt-tokens 64 --max-new-tokens 32 \
  --price-per-hour 0.7582 --output "$OUT/report" "$@"
