"""Request parsing: three schemas in, typed requests out, and a 400 naming field/value/allowed otherwise."""

import pytest

from lmi_handlers.errors import InvalidRequest
from lmi_handlers.request import RequestLimits, SamplingParams, Schema, decode_body, parse_payload


def parse(data, default_max_new_tokens=30):
    return parse_payload(data, default_max_new_tokens)


def test_lmi_schema_with_every_parameter():
    payload = parse({"inputs": "Hi", "stream": True, "parameters": {
        "max_new_tokens": 7, "do_sample": True, "temperature": 0.5, "top_k": 5, "top_p": 0.9,
        "repetition_penalty": 1.2, "stop": ["\n", "END"], "seed": 42, "details": True, "return_full_text": True,
        "ignore_eos": True}})
    (request,) = payload.requests
    assert not payload.many and request.stream
    assert request.schema is Schema.LMI and request.prompt == "Hi"
    assert (request.sampling.do_sample, request.sampling.temperature, request.sampling.top_k) == (True, 0.5, 5)
    assert (request.sampling.top_p, request.sampling.repetition_penalty, request.sampling.seed) == (0.9, 1.2, 42)
    assert request.stopping.max_new_tokens == 7 and request.stopping.stop == ("\n", "END")
    assert request.stopping.ignore_eos and request.details and request.return_full_text


def test_defaults_and_aliases():
    (request,) = parse({"inputs": "Hi", "parameters": {"stop_sequences": "x", "ignore_eos_token": False}},
                       default_max_new_tokens=12).requests
    assert request.sampling.greedy and request.stopping.max_new_tokens == 12
    assert request.stopping.stop == ("x",)


def test_null_means_not_sent():
    (request,) = parse({"inputs": "Hi", "stream": None, "parameters": {"max_new_tokens": None, "temperature": None,
                                                                      "stop": None}}, 12).requests
    assert request.stopping.max_new_tokens == 12 and request.sampling.temperature == 1.0 and not request.stream


def test_temperature_zero_means_greedy_even_when_sampling():
    (request,) = parse({"inputs": "Hi", "parameters": {"do_sample": True, "temperature": 0}}).requests
    assert request.sampling.greedy


def test_list_inputs_make_a_list_answer():
    payload = parse({"inputs": ["a", "b"], "parameters": {"max_new_tokens": 3}})
    assert payload.many and [r.prompt for r in payload.requests] == ["a", "b"]


def test_chat_schema():
    (request,) = parse({"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                  {"type": "text", "text": "there"}]}],
                        "max_tokens": 9, "temperature": 0, "stream": True, "logprobs": True, "model": "m",
                        "stream_options": {"include_usage": True}, "n": 1}).requests
    assert request.schema is Schema.CHAT
    assert request.messages == (("system", "Be brief."), ("user", "Hi there"))
    assert request.stopping.max_new_tokens == 9 and request.sampling.greedy and request.stream
    assert request.details and request.model == "m" and request.include_usage


def test_chat_samples_by_default_like_openai():
    (request,) = parse({"messages": [{"role": "user", "content": "x"}]}).requests
    assert request.sampling.do_sample and request.sampling.temperature == 1.0


def test_legacy_inf2_schema():
    payload = parse({"text": ["Hello", "Bye"], "seq_length": 40})
    assert payload.many and all(r.schema is Schema.LEGACY and r.seq_length == 40 for r in payload.requests)
    assert all(r.return_full_text and r.sampling.greedy for r in payload.requests)


