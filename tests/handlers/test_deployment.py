"""The one init path (``lmi_handlers/deployment.py``): the init call's properties become a ``Deployment`` once, for
this machine or for an instance, and the handler's load and its requests read that."""

from __future__ import annotations

import json
import logging

import pytest

from lmi_handlers.adapters import LoraOptions
from lmi_handlers.backends import scripted
from lmi_handlers.config import HandlerConfig
from lmi_handlers.deployment import HERE, Host, Model, choose, read_settings, resolve
from lmi_handlers.dtypes import BYTES
from lmi_handlers.errors import ConfigError
from lmi_handlers.handler import Handler
from lmi_handlers.mode import Image
from lmi_handlers.structured.tools import ToolOptions
from lmi_tools.serving.worker.frontend import init_input, request_input

GIB = 2**30
G5 = Host(family="g5", kind="gpu", gpu_bytes=24 * GIB, accelerators=1)
LLAMA_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
#: 8 billion parameters, in the dtype the plan loads them in.
MODEL = Model(LLAMA_8B, lambda dtype, int8: 8 * 10**9 * (1 if int8 else BYTES[dtype]))


@pytest.mark.parametrize("props, message", [
    ({"rolling_batch": "on"}, "rolling_batch='on' is invalid: allowed values are disable, auto, scheduler, vllm"),
    ({"backend": "lmi-dist"}, "allowed values are auto, vllm, neuronx, hf, scripted"),
    ({"rolling_batch": "vllm", "backend": "hf"}, "option.rolling_batch=vllm runs the vllm backend's engine"),
])
def test_the_names_a_backend_owns_are_checked_against_the_registry(props, message):
    assert HandlerConfig.from_properties(props)  # the handler's settings alone do not know the backends
    with pytest.raises(ConfigError, match=message):
        read_settings(props)


@pytest.mark.parametrize("props, asked_by", [
    ({"rolling_batch": "vllm"}, "option.rolling_batch=vllm"),
    ({"rolling_batch": "vllm", "backend": "auto"}, "option.rolling_batch=vllm"),
    ({"rolling_batch": "scheduler", "backend": "vllm"}, "option.backend=vllm"),
])
def test_rolling_batch_vllm_selects_the_vllm_backend(props, asked_by):
    settings = read_settings(props)
    assert (settings.requested, settings.asked_by, settings.config.rolling) == ("vllm", asked_by, True)


def test_on_this_machine_the_deployment_holds_every_setting_parsed(tmp_path):
    deployment = resolve({"backend": "scripted", "model_dir": str(tmp_path), "rolling_batch": "auto",
                          "scripted_text": "ab", "enable_lora": "true", "max_loras": "2", "max_new_token": "5"})
    assert deployment.target is HERE and deployment.backend.name == "scripted"
    assert deployment.why == "option.backend=scripted"
    assert deployment.options == scripted.Options(text="ab") and deployment.tools == ToolOptions()
    assert deployment.lora == LoraOptions(enabled=True, max_loras=2)
    assert deployment.config.rolling and not deployment.mode.asynchronous and not deployment.embedding
    assert deployment.plan is None  # here the backend plans at load, after the weights
    assert deployment.warnings == ("unknown option.max_new_token is ignored; did you mean option.max_new_tokens?",)
    assert resolve({"model_dir": str(tmp_path), "async_mode": "true"}).mode.asynchronous
    assert resolve({"model_dir": str(tmp_path), "task": "text-embedding"}).embedding


def test_djls_mode_on_an_image_is_read_once_with_the_recommenders_writes(tmp_path):
    # Here the properties already hold what Java decided; for an LMI image the resolver asks mode.py, and the
    # handler's settings are what Java passes on (rolling_batch=disable, async_mode=true).
    props = {"model_dir": str(tmp_path)}
    assert not read_settings(props).mode.asynchronous
    settings = read_settings(props, Image("djl-lmi", "0.36.0"), ["LlamaForCausalLM"])
    assert settings.mode.asynchronous and "recommender" in settings.mode.reason
    assert settings.config.async_mode and settings.config.continuous and not settings.config.rolling
    old = read_settings({**props, "async_mode": "true"}, Image("djl-lmi", "0.30.0"), ["LlamaForCausalLM"])
    assert not old.mode.asynchronous and old.config.async_mode  # that image ignores the option the handler reads


