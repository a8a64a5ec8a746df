"""Structured output, tool calls and LoRA adapters on the vllm backend: the constraint and the adapter the handler
builds, handed to vLLM's own structured outputs and LoRA, through ``lmi serve`` on SmolLM2-135M-Instruct."""

import json

import httpx
import jsonschema
import openai
import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

pytestmark = pytest.mark.quality

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 16
TARGETS = ["q_proj", "v_proj"]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pets": {"type": "array", "items": {"enum": ["cat", "dog"]},
                                                    "maxItems": 3}},
          "required": ["name", "age", "pets"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, smollm2_dir, make_lora):
    return make_lora(smollm2_dir, tmp_path_factory.mktemp("vllm-lora") / "a1", TARGETS, 1)


@pytest.fixture(scope="module")
def server(serve_module, smollm2_dir, vllm_properties, adapter):
    model = serve_module.model_dir("smollm2", {**vllm_properties, "option.model_id": str(smollm2_dir),
                                               "option.rolling_batch": "vllm", "option.enable_lora": "true",
                                               "option.max_lora_rank": 8, "option.max_new_tokens": 32,
                                               "option.enable_auto_tool_choice": "true",
                                               "option.tool_call_parser": "hermes"})
    (model / "adapters").mkdir()
    (model / "adapters" / "a1").symlink_to(adapter)
    return serve_module([model], ready=False).wait_ready(timeout=900)


def generate(server, prompt, **fields):
    body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}, **fields}
    response = httpx.post(server.url + "/invocations", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_an_adapters_answers_equal_vllms_generate_with_the_same_lora_request(server, smollm2_dir, adapter,
                                                                            vllm_generate):
    lora_engine = {"enable_lora": True, "max_lora_rank": 8}
    with_adapter = vllm_generate(smollm2_dir, PROMPTS, MAX_TOKENS, lora_engine, adapter)
    base = vllm_generate(smollm2_dir, PROMPTS, MAX_TOKENS, lora_engine)
    assert [a["token_ids"] for a in with_adapter] != [b["token_ids"] for b in base]  # the adapter changes answers
    for prompt, want, want_base in zip(PROMPTS, with_adapter, base):
        answer = generate(server, prompt, adapters="a1")
        assert [t["id"] for t in answer["details"]["tokens"]] == want["token_ids"]
        assert [t["id"] for t in generate(server, prompt)["details"]["tokens"]] == want_base["token_ids"]


def test_json_schema_answers_parse_and_validate_sampled_or_greedy(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    for seed in (None, 1, 2):
        answer = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=120,
            temperature=0 if seed is None else 1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                    "strict": True}})
        text = answer.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
        assert answer.choices[0].finish_reason == "stop" and "\n" not in text  # compact JSON, finished in time


def test_a_tgi_regex_grammar_is_followed(server):
    body = {"inputs": "My phone number is", "parameters": {"max_new_tokens": 20,
                                                            "grammar": {"type": "regex", "value": "[0-9]{3}-[0-9]{4}"}}}
    response = httpx.post(server.url + "/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    text = response.json()["generated_text"]
    assert len(text) == 8 and text[3] == "-" and (text[:3] + text[4:]).isdigit(), text


def test_a_forced_tool_call_has_arguments_that_validate(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    answer = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=80,
        temperature=0, tools=[WEATHER], tool_choice="required")
    [call] = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and answer.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
