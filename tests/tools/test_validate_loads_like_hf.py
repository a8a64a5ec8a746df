"""``lmi validate`` and a real hf load of the same model directory: the same KV pool, the same refusal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmi_handlers.config import ConfigError
from lmi_tools.validation.validate import validate_model_dir

pytest.importorskip("torch")

CPU = {"device": "cpu", "rolling_batch": "scheduler", "max_rolling_batch_size": "4", "max_model_len": "40",
       "block_size": "8"}


def model_dir(root: Path, weights: Path, options: dict[str, str]) -> Path:
    lines = ["engine=Python", "option.entryPoint=lmi_handlers.entrypoint", f"option.model_id={weights}",
             "option.backend=hf"]  # auto would be vllm on a g5
    (root / "serving.properties").write_text("\n".join(lines + [f"option.{k}={v}" for k, v in options.items()]))
    return root


def load(weights: Path, options: dict[str, str]):
    from lmi_handlers.deployment import resolve

    return resolve({"backend": "hf", "model_id": str(weights), **options}).load()


@pytest.mark.parametrize("pool", [{}, {"kv_cache_memory_bytes": "40000"}, {"num_gpu_blocks_override": "7"}])
def test_validate_reports_the_pool_the_load_makes(tiny_model_dir, tmp_path, pool):
    options = {**CPU, **pool}
    backend = load(tiny_model_dir, options)
    report = validate_model_dir(model_dir(tmp_path, tiny_model_dir, options), "g5.xlarge")
    assert report.ok, report.errors
    tokens = backend.pool.tokens
    shown = report.figures["kv cache"]
    full = f"4 x {backend.max_sequence_length} tokens"
    assert shown.endswith(f"({full})") if tokens == 4 * backend.max_sequence_length else \
        re.search(rf"a pool of {tokens:,} tokens", shown), (tokens, shown)


def test_validate_refuses_what_the_load_refuses(tiny_model_dir, tmp_path):
    options = {**CPU, "num_gpu_blocks_override": "1"}
    with pytest.raises(ConfigError) as refused:
        load(tiny_model_dir, options)
    report = validate_model_dir(model_dir(tmp_path, tiny_model_dir, options), "g5.xlarge")
    assert [f.message for f in report.errors] == [str(refused.value)]
    assert "the KV cache must hold at least one full-length sequence" in str(refused.value)
