"""Structured output and tool calling on the real model: ``lmi serve`` (rolling batch, hf engine) serving
SmolLM2-135M-Instruct, asked with the unmodified ``openai`` and ``huggingface_hub`` clients and LMI's schema.

Every constrained answer (JSON schema, regex, forced tool call), greedy or sampled, must parse, validate and,
where the schema bounds its size, end on its own within ``max_tokens``."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient

from .chat_requests import (ASK, BAD_CONSTRAINTS, TIME, WEATHER,
                            ask_a_pydantic_tool_with_every_tool_choice)

pytestmark = pytest.mark.quality

#: Schemas that bound the answer's size (strings and lists have maxima, integers ranges).
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["admin", "dev", "ops"]},
                     "minItems": 1, "maxItems": 3}}, "required": ["name", "tags"], "additionalProperties": False},
        "score": {"type": "integer", "minimum": 0, "maximum": 100}, "active": {"type": "boolean"}},
        "required": ["user", "score", "active"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                              "size": {"type": "string", "enum": ["S", "M", "L"]}},
              "required": ["color", "size"], "additionalProperties": False},
    "numbers": {"type": "object", "properties": {"values": {"type": "array", "minItems": 2, "maxItems": 4,
                                                            "items": {"type": "integer", "minimum": 0,
                                                                      "maximum": 999}}},
                "required": ["values"], "additionalProperties": False},
}
#: Bounded schemas fit in this many tokens even if every character were an escape of its own.
BUDGET = 200
#: Sampled answers come from these seeds, greedy ones from temperature 0.
SEEDS = range(1, 7)


@pytest.fixture(scope="module")
def server(serve_module, smollm2_dir):
    model = serve_module.model_dir("smollm2", {
        "engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": str(smollm2_dir),
        "option.rolling_batch": "scheduler", "option.max_rolling_batch_size": 16, "option.max_new_tokens": 32,
        "option.enable_auto_tool_choice": "true", "option.tool_call_parser": "hermes"})
    return serve_module([model], ready=False).wait_ready(timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _sampling(seed):
    return {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}


def _all(calls):
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_json_schema_answers_parse_validate_and_end_within_max_tokens(oai, server):
    def chat(name, seed):
        answer = oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": f"Give me a {name} as JSON."}], max_tokens=BUDGET,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                                    "strict": True}}, **_sampling(seed))
        return name, answer.choices[0].message.content, answer.choices[0].finish_reason

    def completion(name, seed):
        answer = oai.completions.create(
            model="smollm2", prompt=f"A {name} as JSON:", max_tokens=BUDGET, **_sampling(seed),
            extra_body={"response_format": {"type": "json_schema",
                                            "json_schema": {"name": name, "schema": SCHEMAS[name]}}})
        return name, answer.choices[0].text, answer.choices[0].finish_reason

    def lmi(name, seed):
        sampling = {"do_sample": True, "seed": seed} if seed is not None else {}
        answer = httpx.post(server.url + "/invocations", timeout=600, json={
            "inputs": f"A {name} as JSON:", "parameters": {"guided_json": SCHEMAS[name], "max_new_tokens": BUDGET,
                                                           "details": True, **sampling}}).json()
        return name, answer["generated_text"], answer["details"]["finish_reason"]

    calls = [lambda f=f, n=n, s=s: f(n, s) for n in SCHEMAS for s in (None, *SEEDS) for f in (chat, completion)]
    calls += [lambda n=n, s=s: lmi(n, s) for n in SCHEMAS for s in (None, 1)]
    results = _all(calls)
    valid = 0
    for name, text, finish in results:
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        assert finish in ("stop", "eos_token"), (name, text, finish)
        assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)  # compact
        valid += 1
    print(f"\nJSON schema answers: {valid}/{len(results)} parsed, validated and ended on their own")
    assert valid == len(results) == 4 * 7 * 2 + 4 * 2


def test_regex_answers_match_through_tgi_and_lmi(server):
    tgi = InferenceClient(base_url=server.url, timeout=600)
    pattern = r"[0-9]{3}-[0-9]{4}"

    def hub(seed):
        return tgi.text_generation("Call me at", max_new_tokens=20, grammar={"type": "regex", "value": pattern},
                                   **({"do_sample": True, "seed": seed} if seed else {}))

    def lmi(seed):
        parameters = {"guided_regex": pattern, "max_new_tokens": 20, **({"do_sample": True, "seed": seed} if seed
                                                                        else {})}
        return httpx.post(server.url + "/invocations", json={"inputs": "Call me at", "parameters": parameters},
                          timeout=600).json()["generated_text"]

    texts = _all([lambda s=s, f=f: f(s) for s in (None, *SEEDS) for f in (hub, lmi)])
    assert all(re.fullmatch(pattern, text) for text in texts), texts
    print(f"\nregex answers: {len(texts)}/{len(texts)} matched")


def test_tgi_json_grammar_and_guided_choice(server):
    tgi = InferenceClient(base_url=server.url, timeout=600)
    text = tgi.text_generation("A color:", max_new_tokens=BUDGET, grammar={"type": "json", "value": SCHEMAS["enums"]})
    jsonschema.validate(json.loads(text), SCHEMAS["enums"])
    answer = httpx.post(server.url + "/invocations", timeout=600, json={
        "inputs": "Is Paris in France?", "parameters": {"guided_choice": ["yes", "no"], "max_new_tokens": 8}})
    assert answer.json()["generated_text"] in ("yes", "no")


def test_json_object_is_an_object(oai):
    answer = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "A JSON object."}],
                                         response_format={"type": "json_object"}, max_tokens=BUDGET, temperature=0)
    assert answer.choices[0].message.content.startswith("{")  # best effort: nothing bounds an open object


def _check_call(call, functions):
    function = next(f["function"] for f in functions if f["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), function["parameters"])
    assert call.id and call.type == "function"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_always_validate_and_stream_as_they_are_generated(oai, streamed_chat, choice):
    kwargs = dict(model="smollm2", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=BUDGET,
                  parallel_tool_calls=False)

    def ask(seed, stream):
        if not stream:
            return oai.chat.completions.create(**kwargs, **_sampling(seed)).choices[0]
        with oai.chat.completions.stream(**kwargs, **_sampling(seed)) as events:  # the client's own reassembly
            return events.get_final_completion().choices[0]

    calls = [lambda s=s, st=st: ask(s, st) for s in (None, *SEEDS) for st in (False, True)]
    *choices, raw = _all([*calls, lambda: streamed_chat(oai, **kwargs, temperature=0)])
    for answer in choices:
        assert answer.finish_reason == "tool_calls" and answer.message.content is None
        assert len(answer.message.tool_calls) == 1
        _check_call(answer.message.tool_calls[0], [WEATHER, TIME])
        if isinstance(choice, dict):
            assert answer.message.tool_calls[0].function.name == "get_weather"
    # greedy, the stream gives the answer's call, its arguments in pieces as they were generated (not at the end)
    greedy = [(c.function.name, c.function.arguments) for c in choices[0].message.tool_calls]
    assert [(c.function.name, c.function.arguments) for c in choices[1].message.tool_calls] == greedy
    streamed, pieces, finish, content = raw
    assert (streamed, finish, content) == (greedy, "tool_calls", None) and pieces > 1
    print(f"\nforced tool calls ({choice}): {len(choices)}/{len(choices)} validated")


def test_parallel_required_calls_may_be_several(oai):
    answer = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content":
                                         "Weather and time in Paris and Rome?"}], tools=[WEATHER, TIME],
                                         tool_choice="required", max_tokens=400, temperature=0)
    assert answer.choices[0].finish_reason == "tool_calls" and answer.choices[0].message.tool_calls
    for call in answer.choices[0].message.tool_calls:
        _check_call(call, [WEATHER, TIME])


def test_auto_and_none_and_a_tool_result_turn(oai):
    auto = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="auto",
                                       max_tokens=64, temperature=0).choices[0]
    for call in auto.message.tool_calls or []:
        _check_call(call, [WEATHER])
    assert auto.message.tool_calls or isinstance(auto.message.content, str)
    none = oai.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=16, temperature=0).choices[0]
    assert none.message.tool_calls is None and none.message.content and none.finish_reason == "length"
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    after = oai.chat.completions.create(model="smollm2", messages=turns, tools=[WEATHER], tool_choice="none",
                                        max_tokens=24, temperature=0).choices[0]
    assert after.message.content


def test_a_pydantic_tool_with_nested_models_works_with_every_tool_choice(oai):
    ask_a_pydantic_tool_with_every_tool_choice(oai, BUDGET)


def test_constrained_and_free_rows_share_steps(oai):
    free = dict(model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=32, temperature=0)
    alone = oai.chat.completions.create(**free).choices[0].message.content

    def constrained(seed):
        return oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "A person as JSON."}], max_tokens=BUDGET,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}},
            temperature=1.0, seed=seed).choices[0].message.content

    calls = [lambda s=s: constrained(s) for s in SEEDS] + [lambda: oai.chat.completions.create(**free)] * 4
    results = _all(calls)
    for text in results[:len(SEEDS)]:
        jsonschema.validate(json.loads(text), SCHEMAS["person"])
    assert {r.choices[0].message.content for r in results[len(SEEDS):]} == {alone}


@pytest.mark.parametrize("body, field", [*BAD_CONSTRAINTS,
                                         ({"response_format": {"type": "xml"}}, "response_format.type")])
def test_bad_chat_constraints_are_400s_naming_the_field(oai, body, field):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, extra_body=body)
    assert field in caught.value.message


def test_bad_constraints_on_the_other_routes_name_their_field(oai, server):
    with pytest.raises(openai.BadRequestError, match=r"response_format\.json_schema\.schema"):
        oai.completions.create(model="smollm2", prompt="x", max_tokens=8, extra_body={"response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}})
    with pytest.raises(Exception, match=r"parameters\.grammar\.value"):
        InferenceClient(base_url=server.url).text_generation("x", grammar={"type": "regex", "value": "[a-"})
    answer = httpx.post(server.url + "/invocations", json={"inputs": "x", "parameters": {"guided_json": {
        "type": "integer", "minimum": 5, "maximum": 1}}}, timeout=60)
    assert answer.status_code == 400 and "parameters.guided_json" in answer.json()["error"]
