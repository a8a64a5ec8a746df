"""``lmi validate`` and the runtime agree: on every preset, for every backend on every instance, and on generated
configurations.

The runtime side is the handler's init call as the container runs it, through the same resolver the handler calls
(``lmi_handlers.deployment.resolve``), with the instance as its target: the handler's settings, the backend ``auto``
picks there, its options, and its load plan on one of the instance's devices with the weights already loaded
(``tensor_parallel_degree=max`` is every accelerator). Agreement:

* the runtime refuses  =>  validate reports the runtime's own message as an error;
* the runtime accepts  =>  validate's errors are only about the hardware (TP topology, memory, a backend
  on the wrong kind of instance); every warning the runtime would log is among validate's warnings, and validate
  calls exactly the options unknown that the runtime does not read; the batch validate sizes for is the batch the
  backend runs with (vLLM's: the ``max_num_seqs`` the runtime passes).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmi_handlers.backends.registry import NAMES
from lmi_handlers.backends.vllm.options import LMI_NAMES
from lmi_handlers.config import HANDLER_KEYS, SERVER_KEYS, ConfigError
from lmi_handlers.deployment import Deployment, Model, resolve
from lmi_tools.instances import INSTANCES, Instance
from lmi_tools.modeldir.image import target_image
from lmi_tools.modeldir.properties import parse_directives, read_serving_properties
from lmi_tools.modeldir.render import write_model_dir
from lmi_tools.modeldir.resources import known_model_config, preset_names, preset_spec
from lmi_tools.modeldir.spec import load_spec
from lmi_tools.models.architecture import load_config, read_architecture
from lmi_tools.validation.runtime import host
from lmi_tools.validation.sizing import gpu_head_layout, weight_bytes
from lmi_tools.validation.validate import Report, validate_model_dir

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


def runtime(props: dict[str, str], model: dict, instance: Instance, model_dir: Path) -> Deployment | str:
    """The deployment the handler's init call resolves on ``instance`` in the image the directory targets, DJL's mode
    decided there (the weights sized as the runtime measures them once loaded), or its refusal (the
    ``ConfigError``'s text)."""
    arch = read_architecture(model)
    weights = Model(model, lambda dtype, int8: weight_bytes(arch, gpu_head_layout(arch, 1), dtype, int8))
    directives = parse_directives((model_dir / "serving.properties").read_text(encoding="utf-8"))
    try:
        image = target_image(directives, instance.family, props)
        return resolve({**props, "model_dir": str(model_dir)}, host(instance, image), weights)
    except ConfigError as exc:
        return str(exc)


def assert_agree(model_dir: Path, model: dict, instance: Instance) -> Report:
    props = read_serving_properties(model_dir)
    deployment = runtime(props, model, instance, model_dir)
    report = validate_model_dir(model_dir, instance.name, model_dir / "config.json")
    errors = [f"{f.check}: {f.message}" for f in report.errors]
    if isinstance(deployment, str):
        assert any(f.message == deployment for f in report.errors), (deployment, errors)
        return report
    assert all(f.check in HARDWARE_CHECKS for f in report.errors), errors
    reported = {f.message for f in report.warnings}
    assert set(deployment.warnings) <= reported, (set(deployment.warnings) - reported)
    unknown = {f.message for f in report.warnings if f.check == "options" and " ignored" in f.message}
    assert unknown == set(deployment.unknown_keys())
    assert_reads_what_it_keeps(deployment)
    assert_sizes_the_batch_it_runs(deployment, report)
    return report


def assert_reads_what_it_keeps(deployment: Deployment) -> None:
    """An option the runtime calls unknown is one it does not pass on, and one it does not call unknown is one it
    reads: for vLLM, an LMI name or a pass-through engine argument (``tests/vllm/test_vllm_engine_args.py`` holds
    their list to the installed vLLM)."""
    if deployment.backend.name != "vllm":
        return  # the other backends read their options by name, each key a field of their Options
    warned = {re.search(r"option\.(\S+)", w).group(1) for w in deployment.unknown_keys()}
    passed = {key for key, _ in deployment.options.passthrough}
    kept = set(deployment.config.properties) - warned - HANDLER_KEYS - SERVER_KEYS
    assert not warned & passed, warned & passed
    assert kept <= set(LMI_NAMES) | passed, kept - set(LMI_NAMES) - passed


def assert_sizes_the_batch_it_runs(deployment: Deployment, report: Report) -> None:
    """The batch the plan (and so validate) sizes for is the one the backend runs with: vLLM's engine is given
    ``max_num_seqs`` from the options; the other backends load by the plan itself."""
    plan = deployment.plan
    if plan is None:
        return
    if deployment.backend.name == "vllm":
        assert plan.batch_size == deployment.options.engine_args("model").get("max_num_seqs")
    if deployment.config.continuous and not any(f.check == "backend" for f in report.errors):  # else not checked
        assert any(f.message.endswith(f": up to {plan.batch_size} sequences per step")
                   for f in report.findings if f.check == "batching"), report.findings


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
    "backend": st.sampled_from(NAMES),
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
    # vLLM's: its own name for the batch size, engine arguments it passes through, and ones it has not.
    "max_num_seqs": _integers(16, 256),
    "kv_cache_dtype": st.sampled_from(["auto", "fp8"]),
    "enforce_eager": st.sampled_from(["true", "false"]),
    "swap_space": _integers(4),
    "max_num_seq": _integers(8),
    "enable_lora": st.sampled_from(["true", "false"]),
    "max_lora_rank": _integers(8, 64, 1024),
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


#: Options every backend is asked about on every instance: one vLLM passes through (the issue's), one it reads under
#: LMI's name, and one nobody reads; the batch size left to its default (the issue's other one: LMI sends 32).
EVERY_BACKEND = {"num_gpu_blocks_override": "512", "enforce_eager": "true", "max_new_token": "5",
                 "rolling_batch": "scheduler", "n_positions": "2048"}


@pytest.mark.parametrize("instance", sorted(INSTANCES))
@pytest.mark.parametrize("backend", NAMES)
def test_every_backend_on_every_instance(backend, instance, tmp_path):
    model = MODEL_CONFIGS["meta-llama--Meta-Llama-3-8B"]
    report = assert_agree(write_dir(tmp_path, {"backend": backend, **EVERY_BACKEND}, model), model, INSTANCES[instance])
    if report.backend == "vllm":  # the issue's: vLLM reads num_gpu_blocks_override, and runs LMI's 32 sequences
        assert not any("num_gpu_blocks_override" in f.message for f in report.warnings)
        assert any("up to 32 sequences" in f.message for f in report.findings)


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
    from lmi_tools.modeldir.handler_config import settings

    with pytest.raises(ConfigError, match="option.tool_call_parser='mistral'"):
        settings({"tool_call_parser": "mistral"}, str(tmp_path))
    assert settings({"enable_auto_tool_choice": "true", "tool_call_parser": "hermes"}, str(tmp_path)).tools.auto
