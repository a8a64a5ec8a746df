"""The other direction: a model.py written for AWS's vLLM container with the standards package's decorators (an
``@output_formatter`` and a ``@custom_ping_handler``, no lmi_handlers) and no serving.properties, configured the
container's way (``SM_VLLM_*`` variables), runs under ``lmi serve --container vllm`` unchanged, on the tiny model."""

import json
import os

import httpx
import pytest

pytest.importorskip("vllm", reason="the vllm container's tests run in the vLLM environment (scripts/test.sh)")

from lmi_tools.cli import main  # noqa: E402

from .conftest import READY_TIMEOUT  # noqa: E402
from .test_vllm_container import ContainerServer  # noqa: E402

OWN_SCRIPT = '''
import json

import model_hosting_container_standards.sagemaker as sagemaker_standards
from fastapi import Request, Response
from model_hosting_container_standards.common.fastapi.middleware import output_formatter


@output_formatter
async def mark(response):
    response.headers["X-Formatted-By"] = "my model.py"
    return response


@sagemaker_standards.custom_ping_handler
async def ping(request: Request) -> Response:
    return Response(json.dumps({"status": "mine"}), media_type="application/json")
'''
SETTINGS = {"SM_VLLM_DTYPE": "float32", "SM_VLLM_MAX_MODEL_LEN": "256", "SM_VLLM_MAX_NUM_SEQS": "4",
            "SM_VLLM_ENFORCE_EAGER": "true", "SM_VLLM_SERVED_MODEL_NAME": "tiny"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vllm_tiny_model_dir):
    directory = tmp_path_factory.mktemp("own-script") / "tiny"
    directory.mkdir()
    for item in vllm_tiny_model_dir.iterdir():
        os.symlink(item, directory / item.name)
    (directory / "model.py").write_text(OWN_SCRIPT)
    return directory


@pytest.fixture(scope="module")
def server(model_dir):
    running = ContainerServer(str(model_dir), SETTINGS)
    yield running.wait_ready(timeout=READY_TIMEOUT)
    running.stop()


def test_its_ping_and_formatter_run_and_vllm_answers_as_without_lmi(server):
    ping = httpx.get(server.url + "/ping", timeout=30)
    assert ping.json() == {"status": "mine"} and ping.headers["X-Formatted-By"] == "my model.py"
    chat = httpx.post(server.url + "/invocations", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 4}, timeout=300)
    assert chat.status_code == 200 and chat.json()["model"] == "tiny" and chat.headers["X-Formatted-By"]
    lmi = httpx.post(server.url + "/invocations", json={"inputs": "hi"}, timeout=60)
    assert lmi.status_code == 400 and "error" in lmi.json()  # vLLM's own /invocations: no LMI handler was added
    assert "--max-model-len 256" in server.logs() and "--served-model-name tiny" in server.logs()


def test_validate_names_it_the_scripts_own(model_dir, capsys):
    (model_dir / "serving.properties").write_text("option.tensor_parallel_degree=1\n")
    try:
        main(["validate", str(model_dir), "--container", "vllm", "-i", "g5.xlarge", "--json"])
    finally:
        (model_dir / "serving.properties").unlink()
    report = json.loads(capsys.readouterr().out)
    [script] = [f for f in report["findings"] if f["check"] == "model.py"]
    assert script["level"] == "info" and "its own hooks" in script["message"]
