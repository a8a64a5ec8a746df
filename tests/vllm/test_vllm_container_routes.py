"""LMI's handler in the vLLM container's app, in process: the standards package's bootstrap loads the rendered
model.py from SAGEMAKER_MODEL_PATH (as vLLM's server does), whose handlers replace /invocations and /ping of an app
holding vLLM-like framework handlers and a stand-in engine client (the real vLLM configuration of a tiny model, a
``generate`` that yields chosen tokens). What runs on vLLM's real server: integration_tests/vllm/test_vllm_container.py.
"""

import asyncio
import json
import shutil
from types import SimpleNamespace

import httpx
import pytest

pytest.importorskip("vllm", reason="the vllm container's tests run in the vLLM environment (scripts/test.sh)")

from lmi_tools.containers.vllm.environment import check_with_vllm  # noqa: E402
from lmi_tools.containers.vllm.launch import directory_environment  # noqa: E402
from lmi_tools.modeldir.resources import TEMPLATES, resource_dir  # noqa: E402

TOKENS = [72, 105, 33, 10, 72, 105]


class Client:
    """vLLM's engine client as the driver sees it: ``vllm_config`` and ``generate`` (TOKENS, one per delta, then
    finished; ``fail_after`` raises after that many); what it was asked for, and what was left early."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.calls, self.aborted, self.fail_after = [], [], None

    async def generate(self, prompt, params, request_id, lora_request=None, priority=0, trace_headers=None):
        self.calls.append((prompt, params, lora_request))
        try:
            for i, token in enumerate(TOKENS[:params.max_tokens]):
                if self.fail_after == i:
                    raise RuntimeError("the engine failed this request")
                await asyncio.sleep(0.001)
                last = i == min(len(TOKENS), params.max_tokens) - 1
                yield SimpleNamespace(finished=last, outputs=[SimpleNamespace(
                    token_ids=[token], logprobs=None, finish_reason="length" if last else None)])
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("container"), TinySpec(hidden_size=128, intermediate_size=256))
    shutil.copy(resource_dir(TEMPLATES) / "model.py.j2", directory / "model.py")
    (directory / "serving.properties").write_text("engine=Python\noption.entryPoint=model.py\noption.max_new_tokens=4\n"
                                                  "option.enable_lora=true\noption.max_lora_rank=8\n")
    return directory


@pytest.fixture(scope="module")
def app(model_dir):
    """A FastAPI app with vLLM's three decorators on a stand-in /invocations, bootstrapped as vLLM's server is."""
    import os

    import model_hosting_container_standards.sagemaker as standards
    import torch
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from safetensors.torch import save_file
    from vllm import EngineArgs
    from vllm.lora.request import LoRARequest

    application = FastAPI()

    @application.post("/invocations")
    @standards.register_invocation_handler
    @standards.stateful_session_manager()
    @standards.inject_adapter_id(adapter_path="model")
    async def invocations(raw_request: Request):
        return JSONResponse({"vllm": await raw_request.json()})

    @application.get("/ping")
    @standards.register_ping_handler
    async def ping(raw_request: Request):
        return Response(status_code=200)

    os.environ["SAGEMAKER_MODEL_PATH"] = str(model_dir)
    standards.bootstrap(application)
    config = EngineArgs(model=str(model_dir), dtype="float32", max_model_len=256, enable_lora=True, max_lora_rank=8,
                        enable_chunked_prefill=False).create_engine_config()
    application.state.engine_client = Client(config)
    folder = model_dir.parent / "a1"  # what read_adapter checks of it: vLLM loads the weights, here never asked for
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                            "target_modules": ["q_proj", "v_proj"]}))
    save_file({"base_model.model.lora_A.weight": torch.zeros(8, 8)}, str(folder / "adapter_model.safetensors"))
    adapters = {"a1": LoRARequest("a1", 7, str(folder))}
    application.state.openai_serving_models = SimpleNamespace(lora_requests=adapters)
    return application


def call(app, *requests):
    """Each (method, path, kwargs) through the app on one event loop; the responses."""
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://container") as client:
            return [await client.request(method, path, **kwargs) for method, path, kwargs in requests]

    return asyncio.run(run())


def post(body, **kwargs):
    return ("POST", "/invocations", {"json": body, **kwargs})


def test_lmi_shapes_answer_in_djls_bytes_and_openai_shapes_reach_vllms_own_handler(app, model_dir):
    adapter = {"X-Amzn-SageMaker-Adapter-Identifier": "a1"}
    ping, whole, lines, sse, legacy, chat, bad = call(
        app, ("GET", "/ping", {}), post({"inputs": "hi"}), post({"inputs": "hi", "stream": True}),
        post({"inputs": "hi", "stream": True}, headers={"Accept": "text/event-stream"}),
        post({"text": "hi", "seq_length": 5}), post({"messages": [{"role": "user", "content": "hi"}]}, headers=adapter),
        post({"inputs": "hi", "parameters": {"top_p": 2}}))
    assert ping.status_code == 200
    streamed = [json.loads(line) for line in lines.text.splitlines()]
    assert [line["token"]["id"] for line in streamed] == TOKENS[:4]
    assert lines.headers["content-type"] == "application/jsonlines"
    text = streamed[-1]["generated_text"]
    assert "".join(line["token"]["text"] for line in streamed) == text
    assert whole.content == json.dumps({"generated_text": text}, ensure_ascii=False).encode()  # DJL's json pieces
    assert sse.text.startswith("data: {") and sse.headers["content-type"] == "text/event-stream"
    assert legacy.json()["outputs"][0].startswith("hi")
    assert chat.json() == {"vllm": {"messages": [{"role": "user", "content": "hi"}], "model": "a1"}}
    assert bad.status_code == 400 and bad.json()["code"] == 400 and "parameters.top_p" in bad.json()["error"]


def test_adapters_sessions_and_failures_keep_their_shapes(app):
    client = app.state.engine_client
    adapter, unknown, session, plain = call(
        app, post({"inputs": "hi"}, headers={"X-Amzn-SageMaker-Adapter-Identifier": "a1"}),
        post({"inputs": "hi", "adapters": "a2"}), post({"inputs": "hi"}, headers={"X-Amzn-SageMaker-Session-Id": "x"}),
        ("POST", "/invocations", {"content": b"hi", "headers": {"Content-Type": "text/plain"}}))
    assert adapter.status_code == 200, adapter.text
    assert client.calls[-2][2].lora_name == "a1" and client.calls[-2][2].lora_int_id == 7
    assert unknown.status_code == 404 and "'a2'" in unknown.json()["error"] and "a1" in unknown.json()["error"]
    assert session.status_code == 400 and "stateful sessions not enabled" in session.text  # the container's rule
    assert plain.status_code == 200 and "generated_text" in plain.json()
    client.fail_after = 2
    try:
        [failed] = call(app, post({"inputs": "hi", "stream": True}))
    finally:
        client.fail_after = None
    last = json.loads(failed.text.splitlines()[-1])
    assert failed.status_code == 200 and last["code"] == 424 and "engine failed" in last["error"]  # DJL's code


def test_a_reader_that_leaves_stops_its_request_in_vllm(app, model_dir):
    from lmi_handlers.protocol import request_input
    from lmi_handlers.vllm_container.service import ContainerService

    async def leave_early():
        service = ContainerService(str(model_dir))
        await service.load(app.state)
        body = json.dumps({"inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 6}}).encode()
        answer = await service.answer(request_input([("Content-Type", "application/json")], body))
        await answer.rest.aclose()
        await asyncio.sleep(0.05)

    client = app.state.engine_client
    before = len(client.aborted)
    asyncio.run(leave_early())
    assert len(client.aborted) == before + 1


def test_a_bad_serving_properties_fails_ping_naming_the_option(app, tmp_path):
    from lmi_handlers.errors import ConfigError
    from lmi_handlers.vllm_container.service import ContainerService

    (tmp_path / "serving.properties").write_text("option.output_formatter=xml\n")
    with pytest.raises(ConfigError, match="output_formatter"):
        asyncio.run(ContainerService(str(tmp_path)).load(app.state))


def test_vllms_own_parser_checks_the_servers_flags_and_names_the_option(model_dir, monkeypatch):
    assert check_with_vllm(directory_environment(model_dir)) is True
    from lmi_handlers.errors import ConfigError

    properties = model_dir / "serving.properties"
    text = properties.read_text()
    try:
        properties.write_text(text + "option.not_a_vllm_flag=1\n")
        with pytest.raises(ConfigError, match="not_a_vllm_flag"):
            check_with_vllm(directory_environment(model_dir))
        properties.write_text(text + "option.block_size=big\n")
        with pytest.raises(ConfigError, match="block_size"):
            check_with_vllm(directory_environment(model_dir))
    finally:
        properties.write_text(text)
