"""Real processes, real sockets: ``lmi serve`` runs as a subprocess on a free port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# A handler that answers with what it received, so tests can see the exact Input the front end built.
ECHO_HANDLER = '''
import json, os, time

def handle(inputs):
    from lmi_handlers.protocol import Output
    if inputs.is_empty():
        global INIT
        INIT = dict(inputs.get_properties())
        return None
    batches = inputs.get_batches()
    out = Output()
    for i, item in enumerate(batches):
        report = {"pid": os.getpid(), "batch_size": len(batches), "init": INIT,
                  "properties": {k: v for k, v in item.get_properties().items()},
                  "keys": item.get_content().get_keys(), "body": item.get_as_string()}
        if inputs.is_batch():
            out.add_as_json(report, key="data", batch_index=i)
        else:
            out.add_as_json(report)
    time.sleep(float(INIT.get("echo_delay", "0")))
    return out
'''


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, models: list[str], env: dict[str, str] | None = None, args: list[str] = ()):
        self.port, self.management_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: The management API (/models) listens on a port of its own.
        self.management_url = f"http://127.0.0.1:{self.management_port}"
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"lmi-serve-{self.port}.log"
        cmd = [sys.executable, "-m", "lmi_tools", "serve", *models, "--port", str(self.port),
               "--management-port", str(self.management_port), *args]
        self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})

    def wait_ready(self, timeout: float = 60.0) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"lmi serve exited:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/ping", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"lmi serve not ready after {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def logs(self) -> str:
        return self.log.read_text()


class Servers:
    """Starts lmi serve processes and model directories; stops them all at the end of its scope."""

    def __init__(self, base: Path):
        self.base, self.servers = base, []

    def __call__(self, models, env=None, args=(), ready=True) -> Server:
        server = Server([str(m) for m in models], env, list(args))
        self.servers.append(server)
        return server.wait_ready() if ready else server

    def model_dir(self, name: str, properties: dict, model_py: str | None = None) -> Path:
        directory = self.base / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "serving.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        if model_py is not None:
            (directory / "model.py").write_text(model_py)
        return directory

    def scripted(self, name: str = "scripted", **properties) -> Path:
        base = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.backend": "scripted"}
        return self.model_dir(name, {**base, **properties})

    def tiny_rolling(self, model_id: Path, rows: int, name: str = "tiny") -> Path:
        """The tiny model on our engine's rolling batch with torch's own kernels: nothing to compile at load (the
        default builds the CPU kernels once per machine)."""
        return self.model_dir(name, {
            "engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.model_id": str(model_id),
            "option.rolling_batch": "scheduler", "option.max_rolling_batch_size": rows,
            "option.cpu_linear_kernel": "stock", "option.cpu_attention_kernel": "torch"})

    def echo(self, name: str = "echo", **properties) -> Path:
        return self.model_dir(name, {"engine": "Python", **properties}, ECHO_HANDLER)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def serve(tmp_path):
    """``serve([model dirs], env=..., args=...)`` starts lmi serve and waits until /ping says 200."""
    servers = Servers(tmp_path)
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory):
    """Like ``serve``, shared by a whole test module."""
    servers = Servers(tmp_path_factory.mktemp("serve"))
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def streamed_chat():
    """``streamed_chat(openai_client, **create_kwargs)``: a chat answer streamed and reassembled from its deltas as
    they came, as ``(calls as [(name, arguments)], how many deltas carried arguments, finish_reason, content)``."""
    return _streamed_chat


def _streamed_chat(client, **kwargs):
    calls, pieces, finish, content = {}, 0, None, ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.id:  # a call's first delta: its id and name
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            if delta.function.arguments:
                calls[delta.index]["arguments"] += delta.function.arguments
                pieces += 1
    return [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], pieces, finish, content or None
