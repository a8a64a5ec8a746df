#!/usr/bin/env bash
# Create (or update) the project's virtual environment: .venv, or $VENV.
# torch is installed first and pinned, so that nothing pulls a CUDA build: on this project's machines
# `pip install torch==2.13.0` resolves to a CPU wheel; elsewhere add --index-url https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
"$VENV/bin/python" -m pip install -q -e ".[hf,bench,dev]"
