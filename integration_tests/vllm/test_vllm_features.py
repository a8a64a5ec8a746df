"""Structured output, tool calls and LoRA adapters on the vllm backend: the constraint and the adapter the handler
builds, handed to vLLM's own structured outputs and LoRA, and ``auto`` tool calls read by vLLM's own parser, through
``lmi serve`` on SmolLM2-135M-Instruct; and the Responses and Messages APIs, which answer as the chat route does.

One server serves the module; each test sends its requests at once, so that they share vLLM's steps and the module
needs few generations."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import openai
import pytest

from integration_tests.chat_requests import (ASK, BAD_CONSTRAINTS, TIME, WEATHER,
                                             ask_a_pydantic_tool_with_every_tool_choice)

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

pytestmark = pytest.mark.quality

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 16
TARGETS = ["q_proj", "v_proj"]
#: Schemas that bound the answer's size: nested objects, arrays with bounds, enums, integers.
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                               "pets": {"type": "array", "items": {"enum": ["cat", "dog"]},
                                                        "maxItems": 3}},
               "required": ["name", "age", "pets"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["admin", "dev", "ops"]},
                     "minItems": 1, "maxItems": 3}}, "required": ["name", "tags"], "additionalProperties": False},
        "score": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["user", "score"],
        "additionalProperties": False},
    "numbers": {"type": "object", "properties": {"values": {"type": "array", "minItems": 2, "maxItems": 4,
                                                            "items": {"type": "integer", "minimum": 0,
                                                                      "maximum": 999}}},
                "required": ["values"], "additionalProperties": False},
}
BUDGET = 160
NAMED = {"type": "function", "function": {"name": "get_weather"}}
REGEX = r"[0-9]{3}-[0-9]{4}"


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


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def reference(smollm2_dir, adapter, vllm_generate):
    """vLLM's own greedy answers to ``PROMPTS`` (``LLM.generate``, the engine with LoRA enabled as the server's is):
    with the adapter, and without."""
    lora_engine = {"enable_lora": True, "max_lora_rank": 8}
    return (vllm_generate(smollm2_dir, PROMPTS, MAX_TOKENS, lora_engine, adapter),
            vllm_generate(smollm2_dir, PROMPTS, MAX_TOKENS, lora_engine))


def generate(server, prompt, **fields):
    body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}, **fields}
    response = httpx.post(server.url + "/invocations", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()


def _all(calls):
    """Every call at once (vLLM batches them), results in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def _sampling(seed):
    return {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}


def test_an_adapters_answers_equal_vllms_generate_with_the_same_lora_request(server, reference):
    with_adapter, base = reference
    assert [a["token_ids"] for a in with_adapter] != [b["token_ids"] for b in base]  # the adapter changes answers
    for prompt, want, want_base in zip(PROMPTS, with_adapter, base):
        answer = generate(server, prompt, adapters="a1")
        assert [t["id"] for t in answer["details"]["tokens"]] == want["token_ids"]
        assert [t["id"] for t in generate(server, prompt)["details"]["tokens"]] == want_base["token_ids"]


def test_json_schema_answers_parse_validate_and_end_on_their_own_sampled_or_greedy(oai):
    def chat(name, seed):
        answer = oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": f"Describe a {name} as JSON."}],
            max_tokens=BUDGET, **_sampling(seed),
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                                    "strict": True}})
        return name, answer.choices[0]

    for name, choice in _all([lambda n=n, s=s: chat(n, s) for n in SCHEMAS for s in (None, 1)]):
        text = choice.message.content
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        assert choice.finish_reason == "stop", (name, text)
        assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)  # compact


def _check_calls(calls, functions=(WEATHER, TIME)):
    assert calls
    for name, arguments in calls:
        function = next(f["function"] for f in functions if f["function"]["name"] == name)
        jsonschema.validate(json.loads(arguments), function["parameters"])


