"""DJL's async mode through ``lmi serve`` over real sockets: our engine and (where ``djl_python`` and its engine script
are here) DJL's own ``PythonAsyncEngine`` as the worker, many requests in flight; every API's bytes the same on both
engines, and the same text as in sync mode; clients that go away; the mode chosen for the target image; an async
``model.py`` of the model's own; and the entry point DJLServing resolves without ``option.entryPoint``."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import time

import httpx
import pytest

from lmi_tools.serving.worker import engines

from .conftest import ROOT

DJL = engines.find_djl()[0] is not None
needs_djl = pytest.mark.skipif(not DJL, reason="DJL's engine is not here: " + engines.find_djl()[1])
SCRIPTED = {"option.max_new_tokens": 6, "option.scripted_step_delay_ms": 10}
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


@pytest.fixture(scope="module")
def servers(serve_module):
    """The same scripted model in async mode on each engine, and in sync mode (one request per call) beside them."""
    model = serve_module.scripted("async", **SCRIPTED, **{"option.async_mode": "true"})
    anywhere = ["--model-url-pattern", ".*"]  # adapter folders anywhere (the adapter test)
    started = {"lmi": serve_module([model], env=ENV, args=["--engine", "lmi", *anywhere]),
               "sync": serve_module([serve_module.scripted("sync", **SCRIPTED, **{"option.rolling_batch": "disable"})],
                                    env=ENV, args=["--engine", "lmi"])}
    if DJL:
        started["djl"] = serve_module([model], env=ENV, args=["--engine", "djl", *anywhere])
    return started


def _url(server, model: str, path: str) -> str:
    return server.url + path.format(model=model)


CALLS = {  # name: (path, body, headers)
    "lmi json": ("/predictions/{model}", {"inputs": "x", "parameters": {"details": True}}, {}),
    "lmi jsonlines": ("/predictions/{model}", {"inputs": "x", "stream": True}, {}),
    "lmi sse": ("/invocations", {"inputs": "x", "stream": True}, {"Accept": "text/event-stream"}),
    "chat": ("/v1/chat/completions", {"model": "{model}", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 4}, {}),
    "chat stream": ("/v1/chat/completions", {"model": "{model}", "messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 4, "stream": True}, {}),
    "completions": ("/v1/completions", {"model": "{model}", "prompt": "x", "max_tokens": 3}, {}),
    "completions stream": ("/v1/completions", {"model": "{model}", "prompt": "x", "max_tokens": 3, "stream": True},
                           {}),
    "tgi": ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 3}}, {}),
    "tgi stream": ("/generate_stream", {"inputs": "x", "parameters": {"max_new_tokens": 3}}, {}),
    "bad": ("/predictions/{model}", {"inputs": "x", "parameters": {"max_new_tokens": -1}}, {}),
}


def ask(server, model: str, name: str) -> tuple[int, str, bytes]:
    path, body, headers = CALLS[name]
    body = json.loads(json.dumps(body).replace("{model}", model))
    answer = httpx.post(_url(server, model, path), json=body, headers=headers, timeout=60)
    return answer.status_code, answer.headers.get("content-type", ""), answer.content


def stable(raw: bytes, model: str) -> str:
    """Answers without what is each request's own (ids, times) and with the model's name as ``M``."""
    text = raw.decode().replace(model, "M")
    return re.sub(r'"(id|created|system_fingerprint)": ?("[^"]*"|\d+)', r'"\1":_', text)


def every_answer(server, model: str) -> dict[str, tuple[int, str, str]]:
    """Each call three times, all in flight together."""
    names = [name for name in CALLS for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        answers = list(pool.map(lambda name: ask(server, model, name), names))
    out: dict[str, tuple[int, str, str]] = {}
    for name, (code, kind, raw) in zip(names, answers):
        assert out.setdefault(name, (code, kind, stable(raw, model))) == (code, kind, stable(raw, model)), name
    return out


def test_every_api_answers_the_sync_text_with_many_in_flight(servers):
    got, sync = every_answer(servers["lmi"], "async"), every_answer(servers["sync"], "sync")
    assert "DJL's async engine: option.async_mode=true" in servers["lmi"].logs()
    for name, (code, kind, text) in got.items():
        # A whole answer relayed as the handler wrote it ends with a line ending in async mode, as every LMI async
        # answer does; TGI's and the completions API's are read back and written by the server.
        if name == "bad":  # Java writes an async request's error as {"code", "error"}, a sync one as Output.error
            assert code == sync[name][0] == 400 and json.loads(text)["error"] == json.loads(sync[name][2])["error"]
            continue
        whole = sync[name][2] + ("\n" if name in ("lmi json", "chat") else "")
        assert (code, kind, text) == (sync[name][0], sync[name][1], whole), name


@needs_djl
def test_djls_async_engine_and_ours_answer_byte_for_byte(servers):
    assert every_answer(servers["djl"], "async") == every_answer(servers["lmi"], "async")
    assert "worker engine: DJL's engine" in servers["djl"].logs() and "--async-mode" in servers["djl"].logs()


@pytest.mark.parametrize("engine", ["lmi", pytest.param("djl", marks=needs_djl)])
def test_a_client_that_goes_away_is_cancelled_in_the_engine(servers, engine):
    server = servers[engine]
    body = {"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 3000}}
    with httpx.stream("POST", server.url + "/predictions/async", json=body, timeout=60) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 20  # 3000 tokens would take 30 s and more
    while httpx.get(server.management_url + "/models/async").json()[0]["activeRequests"]:
        assert time.monotonic() < deadline, "the request still runs after its client went away"
        time.sleep(0.2)
    assert ask(server, "async", "lmi json")[0] == 200


# An async handler of the model's own, shaped like DJL's test model async_echo: it decodes with DJL's
# encode_decode and answers with async_utils' outputs, a stream as an async generator.
ASYNC_MODEL_PY = '''
import asyncio
from djl_python import Input
from djl_python.async_utils import create_non_stream_output, create_stream_chunk_output
from djl_python.encode_decode import decode


async def words(text):
    for word in text.split():
        await asyncio.sleep(0.01)
        yield word


async def stream(text):
    async for word in words(text):
        yield create_stream_chunk_output({"token": word}, False)
    yield create_stream_chunk_output({"token": "[DONE]"}, True)


async def handle(inputs: Input):
    if inputs.is_empty():
        return None
    payload = decode(inputs, inputs.get_property("Content-Type"))
    if payload.get("stream"):
        return stream(payload["inputs"])
    await asyncio.sleep(0.01)
    return create_non_stream_output({"echo": payload["inputs"].upper()})
'''


@pytest.mark.parametrize("engine", ["lmi", pytest.param("djl", marks=needs_djl)])
def test_an_async_model_py_runs_on_either_engine(serve, engine):
    model = serve.model_dir("custom", {"engine": "Python", "option.async_mode": "true"}, ASYNC_MODEL_PY)
    server = serve([model], env=ENV, args=["--engine", engine])
    url = server.url + "/predictions/custom"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: httpx.post(url, json={"inputs": f"a {i}"}, timeout=30), range(8)))
    assert [a.text for a in answers] == [f'{{"echo": "A {i}"}}\n' for i in range(8)]
    streamed = httpx.post(url, json={"inputs": "one two", "stream": True}, timeout=30)
    assert streamed.text == '{"token": "one"}\n{"token": "two"}\n{"token": "[DONE]"}\n'


def test_the_recommender_turns_async_mode_on_for_the_target_image(serve, tmp_path):
    """rolling_batch unset, a text-generation config.json, a G5 instance: the current LMI image runs async mode."""
    model = serve.model_dir("recommended", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                            "option.backend": "scripted"})
    text = (model / "serving.properties").read_text()
    (model / "serving.properties").write_text("# lmi: instance_type=ml.g5.xlarge\n" + text)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    server = serve([model], env=ENV, args=["--engine", "lmi"])
    assert "DJL's async engine: option.rolling_batch is not set on djl-lmi:0.36.0" in server.logs()
    answer = httpx.post(server.url + "/predictions/recommended", json={"inputs": "x"}, timeout=30)
    assert answer.status_code == 200 and answer.text.endswith("\n")


@needs_djl
def test_djls_engine_loads_a_model_py_without_an_entry_point(serve):
    model = serve.model_dir("plain", {"engine": "Python"}, "def handle(inputs):\n"
                            "    from djl_python import Output\n"
                            "    return None if inputs.is_empty() else Output().add_as_json({'ok': True})\n")
    server = serve([model], env=ENV, args=["--engine", "djl"])
    assert httpx.post(server.url + "/predictions/plain", json={}, timeout=30).json() == {"ok": True}


@pytest.mark.parametrize("engine", ["lmi", pytest.param("djl", marks=needs_djl)])
def test_an_adapter_call_is_answered_through_the_async_engine(servers, engine, tmp_path):
    url = f"{servers[engine].management_url}/models/async/adapters"
    refused = httpx.post(url, params={"name": "a1", "src": str(tmp_path)}, timeout=30)
    assert refused.status_code == 400 and "does not serve adapters" in refused.text


@needs_djl
def test_djls_async_engine_stops_without_a_traceback(serve):
    server = serve([serve.scripted("quiet", **{"option.async_mode": "true"})], env=ENV, args=["--engine", "djl"])
    assert httpx.post(server.url + "/predictions/quiet", json={"inputs": "x"}, timeout=30).status_code == 200
    server.stop()
    assert "Python engine process died" not in server.logs() and "Traceback" not in server.logs()
