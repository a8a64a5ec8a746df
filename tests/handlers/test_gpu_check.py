"""The prepared GPU check (``benchmarks/gpu_check.py``) runs here in its ``--tiny`` mode, so a GPU machine, which
cannot install or fix anything, is never the first to find it broken; CI never needs a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
# The GPU machines have transformers 5; under 4.x the packed step the check measures does not exist.
pytest.importorskip("transformers", minversion="5.0")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_finds_every_greedy_answer_equal_to_generate():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--concurrency", "1,4",
                          "--new-tokens", "8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "paged runner, packed=True, on cpu" in out and "handler in a batch of 4 vs generate's static batch of 4: " \
        "4/4 equal" in out and "0 handler answers differ from generate" in out, out[-4000:]