def test_every_tool_choice_streamed_or_not_and_a_tool_result_turn(oai, streamed_chat):
    ask = dict(model="smollm2", messages=ASK, tools=[WEATHER, TIME], max_tokens=BUDGET, temperature=0)
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]

    def helper():  # the openai client's own reassembly of the deltas
        with oai.chat.completions.stream(**ask, tool_choice="required") as events:
            return events.get_final_completion().choices[0]

    asks = {
        "required": lambda: oai.chat.completions.create(**ask, tool_choice="required").choices[0],
        "required streamed": lambda: streamed_chat(oai, **ask, tool_choice="required"),
        "required by the client's stream helper": helper,
        "named": lambda: oai.chat.completions.create(**ask, tool_choice=NAMED).choices[0],
        "named streamed": lambda: streamed_chat(oai, **ask, tool_choice=NAMED),
        "one call": lambda: [oai.chat.completions.create(**{**ask, **_sampling(seed)}, tool_choice="required",
                                                         parallel_tool_calls=False).choices[0] for seed in (1, 2)],
        "auto": lambda: oai.chat.completions.create(**ask, tool_choice="auto").choices[0],
        "auto streamed": lambda: streamed_chat(oai, **ask, tool_choice="auto"),
        "none": lambda: oai.chat.completions.create(**{**ask, "max_tokens": 16}, tool_choice="none").choices[0],
        "tool result": lambda: oai.chat.completions.create(**{**ask, "messages": turns, "max_tokens": 24},
                                                           tool_choice="none").choices[0],
    }
    answers = dict(zip(asks, _all(list(asks.values()))))

    def calls_of(choice):
        return [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]

    required = answers["required"]
    assert required.finish_reason == "tool_calls" and required.message.content is None
    _check_calls(calls_of(required))
    for name in ("required", "named"):
        calls, pieces, finish, content = answers[f"{name} streamed"]
        # the stream gives the answer's calls, their arguments in pieces as they were generated (not at the end)
        assert (calls, finish, content) == (calls_of(answers[name]), "tool_calls", None) and pieces > 1
    assert calls_of(answers["required by the client's stream helper"]) == calls_of(required)
    assert [name for name, _ in calls_of(answers["named"])] == ["get_weather"]
    _check_calls(calls_of(answers["named"]))
    for choice in answers["one call"]:
        assert len(choice.message.tool_calls) == 1 and choice.finish_reason == "tool_calls"
        _check_calls(calls_of(choice))
    # auto: vLLM's hermes parser reads the free answer; streamed, the calls come at its end
    auto = answers["auto"]
    calls, _, finish, content = answers["auto streamed"]
    assert (calls, finish, content) == (calls_of(auto), auto.finish_reason, auto.message.content)
    if auto.message.tool_calls:
        _check_calls(calls_of(auto))
    else:
        assert isinstance(auto.message.content, str)
    none = answers["none"]
    assert none.message.tool_calls is None and none.message.content and none.finish_reason == "length"
    assert answers["tool result"].message.content


def test_a_pydantic_tool_with_nested_models_works_with_every_tool_choice(oai):
    ask_a_pydantic_tool_with_every_tool_choice(oai, BUDGET)


def test_the_temperature_range_is_the_hf_engines(oai):
    """Both engines take temperature in [0, 2] (``schemas.MAX_TEMPERATURE``) and refuse 3 with the same 400."""
    chat = dict(model="smollm2", messages=ASK, max_tokens=2)
    assert oai.chat.completions.create(**chat, temperature=2).choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(**chat, temperature=3)
    assert caught.value.body["message"] == "temperature: expected a number in [0, 2], got 3"


