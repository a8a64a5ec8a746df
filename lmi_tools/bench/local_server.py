"""``lmi bench --serve MODEL_DIR``: run ``lmi serve`` as a subprocess on a free port for the benchmark's length."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import ToolError, UsageError
from ..serving.store import model_name_for, model_properties
from ..answers.messages import Api

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tokenizer_dir(model_dir: Path) -> Path | None:
    """The local directory the model's tokenizer loads from (``option.model_id``, else the model directory)."""
    model_id = model_properties(model_dir).get("model_id")  # as lmi serve reads it, OPTION_MODEL_ID included
    candidate = model_dir if not model_id else (model_dir / model_id if not Path(model_id).is_absolute()
                                                else Path(model_id))
    if candidate.is_dir() and any((candidate / name).is_file() for name in TOKENIZER_FILES):
        return candidate
    return None


class LocalServer:
    """``lmi serve MODEL_DIR`` on 127.0.0.1:<free port>; its output goes to ``log_path``."""

    def __init__(self, model_dir: Path, log_path: Path, ready_timeout: float = 300.0):
        if not (model_dir / "serving.properties").is_file():
            raise UsageError(f"--serve {model_dir}: no serving.properties there",
                             hint="give a model directory that lmi serve can load (see scripts/bench.sh)")
        self.model_dir, self.log_path, self.ready_timeout = model_dir, log_path, ready_timeout
        self.name = model_name_for(str(model_dir))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def target(self, api: Api | None, stream: bool | None = None) -> str:
        """The URL of this server that speaks ``api`` (``lmi`` when None)."""
        sagemaker = "invocations" if stream is False else "invocations-response-stream"
        paths = {None: f"/predictions/{self.name}", Api.LMI: f"/predictions/{self.name}",
                 Api.SAGEMAKER: f"/endpoints/{self.name}/{sagemaker}", Api.OPENAI_CHAT: "/v1/chat/completions",
                 Api.OPENAI_EMBEDDINGS: "/v1/embeddings"}
        if api not in paths:
            raise UsageError(f"--serve: lmi serve does not speak --api {api.value if api else api}",
                             hint="use --api lmi, sagemaker, openai-chat or openai-embeddings with --serve")
        return self.base + paths[api]

    def __enter__(self) -> "LocalServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "lmi_tools", "serve", str(self.model_dir), "--port", str(self.port),
                 "--management-port", str(self.port),  # one loopback listener: no second port to find free
                 "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ToolError(f"lmi serve exited with code {self.process.returncode} before it was ready:\n"
                                f"{self._log_tail()}", hint=f"the full log is {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + "/ping", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise ToolError(f"lmi serve was not ready after {self.ready_timeout:g}s:\n{self._log_tail()}",
                        hint=f"the full log is {self.log_path}")

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
