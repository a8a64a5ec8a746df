"""The vllm backend in DJL's async mode (``option.async_mode=true``): each request one ``generate`` on vLLM's
``AsyncLLM`` (``backends/vllm/async_engine.py``), through ``lmi serve`` on the tiny random model. Sixteen requests in
flight at once answer as vLLM's own ``LLM.generate`` does; sampling fields, structured output, a forced tool call
and a LoRA adapter work as in the rolling-batch path (``test_vllm_tiny.py``, ``test_vllm_features.py``); a client
that goes away is aborted in vLLM; vLLM's own statistics reach ``/metrics`` under its names, and a request's priority
reaches its scheduler (issue 47). One server serves the module (a vLLM start takes a minute and more)."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

IN_FLIGHT = 16
MAX_TOKENS = 10
PROMPTS = [f"{i} little pigs went to the market and" for i in range(IN_FLIGHT)]
#: The engine the server and vLLM's reference both run: room for every request at once, and LoRA.
ENGINE = {"max_num_seqs": IN_FLIGHT, "enable_lora": True, "max_lora_rank": 8}
PET = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}}, "required": ["pet"],
       "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "pick", "parameters": PET}}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, vllm_tiny_model_dir, make_lora):
    return make_lora(vllm_tiny_model_dir, tmp_path_factory.mktemp("vllm-async-lora") / "a1", ["q_proj", "v_proj"], 1)


@pytest.fixture(scope="module")
def server(serve_module, vllm_tiny_model_dir, vllm_properties, adapter):
    model = serve_module.model_dir("tiny", {**vllm_properties, "option.model_id": str(vllm_tiny_model_dir),
                                            "option.backend": "vllm", "option.async_mode": "true",
                                            "option.rolling_batch": "disable", "option.max_rolling_batch_size": 16,
                                            "option.enable_lora": "true", "option.max_lora_rank": 8,
                                            "option.scheduling_policy": "priority"})
    (model / "adapters").mkdir()
    (model / "adapters" / "a1").symlink_to(adapter)
    return serve_module([model], ready=False).wait_ready(timeout=900)


@pytest.fixture(scope="module")
def reference(vllm_tiny_model_dir, vllm_generate, adapter):
    """vLLM's own greedy token ids for PROMPTS, and for the first two with the adapter (one engine for both)."""
    answers = vllm_generate(vllm_tiny_model_dir, [{"prompt": p, "lora": False} for p in PROMPTS] + PROMPTS[:2],
                            MAX_TOKENS, ENGINE, adapter)
    return answers[:IN_FLIGHT], answers[IN_FLIGHT:]


def post(server, body, path="/predictions/tiny"):
    return httpx.post(server.url + path, json=body, timeout=300)


