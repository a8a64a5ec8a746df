"""``lmi validate`` and the runtime agree: on every preset and on generated configurations.

The runtime side is the handler's init call as the container runs it: ``HandlerConfig.from_properties``, then
the backend's ``Options.from_properties`` and its load plan from the registry - for neuronx with
``NEURON_RT_VISIBLE_CORES`` set the way DJLServing sets it for a worker that owns the instance, for hf on the
instance's GPU (or the CPU) with the weights already loaded. Agreement:

* the runtime refuses  =>  validate reports the runtime's own message as an error;
* the runtime accepts  =>  validate's errors are only about the hardware (TP topology, memory, a backend
  on the wrong kind of instance), and every warning the runtime would log is among validate's warnings.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmi_handlers.backends.base import DeviceMemory
from lmi_handlers.default_dtype import cpu_flags
from lmi_handlers.backends.registry import for_instance
from lmi_handlers.config import ConfigError, HandlerConfig, check_unknown_keys
from lmi_tools.instances import GIB, INSTANCES, Instance
from lmi_tools.modeldir.properties import read_serving_properties
from lmi_tools.modeldir.render import write_model_dir
from lmi_tools.modeldir.resources import known_model_config, preset_names, preset_spec
from lmi_tools.modeldir.spec import load_spec
from lmi_tools.models.architecture import load_config, read_architecture
from lmi_tools.validation.sizing import gpu_head_layout, weight_bytes
from lmi_tools.validation.validate import validate_model_dir

from .model_shapes import LLAMA_2_7B

#: Checks whose errors are about the instance, which the runtime cannot see.
HARDWARE_CHECKS = {"tensor parallel", "memory", "backend"}
SHIM = "from lmi_handlers.entrypoint import handle  # noqa: F401\n"
MODEL_CONFIGS = {path.stem: load_config(path) for path in
                 sorted((Path(__file__).resolve().parents[2] / "serving_properties" / "model_configs").glob("*.json"))}
MODEL_CONFIGS.update({
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
             "vocab_size": 50257, "torch_dtype": "float32"},
    "pythia-1b": {"model_type": "gpt_neox", "hidden_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 16,
                  "intermediate_size": 8192, "max_position_embeddings": 2048, "vocab_size": 50304,
                  "torch_dtype": "float16"},
    "mistral-7b-window": {**MODEL_CONFIGS["mistralai--Mistral-7B-Instruct-v0.2"], "sliding_window": 4096},
    "qwen2-7b": {**LLAMA_2_7B, "model_type": "qwen2", "num_key_value_heads": 4, "num_attention_heads": 28,
                 "hidden_size": 3584, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"},
})


def runtime_verdict(props: dict[str, str], model: dict, instance: Instance, model_dir: Path
                    ) -> tuple[str | None, list[str]]:
    """The runtime's refusal (its ``ConfigError`` text), or the warnings it logs while accepting."""
    # As validate plans it: "max" is every accelerator of the instance (on a GPU instance the backend error says
    # neuronx cannot run there at all; the planner's other verdicts must still agree).
    cores = {"NEURON_RT_VISIBLE_CORES": f"0-{instance.cores - 1}"}
    with mock.patch.dict(os.environ, cores):
        try:
            config = HandlerConfig.from_properties({**props, "model_dir": str(model_dir)})
            # In an LMI container "auto" is the first backend the image of that instance can run.
            backend = for_instance(config.backend, instance.family)
            warnings = check_unknown_keys(config.properties, backend.keys)
            options = backend.options(config.properties)  # every backend parses its options first thing at load
            if backend.plan is not None:
                plan = backend.plan(config, options, model, loaded_memory(config, options, backend, model, instance))
                warnings += plan.warnings
        except ConfigError as exc:
            return str(exc), []
    return None, warnings


