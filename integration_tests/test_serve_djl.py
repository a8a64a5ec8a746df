"""``lmi serve`` and DJL's own material: a custom ``model.py`` that imports ``djl_python``, which engine
runs, and (where ``djl_python`` and its engine script are here) DJL's own engine as the worker."""

import concurrent.futures
import json
import os
import time

import httpx
import pytest

from lmi_tools.serving.worker import engines

from .conftest import ROOT

# The shape of the inf2 post's model.py: it imports DJL's classes by name, from both places DJL offers.
DJL_MODEL_PY = '''
from djl_python import Input, Output
from djl_python.outputs import Output as OutputsOutput
from djl_python.pair_list import PairList


def handle(inputs: Input):
    if inputs.is_empty():
        return None
    data = inputs.get_as_json()
    out = Output()
    out.add_as_json({"outputs": data["inputs"].upper(), "one_class": Output is OutputsOutput,
                     "pairs": PairList(keys=["a"], values=[1]).size()})
    return out
'''


def djl_env():
    """The server sees the djl_python this test run sees."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def wait_for_log(server, text, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in server.logs():
            return server.logs()
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never logged:\n{server.logs()}")


def test_a_model_py_importing_djl_python_runs_unchanged(serve):
    model = serve.model_dir("custom", {"engine": "Python"}, DJL_MODEL_PY)
    server = serve([model])
    answer = httpx.post(server.url + "/predictions/custom", json={"inputs": "hi"}, timeout=60)
    assert answer.status_code == 200
    assert answer.json() == {"outputs": "HI", "one_class": True, "pairs": 1}
    # auto says which engine runs and why; it never falls back silently.
    assert "worker engine: " in server.logs()


@pytest.mark.skipif(engines.find_djl()[0] is not None, reason="DJL's engine can run here")
def test_engine_djl_that_cannot_run_says_what_is_missing(serve):
    server = serve([serve.echo()], env=djl_env(), args=["--engine", "djl"], ready=False)
    logs = wait_for_log(server, "--engine djl cannot run: ")
    assert engines.find_djl()[1] in logs


# A stand-in for DJL's engine script, found where DJLServing extracts it: our engine, then the line DJL's engine
# logs (with a traceback) when the front end closes the socket under it.
FAKE_DJL_ENGINE = '''
import sys
from lmi_tools.serving.worker.process import main
main(sys.argv[1:])
print("Python engine process died", flush=True)
'''


def test_a_packaged_djl_python_runs_from_djls_engine_cache_and_stops_cleanly(serve, tmp_path):
    site = tmp_path / "site"
    (site / "djl_python").mkdir(parents=True)
    (site / "djl_python" / "__init__.py").write_text("")
    (site / "djl_python-0.29.0.dist-info").mkdir()
    (site / "djl_python-0.29.0.dist-info" / "METADATA").write_text("Name: djl_python\nVersion: 0.29.0\n")
    script = tmp_path / "cache" / "python" / "0.29.0" / "djl_python_engine.py"
    script.parent.mkdir(parents=True)
    script.write_text(FAKE_DJL_ENGINE)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]), "DJL_CACHE_DIR": str(tmp_path / "cache")}
    server = serve([serve.echo()], env=env, args=["--engine", "auto"])
    assert httpx.post(server.url + "/predictions/echo", json={"i": 1}, timeout=60).status_code == 200
    assert f"worker engine: DJL's engine {script} (djl_python 0.29.0)" in server.logs()
    server.stop()
    assert "Python engine process died" not in server.logs()  # killed before its socket closed, as Java does


# --- DJL's own engine as the worker: runs where djl_python and djl_python_engine.py are found ----------

needs_djl = pytest.mark.skipif(engines.find_djl()[0] is None, reason="DJL's engine is not here: "
                               + engines.find_djl()[1])


@needs_djl
def test_djls_engine_serves_the_handler_and_stops_without_a_traceback(serve):
    server = serve([serve.scripted(**{"option.max_new_tokens": 4})], env=djl_env(), args=["--engine", "djl"])
    url = server.url + "/predictions/scripted"
    assert httpx.post(url, json={"inputs": "x"}, timeout=60).json() == {"generated_text": " The"}
    assert "worker engine: DJL's engine" in server.logs()
    server.stop()
    assert "Python engine process died" not in server.logs()


@needs_djl
def test_djls_engine_answers_a_bad_item_in_a_dynamic_batch_with_200_like_java(serve):
    server = serve([serve.scripted(batch_size=3, max_batch_delay=5000, **{"option.max_new_tokens": 2})],
                   env=djl_env(), args=["--engine", "djl"])
    url = server.url + "/predictions/scripted"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: httpx.post(url, json=p, timeout=60),
                                [{"inputs": "a"}, {"inputs": ""}, {"inputs": "b"}]))
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert json.loads(answers[1].text)["code"] == 400