def greedy(prompt, **extra):
    return {"inputs": prompt, "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}, **extra}


def ids(answer):
    assert answer.status_code == 200, answer.text
    return [token["id"] for token in answer.json()["details"]["tokens"]]


def streamed_ids(server, body):
    with httpx.stream("POST", server.url + "/predictions/tiny", json={**body, "stream": True}, timeout=300) as answer:
        return [json.loads(line)["token"]["id"] for line in answer.iter_lines() if line]


def test_sixteen_in_flight_answer_as_vllms_generate_streamed_or_not(server, reference):
    plain, _ = reference
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        got = list(pool.map(lambda i: streamed_ids(server, greedy(PROMPTS[i])) if i % 2 else
                            ids(post(server, greedy(PROMPTS[i]))), range(IN_FLIGHT)))
    assert got == [answer["token_ids"] for answer in plain]
    assert "DJL's async engine: option.async_mode=true" in server.logs()


def test_sampling_fields_structured_output_a_tool_call_and_an_adapter_side_by_side(server, reference):
    _, with_adapter = reference
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Pick a pet."}], "max_tokens": 40,
            "temperature": 0}
    calls = {
        "bias": lambda: post(server, greedy(PROMPTS[0], parameters={"max_new_tokens": MAX_TOKENS, "details": True,
                                                                     "logit_bias": {"42": 100}, "ignore_eos": True})),
        "top": lambda: post(server, greedy(PROMPTS[1], parameters={"max_new_tokens": 3, "details": True,
                                                                    "top_logprobs": 2})),
        "schema": lambda: post(server, {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}},
            "/v1/chat/completions"),
        "tool": lambda: post(server, {**chat, "tools": [TOOL], "tool_choice": {"type": "function",
                                                                              "function": {"name": "pick"}}},
                             "/v1/chat/completions"),
        "adapter 0": lambda: post(server, greedy(PROMPTS[0], adapters="a1")),
        "adapter 1": lambda: post(server, greedy(PROMPTS[1], adapters="a1")),
        "unknown adapter": lambda: post(server, greedy(PROMPTS[0], adapters="nope")),
        "outside the vocabulary": lambda: post(server, greedy(PROMPTS[0], parameters={"logit_bias": {"999999": 1}})),
    }
    with ThreadPoolExecutor(len(calls)) as pool:
        got = dict(zip(calls, pool.map(lambda call: call(), calls.values())))
    assert ids(got["bias"]) == [42] * MAX_TOKENS
    for token in got["top"].json()["details"]["tokens"]:
        assert [alt["id"] for alt in token["top_logprobs"]][:1] == [token["id"]] and len(token["top_logprobs"]) == 2
    jsonschema.validate(json.loads(got["schema"].json()["choices"][0]["message"]["content"]), PET)
    [call] = got["tool"].json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "pick"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PET)
    assert [ids(got["adapter 0"]), ids(got["adapter 1"])] == [a["token_ids"] for a in with_adapter]
    assert got["unknown adapter"].status_code == 404 and "a1" in got["unknown adapter"].text
    assert got["outside the vocabulary"].status_code == 400 and "logit_bias" in got["outside the vocabulary"].text


def test_a_client_that_goes_away_is_aborted_in_vllm(server):
    import time

    body = {"inputs": PROMPTS[0], "stream": True, "parameters": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/predictions/tiny", json=body, timeout=300) as answer:
        next(answer.iter_lines())
    deadline = time.monotonic() + 60
    while httpx.get(server.management_url + "/models/tiny").json()[0]["activeRequests"]:
        assert time.monotonic() < deadline, "the request still runs after its client went away"
        time.sleep(0.2)
    assert ids(post(server, greedy(PROMPTS[2]))) and post(server, greedy(PROMPTS[3])).status_code == 200


def test_vllms_own_statistics_reach_metrics_and_a_priority_reaches_its_scheduler(server, reference):
    """AsyncLLM's stat logger feeds the gauges, which lmi serve reads from the handler while requests run and once
    after the last (there is no step answer to carry them in async mode)."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from lmi_tools.serving.async_channel import STATS_EVERY

    def samples_now():
        text = httpx.get(server.url + "/metrics", timeout=10).text
        return {sample.name: sample for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name.startswith("vllm:")}

    def queries(samples):
        return samples["vllm:prefix_cache_queries_total"].value if "vllm:prefix_cache_queries_total" in samples else 0

    plain, _ = reference
    time.sleep(STATS_EVERY + 0.5)  # lmi serve's read after the last request of the tests before
    before = queries(samples_now())
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": MAX_TOKENS, "details": True, "priority": -3}}
    answer = post(server, body)
    assert ids(answer) == plain[0]["token_ids"]
    prompt_tokens = answer.json()["details"]["prompt_tokens"]
    deadline = time.monotonic() + 10
    while True:  # lmi serve reads the numbers once a second, and once after the last request
        samples = samples_now()
        if (queries(samples) - before == prompt_tokens and not samples["vllm:num_requests_running"].value) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert samples["vllm:num_requests_running"].labels == {"model_name": "tiny", "engine": "0"}
    assert samples["vllm:num_requests_running"].value == 0 and samples["vllm:num_requests_waiting"].value == 0
    assert samples["vllm:kv_cache_usage_perc"].value == 0  # idle: vLLM holds no block for a request
    assert queries(samples) - before == prompt_tokens  # vLLM looked the prompt up in its prefix cache
    assert samples["vllm:lora_requests_info"].labels["max_lora"].isdigit()  # LoRA is on: vLLM's own series
