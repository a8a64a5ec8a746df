"""``lmi serve`` with ``option.rolling_batch=vllm`` on SmolLM2-135M-Instruct: vLLM's engine driven through DJL's
rolling-batch protocol, asked on every route, against vLLM's own ``LLM.generate``."""

import json
import threading
import time

import boto3
import httpx
import openai
import pytest
from botocore.config import Config

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

pytestmark = pytest.mark.quality

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "The three primary colors are", "Water boils at", "My favourite book is"]
MAX_TOKENS = 24
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_rolling):
    return smollm2_rolling


@pytest.fixture(scope="module")
def reference(smollm2_dir, vllm_generate):
    return {prompt: answer for prompt, answer in zip(PROMPTS, vllm_generate(smollm2_dir, PROMPTS, MAX_TOKENS))}


def generate(server, prompt, **parameters):
    body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True, **parameters}}
    response = httpx.post(server.url + "/invocations", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def in_threads(calls):
    """Run the calls at once (each a (delay, function)); their results in order."""
    results = [None] * len(calls)

    def run(i, delay, call):
        time.sleep(delay)
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, delay, call)) for i, (delay, call) in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_greedy_text_equals_vllms_own_generate(server, reference):
    for prompt in PROMPTS[:3]:
        answer = generate(server, prompt)
        assert answer["generated_text"] == reference[prompt]["text"]
        assert [t["id"] for t in answer["details"]["tokens"]] == reference[prompt]["token_ids"]


def test_a_busy_batch_with_staggered_arrivals_gives_each_prompt_its_own_answer(server, reference):
    answers = in_threads([(0.3 * i, lambda p=prompt: generate(server, p)) for i, prompt in enumerate(PROMPTS)])
    assert [a["generated_text"] for a in answers] == [reference[p]["text"] for p in PROMPTS]


def test_streaming_sends_the_same_tokens(server, reference):
    prompt = PROMPTS[0]
    body = {"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": MAX_TOKENS}}
    with httpx.stream("POST", server.url + "/predictions/smollm2", json=body, timeout=300) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["token"]["id"] for line in lines] == reference[prompt]["token_ids"]
    assert "".join(line["token"]["text"] for line in lines) == lines[-1]["generated_text"] == reference[prompt]["text"]


def test_stop_sequences_seeds_and_details(server, reference):
    text = reference[PROMPTS[1]]["text"]
    stop = text[10:14]
    answer = generate(server, PROMPTS[1], stop=[stop])
    assert answer["generated_text"] == text[:text.index(stop)]
    assert answer["details"]["finish_reason"] == "stop_sequence"
    sampled = [generate(server, PROMPTS[2], do_sample=True, temperature=0.9, seed=7)["generated_text"] for _ in "ab"]
    assert sampled[0] == sampled[1]
    details = generate(server, PROMPTS[2], max_new_tokens=4)["details"]
    assert details["generated_tokens"] == 4 and details["finish_reason"] == "length"
    assert all(t["log_prob"] <= 0 for t in details["tokens"])


def test_a_client_that_goes_away_frees_its_request(server):
    body = {"inputs": PROMPTS[3], "stream": True, "parameters": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/predictions/smollm2", json=body, timeout=300) as response:
        for _ in zip(range(3), response.iter_lines()):
            pass
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = httpx.get(server.url + "/metrics").text
        if 'lmi_running_sequences{model="smollm2"} 0.0' in metrics:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the abandoned stream is still running:\n{metrics}")
    assert generate(server, PROMPTS[4], max_new_tokens=4)["details"]["generated_tokens"] == 4


def test_bad_requests_get_their_own_4xx_and_spare_their_neighbours(server, reference):
    bad = {"inputs": PROMPTS[0], "parameters": {"temperature": -1}}
    too_long = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 600}}
    answers = in_threads([(0, lambda: httpx.post(server.url + "/invocations", json=bad, timeout=300)),
                          (0, lambda: generate(server, PROMPTS[0])),
                          (0, lambda: httpx.post(server.url + "/invocations", json=too_long, timeout=300))])
    assert answers[0].status_code == 400 and "parameters.temperature" in answers[0].text
    assert answers[2].status_code == 400 and "parameters.max_new_tokens" in answers[2].text
    assert answers[1]["generated_text"] == reference[PROMPTS[0]]["text"]


def test_every_route_answers(server, reference):
    expected = reference[PROMPTS[0]]["text"]
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": MAX_TOKENS}}
    assert httpx.post(server.url + "/predictions/smollm2", json=body, timeout=300).json()["generated_text"] == expected
    runtime = boto3.client("sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing",
                           config=Config(retries={"max_attempts": 1}, read_timeout=300))
    plain = runtime.invoke_endpoint(EndpointName="smollm2", Body=json.dumps(body), ContentType="application/json")
    assert json.loads(plain["Body"].read())["generated_text"] == expected
    streamed = runtime.invoke_endpoint_with_response_stream(EndpointName="smollm2",
                                                            Body=json.dumps({**body, "stream": True}))
    lines = b"".join(e["PayloadPart"]["Bytes"] for e in streamed["Body"]).decode().splitlines()
    assert json.loads(lines[-1])["generated_text"] == expected
    tgi = httpx.post(server.url + "/generate", json=body, timeout=300).json()
    assert tgi["generated_text"] == expected
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    chat = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32)
    assert chat.choices[0].message.content == "The capital of France is Paris."
    completion = oai.completions.create(model="smollm2", prompt=PROMPTS[0], temperature=0, max_tokens=MAX_TOKENS)
    assert completion.choices[0].text == expected


def test_vllms_own_statistics_reach_metrics_and_a_priority_reaches_its_scheduler(server, reference):
    """vLLM's scheduler gauges and prefix cache counters, from vLLM's own stat logger (issue 47)."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples_now():
        text = httpx.get(server.url + "/metrics", timeout=10).text
        return {sample.name: sample for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name.startswith("vllm:")}

    before = samples_now().get("vllm:prefix_cache_queries_total")
    answer = generate(server, PROMPTS[0], priority=-3)
    assert answer["generated_text"] == reference[PROMPTS[0]]["text"]
    samples = samples_now()
    assert samples["vllm:num_requests_running"].labels == {"model_name": "smollm2", "engine": "0"}
    assert samples["vllm:num_requests_running"].value == 0 and samples["vllm:num_requests_waiting"].value == 0
    assert samples["vllm:kv_cache_usage_perc"].value == 0  # idle: vLLM holds no block for a request
    queried = samples["vllm:prefix_cache_queries_total"].value - (before.value if before else 0)
    assert queried == answer["details"]["prompt_tokens"]  # vLLM looked the prompt up in its prefix cache
    assert "vllm:lora_requests_info" not in samples  # no LoRA: vLLM has no such series either
