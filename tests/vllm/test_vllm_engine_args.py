"""The vllm backend's options against the installed vLLM: the engine arguments lmi knows without vLLM
(``backends/vllm/engine_args.py``) are its ``EngineArgs`` fields, and what the resolver keeps (as ``lmi validate``
reports it) reaches ``EngineArgs`` typed, with the batch size LMI sends."""

import dataclasses

import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

from lmi_handlers.backends.vllm.engine_args import ENGINE_ARGS  # noqa: E402
from lmi_handlers.backends.vllm.options import engine_arg_defaults  # noqa: E402
from lmi_handlers.deployment import resolve  # noqa: E402


def test_the_engine_arguments_lmi_knows_are_the_installed_vllms():
    from vllm import EngineArgs

    installed = {f.name for f in dataclasses.fields(EngineArgs)}
    assert ENGINE_ARGS == installed, (sorted(installed - ENGINE_ARGS), sorted(ENGINE_ARGS - installed))


def test_what_the_resolver_keeps_reaches_vllms_engine_arguments(tmp_path):
    from vllm import EngineArgs
    from vllm.config import CacheConfig

    deployment = resolve({"rolling_batch": "vllm", "model_dir": str(tmp_path), "num_gpu_blocks_override": "64",
                          "enforce_eager": "true", "kv_cache_dtype": "auto"})
    assert deployment.backend.name == "vllm" and deployment.warnings == ()  # nothing called unknown
    args = EngineArgs(**deployment.options.engine_args(str(tmp_path), engine_arg_defaults(EngineArgs)))
    assert (args.enforce_eager, args.kv_cache_dtype) == (True, "auto")
    # A field whose default is None keeps the text; vLLM's own config types it, as it would from its command line.
    assert CacheConfig(num_gpu_blocks_override=args.num_gpu_blocks_override).num_gpu_blocks_override == 64
    assert args.max_num_seqs == 32  # LMI's rolling batch size, as the plan and lmi validate size for
