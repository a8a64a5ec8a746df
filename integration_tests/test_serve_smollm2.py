"""The real model over real sockets: ``lmi serve`` (rolling batch) serving SmolLM2-135M-Instruct, asked with the
unmodified ``openai`` client, plain and streamed, and with the LMI schema over httpx."""

import httpx
import openai
import pytest

pytestmark = pytest.mark.quality

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(serve_module, smollm2_dir):
    model = serve_module.model_dir("smollm2", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                               "option.model_id": str(smollm2_dir), "option.rolling_batch": "scheduler",
                                               "option.max_new_tokens": 32})
    return serve_module([model], ready=False).wait_ready(timeout=300)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_chat_answers_and_ends_on_eos(oai):
    answer = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32)
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens < 32


def test_openai_chat_streams_the_same_answer(oai):
    stream = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The capital of France is Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_plain_completion_with_a_stop_sequence(server):
    body = {"inputs": "The capital of France is", "parameters": {"max_new_tokens": 16, "stop": ["\n"]}}
    answer = httpx.post(server.url + "/predictions/smollm2", json=body, timeout=300)
    assert answer.status_code == 200 and answer.json() == {"generated_text": " Paris."}
