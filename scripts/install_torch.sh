#!/usr/bin/env bash
# install_torch.sh PYTHON [PIP OPTIONS...]: install torch into PYTHON's environment, before anything that depends on it.
# TORCH_VERSION (default 2.13.0) pins it; TORCH_INDEX_URL, when set, is the index to take it from (PyTorch's CPU
# index, https://download.pytorch.org/whl/cpu, where the default registry would give a CUDA build).
set -euo pipefail
python=$1; shift
index=()
[ -z "${TORCH_INDEX_URL:-}" ] || index=(--index-url "$TORCH_INDEX_URL")
"$python" -m pip install "$@" "${index[@]}" "torch==${TORCH_VERSION:-2.13.0}"
