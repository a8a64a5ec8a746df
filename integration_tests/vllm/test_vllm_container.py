"""AWS's vLLM container's serving stack for real, on SmolLM2: vLLM's own OpenAI server, started by ``lmi serve
--container vllm`` as the container's entrypoint starts it, with the model.py ``lmi render`` writes. LMI's request
shapes get the same bytes as ``lmi serve`` on DJL's handler with ``option.rolling_batch=vllm`` (``smollm2_rolling``,
greedy); the seeds' and DJL's client recipes (boto3 through ``sagemaker_front.py``, which plays SageMaker Runtime),
``openai``, ``huggingface_hub`` and curl work unchanged; OpenAI's shapes reach vLLM's own handlers; an adapter named
by SageMaker's header and the container's sticky sessions work; a bad request is a 4xx in its protocol's shape.
One container server serves the module (a vLLM start takes minutes)."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

pytest.importorskip("vllm", reason="the vllm container's tests run in the vLLM environment (scripts/test.sh)")

from integration_tests.conftest import ROOT, Server, free_port  # noqa: E402
from integration_tests.test_client_recipes import PostLineIterator, print_response_stream  # noqa: E402

from .conftest import READY_TIMEOUT  # noqa: E402
from .sagemaker_front import runtime_for  # noqa: E402

pytestmark = pytest.mark.quality

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ADAPTER = {"X-Amzn-SageMaker-Adapter-Identifier": "a1"}


class ContainerServer(Server):
    """``lmi serve --container vllm NAME=DIR`` on a free port (vLLM's server has no management API)."""

    def __init__(self, model: str, env: dict[str, str]):
        self.port = free_port()
        self.url, self.management_url = f"http://127.0.0.1:{self.port}", None
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"lmi-vllm-container-{self.port}.log"
        cmd = [sys.executable, "-m", "lmi_tools", "serve", "--container", "vllm", model, "--port", str(self.port)]
        self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.fixture(scope="module")
def container(tmp_path_factory, smollm2_dir, vllm_properties, make_lora):
    directory = tmp_path_factory.mktemp("container") / "smollm2"
    (directory / "adapters").mkdir(parents=True)
    make_lora(smollm2_dir, directory / "adapters" / "a1", ["q_proj", "v_proj"], 3)
    properties = {**vllm_properties, "option.entryPoint": "model.py", "option.model_id": str(smollm2_dir),
                  "option.rolling_batch": "vllm", "option.max_new_tokens": 32, "option.enable_lora": "true",
                  "option.max_lora_rank": 8}
    (directory / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    shutil.copy(ROOT / "model_templates" / "model.py.j2", directory / "model.py")
    server = ContainerServer(f"smollm2={directory}", {"SAGEMAKER_ENABLE_STATEFUL_SESSIONS": "true"})
    yield server.wait_ready(timeout=READY_TIMEOUT)
    server.stop()


def both(container, reference, body, headers=None):
    """The answer of each server's /invocations to the same request, as (status, content type, bytes)."""
    def ask(server):
        answer = httpx.post(server.url + "/invocations", content=json.dumps(body), timeout=300,
                            headers={"Content-Type": "application/json", **(headers or {})})
        return answer.status_code, answer.headers["content-type"], answer.content

    return ask(container), ask(reference)


@pytest.mark.parametrize("body, headers", [
    ({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 16, "details": True}}, None),
    ({"inputs": PROMPTS[1], "stream": True, "parameters": {"max_new_tokens": 8}}, None),
    ({"inputs": PROMPTS[2], "stream": True, "parameters": {"max_new_tokens": 8}}, {"Accept": "text/event-stream"}),
    ({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 12, "stop": [" the"], "return_full_text": True}},
     None),
    ({"text": [PROMPTS[0]], "seq_length": 14}, None),
    ({"inputs": ["hi"], "stream": True, "parameters": {"max_new_tokens": 4}}, None),  # DJL's client: a 400
    ({"inputs": PROMPTS[0], "parameters": {"temperature": -1}}, None),
    ({"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 600}}, None),
])
def test_lmi_shapes_get_djls_bytes(container, smollm2_rolling, body, headers):
    mine, djl = both(container, smollm2_rolling, body, headers)
    assert mine == djl


def test_the_seeds_and_djls_boto3_recipes_work_unchanged(container, smollm2_rolling):
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 12}}
    expected = httpx.post(smollm2_rolling.url + "/invocations", json=body, timeout=300).json()["generated_text"]
    runtime = runtime_for(container.url)
    plain = runtime.invoke_endpoint(EndpointName="smollm2", Body=json.dumps(body), ContentType="application/json")
    assert json.loads(plain["Body"].read())["generated_text"] == expected
    printed = io.StringIO()  # the LMI recipe (seed 003): DJL's json answer in pieces, printed as they come
    with contextlib.redirect_stdout(printed):
        print_response_stream(runtime.invoke_endpoint_with_response_stream(
            EndpointName="smollm2", Body=json.dumps(body), ContentType="application/json"))
    assert printed.getvalue() == expected
    streamed = runtime.invoke_endpoint_with_response_stream(  # the TGI recipe's line iterator on jsonlines
        EndpointName="smollm2", Body=json.dumps({**body, "stream": True}), ContentType="application/json")
    lines = [json.loads(line) for line in PostLineIterator(streamed["Body"])]
    assert lines[-1]["generated_text"] == expected == "".join(line["token"]["text"] for line in lines)
    with pytest.raises(runtime.exceptions.ModelError, match="parameters.temperature"):
        runtime.invoke_endpoint(EndpointName="smollm2", Body=json.dumps({"inputs": "x", "parameters": {
            "temperature": -1}}), ContentType="application/json")


