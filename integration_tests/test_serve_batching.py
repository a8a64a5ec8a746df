"""Dynamic batching and the rolling-batch step loop, driven by concurrent clients over real sockets."""

import concurrent.futures
import json
import time

import httpx
import pytest


def post(url, payload, timeout=60):
    return httpx.post(url, json=payload, timeout=timeout)


def test_dynamic_batching_groups_concurrent_requests(serve):
    server = serve([serve.echo(batch_size=4, max_batch_delay=300, **{"option.echo_delay": "0.2"})])
    url = server.url + "/predictions/echo"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        reports = list(pool.map(lambda i: post(url, {"i": i}).json(), range(8)))
    assert sorted(json.loads(r["body"])["i"] for r in reports) == list(range(8))  # each got its own item
    assert max(r["batch_size"] for r in reports) > 1
    assert all(r["batch_size"] <= 4 for r in reports)
    batched = next(r for r in reports if r["batch_size"] > 1)
    assert batched["keys"] == ["data"] and "Content-Type" in {k.title() for k in batched["properties"]}


def test_a_dynamic_batch_answers_bad_items_separately(serve):
    server = serve([serve.scripted(batch_size=3, max_batch_delay=500, **{"option.max_new_tokens": 4})])
    url = server.url + "/predictions/scripted"
    payloads = [{"inputs": "a"}, {"inputs": ""}, {"inputs": "b", "parameters": {"max_new_tokens": 2}}]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: post(url, p), payloads))
    bodies = [a.json() for a in answers]
    assert {"generated_text": " The"} in bodies and {"generated_text": " T"} in bodies
    error = next(b for b in bodies if "error" in b)
    assert error["code"] == 400 and "inputs: expected a non-empty string" in error["error"]


@pytest.fixture(scope="module")
def rolling(serve_module):
    return serve_module([serve_module.scripted("rolling", **{
        "option.rolling_batch": "auto", "option.max_rolling_batch_size": 3, "option.scripted_step_delay_ms": 20})])


def stream_lines(url, payload):
    times, lines = [], []
    with httpx.stream("POST", url, json=payload, timeout=60) as response:
        for line in response.iter_lines():
            if line:
                times.append(time.monotonic())
                lines.append(json.loads(line))
    return response.status_code, times, lines


def test_rolling_batch_interleaves_concurrent_streams(rolling):
    url = rolling.url + "/predictions/rolling"
    payload = {"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 15}}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: stream_lines(url, payload), range(3)))
    assert all(status == 200 and len(lines) == 15 for status, _, lines in results)
    # They ran side by side: each one's first token came before any other finished.
    assert max(times[0] for _, times, _ in results) < min(times[-1] for _, times, _ in results)


def test_rolling_batch_admits_at_most_max_rolling_batch_size(rolling):
    url = rolling.url + "/predictions/rolling"
    payload = {"inputs": "x", "parameters": {"max_new_tokens": 10}}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(post, url, payload) for _ in range(6)]
        peak = 0
        while not all(f.done() for f in futures):
            info = httpx.get(rolling.url + "/models/rolling").json()[0]
            peak = max(peak, info["activeRequests"])
            time.sleep(0.01)
    assert all(f.result().json() == {"generated_text": " The quick"} for f in futures)
    assert 1 <= peak <= 3


def test_one_bad_request_does_not_fail_its_neighbours(rolling):
    url = rolling.url + "/predictions/rolling"
    good = {"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 12}}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(stream_lines, url, good)
        time.sleep(0.05)
        bad = post(url, {"inputs": "x", "parameters": {"temperature": -3}})
        status, _, lines = slow.result()
    assert bad.status_code == 400 and "parameters.temperature" in bad.json()["error"]
    assert status == 200 and len(lines) == 12


def test_client_disconnect_mid_stream_frees_the_slot(rolling):
    url = rolling.url + "/predictions/rolling"
    with httpx.stream("POST", url, json={"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 2000}},
                      timeout=60) as response:
        lines = response.iter_lines()
        next(lines), next(lines)
        assert httpx.get(rolling.url + "/models/rolling").json()[0]["activeRequests"] == 1
    deadline = time.monotonic() + 10  # 2000 tokens would take 40 s: the slot must free long before
    while httpx.get(rolling.url + "/models/rolling").json()[0]["activeRequests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(rolling.url + "/models/rolling").json()[0]["activeRequests"] == 0
    assert post(url, {"inputs": "x", "parameters": {"max_new_tokens": 2}}).json() == {"generated_text": " T"}


def test_a_backend_failure_mid_stream_ends_that_stream_with_an_error(rolling):
    status, _, lines = stream_lines(rolling.url + "/predictions/rolling", {"inputs": "[[fail@3]]", "stream": True})
    assert status == 200 and lines[-1]["code"] == 424 and "scripted failure" in lines[-1]["error"]