@pytest.mark.parametrize("data, field, fragment", [
    ({"inputs": ""}, "inputs", "expected a non-empty string"),
    ({"inputs": 5}, "inputs", "expected a non-empty string"),
    ({"inputs": []}, "inputs", "non-empty list"),
    ({"inputs": ["ok", ""]}, "inputs[1]", "expected a non-empty string"),
    ({"inputs": "x", "parameters": []}, "parameters", "expected a JSON object"),
    ({"inputs": "x", "parameters": {"max_new_tokens": 0}}, "parameters.max_new_tokens", "integer >= 1"),
    ({"inputs": "x", "parameters": {"max_new_tokens": 2.5}}, "parameters.max_new_tokens", "integer >= 1"),
    ({"inputs": "x", "parameters": {"temperature": -1}}, "parameters.temperature", "number in [0, 2]"),
    ({"inputs": "x", "parameters": {"temperature": "hot"}}, "parameters.temperature", "number in [0, 2]"),
    ({"inputs": "x", "parameters": {"top_p": 1.7}}, "parameters.top_p", "(0, 1]"),
    ({"inputs": "x", "parameters": {"top_p": 0}}, "parameters.top_p", "(0, 1]"),
    ({"inputs": "x", "parameters": {"top_k": -2}}, "parameters.top_k", "integer >= 0"),
    ({"inputs": "x", "parameters": {"repetition_penalty": 0}}, "parameters.repetition_penalty", "number > 0"),
    ({"inputs": "x", "parameters": {"seed": -1}}, "parameters.seed", "integer >= 0"),
    ({"inputs": "x", "parameters": {"do_sample": "yes"}}, "parameters.do_sample", "true or false"),
    ({"inputs": "x", "parameters": {"details": 1}}, "parameters.details", "true or false"),
    ({"inputs": "x", "parameters": {"stop": [""]}}, "parameters.stop", "non-empty strings"),
    ({"inputs": "x", "parameters": {"stop": ["a"] * 17}}, "parameters.stop", "at most 16"),
    ({"inputs": "x", "stream": "true"}, "stream", "true or false"),
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "allowed roles"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]",
     "only text parts"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2, "temperature": 0}, "n", "needs sampling"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 129}, "n", "<= 128"),
    ({"inputs": "x", "parameters": {"n": 3}}, "parameters.n", "set parameters.do_sample to true"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs", "logprobs: true"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -0.5}, "temperature", "number in [0, 2]"),
    # OpenAI's range, which vLLM's SamplingParams keeps too: both engines refuse 3 alike
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature", "number in [0, 2]"),
    ({"inputs": "x", "parameters": {"temperature": 2.01}}, "parameters.temperature", "number in [0, 2]"),
    # OpenAI's rules: a tool result names the call it answers; stream_options only with a stream
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "21C"}]},
     "messages[1].tool_call_id", "needs the id of the call it answers"),
    ({"messages": [{"role": "tool", "content": "21C", "tool_call_id": ""}]}, "messages[0].tool_call_id",
     "non-empty string"),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}, "stream_options",
     'allowed only with "stream": true'),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage", "true or false"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
    ({"inputs": "x", "parameters": {"logit_bias": {"a": 1}}}, "parameters.logit_bias.a", "token ids"),
    ({"inputs": "x", "parameters": {"logit_bias": {"5": 101}}}, "parameters.logit_bias.5", "[-100, 100]"),
    ({"inputs": "x", "parameters": {"min_p": 1.5}}, "parameters.min_p", "[0, 1]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", "integer >= 1"),
    ({"text": "x", "seq_length": 1}, "seq_length", "integer >= 2"),
    # whitespace is no prompt, and OpenAI's fields keep their JSON types (true is not 1, 5 is not a name)
    ({"inputs": " \n\t "}, "inputs", "not only whitespace"),
    ({"inputs": ["ok", "   "]}, "inputs[1]", "not only whitespace"),
    ({"text": "  "}, "text", "not only whitespace"),
    ({"messages": [{"role": "user", "content": " \n "}]}, "messages[0].content", "not only whitespace"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]}, "messages[0].content",
     "not only whitespace"),
    ({"messages": [{"role": "user", "content": "x"}], "n": True}, "n", "expected an integer"),
    ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages[0].name", "expected a string"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": False}, "top_logprobs", "expected an integer"),
    ({"messages": [{"role": "user", "content": "x"}], "user": 7}, "user", "expected a string"),
    # numbers JSON can carry but no field can hold
    ({"inputs": "x", "parameters": {"temperature": 10 ** 400}}, "parameters.temperature", "number in [0, 2]"),
    ({"inputs": "x", "parameters": {"seed": 2 ** 64}}, "parameters.seed", "<= "),
    ({"inputs": "x", "parameters": {"top_p": float("nan")}}, "parameters.top_p", "(0, 1]"),
    (["not", "an", "object"], "body", "expected a JSON object"),
])
def test_invalid_values_name_field_value_and_allowed(data, field, fragment):
    with pytest.raises(InvalidRequest) as info:
        parse(data)
    assert info.value.status == 400
    assert info.value.field == field
    assert str(info.value).startswith(field) and fragment in str(info.value)


