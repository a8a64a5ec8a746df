"""Many concurrent streamed OpenAI completions on the vllm backend, sampled, with prompts vLLM prefills in chunks
and clients that go away mid-stream: the load under which vLLM's CPU engine once stopped (a request with its own
random generator, prefilled in chunks), made small enough for the tiny random model."""

import concurrent.futures
import time

import httpx
import openai
import pytest

pytest.importorskip("vllm", reason="the vllm backend's tests run in the vLLM environment (scripts/test.sh)")

CLIENTS = 16
GONE = 4  # more clients, each reading one chunk and going away
MAX_TOKENS = 16
#: Far more prompt tokens per step than a burst's prompts hold, so that most are prefilled in several steps.
PREFILL_BUDGET = 64


@pytest.fixture(scope="module")
def server(serve_module, vllm_tiny_model_dir, vllm_properties):
    model = serve_module.model_dir("tiny", {**vllm_properties, "option.model_id": str(vllm_tiny_model_dir),
                                            "option.rolling_batch": "vllm", "option.enable_chunked_prefill": "true",
                                            "option.max_rolling_batch_prefill_tokens": PREFILL_BUDGET})
    return serve_module([model], ready=False).wait_ready(timeout=900)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def prompt(i: int) -> str:
    """A prompt of its own (no shared prefix to cache), longer than a step's share of the budget."""
    return f"{i}. " + " ".join(f"word{(7 * i + j) % 50}" for j in range(40))


def stream(client, i: int, leave: bool = False, **fields) -> int:
    """Streams a sampled completion (the OpenAI default temperature); the tokens generated, or 0 if it left."""
    answer = client.completions.create(model="tiny", prompt=prompt(i), max_tokens=MAX_TOKENS, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                                       **fields)
    tokens = 0
    for chunk in answer:
        if leave:
            answer.response.close()
            return 0
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return tokens


def test_a_burst_of_sampled_streams_with_chunked_prefills_and_disconnects_all_finish(server, client):
    with concurrent.futures.ThreadPoolExecutor(CLIENTS + GONE) as pool:
        staying = [pool.submit(stream, client, i) for i in range(CLIENTS)]
        leaving = [pool.submit(stream, client, CLIENTS + i, leave=True) for i in range(GONE)]
        assert [future.result() for future in staying] == [MAX_TOKENS] * CLIENTS
        assert [future.result() for future in leaving] == [0] * GONE
    deadline = time.monotonic() + 60
    while 'lmi_running_sequences{model="tiny"} 0.0' not in httpx.get(server.url + "/metrics").text:
        assert time.monotonic() < deadline, "requests are still running after every client finished or left"
        time.sleep(0.5)
    assert stream(client, 99) == MAX_TOKENS  # the same engine serves on


def test_a_seed_that_would_stop_vllms_cpu_engine_is_refused_alone(server, client):
    with pytest.raises(openai.BadRequestError) as refused:
        stream(client, 0, seed=7)
    assert "seed: vLLM's CPU build stops its engine" in str(refused.value)
    assert "option.enable_chunked_prefill=false" in str(refused.value)
    assert stream(client, 1) == MAX_TOKENS


def test_when_vllms_engine_process_is_killed_a_fresh_worker_serves_the_next_request(server, client):
    """Last in this module: the model's worker is a new process afterwards. A killed engine core leaves vLLM's
    ``LLMEngine.step()`` waiting forever; the handler's watcher ends the worker instead of a predict timeout."""
    import psutil

    # The core is found before the request and killed at the first token: the tiny model streams the rest in about
    # a second and a half, which a busy CI machine once spent before the kill (the stream then ended whole).
    [core] = [process for process in psutil.Process(server.process.pid).children(recursive=True)
              if process.cmdline()[:1] == ["VLLM::EngineCore"]]
    body = {"model": "tiny", "prompt": prompt(5), "max_tokens": 350, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        core.kill()
        rest = "\n".join(lines)
    assert "the worker process died" in rest and "no answer within" not in rest, rest[-500:]
    # lmi serve starts a fresh worker at once (answering 503 "not ready" meanwhile), then serves on.
    deadline = time.monotonic() + 900
    while (worker := httpx.get(server.management_url + "/models/tiny").json()[0]["workerGroups"][0]["workers"][0]) \
            != {**worker, "status": "READY", "restarts": 1}:
        assert time.monotonic() < deadline, worker
        time.sleep(0.5)
    assert stream(client, 6) == MAX_TOKENS