def loaded_memory(config: HandlerConfig, options, backend, model: dict, instance: Instance) -> DeviceMemory:
    """What the hf backend measures after its weights load on one of the instance's GPUs (``option.device`` as it
    resolves it; nothing to measure on the CPU): the weights in the dtype it loads them in, spread over the TP
    degree's GPUs."""
    device = config.device if config.device != "auto" else ("cuda" if instance.kind == "gpu" else "cpu")
    if device != "cuda":
        return DeviceMemory("cpu", cpu_flags=cpu_flags())  # what the backend passes: this machine's CPU
    total = instance.memory_per_core_gib * GIB
    dtype_plan = backend.plan(config, options, model, DeviceMemory("cuda", 1 << 62))
    tp = config.tensor_parallel_degree or instance.cores
    arch = read_architecture(model)
    return DeviceMemory("cuda", total, weight_bytes(arch, gpu_head_layout(arch, tp), dtype_plan.dtype,
                                                   dtype_plan.int8) // tp)


def assert_agree(model_dir: Path, model: dict, instance: Instance) -> None:
    props = read_serving_properties(model_dir)
    refusal, warnings = runtime_verdict(props, model, instance, model_dir)
    report = validate_model_dir(model_dir, instance.name, model_dir / "config.json")
    errors = [f"{f.check}: {f.message}" for f in report.errors]
    if refusal is not None:
        assert any(f.message == refusal for f in report.errors), (refusal, errors)
        return
    assert all(f.check in HARDWARE_CHECKS for f in report.errors), errors
    reported = {f.message for f in report.warnings}
    assert set(warnings) <= reported, (set(warnings) - reported)


def write_dir(root: Path, props: dict[str, str], model: dict) -> Path:
    lines = ["engine=Python", "option.entryPoint=model.py"] + [f"option.{k}={v}" for k, v in props.items()]
    (root / "serving.properties").write_text("\n".join(lines) + "\n")
    (root / "model.py").write_text(SHIM)
    (root / "config.json").write_text(json.dumps(model))
    return root


@pytest.mark.parametrize("name", preset_names())
def test_every_preset(name, tmp_path):
    spec = load_spec(preset_spec(name))
    write_model_dir(spec, tmp_path, f"preset {name}")
    model = load_config(known_model_config(spec.model_id))
    (tmp_path / "config.json").write_text(json.dumps(model))
    assert_agree(tmp_path, model, INSTANCES[spec.instance_type.removeprefix("ml.")])


def _integers(*values: int) -> st.SearchStrategy[str]:
    return st.sampled_from(values).map(str)


BUCKETS = st.lists(st.sampled_from([128, 256, 512, 1024, 2048, 4096, 8192]), min_size=1, max_size=4).map(
    lambda values: ",".join(map(str, values)))
OPTIONS = st.fixed_dictionaries({}, optional={
    "backend": st.sampled_from(["auto", "neuronx", "hf"]),
    "tensor_parallel_degree": st.sampled_from(["1", "2", "3", "4", "8", "12", "16", "24", "max", "0", "two"]),
    "n_positions": st.one_of(_integers(128, 512, 1024, 2048, 4096, 8192, 16384), st.just("4k")),
    "context_length_estimate": st.one_of(BUCKETS, st.just("256,abc")),
    "rolling_batch": st.sampled_from(["disable", "auto", "scheduler", "tnx", "vllm", "sometimes"]),
    "max_rolling_batch_size": _integers(1, 2, 4, 8, 32),
    "batch_size": _integers(1, 2, 4),
    "dtype": st.sampled_from(["auto", "fp16", "bf16", "fp32", "float16", "int4"]),
    "amp": st.sampled_from(["f16", "bf16", "f32", "fp8"]),
    "quantize": st.sampled_from(["static_int8", "awq"]),
    "load_in_8bit": st.sampled_from(["true", "false", "maybe"]),
    "group_query_attention": st.sampled_from(["shard-over-heads", "replicated-heads", "all-gather-heads", "x"]),
    "rolling_batch_strategy": st.sampled_from(["continuous_batching", "naive_rolling_batch", "sometimes"]),
    "cache_layout": st.sampled_from(["SBH", "BSH", "HBS"]),
    "unroll": _integers(1, 2, 4, 5),
    "max_model_len": st.one_of(_integers(512, 4096, 100000), st.just("big")),
    "neuron_optimize_level": _integers(1, 3, 4),
    "fuse_qkv": st.sampled_from(["true", "perhaps"]),
    "speculative_draft_model": st.sampled_from(["[ngram]", "/opt/ml/model/draft", ""]),
    "speculative_length": st.sampled_from(["0", "5", "16", "17", "five"]),
    # The hf backend's load plan: device, KV pool and CPU kernels.
    "device": st.sampled_from(["auto", "cpu", "cuda", "tpu"]),
    "block_size": st.one_of(_integers(8, 16, 32, 4096), st.just("x")),
    "num_gpu_blocks_override": _integers(0, 1, 64, 512, 100000),
    "kv_cache_memory_bytes": _integers(1_000_000, 1 << 28, 1 << 34),
    "gpu_memory_utilization": st.sampled_from(["0.05", "0.5", "0.9", "1.5"]),
    "enable_prefix_caching": st.sampled_from(["true", "maybe"]),
    "cpu_linear_kernel": st.sampled_from(["stock", "onednn", "compiled", "mkl"]),
    "cpu_attention_kernel": st.sampled_from(["torch", "compiled"]),
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=OPTIONS, model_name=st.sampled_from(sorted(MODEL_CONFIGS)), instance=st.sampled_from(sorted(INSTANCES)))
# The two cases the issue found: validate said ok where the planner refuses, and the other way round.
@example(options={"backend": "neuronx", "tensor_parallel_degree": "2", "rolling_batch": "scheduler",
                  "max_rolling_batch_size": "4", "n_positions": "2048", "context_length_estimate": "256,512"},
         model_name="meta-llama--Meta-Llama-3-8B", instance="inf2.xlarge")
@example(options={"backend": "neuronx", "tensor_parallel_degree": "2", "rolling_batch": "scheduler",
                  "max_rolling_batch_size": "4", "n_positions": "2048", "context_length_estimate": "256,512,2048"},
         model_name="meta-llama--Meta-Llama-3-8B", instance="inf2.xlarge")
# Found by this test: the planner's warnings were dropped when the backend does not fit the instance.
@example(options={"backend": "neuronx"}, model_name="pythia-1b", instance="g5.12xlarge")
# Found by this test: "max" on a GPU instance, and a refused quantize method beside a backend on the wrong instance.
@example(options={"backend": "neuronx", "tensor_parallel_degree": "max"}, model_name="pythia-1b", instance="g5.12xlarge")
@example(options={"backend": "hf", "quantize": "awq"}, model_name="EleutherAI--gpt-j-6b", instance="inf2.24xlarge")
# The issue's: loading refuses a KV pool smaller than one full-length sequence, and so must validate.
@example(options={"num_gpu_blocks_override": "1"}, model_name="meta-llama--Meta-Llama-3-8B", instance="g5.2xlarge")
# A sliding window caps the sequence length the pool is sized for (Mistral's 4096 of its 32768 positions).
@example(options={"kv_cache_memory_bytes": str(600 << 20), "max_model_len": "100000"},
         model_name="mistral-7b-window", instance="g5.2xlarge")
# rolling_batch=vllm under backend=auto is vllm, whose options do not include neuronx's amp
@example(options={"backend": "auto", "rolling_batch": "vllm", "amp": "f16"}, model_name="EleutherAI--gpt-j-6b",
         instance="inf2.24xlarge")
def test_generated_configurations(options, model_name, instance):
    model = MODEL_CONFIGS[model_name]
    with tempfile.TemporaryDirectory(prefix="lmi-agree-") as root:
        assert_agree(write_dir(Path(root), options, model), model, INSTANCES[instance])


@pytest.mark.parametrize("buckets, refused", [("256,512", True), ("256,512,2048", False)])
def test_the_issues_examples(tmp_path, buckets, refused):
    """Llama on inf2.xlarge, continuous batching, n_positions=2048: the largest bucket must equal it."""
    model = MODEL_CONFIGS["meta-llama--Meta-Llama-3-8B"]
    options = {"backend": "neuronx", "tensor_parallel_degree": "2", "rolling_batch": "scheduler",
               "max_rolling_batch_size": "4", "n_positions": "2048", "context_length_estimate": buckets}
    model_dir = write_dir(tmp_path, options, model)
    report = validate_model_dir(model_dir, "inf2.xlarge")
    assert report.ok is not refused
    assert any("largest bucket must equal n_positions" in f.message for f in report.errors) is refused
    assert_agree(model_dir, model, INSTANCES["inf2.xlarge"])


def test_validate_reads_the_tool_call_options_as_the_handler_does(tmp_path):
    from lmi_handlers.config import ConfigError
    from lmi_tools.modeldir.handler_config import handler_config

    with pytest.raises(ConfigError, match="option.tool_call_parser='mistral'"):
        handler_config({"tool_call_parser": "mistral"}, str(tmp_path))
    assert handler_config({"enable_auto_tool_choice": "true", "tool_call_parser": "hermes"}, str(tmp_path))