def test_openai_huggingface_hub_and_curl_work_unchanged(container, smollm2_rolling):
    from huggingface_hub import InferenceClient

    oai = openai.OpenAI(base_url=container.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    chat = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32)
    assert chat.choices[0].message.content == "The capital of France is Paris."
    body = {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 12}}
    expected = httpx.post(smollm2_rolling.url + "/invocations", json=body, timeout=300).json()["generated_text"]
    completion = oai.completions.create(model="smollm2", prompt=PROMPTS[1], temperature=0, max_tokens=12)
    assert completion.choices[0].text == expected
    tgi = InferenceClient(base_url=container.url + "/invocations", timeout=300)
    assert tgi.text_generation(PROMPTS[1], max_new_tokens=12, details=True).generated_text == expected
    curl = subprocess.run(["curl", "-s", "-X", "POST", container.url + "/invocations", "-H",
                           "Content-Type: application/json", "-d", json.dumps(body)], capture_output=True, timeout=300)
    assert json.loads(curl.stdout)["generated_text"] == expected


def test_openai_shapes_reach_vllms_own_handler_and_the_adapter_header_works_on_both(container):
    chat = {"messages": QUESTION, "max_tokens": 4, "temperature": 0}
    plain = httpx.post(container.url + "/invocations", json=chat, timeout=300).json()
    assert plain["object"] == "chat.completion" and plain["system_fingerprint"].startswith("vllm-")
    completion = {"prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0}
    via_vllm = httpx.post(container.url + "/invocations", json=completion, headers=ADAPTER, timeout=300).json()
    lmi = {"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 8}}
    via_lmi = httpx.post(container.url + "/invocations", json=lmi, headers=ADAPTER, timeout=300).json()
    base = httpx.post(container.url + "/invocations", json=lmi, timeout=300).json()
    assert via_lmi["generated_text"] == via_vllm["choices"][0]["text"] != base["generated_text"]
    unknown = httpx.post(container.url + "/invocations", json=lmi, headers={
        "X-Amzn-SageMaker-Adapter-Identifier": "a9"}, timeout=300)
    assert unknown.status_code == 404 and "'a9'" in unknown.json()["error"] and "a1" in unknown.json()["error"]


def test_sticky_sessions_carry_lmi_requests(container):
    created = httpx.post(container.url + "/invocations", json={"requestType": "NEW_SESSION"}, timeout=60)
    session = created.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0]
    lmi = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 4}}
    inside = httpx.post(container.url + "/invocations", json=lmi, timeout=300,
                        headers={"X-Amzn-SageMaker-Session-Id": session})
    assert inside.status_code == 200 and "generated_text" in inside.json()
    unknown = httpx.post(container.url + "/invocations", json=lmi, timeout=60,
                         headers={"X-Amzn-SageMaker-Session-Id": "not-a-session"})
    assert unknown.status_code == 400
    closed = httpx.post(container.url + "/invocations", json={"requestType": "CLOSE"}, timeout=60,
                        headers={"X-Amzn-SageMaker-Session-Id": session})
    assert closed.status_code == 200 and closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == session


def test_bad_requests_are_4xx_in_their_protocols_shape(container):
    lmi = httpx.post(container.url + "/invocations", json={"inputs": "x", "parameters": {"top_k": "many"}},
                     timeout=60)
    assert lmi.status_code == 400 and set(lmi.json()) == {"code", "error"} and "parameters.top_k" in lmi.json()["error"]
    chat = httpx.post(container.url + "/invocations", json={"messages": QUESTION, "max_tokens": -1}, timeout=60)
    assert chat.status_code == 400 and set(chat.json()) == {"error"} and "max_tokens" in chat.json()["error"]["message"]
    broken = httpx.post(container.url + "/invocations", content=b'{"inputs": ', timeout=60,
                        headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]
    # A grammar past the budgets is refused at admission, naming its field, before it reaches vLLM's engine.
    hostile = {"inputs": "x", "parameters": {"guided_regex": "(SECRET{1000}){1000}"}}
    grammar = httpx.post(container.url + "/invocations", json=hostile, timeout=60)
    assert grammar.status_code == 400 and "parameters.guided_regex" in grammar.json()["error"]
    after = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2}}
    assert httpx.post(container.url + "/invocations", json=after, timeout=300).status_code == 200


def test_a_client_that_goes_away_is_aborted_in_vllm(container):
    import re
    import socket
    import time

    body = json.dumps({"text": PROMPTS[1], "seq_length": 400}).encode()  # answered whole, at the end
    with socket.create_connection(("127.0.0.1", container.port)) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(2)
    deadline = time.monotonic() + 60
    while True:
        metrics = httpx.get(container.url + "/metrics", timeout=30).text
        running = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", metrics, re.M)
        if running and float(running.group(1)) == 0:
            break
        assert time.monotonic() < deadline, "the request still runs in vLLM after its client went away"
        time.sleep(0.5)
