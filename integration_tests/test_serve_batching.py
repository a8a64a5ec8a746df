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
            info = httpx.get(rolling.management_url + "/models/rolling").json()[0]
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
        assert httpx.get(rolling.management_url + "/models/rolling").json()[0]["activeRequests"] == 1
    deadline = time.monotonic() + 10  # 2000 tokens would take 40 s: the slot must free long before
    while active(rolling) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active(rolling) == 0
    assert post(url, {"inputs": "x", "parameters": {"max_new_tokens": 2}}).json() == {"generated_text": " T"}


def active(server):
    return httpx.get(server.management_url + "/models/rolling").json()[0]["activeRequests"]


def test_client_disconnect_from_a_plain_request_frees_the_slot(rolling):
    """Issue 12 #3: a non-streaming client that goes away is cancelled too, not only a streaming one. In a rolling
    batch its JSON answer arrives in pieces (as DJL's json formatter sends it): the client leaves after the first."""
    url = rolling.url + "/predictions/rolling"
    with httpx.stream("POST", url, json={"inputs": "x", "parameters": {"max_new_tokens": 2000}},
                      timeout=60) as response:  # 2000 tokens take 40 s
        assert next(response.iter_raw()) == b'{"generated_text": "'
    deadline = time.monotonic() + 5
    while active(rolling) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active(rolling) == 0


GOOD_STREAMS = [{"inputs": prompt, "stream": True, "parameters": {"max_new_tokens": n}}
                for prompt, n in (("a", 60), ("bb", 50))]  # the rolling batch holds 3: one slot stays free
MALFORMED_BODIES = [b'{"inputs": "a\\ud800b"}',
                    b'{"inputs": "x", "parameters": {"max_new_tokens": ' + b"9" * 5000 + b"}}",
                    b"[" * 100_000 + b"]" * 100_000, b'{"inputs": "\xff"}', b'{"inputs": "  "}', b"{nope",
                    b'{"messages": [{"role": "user", "content": "x", "name": 5}]}', b'{"inputs": "x", "parameters": 7}',
                    b'{"messages": [{"role": "user", "content": "x"}], "n": true}', b'{"inputs": ["x"]}' * 3]


def stream_text(url, payload):
    status, _, lines = stream_lines(url, payload)
    return status, "".join(line["token"]["text"] for line in lines)


def test_malformed_requests_into_a_running_rolling_batch(rolling):
    """Issue 12: a stream of malformed requests sent while good streams run; each good stream's text equals the
    text it gets alone, and every bad request gets its own 400."""
    url = rolling.url + "/predictions/rolling"
    alone = [stream_text(url, payload) for payload in GOOD_STREAMS]
    with concurrent.futures.ThreadPoolExecutor(len(GOOD_STREAMS)) as pool:
        together = [pool.submit(stream_text, url, payload) for payload in GOOD_STREAMS]
        time.sleep(0.1)
        bad = [httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
               for body in MALFORMED_BODIES * 2]
        assert [f.result() for f in together] == alone
    assert all(status == 200 and text for status, text in alone)
    assert [response.status_code for response in bad] == [400] * len(bad), [r.text for r in bad]


def test_a_backend_failure_mid_stream_ends_that_stream_with_an_error(rolling):
    status, _, lines = stream_lines(rolling.url + "/predictions/rolling", {"inputs": "[[fail@3]]", "stream": True})
    assert status == 200 and lines[-1]["code"] == 424 and "scripted failure" in lines[-1]["error"]
