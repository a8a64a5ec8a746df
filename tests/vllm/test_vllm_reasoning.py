"""``option.reasoning_parser`` on the vllm backend: it reaches vLLM's engine as its own engine argument, so that
vLLM's structured outputs wait for the end of the reasoning (the handler leaves the constraint as it is there)."""

import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")


def test_the_parser_reaches_vllms_structured_outputs(thinking_model_dir):
    from vllm import EngineArgs
    from vllm.config import StructuredOutputsConfig

    from lmi_handlers.backends.vllm.engine import VllmBackend
    from lmi_handlers.backends.vllm.options import Options, engine_arg_defaults

    kwargs = Options.from_properties({"reasoning_parser": "deepseek_r1"}).engine_args(
        str(thinking_model_dir), engine_arg_defaults(EngineArgs))
    config = EngineArgs(**kwargs, structured_outputs_config=StructuredOutputsConfig(backend="guidance")) \
        .create_engine_config()
    assert config.structured_outputs_config.reasoning_parser == "deepseek_r1"
    assert VllmBackend.reasoning_aware  # so the handler does not prefix the grammar itself (job._reasoning)
