"""Worker processes: crashes and hangs are contained, queues overflow cleanly, models load and unload live."""

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

import httpx


def post(url, payload, timeout=60):
    return httpx.post(url, json=payload, timeout=timeout)


def describe(server, name):
    return httpx.get(f"{server.management_url}/models/{name}").json()[0]


def wait_status(server, name, status, timeout=60):
    deadline, info = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            info = httpx.get(f"{server.management_url}/models/{name}").json()[0]
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
    # The worker's last output lines (paths, log text) stay in the server log (issue 12 #7).
    assert "engine started" not in crashed.text and "last output" not in crashed.text
    assert "last output" in server.logs()
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


def test_a_worker_hung_mid_stream_is_caught_by_predict_timeout(serve):
    """Issue 12 #6: a stream that stops is a hung worker after predict_timeout, not the 120 s chunked-read timeout."""
    server = serve([serve.scripted(**{"option.predict_timeout": "2"})])
    began = time.monotonic()
    with httpx.stream("POST", server.url + "/predictions/scripted", timeout=60,
                      json={"inputs": "[[hang@3]]", "stream": True, "parameters": {"max_new_tokens": 10}}) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert time.monotonic() - began < 20
    assert lines[0]["token"]["text"] == " " and "no chunk within 2 s" in lines[-1]["error"]
    wait_status(server, "scripted", "READY")
    assert post(server.url + "/predictions/scripted", {"inputs": "x", "parameters": {"max_new_tokens": 2}}).json() \
        == {"generated_text": " T"}  # a new worker took over


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


def allow_loading(serve):
    return ["--model-url-pattern", re.escape(str(serve.base.resolve())) + "/.*"]


def test_load_switch_and_unload_models_while_requests_run(serve):
    server = serve([serve.scripted("old", **{"option.scripted_step_delay_ms": 20})], args=allow_loading(serve))
    new_dir = serve.scripted("new", **{"option.scripted_text": "fresh!", "option.scripted_load_seconds": 1})
    old_pid = describe(server, "old")["workerGroups"][0]["workers"][0]["id"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(post, server.url + "/predictions/old", {"inputs": "x",
                                                                       "parameters": {"max_new_tokens": 30}})
                   for _ in range(2)]
        response = httpx.post(f"{server.management_url}/models", params={"url": str(new_dir), "model_name": "new",
                                                              "synchronous": "false"})
        assert response.status_code == 202
        assert describe(server, "new")["status"] == "PENDING"
        assert httpx.get(server.url + "/ping").status_code == 503  # a model is still loading
        wait_status(server, "new", "READY")
        assert post(server.url + "/predictions/new", {"inputs": "x", "parameters": {"max_new_tokens": 6}}).json() \
            == {"generated_text": "fresh!"}
        assert all(f.result().status_code == 200 for f in running)
    assert httpx.delete(f"{server.management_url}/models/old").json() == {"status": 'Model "old" unregistered'}
    assert not pid_alive(old_pid)  # the worker process, and its memory, are gone
    assert [m["modelName"] for m in httpx.get(server.management_url + "/models").json()["models"]] == ["new"]
    assert post(server.url + "/predictions/old", {"inputs": "x"}).status_code == 404
    assert httpx.get(server.url + "/ping").status_code == 200


def test_synchronous_load_and_errors(serve):
    server = serve([serve.scripted("a")], args=allow_loading(serve))
    models = server.management_url + "/models"
    ok = httpx.post(models, params={"url": str(serve.scripted("b")), "model_name": "b"}, timeout=60)
    assert ok.status_code == 200 and ok.json() == {"status": 'Model "b" registered.'}
    assert describe(server, "b")["status"] == "READY"
    again = httpx.post(models, params={"url": str(serve.scripted("b")), "model_name": "b"})
    assert again.status_code == 409
    missing = httpx.post(models, params={"url": str(serve.base / "no-such-dir")})
    assert missing.status_code == 400 and "does not exist" in missing.json()["message"]
    # Issue 12 #5: bad queue sizes are refused, and the message says they came from the query.
    for value in ("abc", "0", "-3"):
        refused = httpx.post(models, params={"url": str(serve.scripted("q")), "job_queue_size": value})
        assert refused.status_code == 400, refused.text
        assert f"job_queue_size={value!r} in the request's query is invalid" in refused.json()["message"]
    broken = serve.scripted("broken", **{"option.dtype": "fp8"})
    failed = httpx.post(f"{server.management_url}/models", params={"url": str(broken)}, timeout=60)
    assert failed.status_code == 500 and "option.dtype='fp8' is invalid" in failed.json()["message"]
    assert httpx.delete(f"{server.management_url}/models/nope").status_code == 404


def test_a_model_that_fails_to_load_is_reported(serve):
    server = serve([serve.scripted("bad", **{"option.scripted_fail_load": "true"})], ready=False)
    info = wait_status(server, "bad", "FAILED")
    assert "asked to fail while loading" in info["error"]
    assert httpx.get(server.url + "/ping").status_code == 503
    refused = post(server.url + "/predictions/bad", {"inputs": "x"})
    assert refused.status_code == 503 and "not ready (FAILED" in refused.json()["message"]


def test_the_management_api_has_its_own_loopback_listener(serve):
    """Issue 12 #4: /models is not on the inference port, and loading by URL needs --model-url-pattern."""
    elsewhere = serve.scripted("elsewhere")
    server = serve([serve.scripted("a")])
    assert httpx.get(server.url + "/models").status_code in (404, 405)
    assert httpx.post(server.url + "/models", params={"url": str(elsewhere)}).status_code in (404, 405)
    assert httpx.post(server.management_url + "/predictions/a", json={"inputs": "x"}).status_code == 404
    assert httpx.get(server.management_url + "/models").json()["models"][0]["modelName"] == "a"
    refused = httpx.post(server.management_url + "/models", params={"url": str(elsewhere)})
    assert refused.status_code == 403 and "--model-url-pattern" in refused.json()["message"]

    narrow = serve([serve.scripted("b")], args=["--model-url-pattern", re.escape(str(serve.base.resolve())) + "/ok-.*"])
    escape = str(serve.base / "ok-x" / ".." / "elsewhere")  # matches the pattern as written, not once resolved
    refused = httpx.post(narrow.management_url + "/models", params={"url": escape})
    assert refused.status_code == 403 and "does not match" in refused.json()["message"]
    loaded = httpx.post(narrow.management_url + "/models", params={"url": str(serve.scripted("ok-c"))}, timeout=60)
    assert loaded.status_code == 200


def test_binding_beyond_loopback_warns_loudly(serve):
    server = serve([serve.scripted()], args=["--management-host", "0.0.0.0"])
    assert "WARNING: the management API on 0.0.0.0 has no authentication" in server.logs()
    assert httpx.get(server.management_url + "/models").status_code == 200


def test_a_zero_job_queue_size_is_refused(tmp_path):
    run = subprocess.run([sys.executable, "-m", "lmi_tools", "serve", str(tmp_path), "--job-queue-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "job-queue-size" in run.stderr and "Traceback" not in run.stderr
