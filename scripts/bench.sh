#!/usr/bin/env bash
# A load-test sweep against `lmi serve`: `lmi bench` starts the server itself, runs each concurrency, and writes
# report.json, report.md, per-request logs and PNG plots to $OUT/report. Extra arguments go to `lmi bench`
# (e.g. scripts/bench.sh --duration 20). See docs/benchmarking.md.
#   scripts/bench.sh                 # the tiny random model: every answer is exactly --max-new-tokens long
#   MODEL=smollm2 scripts/bench.sh   # SmolLM2-135M-Instruct: chat questions, answers end on the model's EOS
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/lmi ] || scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
MODEL=${MODEL:-tiny}

case "$MODEL" in
  tiny)
    OUT=${OUT:-out/bench}
    lmi tiny-model "$OUT/tiny-model"
    model_id=$(cd "$OUT/tiny-model" && pwd)
    workload=(--sweep 1,4,16 --requests 64 --prompt-tokens 64 --max-new-tokens 32) ;;
  smollm2)
    OUT=${OUT:-out/bench-smollm2}
    lmi model smollm2  # converted once into lmi's cache
    model_id=$(python -c 'from lmi_tools.models.smollm2 import default_dir; print(default_dir())')
    # Greedy answers through the chat API, without ignore_eos: output tokens are what the server says each answer
    # had (up to and with EOS), and the report counts the finish reasons.
    workload=(--api openai-chat --no-ignore-eos --extra-body '{"temperature": 0}' --sweep 1,4 --requests 16
              --max-new-tokens 128 --prompt "What is the capital of France?"
              --prompt "Explain photosynthesis in a few sentences." --prompt "Name three primary colours."
              --prompt "Write a haiku about the sea.") ;;
  *) echo "MODEL=$MODEL: use tiny or smollm2" >&2; exit 2 ;;
esac

mkdir -p "$OUT/model"
cat > "$OUT/model/serving.properties" <<PROPS
engine=Python
option.entryPoint=lmi_handlers.entrypoint
option.model_id=$model_id
option.rolling_batch=scheduler
option.max_rolling_batch_size=16
PROPS

# 0.7582 $/h is inf2.xlarge's on-demand price (the AWS inf2 example's): it only shows the cost columns here.
lmi bench --serve "$OUT/model" "${workload[@]}" --price-per-hour 0.7582 --output "$OUT/report" "$@"
