"""Careless and hostile requests against ``lmi serve``, with real clients where a user has one: every route answers
a 4xx in its own protocol's error shape that names the field the client sent, the routes clients probe exist, and
names copied from URLs never become metric series."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lmi_tools.serving.metrics import ENGINE_METRICS

FOX = " The quick brown fox"
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def server(serve_module):
    rolling = {"option.rolling_batch": "scheduler", "option.max_new_tokens": 8}
    return serve_module([serve_module.scripted("fox", **rolling), serve_module.scripted("bonjour")])


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


OPENAI_SHAPE = {"/v1/completions", "/v1/chat/completions"}
TGI_SHAPE = {"/generate", "/generate_stream", "/"}


@pytest.mark.parametrize("path", sorted(OPENAI_SHAPE | TGI_SHAPE | {"/predictions/fox"}))
def test_json_nested_100000_deep_is_a_4xx_in_the_routes_own_shape(server, path):
    answer = httpx.post(f"{server.url}{path}?model_name=fox", content=DEEP,
                        headers={"content-type": "application/json"}, timeout=30)
    assert 400 <= answer.status_code < 500
    body = answer.json()
    if path in OPENAI_SHAPE:
        assert "nested too deeply" in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    elif path in TGI_SHAPE:
        assert answer.status_code == 422 and body["error_type"] == "validation" and "nested too deeply" in body["error"]
    else:
        assert "nested too deeply" in body["error"]


@pytest.mark.parametrize("stream", ["no", 1, "true"])
def test_tgi_compat_route_streams_only_for_a_boolean_true(server, stream):
    answer = httpx.post(f"{server.url}/?model_name=fox", json={"inputs": "hi", "stream": stream}, timeout=30)
    assert answer.status_code == 422
    assert answer.json() == {"error": f"stream={json.dumps(stream)} is invalid: expected true or false",
                             "error_type": "validation"}
    plain = httpx.post(f"{server.url}/?model_name=fox", json={"inputs": "hi", "stream": False}, timeout=30)
    assert plain.json() == [{"generated_text": FOX[:8]}]


def test_completions_check_stream_options_as_chat_does(oai):
    for create in (oai.completions.create, oai.chat.completions.create):
        kwargs = {"prompt": "hi"} if create == oai.completions.create else {
            "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(openai.BadRequestError, match="unknown field stream_options.bogus: allowed fields are "
                                                         "include_usage"):
            create(model="fox", stream=True, stream_options={"include_usage": True, "bogus": 1}, **kwargs)


@pytest.mark.parametrize("kwargs,field", [({"max_tokens": -1}, "max_tokens: expected an integer >= 1, got -1"),
                                          ({"echo": "yes"}, "echo: expected true or false, got 'yes'"),
                                          ({"temperature": -1}, "temperature: expected a number in [0, 2], got -1"),
                                          ({"logprobs": 21}, "logprobs: expected an integer >= 0 and <= 20")])
def test_completion_errors_name_the_field_the_client_sent(oai, kwargs, field):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="fox", prompt="hi", **kwargs)
    assert field in caught.value.message and "parameters." not in caught.value.message


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt": ""}, "prompt: expected a non-empty string with text in it"),
    ({"prompt": ["ok", " "]}, "prompt[1]: expected a non-empty string with text in it"),
    ({"prompt": "hi", "max_tokens": 5000}, "max_tokens: the prompt is"),  # past the model's 4096 tokens
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, 'stream_options: allowed only with "stream": true'),
    ({"prompt": "hi", "temperature": 3}, "temperature: expected a number in [0, 2], got 3"),
])
def test_completions_errors_found_by_the_handler_name_the_completions_field(oai, kwargs, message):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.completions.create(model="fox", **kwargs)
    said = caught.value.body["message"]  # the error's own text, without the client's "Error code: 400 - "
    assert said.startswith(message) and "inputs" not in said and "parameters." not in said
    assert oai.completions.create(model="fox", prompt="hi", max_tokens=4, temperature=2).choices[0].text


@pytest.mark.parametrize("kwargs, message", [
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "21C"}]},
     "messages[1].tool_call_id: a tool message needs the id of the call it answers"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens: the prompt is"),
    ({"stream_options": {"include_usage": True}}, 'stream_options: allowed only with "stream": true'),
    ({"temperature": 3}, "temperature: expected a number in [0, 2], got 3"),
])
def test_chat_errors_name_the_field_as_openai_does(oai, kwargs, message):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(**{"model": "fox", "messages": [{"role": "user", "content": "hi"}], **kwargs})
    assert caught.value.body["message"].startswith(message)


def test_chat_top_logprobs_error_says_what_is_supported(oai):
    # 0 is what this backend supports (logprobs=true gives each chosen token's log probability); the hf and vllm
    # backends give alternatives too
    with pytest.raises(openai.BadRequestError, match=r"top_logprobs: not supported by the scripted backend \(the hf "
                                                     r"and vllm backends support it\); omit it, got 2"):
        oai.chat.completions.create(model="fox", messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                    top_logprobs=2)


def test_completion_logprobs_come_with_one_top_logprobs_map_per_position(oai):
    # logprobs=0: the chosen token's only; alternatives (logprobs > 0) are the hf and vllm backends'
    with pytest.raises(openai.BadRequestError, match=r"^Error code: 400 - logprobs: not supported by the scripted"):
        oai.completions.create(model="fox", prompt="hi", max_tokens=4, logprobs=2)
    choice = oai.completions.create(model="fox", prompt="hi", max_tokens=4, logprobs=0).choices[0]
    logprobs = choice.logprobs
    assert logprobs.tokens == list(FOX[:4]) and len(logprobs.top_logprobs) == 4
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs)]


def test_health_and_model_retrieval_that_clients_probe(server, oai):
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.content == b""
    fox = oai.models.retrieve("fox")
    assert fox.id == "fox" and fox.object == "model"
    with pytest.raises(openai.NotFoundError, match="`gpt-4o` does not exist: this server has fox, bonjour"):
        oai.models.retrieve("gpt-4o")


def status(server) -> str | None:
    try:
        return httpx.get(server.url + "/ping").json().get("broken", {}).get("status")
    except httpx.ConnectError:  # not listening yet
        return None


def test_health_is_503_while_a_model_cannot_answer(serve):
    server = serve([serve.scripted("broken", **{"option.scripted_fail_load": "true"})], ready=False)
    deadline = time.monotonic() + 30
    while status(server) != "FAILED":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    health = httpx.get(server.url + "/health")
    assert health.status_code == 503 and health.json() == {"error": "not healthy: broken is FAILED",
                                                           "error_type": "unhealthy"}


def test_info_without_a_model_name_answers_in_tgis_shape(server):
    answer = httpx.get(server.url + "/info")
    assert answer.status_code == 422
    assert answer.json() == {"error": "Parameter model_name is required: this server has several models (fox, bonjour)",
                             "error_type": "validation"}


def test_names_from_urls_never_become_metric_series(server):
    for i in range(5):
        httpx.post(f"{server.url}/predictions/random-{i}", json={"inputs": "hi"})
        httpx.get(f"{server.url}/ui/random-{i}")
        httpx.get(f"{server.url}/no/such/route-{i}")
    httpx.post(f"{server.url}/predictions/fox", json={"inputs": "hi"})
    samples = [s for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
               if f.name == "lmi_requests" for s in f.samples if s.name == "lmi_requests_total"]
    assert {s.labels["model"] for s in samples} <= {"fox", "bonjour", "-"}
    assert not [s for s in samples if "random" in s.labels["route"] or "route-" in s.labels["route"]]
    assert sum(s.value for s in samples if s.labels == {"model": "-", "route": "/predictions/{model_name}",
                                                        "status": "404"}) == 5


def test_no_gauge_is_named_like_a_counter():
    assert [metric for metric, counter, _ in ENGINE_METRICS.values() if metric.endswith("_total") and not counter] == []
