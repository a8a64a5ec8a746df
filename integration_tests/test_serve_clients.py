"""The clients users point at a TGI or OpenAI server, unmodified, against lmi serve with two models:
``huggingface_hub.InferenceClient`` (TGI's routes) and the ``openai`` client (chat and completions),
plain and streamed, over real sockets."""

import warnings

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

FOX = " The quick brown fox"
BONJOUR = "Bonjour le monde"


@pytest.fixture(scope="module")
def server(serve_module):
    rolling = {"option.rolling_batch": "scheduler", "option.max_new_tokens": 8}
    return serve_module([serve_module.scripted("fox", **rolling),
                         serve_module.scripted("bonjour", **{"option.scripted_text": BONJOUR})])


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def tgi(server, model):
    # TGI serves one model; with several, lmi serve takes ?model_name= as on /invocations.
    return InferenceClient(base_url=f"{server.url}/?model_name={model}", timeout=30)


def test_huggingface_hub_text_generation(server):
    assert tgi(server, "fox").text_generation("hi", max_new_tokens=5) == FOX[:5]
    details = tgi(server, "bonjour").text_generation("hi", max_new_tokens=3, details=True)
    assert details.generated_text == "Bon" and details.details.finish_reason == "length"
    assert [t.text for t in details.details.tokens] == ["B", "o", "n"]


def test_huggingface_hub_text_generation_streams(server):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a client that thinks it is not talking to TGI warns and drops parameters
        fox = tgi(server, "fox")  # the client must outlive its stream: its session closes with it
        tokens = list(fox.text_generation("hi", max_new_tokens=6, stream=True))
    assert tokens == list(FOX[:6])
    bonjour = tgi(server, "bonjour")
    events = list(bonjour.text_generation("hi", max_new_tokens=4, stream=True, details=True))
    assert events[-1].generated_text == "Bonj" and events[-1].details.generated_tokens == 4


def test_huggingface_hub_sees_validation_errors(server):
    with pytest.raises(ValidationError, match="max_new_tokens"):
        tgi(server, "fox").text_generation("hi", max_new_tokens=0)
    with pytest.raises(ValidationError, match="best_of"):
        tgi(server, "fox").text_generation("hi", best_of=3)


def test_generate_routes_directly(server):
    answer = httpx.post(server.url + "/generate?model_name=fox", json={"inputs": "hi",
                                                                      "parameters": {"max_new_tokens": 4}}).json()
    assert answer == {"generated_text": FOX[:4]}
    with httpx.stream("POST", server.url + "/generate_stream?model_name=fox",
                      json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert len(lines) == 2 and '"generated_text": " T"' in lines[-1]
    info = httpx.get(server.url + "/info?model_name=bonjour").json()
    assert info["model_id"] == "bonjour" and info["max_best_of"] == 1


def test_openai_chat_picks_the_model_named_in_the_body(server, oai):
    """Issue 19 item 8: with two models the `model` field used to be ignored (400 model_name required)."""
    for model, text in (("fox", FOX[:4]), ("bonjour", BONJOUR[:4])):
        answer = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, temperature=0)
        assert answer.choices[0].message.content == text and answer.model == model


def test_openai_chat_streams(server, oai):
    stream = oai.chat.completions.create(model="bonjour", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=7, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == BONJOUR[:7]
    assert chunks[-1].usage.completion_tokens == 7


def test_openai_completions(server, oai):
    answer = oai.completions.create(model="fox", prompt="hi", max_tokens=5, temperature=0)
    assert answer.choices[0].text == FOX[:5] and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 5
    many = oai.completions.create(model="bonjour", prompt=["a", "b"], max_tokens=3, logprobs=0)
    assert [c.text for c in many.choices] == ["Bon", "Bon"] and many.choices[1].logprobs.tokens == ["B", "o", "n"]
    pieces = [c.choices[0].text for c in oai.completions.create(model="fox", prompt="hi", max_tokens=6, stream=True)]
    assert "".join(pieces) == FOX[:6] and len(pieces) == 6


def test_openai_errors_reach_the_client_with_their_message(server, oai):
    with pytest.raises(openai.BadRequestError, match="max_tokens") as caught:
        oai.chat.completions.create(model="fox", messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError, match="`nope` does not exist: this server has fox, bonjour"):
        oai.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        oai.completions.create(model="fox", prompt="hi", presence_penalty=1.5)
    assert [m.id for m in oai.models.list()] == ["fox", "bonjour"]


def test_openai_stream_failing_mid_answer_raises_with_the_message(server, oai):
    stream = oai.completions.create(model="fox", prompt="[[fail@3]]", max_tokens=6, stream=True)
    with pytest.raises(openai.APIError, match="fail"):
        list(stream)


def test_metrics_in_prometheus_text_format(server, oai):
    """Last in this module: the requests above are what it counts."""
    from prometheus_client.parser import text_string_to_metric_families

    list(oai.completions.create(model="fox", prompt="hi", max_tokens=4, stream=True))
    response = httpx.get(server.url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}

    def value(family, sample_name, **labels):
        return sum(s.value for s in families[family].samples
                   if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("lmi_requests", "lmi_requests_total", model="fox", route="/v1/completions", status="200") >= 3
    assert value("lmi_requests", "lmi_requests_total", route="/v1/chat/completions", status="400") >= 1
    assert value("lmi_requests", "lmi_requests_total", model="bonjour", route="/", status="200") >= 2
    assert value("lmi_time_to_first_token_seconds", "lmi_time_to_first_token_seconds_count", model="fox") >= 2
    assert value("lmi_inter_token_latency_seconds", "lmi_inter_token_latency_seconds_count", model="fox") >= 3
    assert value("lmi_request_duration_seconds", "lmi_request_duration_seconds_count", model="bonjour") >= 5
    assert value("lmi_generated_tokens", "lmi_generated_tokens_total", model="bonjour") >= 3 + 4 + 7
    assert value("lmi_prompt_tokens", "lmi_prompt_tokens_total", model="fox") > 0
    assert value("lmi_queue_depth", "lmi_queue_depth", model="fox") == 0
    assert value("lmi_running_sequences", "lmi_running_sequences", model="fox") == 0
    assert value("lmi_model_ready", "lmi_model_ready", model="bonjour") == 1
    assert value("lmi_worker_restarts", "lmi_worker_restarts_total", model="fox") == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_lmi_bench_with_model_against_two_models(server, tmp_path, path):
    """Issue 19 item 8: `lmi bench --model` against the multi-model setup used to get 400s only."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "lmi_tools", "bench", server.url + path, "--model", "bonjour",
                             "-n", "4", "--max-new-tokens", "4", "--prompt-tokens", "4", "--no-plots",
                             "-o", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 requests 0 errors" in result.stdout + result.stderr


def test_huggingface_hub_streams_from_predictions_only_with_tgi_compat(serve):
    """Issue 19 item 8: TGI clients pointed at /predictions/{model} need option.tgi_compat=true (docs/serving.md);
    the server's root and /generate_stream need nothing."""
    server = serve([serve.scripted("compat", **{"option.tgi_compat": "true"})])
    client = InferenceClient(base_url=server.url + "/predictions/compat", timeout=30)
    assert "".join(client.text_generation("hi", max_new_tokens=5, stream=True)) == FOX[:5]
    root = InferenceClient(base_url=server.url, timeout=30)
    assert "".join(root.text_generation("hi", max_new_tokens=5, stream=True)) == FOX[:5]
