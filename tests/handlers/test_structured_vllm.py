"""The constraint as vLLM's structured-output parameters: runs where vLLM imports (the vLLM environment)."""

import pytest

from lmi_handlers.structured.constraint import Constraint
from lmi_handlers.structured.tools import parse_tools
from lmi_handlers.backends.vllm.structured import structured_outputs, structured_outputs_params

vllm_sampling = pytest.importorskip("vllm.sampling_params")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize("constraint, fields", [
    (Constraint("json", '{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}', "f"),
     {"json": SCHEMA, "disable_any_whitespace": True}),
    (Constraint("json", '{"type":"object"}', "f", whitespace=r"[ ]?"),
     {"json": {"type": "object"}, "whitespace_pattern": "[ ]?", "disable_any_whitespace": False}),
    (Constraint("json", '{"type":"object"}', "f", any_object=True), {"json_object": True}),
    (Constraint("regex", "[0-9]{3}", "f"), {"regex": "[0-9]{3}"}),
    (Constraint("choice", '["yes","no"]', "f"), {"choice": ["yes", "no"]}),
])
def test_each_constraint_becomes_the_structured_outputs_vllm_samples_with(constraint, fields):
    params = structured_outputs_params(constraint)
    assert isinstance(params, vllm_sampling.StructuredOutputsParams)
    assert {name: getattr(params, name) for name in fields} == fields
    sampling = vllm_sampling.SamplingParams(max_tokens=8, structured_outputs=params)
    assert sampling.structured_outputs is params


def test_a_forced_tool_call_reaches_vllm_as_the_function_parameters():
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}],
                         "tool_choice": {"type": "function", "function": {"name": "f"}}})
    assert structured_outputs(tools.constraint()) == {"json": SCHEMA, "disable_any_whitespace": True}
    assert structured_outputs(None) is None and structured_outputs_params(None) is None


def test_auto_answers_on_the_vllm_engine_are_read_by_vllms_own_parser(smollm2_dir):
    from transformers import AutoTokenizer

    from lmi_handlers.errors import ConfigError
    from lmi_handlers.structured.tools import ToolOptions, resolve
    from lmi_handlers.backends.vllm.structured import check_tool_parser, tool_call_parser

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
    tools = resolve(parse_tools({"tools": [weather], "parallel_tool_calls": False}), ToolOptions(True, "hermes"),
                    lambda name, calling: tool_call_parser(tokenizer, name, calling))
    text = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"n": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"n": 2}}</tool_call>')
    assert tools.calls(text) == ("Sure. ", [("get_weather", '{"n":1}')])  # vLLM's content; one call (not parallel)
    assert tools.calls("No call here.") == ("No call here.", [])
    check_tool_parser(tokenizer, "hermes")
    with pytest.raises(ConfigError, match=r"option\.tool_call_parser.*python_tag"):
        check_tool_parser(tokenizer, "llama3_json")  # SmolLM2's vocabulary has no <|python_tag|>


def test_a_tool_parser_that_refuses_the_tokenizer_refuses_the_load_before_vllm_starts(smollm2_dir):
    from lmi_handlers.deployment import resolve
    from lmi_handlers.errors import ConfigError

    deployment = resolve({"model_id": str(smollm2_dir), "rolling_batch": "vllm", "enable_auto_tool_choice": "true",
                          "tool_call_parser": "llama3_json"})
    with pytest.raises(ConfigError, match=r"option\.tool_call_parser.*llama3_json"):
        deployment.load()
