#!/usr/bin/env bash
# The main job end to end on the embedded default: build a tiny model locally and answer requests with it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/lmi demo --out-dir out/demo