@pytest.mark.parametrize("data, field", [
    ({"inputs": "x", "parameters": {"best_of": 2}}, "parameters.best_of"),
    ({"inputs": "x", "extra": 1}, "extra"),
    ({"messages": [{"role": "user", "content": "x"}], "functions": []}, "functions"),
    ({"text": "x", "seq_length": 10, "batch": 2}, "batch"),
])
def test_unknown_fields_are_refused_with_the_allowed_list(data, field):
    with pytest.raises(InvalidRequest) as info:
        parse(data)
    assert info.value.field == field
    assert f"unknown field {field}" in str(info.value) and "allowed fields are" in str(info.value)


def test_limits_are_checked_before_anything_is_tokenized():
    limits = RequestLimits(max_prompt_chars=10, max_prompts_per_request=3)
    for data, field, fragment in [
            ({"inputs": "x" * 11}, "inputs", "at most 10 characters"),
            ({"inputs": ["a", "b", "c", "d"]}, "inputs", "at most 3 prompts"),
            ({"text": ["a"] * 4, "seq_length": 9}, "text", "at most 3 prompts"),
            ({"messages": [{"role": "system", "content": "123456"}, {"role": "user", "content": "78901"}]},
             "messages", "at most 10 characters in all")]:
        with pytest.raises(InvalidRequest) as info:
            parse_payload(data, 30, limits)
        assert info.value.field == field and fragment in str(info.value)
    assert len(parse_payload({"inputs": ["a", "b", "c"]}, 30, limits).requests) == 3


def test_default_limits_refuse_two_hundred_prompts():
    with pytest.raises(InvalidRequest, match="at most 64 prompts"):
        parse({"inputs": ["hi"] * 200})


@pytest.mark.parametrize("body, fragment", [
    (b'{"inputs": "a\\ud800b"}', "lone surrogate"),  # a JSON escape of half a UTF-16 pair
    (b'{"inputs": "x", "parameters": {"max_new_tokens": ' + b"9" * 5000 + b"}}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # deeper than Python's recursion limit
    (b'{"inputs": "x", "parameters": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, "nested too deeply"),
    (b'{"\\udc00": 1}', "lone surrogate"),
])
def test_bodies_that_used_to_end_in_a_traceback_are_400s(body, fragment):
    with pytest.raises(InvalidRequest) as info:
        decode_body(body, "application/json")
    assert info.value.status == 400 and fragment in str(info.value)


def test_a_lone_surrogate_names_its_field():
    with pytest.raises(InvalidRequest) as info:
        decode_body(b'{"messages": [{"role": "user", "content": "ok \\udfff"}]}', None)
    assert info.value.field == "messages[0].content"


def test_ranges_live_on_the_types():
    """Each field of the typed parameters carries its rule and a docstring; the parsers add none of their own."""
    import dataclasses
    import inspect

    from lmi_handlers import schemas

    for cls in (schemas.SamplingParams, schemas.StoppingParams):
        source = inspect.getsource(cls)
        for field in dataclasses.fields(cls):
            assert isinstance(field.metadata.get("rule"), schemas.Rule), field.name
            assert "#: " in source.split(f"    {field.name}:")[0].rsplit("\n", 2)[-2], field.name
    assert SamplingParams(do_sample=True, temperature=0).greedy  # 0 means greedy, on the type itself


def test_a_body_without_a_known_schema():
    with pytest.raises(InvalidRequest, match="must contain 'inputs'"):
        parse({"prompt": "x"})


def test_decode_body():
    assert decode_body(b'{"inputs": "x"}', "application/json") == {"inputs": "x"}
    assert decode_body(b"plain prompt", "text/plain; charset=utf-8") == {"inputs": "plain prompt"}
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode_body(b"{nope", None)
    with pytest.raises(InvalidRequest, match="request body is empty"):
        decode_body(b"", "application/json")
    with pytest.raises(InvalidRequest, match="not valid UTF-8"):
        decode_body(b"\xff\xfe", None)


def test_the_callers_dict_is_not_modified():
    data = {"inputs": "x", "parameters": {"max_new_tokens": 3, "details": True}}
    snapshot = repr(data)
    parse(data)
    assert repr(data) == snapshot
