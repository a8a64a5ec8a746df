"""lmi validate: the rules of reference neuron.md §3 applied to model directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmi_tools.errors import UsageError
from lmi_tools.modeldir.render import write_model_dir
from lmi_tools.modeldir.resources import preset_names, preset_spec
from lmi_tools.modeldir.spec import load_spec
from lmi_tools.validation.validate import validate_model_dir

from .model_shapes import LLAMA_2_7B, LLAMA_2_13B

SHIM = "from lmi_handlers.entrypoint import handle  # noqa: F401\n"
NEURON = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "neuronx",
          "option.rolling_batch": "disable", "option.dtype": "fp16"}


def make_dir(root: Path, props: dict, instance: str | None = "inf2.48xlarge", config: dict | None = None,
             model_py: str | None = SHIM, name: str = "model") -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"# lmi: instance_type={instance}"] if instance else []
    lines += [f"{k}={v}" for k, v in props.items()]
    (directory / "serving.properties").write_text("\n".join(lines) + "\n")
    if model_py is not None:
        (directory / "model.py").write_text(model_py)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def by_check(report, check: str) -> list:
    return [f for f in report.findings if f.check == check]


def levels(report, check: str) -> set[str]:
    return {f.level for f in by_check(report, check)}


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate_against_their_model_configs(name, tmp_path):
    spec = load_spec(preset_spec(name))
    write_model_dir(spec, tmp_path, f"preset {name}")
    report = validate_model_dir(tmp_path)
    assert report.ok, [f"{f.check}: {f.message}" for f in report.errors]
    assert report.instance == spec.instance_type.removeprefix("ml.")
    assert "bundled reference config" in report.architecture
    assert report.figures["model copies"].endswith(f"TP {spec.tensor_parallel_degree}")


def opt_13b(tmp_path: Path, tp: int) -> Path:
    spec = load_spec(preset_spec("opt-13b-inf2-48xlarge")).model_copy(update={"tensor_parallel_degree": tp})
    write_model_dir(spec, tmp_path / f"tp{tp}", "test")
    return tmp_path / f"tp{tp}"


def test_opt_13b_passes_with_tp_8(tmp_path):
    report = validate_model_dir(opt_13b(tmp_path, 8))
    assert report.ok and not report.warnings
    assert report.figures["model copies"] == "3 x TP 8"
    assert report.figures["kv cache per token"].startswith("819,200 B")


def test_opt_13b_fails_with_tp_3_and_says_what_to_use(tmp_path):
    report = validate_model_dir(opt_13b(tmp_path, 3))
    [error] = report.errors
    assert error.check == "tensor parallel"
    assert "tensor_parallel_degree=3" in error.message and "1, 2, 4, 8, 24" in error.message
    assert error.hint == "TP degrees that fit on inf2.48xlarge: 2, 4, 8, 24"


def test_tp_beyond_the_cores(tmp_path):
    directory = make_dir(tmp_path, {**NEURON, "option.tensor_parallel_degree": 4, "option.n_positions": 1024},
                         "inf2.xlarge", LLAMA_2_7B)
    [error] = validate_model_dir(directory).errors
    assert "needs 4 NeuronCores; inf2.xlarge has 2" in error.message
    assert error.hint == "TP degrees that fit on inf2.xlarge: 1, 2"


def test_tp_12_is_a_warning(tmp_path):
    directory = make_dir(tmp_path, {**NEURON, "option.tensor_parallel_degree": 12, "option.n_positions": 1024},
                         "inf2.24xlarge", LLAMA_2_7B)
    report = validate_model_dir(directory)
    assert report.ok and levels(report, "tensor parallel") == {"warning"}


def test_gpt_j_heads_must_divide_tp(tmp_path):
    gptj = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048,
            "vocab_size": 50400, "torch_dtype": "float32"}
    directory = make_dir(tmp_path, {**NEURON, "option.tensor_parallel_degree": 24, "option.n_positions": 2048},
                         "inf2.48xlarge", gptj)
    [error] = validate_model_dir(directory).errors  # the runtime's planner refuses it
    assert error.check == "neuronx" and "16 attention heads must divide evenly" in error.message
    assert error.hint == "TP degrees that fit on inf2.48xlarge: 1, 2, 4, 8"


def test_padding_and_replication_are_warnings_with_numbers(tmp_path):
    llama_3 = {**LLAMA_2_7B, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    props = {**NEURON, "option.dtype": "bf16", "option.tensor_parallel_degree": 24, "option.n_positions": 4096}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.48xlarge", llama_3))
    messages = [f.message for f in by_check(report, "attention heads") + by_check(report, "neuronx")]
    assert any("pads them to 48 (50% more" in m for m in messages)  # the runtime planner's warning
    assert any("replicated-heads copies them to 24" in m and "3.0x" in m for m in messages)
    assert report.figures["kv cache per token"].startswith("393,216 B (384 KiB)")


def test_llama_2_7b_memory_needs_tp_2_on_inf2_xlarge(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 1, "option.n_positions": 2048, "batch_size": 4}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.xlarge", LLAMA_2_7B))
    [error] = report.errors
    assert error.check == "memory" and "KV cache 4.00 GiB" in error.message
    assert error.hint == "TP degrees that fit on inf2.xlarge: 2"


def test_nothing_fits_points_to_bigger_instances(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 4096, "batch_size": 8}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.xlarge", LLAMA_2_13B)).errors
    assert error.check == "memory"
    assert error.hint.startswith("nothing fits on inf2.xlarge; it fits on inf2.24xlarge (TP 4, 8)")


def test_int8_makes_llama_2_13b_fit_two_cores(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 512, "batch_size": 4,
             "option.enable_saturate_infinity": "true", "option.enable_mixed_precision_accumulation": "true"}
    fp16 = validate_model_dir(make_dir(tmp_path, props, "inf2.xlarge", LLAMA_2_13B, name="fp16"))
    assert levels(fp16, "memory") == {"warning"}
    int8 = validate_model_dir(make_dir(tmp_path, {**props, "option.quantize": "static_int8"}, "inf2.xlarge",
                                       LLAMA_2_13B, name="int8"))
    assert levels(int8, "memory") == {"ok"} and "int8" in int8.figures["weights"]
    assert levels(int8, "host memory") == {"warning"}  # 26 GB of fp16 checkpoint vs 16 GiB of host RAM


def test_llama_2_13b_fp16_on_neuron_asks_for_accuracy_flags(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 8, "option.n_positions": 2048}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.24xlarge", LLAMA_2_13B))
    [warning] = [f for f in by_check(report, "dtype") if f.level == "warning"]
    assert "option.enable_saturate_infinity=true" in warning.hint


@pytest.mark.parametrize("model_type, level", [("opt", "error"), ("llama", "warning")])
def test_positions_beyond_the_model(tmp_path, model_type, level):
    config = {"model_type": "opt", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
              "ffn_dim": 3072, "max_position_embeddings": 2048, "vocab_size": 50272} if model_type == "opt" \
        else LLAMA_2_7B
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 8192}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", config))
    [finding] = by_check(report, "neuronx")  # the runtime planner's refusal or warning
    assert finding.level == level
    assert ("positions up to 2048" if model_type == "opt" else "exceeds the 4096 positions") in finding.message


def test_context_buckets_longer_than_n_positions(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 1024,
             "option.context_length_estimate": "512,2048"}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B)).errors
    assert "every prefill bucket must be <= n_positions (1024)" in error.message


def test_n_positions_must_be_an_integer(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": "4k"}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B)).errors
    assert error.message == "option.n_positions='4k' is invalid: expected an integer"


def test_unset_n_positions_warns_and_sizes_for_the_model(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B))
    assert levels(report, "sequence length") == {"warning"}
    assert "1 x 4096 tokens" in report.figures["kv cache"]


@pytest.mark.parametrize("image, rolling, warned", [
    (None, None, False),  # djl-neuronx 0.30.0: unset is disable on a transformers-neuronx image
    (None, "auto", True),
    ("djl-lmi:0.29.0", None, True),  # unset is auto there, rewritten to lmi-dist or vllm
    ("djl-lmi:0.36.0", None, False),  # from 0.35 on auto turns async mode on instead (check_mode)
])
def test_rolling_batch_values_djl_would_change(tmp_path, image, rolling, warned):
    props = {k: v for k, v in NEURON.items() if k != "option.rolling_batch"}
    if rolling:
        props["option.rolling_batch"] = rolling
    props.update({"option.tensor_parallel_degree": 2, "option.n_positions": 1024})
    directory = make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B)
    if image:
        (directory / "serving.properties").write_text(f"# lmi: image={image}\n" +
                                                       (directory / "serving.properties").read_text())
    report = validate_model_dir(directory)
    assert any(f.level == "warning" and "rewrites auto" in f.message for f in by_check(report, "batching")) == warned


def test_rolling_batch_with_dynamic_batch_is_an_error(tmp_path):
    props = {**NEURON, "option.rolling_batch": "scheduler", "batch_size": 4}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B)).errors
    assert error.check == "properties" and "batch_size" in error.message


def test_rolling_batch_on_neuron_for_opt_warns(tmp_path):
    config = {"model_type": "opt", "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
              "ffn_dim": 3072, "max_position_embeddings": 2048, "vocab_size": 50272}
    props = {**NEURON, "option.rolling_batch": "scheduler", "option.tensor_parallel_degree": 2,
             "option.n_positions": 512}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", config))
    assert any("continuous batching" in f.message for f in by_check(report, "batching"))


@pytest.mark.parametrize("entry, model_py, ok, message", [
    ("model.py", SHIM, True, "model.py -> lmi_handlers.entrypoint (vendored by lmi package)"),
    ("lmi_handlers.entrypoint", None, True, "vendored by lmi package"),
    ("model.py", "def handle(inputs):\n    return None\n", True, "defines its own handle()"),
    ("model.py", None, False, "there is no model.py"),
    ("model.py", "import os\n", False, "neither defines nor imports handle()"),
    ("djl_python.transformers_neuronx", None, False, "DJLServing's built-in handler"),
    ("../outside.py", None, False, "outside the model directory"),
    (None, None, False, "no option.entryPoint and no model.py"),
])
def test_entry_point(tmp_path, entry, model_py, ok, message):
    props = {k: v for k, v in NEURON.items() if k != "option.entryPoint"}
    if entry:
        props["option.entryPoint"] = entry
    props.update({"option.tensor_parallel_degree": 2, "option.n_positions": 1024})
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B, model_py=model_py))
    [finding] = by_check(report, "entry point")
    assert (finding.level == "ok") == ok and message in finding.message


def test_unknown_and_misspelt_options(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positons": 1024, "option.load_in_8bit": "maybe",
             "option.dtype": "fp16 "}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B))
    messages = [f.message for f in by_check(report, "options")]
    assert any("did you mean option.n_positions" in m for m in messages)
    assert any("dtype ends in whitespace" in m for m in messages)
    [error] = report.errors  # the runtime's boolean parser
    assert error.message == "option.load_in_8bit='maybe' is invalid: expected true or false"


def test_backend_must_match_the_hardware(tmp_path):
    props = {**NEURON, "option.backend": "hf"}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.xlarge", LLAMA_2_7B, name="a")).errors
    assert error.message.startswith("backend hf runs on cpu, g4dn, g5") and "inf2.xlarge is not one" in error.message
    assert error.hint == "use option.backend=vllm or neuronx (or auto) on inf2.xlarge"
    [error] = validate_model_dir(make_dir(tmp_path, NEURON, "g5.2xlarge", LLAMA_2_7B, name="b")).errors
    assert error.message == "backend neuronx runs on inf2, trn1, trn1n, trn2 instances; g5.2xlarge is not one"
    assert error.hint == "use option.backend=vllm or hf (or auto) on g5.2xlarge"


def test_neuronx_rejects_architectures_without_a_model_class(tmp_path):
    qwen = {**LLAMA_2_7B, "model_type": "qwen2"}
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 1024}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", qwen)).errors
    assert "model_type='qwen2'; the neuronx backend serves" in error.message


def test_gpu_instance_with_hf_backend(tmp_path):
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf",
             "option.tensor_parallel_degree": 1, "option.rolling_batch": "scheduler",
             "option.max_rolling_batch_size": 32, "option.max_model_len": 4096, "option.dtype": "fp16"}
    report = validate_model_dir(make_dir(tmp_path, props, "g5.2xlarge", LLAMA_2_7B))
    # The hf load plan sizes its KV pool to what the weights leave of 90% of the GPU: it loads, with room for 4 of
    # the 32 sequences at full length at once.
    assert report.ok
    [memory] = by_check(report, "memory")
    assert memory.level == "warning" and "per A10G GPU" in memory.message
    assert "a pool of 18,528 tokens: 4 of 32 sequences at full length (4096 tokens)" in report.figures["kv cache"]


def test_idle_cores_and_copies(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 8, "option.n_positions": 1024}
    report = validate_model_dir(make_dir(tmp_path, props, "trn1.32xlarge", LLAMA_2_7B))
    assert [f.message for f in by_check(report, "model copies")][0].startswith("4 model copies of TP 8 on 32")
    report = validate_model_dir(make_dir(tmp_path, {**props, "option.tensor_parallel_degree": 16}, "inf2.48xlarge",
                                         LLAMA_2_7B, name="idle"))
    assert "tensor parallel" in {f.check for f in report.errors}  # 16 is not an inf2 topology


def test_scripted_backend_skips_hardware_checks(tmp_path):
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "scripted",
             "option.rolling_batch": "disable"}
    report = validate_model_dir(make_dir(tmp_path, props, "g5.xlarge", LLAMA_2_7B))
    assert report.ok and any("scripted backend" in f.message for f in report.findings)


def test_config_resolution_order(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps(LLAMA_2_13B))
    props = {**NEURON, "option.model_id": str(weights), "option.tensor_parallel_degree": 8,
             "option.n_positions": 512}
    directory = make_dir(tmp_path, props, "inf2.48xlarge", LLAMA_2_7B)
    assert str(weights / "config.json") in validate_model_dir(directory).architecture  # model_id's directory first
    explicit = tmp_path / "explicit.json"
    explicit.write_text(json.dumps(LLAMA_2_7B))
    report = validate_model_dir(directory, config_path=explicit)
    assert report.architecture.endswith(f"(from {explicit})")  # --config wins
    props.pop("option.model_id")
    own = make_dir(tmp_path, props, "inf2.48xlarge", LLAMA_2_7B, name="own")
    assert str(own / "config.json") in validate_model_dir(own).architecture


def test_missing_config_is_an_error_with_a_hint(tmp_path):
    props = {**NEURON, "option.model_id": "someone/unknown-model", "option.tensor_parallel_degree": 2}
    [error] = validate_model_dir(make_dir(tmp_path, props, "inf2.xlarge")).errors
    assert error.check == "architecture" and error.hint == "pass --config PATH/TO/config.json"


def test_s3_model_id_is_downloaded_by_djl(tmp_path):
    props = {**NEURON, "option.model_id": "s3://bucket/llama/", "option.tensor_parallel_degree": 2,
             "option.n_positions": 1024}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge"), config_path=_write(tmp_path, LLAMA_2_7B))
    assert report.ok
    assert "DJLServing downloads s3://bucket/llama/" in by_check(report, "weights")[0].message


def _write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "given-config.json"
    path.write_text(json.dumps(config))
    return path


def test_instance_comes_from_the_flag_or_the_directive(tmp_path):
    props = {**NEURON, "option.tensor_parallel_degree": 2, "option.n_positions": 1024}
    directory = make_dir(tmp_path, props, None, LLAMA_2_7B)
    with pytest.raises(UsageError, match="no instance type") as info:
        validate_model_dir(directory)
    assert "--instance" in info.value.hint
    assert validate_model_dir(directory, instance="ml.inf2.8xlarge").instance == "inf2.8xlarge"
    with pytest.raises(UsageError, match="unknown instance type"):
        validate_model_dir(directory, instance="inf9.tiny")


def test_report_is_json_serializable(tmp_path):
    report = validate_model_dir(opt_13b(tmp_path, 8))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is True and data["backend"] == "neuronx"
    assert {f["check"] for f in data["findings"]} >= {"tensor parallel", "attention heads", "memory",
                                                      "sequence length", "batching", "dtype", "model copies",
                                                      "host memory", "entry point", "options"}


def test_hf_int8_weights_count_in_the_memory_fit_and_a_wrong_method_is_an_error(tmp_path):
    gpu = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf", "option.dtype": "fp16"}
    fp16 = validate_model_dir(make_dir(tmp_path, gpu, "g5.xlarge", LLAMA_2_13B, name="fp16"))
    int8 = validate_model_dir(make_dir(tmp_path, {**gpu, "option.quantize": "static_int8"}, "g5.xlarge",
                                       LLAMA_2_13B, name="int8"))
    assert "int8" in int8.figures["weights"] and levels(int8, "memory") != {"error"}  # ~13 GB on 24 GiB
    [error] = fp16.errors  # 26 GB of weights leave the load plan no room for a KV cache
    assert error.check == "hf" and "option.gpu_memory_utilization=0.9 is invalid: the KV cache must hold" in \
        error.message and "less 26031728640 for the weights" in error.message
    awq = validate_model_dir(make_dir(tmp_path, {**gpu, "option.quantize": "awq"}, "g5.xlarge", LLAMA_2_13B,
                                      name="awq"))
    [error] = [f for f in awq.errors if f.check == "hf"]
    assert "option.quantize='awq' is invalid" in error.message and "static_int8" in error.message


def test_an_unknown_cpu_linear_kernel_is_an_error_naming_what_is_allowed(tmp_path):
    gpu = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf", "option.dtype": "fp16"}
    report = validate_model_dir(make_dir(tmp_path, {**gpu, "option.cpu_linear_kernel": "mkl"}, "g5.xlarge",
                                         LLAMA_2_13B))
    [error] = [f for f in report.errors if f.check == "hf"]
    assert "option.cpu_linear_kernel='mkl' is invalid" in error.message
    assert "auto, stock, onednn, compiled" in error.message


@pytest.mark.parametrize("options", [{"option.dtype": "fp16"}, {"option.device": "cpu"}, {}])
def test_auto_cpu_kernels_are_valid_anywhere_they_are_the_stock_path_off_float32_cpu(tmp_path, options):
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf",
             "option.cpu_linear_kernel": "auto", "option.cpu_attention_kernel": "auto", **options}
    report = validate_model_dir(make_dir(tmp_path, props, "g5.xlarge", LLAMA_2_13B))
    assert not [f for f in report.errors if "kernel" in f.message], report.errors


@pytest.mark.parametrize("kernel", [("cpu_linear_kernel", "onednn"), ("cpu_linear_kernel", "compiled"),
                                    ("cpu_attention_kernel", "compiled")])
@pytest.mark.parametrize("options, refused", [({}, True), ({"option.dtype": "fp32"}, True),
                                              ({"option.device": "cpu", "option.dtype": "fp16"}, True),
                                              ({"option.device": "cpu"}, False),
                                              ({"option.device": "cpu", "option.dtype": "fp32"}, False)])
def test_cpu_kernels_off_the_cpu_or_float32_are_an_error_before_deploying(tmp_path, kernel, options, refused):
    # the handler would refuse them at its init call, after the endpoint was created and the model copied
    key, value = kernel
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf", f"option.{key}": value,
             **options}
    report = validate_model_dir(make_dir(tmp_path, props, "g5.xlarge", LLAMA_2_13B))
    errors = [f for f in report.errors if key in f.message]
    assert bool(errors) == refused, report.errors
    if refused:
        assert f"option.{key}='{value}' is invalid" in errors[0].message and "float32" in errors[0].message


# The original inf2 example: a model.py with its own handle() that reads option.dtype=f16 (amp style) itself.
OWN_HANDLE = '''from djl_python import Input, Output


def handle(inputs: Input):
    if inputs.is_empty():
        return None
    return Output().add_as_json({"outputs": [inputs.get_as_json()["text"]]})
'''


def test_own_handle_reads_its_own_dtype_so_validate_package_and_inspect_accept_it(tmp_path):
    from lmi_tools.packaging.artifact import inspect_artifact
    from lmi_tools.packaging.package import build

    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("engine=Python\noption.tensor_parallel_degree=2\noption.dtype=f16\n"
                                              "option.n_positions=128\nbatch_size=4\n")
    (model / "model.py").write_text(OWN_HANDLE)
    report = validate_model_dir(model, "inf2.xlarge")
    assert report.ok and any("defines its own handle()" in f.message for f in report.findings if f.level == "info")
    build(model, tmp_path / "model.tar.gz", None, instance="inf2.xlarge")
    inspected = inspect_artifact(tmp_path / "model.tar.gz")
    assert inspected.ok and any("own handle() reads it" in note for note in inspected.notes)


def test_lmi_handlers_entry_point_still_refuses_f16(tmp_path):
    model = make_dir(tmp_path, {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                "option.dtype": "f16"}, instance="inf2.xlarge")
    report = validate_model_dir(model)
    assert not report.ok and "option.dtype='f16' is invalid" in report.findings[0].message


def test_container_model_path_is_the_model_directory_and_other_absolute_paths_are_not_hub_ids(tmp_path):
    model = make_dir(tmp_path, {"engine": "Python", "option.entryPoint": "lmi_handlers.entrypoint",
                                "option.model_id": "/nowhere/llama"}, instance="inf2.xlarge")
    report = validate_model_dir(model)
    weights = by_check(report, "weights")
    assert weights[0].level == "warning" and "absolute path that does not exist" in weights[0].message
    assert all("hub" not in f.message for f in report.findings if f.level == "error")


def test_a_draft_model_with_another_tokenizer_is_an_error_naming_both(tmp_path, tiny_model_dir):
    pytest.importorskip("torch")
    from lmi_tools.models.tiny import TinySpec, build_tiny_model

    stranger = build_tiny_model(tmp_path / "stranger", TinySpec(seed=1))
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.backend": "hf",
             "option.model_id": str(tiny_model_dir), "option.rolling_batch": "scheduler"}
    same = validate_model_dir(make_dir(tmp_path, {**props, "option.speculative_draft_model": str(tiny_model_dir)},
                                       "g5.xlarge", name="same"))
    assert same.ok, [f.message for f in same.errors]
    other = validate_model_dir(make_dir(tmp_path, {**props, "option.speculative_draft_model": str(stranger)},
                                        "g5.xlarge", name="other"))
    [error] = other.errors
    assert "option.speculative_draft_model" in error.message and "vocabularies differ" in error.message
    assert str(stranger) in error.message and str(tiny_model_dir) in error.message
    length = validate_model_dir(make_dir(tmp_path, {**props, "option.speculative_draft_model": "[ngram]",
                                                    "option.speculative_length": "40"}, "g5.xlarge", name="long"))
    assert any("option.speculative_length='40' is invalid" in f.message for f in length.errors)


SYNC_HANDLE = "from djl_python import Output\n\ndef handle(inputs):\n    return None\n"
ASYNC_HANDLE = "from djl_python import Output\n\nasync def handle(inputs):\n    return None\n"


@pytest.mark.parametrize("model_py, refused", [(SYNC_HANDLE, True), (ASYNC_HANDLE, False), (SHIM, False)])
def test_the_mode_of_a_current_vllm_image_and_a_handle_of_the_models_own(tmp_path, model_py, refused):
    """A text-generation model with rolling_batch unset on djl-lmi 0.36: LMI's recommender turns async mode on,
    which lmi_handlers answers and a plain handle() of the model's own cannot."""
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.tensor_parallel_degree": 4}
    config = {**LLAMA_2_7B, "architectures": ["LlamaForCausalLM"]}
    report = validate_model_dir(make_dir(tmp_path, props, "ml.g5.12xlarge", config, model_py=model_py))
    [mode, *mismatch] = by_check(report, "mode")
    assert mode.message.startswith("djl-lmi:0.36.0: DJL's async engine (option.rolling_batch is not set")
    assert bool(mismatch) == refused and (not refused or mismatch[0].level == "error")
    if refused:
        assert "async def handle(inputs)" in mismatch[0].hint and "lmi_handlers.entrypoint" in mismatch[0].hint


def test_the_last_neuronx_image_runs_sync_and_ignores_async_mode(tmp_path):
    props = {**NEURON, "option.async_mode": "true", "option.tensor_parallel_degree": 2, "option.n_positions": 1024}
    report = validate_model_dir(make_dir(tmp_path, props, "inf2.8xlarge", LLAMA_2_7B))
    [mode] = by_check(report, "mode")
    assert mode.level == "warning" and "djl-neuronx:0.30.0 (DJL 0.30.0) has only the synchronous engine" in mode.message


def test_djls_batching_beside_async_mode_is_an_error(tmp_path):
    props = {"engine": "Python", "option.entryPoint": "model.py", "option.tensor_parallel_degree": 4,
             "option.async_mode": "true", "option.rolling_batch": "scheduler"}
    report = validate_model_dir(make_dir(tmp_path, props, "ml.g5.12xlarge", LLAMA_2_7B))
    [error] = report.errors
    assert error.check == "mode" and "option.rolling_batch='scheduler'" in error.message
