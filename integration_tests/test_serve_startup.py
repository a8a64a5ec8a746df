"""``lmi serve`` for a newcomer: a port in use fails before any model loads; a model directory without its model
files names the missing config.json (not a transformers hint about sentencepiece); /docs works offline; a worker's
temp folder does not outlive it."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time

import httpx

from .conftest import ROOT, free_port


def test_a_port_in_use_is_a_usage_error_before_loading(serve):
    model = serve.model_dir("model", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint"})
    with contextlib.closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "lmi_tools", "serve", str(model), "--port", str(port)],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                                text=True, timeout=60)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
    assert "lmi.worker" not in result.stdout + result.stderr  # no worker was started
    assert "Traceback" not in result.stderr


def test_a_model_directory_without_config_json_says_so(serve):
    model = serve.model_dir("model", {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint"})
    server = serve([model], ready=False)
    deadline, status = time.monotonic() + 60, None
    while time.monotonic() < deadline and status != "FAILED":
        with contextlib.suppress(httpx.HTTPError):
            status = httpx.get(f"{server.management_url}/models/model", timeout=2).json()[0]["status"]
        time.sleep(0.2)
    description = httpx.get(f"{server.management_url}/models/model", timeout=5).json()[0]
    assert status == "FAILED"
    assert "has no config.json" in description["error"] and "sentencepiece" not in description["error"]
    assert httpx.get(f"{server.url}/ping", timeout=5).status_code == 503


def test_docs_page_loads_its_scripts_from_the_server_itself(serve):
    server = serve([serve.scripted()])
    page = httpx.get(f"{server.url}/docs", timeout=10)
    assert page.status_code == 200
    assets = re.findall(r"""(?:src|href)=["']?([^"' >]+\.(?:js|css))""", page.text)
    assert assets and all(url.startswith("/") for url in assets), assets  # no CDN
    for url in assets:
        assert httpx.get(server.url + url, timeout=10).status_code == 200


def workers_of(model) -> list[str]:
    """Worker processes serving this model directory (their command line names it)."""
    found = subprocess.run(["pgrep", "-af", f"--model-dir {model}"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "worker.process" in line]


def test_one_port_for_both_apis_on_two_addresses_is_refused_and_leaves_no_worker(serve):
    """--host 0.0.0.0 with --management-port equal to --port (the management API stays on 127.0.0.1): both sockets
    bind, only the second listen would fail, after the models loaded."""
    model = serve.scripted("both")
    port = str(free_port())
    result = subprocess.run([sys.executable, "-m", "lmi_tools", "serve", str(model), "--host", "0.0.0.0", "--port",
                             port, "--management-port", port], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--management-port {port} is --port's on another address" in result.stderr
    assert "--management-host 0.0.0.0" in result.stderr
    assert workers_of(model) == []


def test_a_workers_temp_folder_goes_when_its_model_is_unloaded_or_the_server_stops(serve, tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    server = serve([serve.scripted("one"), serve.scripted("two")], env={"TMPDIR": str(temp)})
    assert len(list(temp.glob("lmi-worker-*"))) == 2  # one a worker: its unix socket's folder
    assert httpx.delete(f"{server.management_url}/models/two", timeout=30).status_code == 200
    assert len(list(temp.glob("lmi-worker-*"))) == 1
    server.stop()  # SIGTERM: the server stops its workers, whose folders go with them
    assert list(temp.iterdir()) == [], server.logs()

