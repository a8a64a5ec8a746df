"""Worker processes: crashes and hangs are contained, queues overflow cleanly, models load and unload live."""

import concurrent.futures
import os
import time

import httpx


def post(url, payload, timeout=60):
    return httpx.post(url, json=payload, timeout=timeout)


def describe(server, name):
    return httpx.get(f"{server.url}/models/{name}").json()[0]


def wait_status(server, name, status, timeout=60):
    deadline, info = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            info = httpx.get(f"{server.url}/models/{name}").json()[0]
        except httpx.ConnectError:  # the server is still starting
            info = None
        if info and info["status"] == status:
            return info
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {status}: {info}")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_worker_killed_mid_request_is_restarted(serve):
    server = serve([serve.scripted(**{"option.scripted_step_delay_ms": 30})])
    url = server.url + "/predictions/scripted"
    first_pid = describe(server, "scripted")["workerGroups"][0]["workers"][0]["id"]
    crashed = post(url, {"inputs": "[[crash@3]]", "parameters": {"max_new_tokens": 10}})
    assert crashed.status_code == 503 and "died" in crashed.json()["message"]
    info = wait_status(server, "scripted", "READY")
    assert info["workerGroups"][0]["workers"][0]["restarts"] == 1
    assert info["workerGroups"][0]["workers"][0]["id"] != first_pid and not pid_alive(first_pid)
    assert post(url, {"inputs": "x", "parameters": {"max_new_tokens": 2}}).json() == {"generated_text": " T"}


def test_a_predict_timeout_kills_the_worker_and_the_others_continue(serve):
    server = serve([serve.scripted(**{"option.predict_timeout": "2"})])
    url = server.url + "/predictions/scripted"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        hung = pool.submit(post, url, {"inputs": "[[hang@2]]", "parameters": {"max_new_tokens": 5}})
        time.sleep(0.2)
        queued = pool.submit(post, url, {"inputs": "y", "parameters": {"max_new_tokens": 3}})
        assert hung.result().status_code == 503
        assert "no answer within 2 s" in hung.result().json()["message"]
        assert queued.result().json() == {"generated_text": " Th"}  # served by the restarted worker


def test_a_full_queue_answers_503(serve):
    server = serve([serve.scripted(job_queue_size=1, **{"option.scripted_step_delay_ms": 100})])
    url = server.url + "/predictions/scripted"
    payload = {"inputs": "x", "parameters": {"max_new_tokens": 5}}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post(url, payload), range(6)))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(200) >= 2 and 503 in codes
    rejected = next(a for a in answers if a.status_code == 503).json()
    assert rejected["type"] == "ServiceUnavailableException" and "job queue is full" in rejected["message"]


def test_load_switch_and_unload_models_while_requests_run(serve):
    server = serve([serve.scripted("old", **{"option.scripted_step_delay_ms": 20})])
    new_dir = serve.scripted("new", **{"option.scripted_text": "fresh!", "option.scripted_load_seconds": 1})
    old_pid = describe(server, "old")["workerGroups"][0]["workers"][0]["id"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(post, server.url + "/predictions/old", {"inputs": "x",
                                                                       "parameters": {"max_new_tokens": 30}})
                   for _ in range(2)]
        response = httpx.post(f"{server.url}/models", params={"url": str(new_dir), "model_name": "new",
                                                              "synchronous": "false"})
        assert response.status_code == 202
        assert describe(server, "new")["status"] == "PENDING"
        assert httpx.get(server.url + "/ping").status_code == 503  # a model is still loading
        wait_status(server, "new", "READY")
        assert post(server.url + "/predictions/new", {"inputs": "x", "parameters": {"max_new_tokens": 6}}).json() \
            == {"generated_text": "fresh!"}
        assert all(f.result().status_code == 200 for f in running)
    assert httpx.delete(f"{server.url}/models/old").json() == {"status": 'Model "old" unregistered'}
    assert not pid_alive(old_pid)  # the worker process, and its memory, are gone
    assert [m["modelName"] for m in httpx.get(server.url + "/models").json()["models"]] == ["new"]
    assert post(server.url + "/predictions/old", {"inputs": "x"}).status_code == 404
    assert httpx.get(server.url + "/ping").status_code == 200


def test_synchronous_load_and_errors(serve):
    server = serve([serve.scripted("a")])
    ok = httpx.post(f"{server.url}/models", params={"url": str(serve.scripted("b")), "model_name": "b"}, timeout=60)
    assert ok.status_code == 200 and ok.json() == {"status": 'Model "b" registered.'}
    assert describe(server, "b")["status"] == "READY"
    again = httpx.post(f"{server.url}/models", params={"url": str(serve.scripted("b")), "model_name": "b"})
    assert again.status_code == 409
    missing = httpx.post(f"{server.url}/models", params={"url": "/no/such/dir"})
    assert missing.status_code == 400 and "does not exist" in missing.json()["message"]
    broken = serve.scripted("broken", **{"option.dtype": "fp8"})
    failed = httpx.post(f"{server.url}/models", params={"url": str(broken)}, timeout=60)
    assert failed.status_code == 500 and "option.dtype='fp8' is invalid" in failed.json()["message"]
    assert httpx.delete(f"{server.url}/models/nope").status_code == 404


def test_a_model_that_fails_to_load_is_reported(serve):
    server = serve([serve.scripted("bad", **{"option.scripted_fail_load": "true"})], ready=False)
    info = wait_status(server, "bad", "FAILED")
    assert "asked to fail while loading" in info["error"]
    assert httpx.get(server.url + "/ping").status_code == 503
    refused = post(server.url + "/predictions/bad", {"inputs": "x"})
    assert refused.status_code == 503 and "not ready (FAILED" in refused.json()["message"]