def test_auto_here_says_what_it_found(tmp_path):
    deployment = resolve({"model_dir": str(tmp_path)})
    assert deployment.backend.name == "hf"
    assert deployment.why.startswith("option.backend=auto: the first available here")


def test_on_an_instance_auto_is_the_images_backend_and_the_plan_is_made_for_its_gpu():
    deployment = resolve({"rolling_batch": "vllm", "num_gpu_blocks_override": "64"}, G5, MODEL)
    assert deployment.backend.name == "vllm" and deployment.why == "option.rolling_batch=vllm"
    assert deployment.warnings == ()  # num_gpu_blocks_override is one of vLLM's engine arguments
    # LMI sends its rolling batch size (32 by default) as vLLM's max_num_seqs: the plan sizes for what vLLM gets.
    assert deployment.plan.batch_size == deployment.options.engine_args("m")["max_num_seqs"] == 32
    assert ("num_gpu_blocks_override", "64") in deployment.options.passthrough  # typed against EngineArgs at load
    auto = resolve({}, G5, MODEL)
    assert auto.backend.name == "vllm" and auto.why == "option.backend=auto: the one g5 instances run"


def test_the_plan_sizes_the_weights_over_the_tp_degree_max_is_every_accelerator():
    choice = choose(read_settings({"backend": "hf", "tensor_parallel_degree": "max"}),
                    Host("g5", "gpu", 24 * GIB, accelerators=4))
    options = choice.backend.options(choice.config.properties)
    assert choice.plan_for(options, MODEL).kv_tokens > choice.plan_for(options, MODEL, tp=2).kv_tokens


def test_what_the_backend_refuses_is_refused_before_it_loads():
    with pytest.raises(ConfigError, match="option.max_lora_rank=1024.*the vllm backend serves ranks up to 512"):
        resolve({"rolling_batch": "vllm", "enable_lora": "true", "max_lora_rank": "1024"}, G5)
    with pytest.raises(ConfigError, match="option.tensor_parallel_degree=3"):
        resolve({"backend": "vllm", "tensor_parallel_degree": "3"}, Host("g5", "gpu", 24 * GIB, 4), MODEL)


@pytest.mark.parametrize("props, target", [
    ({"backend": "scripted"}, HERE),
    ({}, Host("inf2", "neuron", 16 * GIB, accelerators=2)),  # auto there is neuronx
])
def test_an_embedding_model_on_a_backend_without_a_pooler_is_refused_naming_the_task(props, target):
    with pytest.raises(ConfigError, match=r"option.task='text-embedding'.*generates text only.*loads on vllm, hf"):
        resolve({"task": "text-embedding", **props}, target, MODEL)


def test_the_handler_loads_by_the_deployment_and_requests_parse_nothing_again(tmp_path, monkeypatch, caplog):
    """Each kind of options is parsed once per load, however many requests follow."""
    parsed = {}
    for owner in (HandlerConfig, scripted.Options, ToolOptions, LoraOptions):
        original = owner.from_properties.__func__

        def counting(cls, props, _original=original, _name=owner.__qualname__):
            parsed[_name] = parsed.get(_name, 0) + 1
            return _original(cls, props)

        monkeypatch.setattr(owner, "from_properties", classmethod(counting))
    caplog.set_level(logging.INFO, logger="lmi_handlers.handler")
    handler = Handler()
    assert handler.handle(init_input({"backend": "scripted", "model_dir": str(tmp_path), "max_new_token": "5"})) is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for body in ({"inputs": "hi"}, {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                                    "tool_choice": "none", "max_tokens": 2}):
        out = handler.handle(request_input([("Content-Type", "application/json")], json.dumps(body).encode()))
        assert out.code == 200
    assert parsed == {"HandlerConfig": 1, "Options": 1, "ToolOptions": 1, "LoraOptions": 1}
    assert handler.deployment.config is handler.config
    assert "backend scripted (option.backend=scripted)" in caplog.text
    assert "did you mean option.max_new_tokens" in caplog.text
