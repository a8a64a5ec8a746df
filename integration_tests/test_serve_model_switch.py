"""The model-switching setup (``lmi serve smol=... tiny=... --one-at-a-time``) under real clients: a request for a
model the server knows but has not loaded is never answered by another model, on any route, and the streams of a
model being unloaded end at once with an error that names the switch (docs/serving.md, "The chat page")."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from botocore.exceptions import ClientError
from huggingface_hub import InferenceClient
from huggingface_hub.errors import GenerationError

from .test_serve_sagemaker import runtime

SMOL, TINY = "Smol answers here.", "Tiny answers here."


@pytest.fixture(scope="module")
def server(serve_module):
    return serve_module([serve_module.scripted("smol", **{"option.scripted_text": SMOL}),
                         serve_module.scripted("tiny", **{"option.scripted_text": TINY})], args=["--one-at-a-time"])


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def activate(server, name: str) -> None:
    assert httpx.post(f"{server.url}/ui/models/{name}/activate", timeout=30).status_code == 202
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        models = {m["name"]: m["status"] for m in httpx.get(server.url + "/ui/models").json()["models"]}
        if models[name] == "READY":
            return
        time.sleep(0.1)
    raise TimeoutError(f"{name} did not load")


def assert_names_the_unloaded_model(message: str, name: str) -> None:
    assert f"Model {name} is not loaded (UNLOADED" in message and f"/ui/models/{name}/activate" in message


def test_an_unloaded_model_is_a_503_on_every_route_never_another_models_answer(server, oai):
    with pytest.raises(openai.InternalServerError) as chat:
        oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.value.status_code == 503
    assert_names_the_unloaded_model(chat.value.message, "tiny")
    with pytest.raises(openai.InternalServerError) as completion:
        oai.completions.create(model="tiny", prompt="hi", max_tokens=4)
    assert_names_the_unloaded_model(completion.value.message, "tiny")

    with pytest.raises(ClientError) as invoke:
        runtime(server).invoke_endpoint(EndpointName="tiny", Body=json.dumps({"inputs": "hi"}),
                                        ContentType="application/json")
    assert invoke.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert invoke.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert_names_the_unloaded_model(invoke.value.response["Error"]["Message"], "tiny")

    with pytest.raises(openai.InternalServerError) as retrieve:
        oai.models.retrieve("tiny")
    assert retrieve.value.status_code == 503
    assert_names_the_unloaded_model(retrieve.value.message, "tiny")
    with pytest.raises(openai.NotFoundError):  # a name the server does not know at all
        oai.models.retrieve("nowhere")

    predictions = httpx.post(server.url + "/predictions/tiny", json={"inputs": "hi"})
    assert predictions.status_code == 503
    assert_names_the_unloaded_model(predictions.json()["message"], "tiny")
    with pytest.raises(GenerationError) as tgi:
        InferenceClient(base_url=f"{server.url}/?model_name=tiny", timeout=30).text_generation("hi", max_new_tokens=4)
    assert tgi.value.__cause__.response.status_code == 503
    assert_names_the_unloaded_model(str(tgi.value), "tiny")
    # A name the server does not know still reaches its one loaded model (clients send names of their own).
    other = oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert other.choices[0].message.content == SMOL[:4] and other.model == "smol"  # the model that answered


def test_after_a_switch_each_name_reaches_its_own_model_or_a_503(server, oai):
    activate(server, "tiny")
    try:
        answer = oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert answer.choices[0].message.content == TINY[:4] and answer.model == "tiny"
        body = runtime(server).invoke_endpoint(EndpointName="tiny", Body=json.dumps({"inputs": "hi", "parameters": {
            "max_new_tokens": 4}}), ContentType="application/json")["Body"].read()
        assert json.loads(body)["generated_text"] == TINY[:4]
        with pytest.raises(openai.InternalServerError) as smol:
            oai.completions.create(model="smol", prompt="hi", max_tokens=4)
        assert_names_the_unloaded_model(smol.value.message, "smol")
    finally:
        activate(server, "smol")


@pytest.fixture
def switching(serve):
    """A slow rolling-batch model loaded, a plain streaming one to switch to."""
    slow = {"option.rolling_batch": "scheduler", "option.scripted_step_delay_ms": 200, "option.max_new_tokens": 400}
    plain = {"option.scripted_step_delay_ms": 200, "option.max_new_tokens": 400}
    return serve([serve.scripted("fox", **slow), serve.scripted("owl", **plain)], args=["--one-at-a-time"])


def read_stream(url: str, body: dict, lines: list[str], done: threading.Event) -> None:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
    done.set()


@pytest.mark.parametrize("first,second", [("fox", "owl"), ("owl", "fox")])
def test_a_switch_ends_the_unloaded_models_streams_at_once_naming_the_switch(switching, first, second):
    if first != "fox":
        activate(switching, first)
    lines: list[str] = []
    done = threading.Event()
    url = f"{switching.url}/predictions/{first}"
    body = {"inputs": "hi", "stream": True}
    reader = threading.Thread(target=read_stream, args=(url, body, lines, done), daemon=True)
    reader.start()
    deadline = time.monotonic() + 20
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) >= 2, "the stream never started"
    began = time.monotonic()
    activate(switching, second)
    assert done.wait(10), "the unloaded model's stream was left open"
    assert time.monotonic() - began < 10
    last = json.loads(lines[-1])
    assert last["code"] == 503
    assert last["error"] == f"model {first} was unloaded: the server switched to model {second} (--one-at-a-time)"