def test_constrained_and_free_rows_run_side_by_side_and_free_greedy_rows_equal_vllms_generate(server, oai,
                                                                                              reference):
    _, base = reference

    def person(seed):
        return oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "A person as JSON."}], max_tokens=BUDGET,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}},
            **_sampling(seed)).choices[0].message.content

    def phone():
        response = httpx.post(server.url + "/generate", timeout=600, json={
            "inputs": "My phone number is", "parameters": {"max_new_tokens": 20,
                                                           "grammar": {"type": "regex", "value": REGEX}}})
        assert response.status_code == 200, response.text
        return response.json()["generated_text"]

    def call():
        return oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=BUDGET, temperature=1.0, seed=3).choices[0]

    free = [lambda p=p: generate(server, p) for p in PROMPTS]
    results = _all([*free, lambda: person(None), lambda: person(4), phone, call])
    for answer, want in zip(results, base):
        assert [t["id"] for t in answer["details"]["tokens"]] == want["token_ids"]
    for text in results[2:4]:
        jsonschema.validate(json.loads(text), SCHEMAS["person"])
    assert re.fullmatch(REGEX, results[4]), results[4]
    _check_calls([(c.function.name, c.function.arguments) for c in results[5].message.tool_calls], [WEATHER])


@pytest.mark.parametrize("body, field", BAD_CONSTRAINTS)
def test_bad_schemas_are_400s_naming_the_field_before_anything_runs(oai, body, field):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, extra_body=body)
    assert field in caught.value.message


def test_responses_and_messages_answer_as_the_chat_route_does_on_vllm(server, oai):
    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=600)
    greedy = {"extra_body": {"temperature": 0}}
    responses_tools = [{"type": "function", **tool["function"]} for tool in (WEATHER, TIME)]
    messages_tools = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                      for f in (WEATHER["function"], TIME["function"])]

    def streamed_response(**kwargs):
        return list(oai.responses.create(stream=True, **kwargs))[-1].response

    def streamed_message(**kwargs):
        with claude.messages.stream(**kwargs) as stream:
            return stream.get_final_message()

    asks = {
        "chat": lambda: oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=MAX_TOKENS,
                                                    temperature=0),
        "response": lambda: oai.responses.create(model="smollm2", input=ASK, max_output_tokens=MAX_TOKENS,
                                                 temperature=0),
        "response streamed": lambda: streamed_response(model="smollm2", input=ASK, max_output_tokens=MAX_TOKENS,
                                                       temperature=0),
        "message": lambda: claude.messages.create(model="smollm2", messages=ASK, max_tokens=MAX_TOKENS, **greedy),
        "message streamed": lambda: streamed_message(model="smollm2", messages=ASK, max_tokens=MAX_TOKENS, **greedy),
        "count": lambda: claude.messages.count_tokens(model="smollm2", messages=ASK),
        "chat tools": lambda: oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=BUDGET,
                                                          temperature=0, tools=[WEATHER, TIME]),
        "response tools": lambda: oai.responses.create(model="smollm2", input=ASK, max_output_tokens=BUDGET,
                                                       temperature=0, tools=responses_tools),
        "message tools": lambda: claude.messages.create(model="smollm2", messages=ASK, max_tokens=BUDGET,
                                                        tools=messages_tools, **greedy),
    }
    answers = dict(zip(asks, _all(list(asks.values()))))
    chat = answers["chat"]
    want = chat.choices[0].message.content
    assert want and answers["response"].output_text == answers["response streamed"].output_text == want
    assert answers["message"].content[0].text == answers["message streamed"].content[0].text == want
    assert answers["count"].input_tokens == chat.usage.prompt_tokens == answers["response"].usage.input_tokens
    # auto tool calls, read by vLLM's hermes parser, come back as function_call items and tool_use blocks
    calls = [(c.function.name, json.loads(c.function.arguments))
             for c in answers["chat tools"].choices[0].message.tool_calls or []]
    assert [(i.name, json.loads(i.arguments)) for i in answers["response tools"].output
            if i.type == "function_call"] == calls
    assert [(b.name, b.input) for b in answers["message tools"].content if b.type == "tool_use"] == calls
