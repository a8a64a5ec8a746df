"""The vllm backend for real: ``lmi serve`` with ``option.rolling_batch=vllm`` on vLLM's CPU build.

Each test module runs only where vLLM imports (``scripts/test.sh`` builds that environment); elsewhere it is skipped.
Each server loads vLLM once per module, with the small settings below (one GiB of KV cache, eager mode), since a
vLLM start takes a minute or more on a small CPU host.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

#: The engine arguments of every model these tests serve, and of vLLM's own reference answers.
#: Chunked prefill is off so that seeded requests are honoured on vLLM's CPU build (the backend refuses seeds where
#: chunked prefill is on there: ``VllmBackend.seeds_stop_engine``); ``test_vllm_concurrency.py`` turns it on.
ENGINE = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8, "enforce_eager": True,
          "enable_chunked_prefill": False}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
os.environ.update({key: os.environ.get(key, value) for key, value in ENV.items()})
READY_TIMEOUT = 900
#: serving.properties of every model these tests serve (the same engine arguments as the reference).
PROPERTIES = {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint", "option.dtype": "fp32",
              "option.max_model_len": ENGINE["max_model_len"], "option.max_rolling_batch_size": ENGINE["max_num_seqs"],
              "option.enforce_eager": "true", "option.enable_chunked_prefill": "false",
              # vLLM's start (its engine process, profiling, the KV cache) takes minutes on a small shared CPU.
              "option.model_loading_timeout": READY_TIMEOUT}


@pytest.fixture(scope="session")
def vllm_properties() -> dict:
    """serving.properties entries every vllm model directory of these tests starts from."""
    return dict(PROPERTIES)


@pytest.fixture(scope="session")
def vllm_generate():
    """``vllm_generate(model_dir, prompts, max_tokens, engine=None, lora=None)``: vLLM's own greedy answers
    (``LLM.generate``, with a LoRA adapter's folder as its ``LoRARequest``), computed in a child process, as
    ``[{"text", "token_ids"}]``; ``engine`` adds engine arguments."""
    return _generate


def _generate(model: Path, prompts: list[str], max_tokens: int, engine: dict | None = None,
              lora: str | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answers.json"
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("reference.py")), str(model),
                               str(max_tokens), json.dumps({**ENGINE, **(engine or {})}), str(out),
                               *([lora] if lora else [])], input=json.dumps(prompts),
                              capture_output=True, text=True, timeout=READY_TIMEOUT)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return json.loads(out.read_text())


@pytest.fixture(scope="session")
def vllm_tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny random Llama with 32-wide attention heads, the narrowest vLLM's CPU attention takes."""
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-tiny"), TinySpec(hidden_size=128, intermediate_size=256))


@pytest.fixture(scope="session")
def smollm2_rolling(tmp_path_factory, smollm2_dir, vllm_properties):
    """``lmi serve`` with ``option.rolling_batch=vllm`` on SmolLM2 (DJL's sync mode): one server for the modules
    that ask it (``test_vllm_serve.py``, and ``test_vllm_container.py``'s reference answers), since a vLLM start
    takes minutes."""
    from integration_tests.conftest import Servers

    servers = Servers(tmp_path_factory.mktemp("smollm2-rolling"))
    model = servers.model_dir("smollm2", {**vllm_properties, "option.model_id": str(smollm2_dir),
                                          "option.rolling_batch": "vllm", "option.max_new_tokens": 32,
                                          # vLLM's priority scheduling (issue 47); every other request has 0
                                          "option.scheduling_policy": "priority"})
    yield servers([model], ready=False).wait_ready(timeout=READY_TIMEOUT)
    servers.stop()


class VllmServer:
    """vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on a free port, started at once;
    ``wait_ready`` waits for its ``/health``."""

    def __init__(self, model: Path, *args: str):
        from integration_tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.gettempdir()) / f"vllm-serve-{self.port}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                             str(model), "--dtype", ENGINE["dtype"], "--enforce-eager", "--host",
                                             "127.0.0.1", "--port", str(self.port), *args],
                                            stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> "VllmServer":
        import httpx

        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM's server not ready after {READY_TIMEOUT} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="module")
def vllm_server():
    """``vllm_server(model_dir, *arguments)``: vLLM's own server, started at once (wait with ``wait_ready``),
    stopped at the end of the module."""
    started: list[VllmServer] = []

    def start(model: Path, *args: str) -> VllmServer:
        started.append(VllmServer(model, *args))
        return started[-1]

    yield start
    for server in started:
        server.stop()
