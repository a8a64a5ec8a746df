"""A model directory in AWS's vLLM container, without vLLM: serving.properties as its SM_VLLM_* environment and
its entrypoint's arguments, what has no vLLM equivalent refused by name, the image URIs, and lmi validate, package,
docker-run and serve with --container vllm. (vLLM's own parser and server: tests/vllm, integration_tests/vllm.)"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from lmi_handlers.config import ConfigError
from lmi_tools.cli import main
from lmi_tools.containers.vllm.checks import script_kind, validate_container
from lmi_tools.containers.vllm.environment import container_environment, entrypoint_args, model_location
from lmi_tools.containers.vllm.images import public_image, vllm_image
from lmi_tools.errors import UsageError
from lmi_tools.modeldir.resources import TEMPLATES, resource_dir

from .model_shapes import LLAMA_2_13B
from .test_validate import SHIM, make_dir

MODEL = "meta-llama/Llama-2-13b-chat-hf"
LMI = {"engine": "Python", "option.entryPoint": "model.py", "option.model_id": MODEL, "option.rolling_batch": "vllm",
       "option.tensor_parallel_degree": "4", "option.max_model_len": "4096", "option.dtype": "fp16",
       "option.max_rolling_batch_size": "64", "option.max_rolling_batch_prefill_tokens": "2048"}
TEMPLATE = (resource_dir(TEMPLATES) / "model.py.j2").read_text()


def env_of(props: dict, **kwargs) -> dict:
    return container_environment(props, kwargs.pop("model", MODEL), **kwargs).env


def test_lmis_names_become_the_engine_arguments_the_vllm_backend_passes():
    props = {key.removeprefix("option."): value for key, value in LMI.items()}
    env = env_of({**props, "quantize": "awq", "enable_chunked_prefill": "false", "enforce_eager": "true",
                  "speculative_draft_model": "ngram", "speculative_length": "4", "kv_cache_dtype": "fp8",
                  "enable_auto_tool_choice": "true", "tool_call_parser": "hermes", "max_new_tokens": "64",
                  "output_formatter": "jsonlines"}, served_name="llama")
    assert env == {
        "SM_VLLM_DTYPE": "float16", "SM_VLLM_ENABLE_AUTO_TOOL_CHOICE": "true", "SM_VLLM_ENFORCE_EAGER": "true",
        "SM_VLLM_KV_CACHE_DTYPE": "fp8", "SM_VLLM_MAX_MODEL_LEN": "4096", "SM_VLLM_MAX_NUM_BATCHED_TOKENS": "2048",
        "SM_VLLM_MAX_NUM_SEQS": "64", "SM_VLLM_MODEL": MODEL, "SM_VLLM_NO_ENABLE_CHUNKED_PREFILL": "true",
        "SM_VLLM_QUANTIZATION": "awq", "SM_VLLM_SERVED_MODEL_NAME": "llama",
        "SM_VLLM_SPECULATIVE_CONFIG": '{"method":"ngram","num_speculative_tokens":4}',
        "SM_VLLM_TENSOR_PARALLEL_SIZE": "4", "SM_VLLM_TOOL_CALL_PARSER": "hermes"}


def test_the_entrypoint_turns_the_variables_into_flags_as_the_containers_does():
    env = {"SM_VLLM_MODEL": "/opt/ml/model", "SM_VLLM_ENFORCE_EAGER": "true", "SM_VLLM_TRUST_REMOTE_CODE": "false",
           "SM_VLLM_NO_ENABLE_PREFIX_CACHING": "true", "SM_VLLM_DISABLE_LOG_STATS": "",
           "SM_VLLM_LORA_MODULES": '[{"name": "a1", "path": "/opt/ml/model/adapters/a1"}, "b=/b"]',
           "SM_VLLM_SPECULATIVE_CONFIG": '{"method": "ngram"}', "OPTION_DTYPE": "fp16"}
    assert entrypoint_args(env) == [
        "--disable-log-stats", "--enforce-eager",
        "--lora-modules", '{"name":"a1","path":"/opt/ml/model/adapters/a1"}', "b=/b",
        "--model", "/opt/ml/model", "--no-enable-prefix-caching", "--speculative-config", '{"method": "ngram"}']


def test_lora_options_and_the_adapters_folder_become_lora_modules():
    env = env_of({"enable_lora": "true", "max_lora_rank": "20"}, adapters=["b", "a"])
    assert env["SM_VLLM_ENABLE_LORA"] == "true" and env["SM_VLLM_MAX_LORA_RANK"] == "32"  # vLLM's next rank
    assert env["SM_VLLM_MAX_LORAS"] == "4" and env["SM_VLLM_MAX_CPU_LORAS"] == "4"  # LMI's defaults, not vLLM's
    assert json.loads(env["SM_VLLM_LORA_MODULES"]) == [{"name": "a", "path": "/opt/ml/model/adapters/a"},
                                                      {"name": "b", "path": "/opt/ml/model/adapters/b"}]
    with pytest.raises(ConfigError, match="enable_lora.*adapters folder holds a"):
        env_of({}, adapters=["a"])


@pytest.mark.parametrize("props, key", [
    ({"backend": "hf"}, "backend"), ({"rolling_batch": "scheduler"}, "rolling_batch"), ({"device": "cpu"}, "device"),
    ({"amp": "f16"}, "amp"), ({"cpu_linear_kernel": "onednn"}, "cpu_linear_kernel"),
    ({"model_id": "s3://bucket/llama/"}, "model_id"),
    ({"override_neuron_config": '{"a": 1}'}, "override_neuron_config"),
    ({"max_num_seq": "8"}, "max_num_seq"), ({"enable_streaming": "true"}, "enable_streaming"),
    ({"task": "text-embedding"}, "task"), ({"output_formatter": "xml"}, "output_formatter"),
])
def test_an_option_with_no_vllm_equivalent_is_refused_by_name(props, key):
    with pytest.raises(ConfigError) as refused:
        env_of(props)
    assert refused.value.key == key and key in str(refused.value)


def test_the_reasoning_parser_is_the_handlers_and_vllms():
    assert env_of({"reasoning_parser": "qwen3", "task": "text-generation"})["SM_VLLM_REASONING_PARSER"] == "qwen3"


def test_djlservings_own_settings_are_named_in_notes_and_hf_pool_names_are_vllms():
    result = container_environment({"engine": "Python", "job_queue_size": "100", "batch_size": "4",
                                    "predict_timeout": "240", "block_size": "32"}, MODEL)
    assert result.env["SM_VLLM_BLOCK_SIZE"] == "32"
    assert "batch_size" in result.notes[0] and "job_queue_size" in result.notes[1] and "predict_timeout" in \
        result.notes[1]


def test_tensor_parallel_degree_max_is_the_instances_gpus_and_the_model_is_where_the_container_has_it():
    assert env_of({"tensor_parallel_degree": "max"}, gpus=8)["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "8"
    assert model_location("", False) == "/opt/ml/model" and model_location("weights", True) == "/opt/ml/model/weights"
    assert model_location(MODEL, False) == MODEL and model_location("/opt/ml/model/w", False, "/tmp/m") == "/tmp/m/w"


def test_image_uris_from_the_table_and_the_public_gallery():
    image = vllm_image("eu-west-1")
    assert image.uri == "763104351884.dkr.ecr.eu-west-1.amazonaws.com/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-sagemaker"
    china = vllm_image("cn-north-1", version="0.14.0").uri
    assert china.startswith("727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/vllm:0.14.0-")
    assert public_image("0.20.0") == ("public.ecr.aws/deep-learning-containers/vllm:"
                                      "0.20.0-gpu-py312-cu130-ubuntu22.04-sagemaker")
    with pytest.raises(UsageError, match="0.99.0"):
        vllm_image("us-east-1", version="0.99.0")


def lmi_dir(tmp_path: Path, model_py: str | None = TEMPLATE, **extra) -> Path:
    return make_dir(tmp_path, {**LMI, **extra}, "g5.12xlarge", LLAMA_2_13B, model_py=model_py)


def test_validate_sizes_vllms_engine_per_gpu_and_lists_the_environment(tmp_path):
    report = validate_container(lmi_dir(tmp_path))
    assert report.ok and report.backend.startswith("vllm")
    assert report.figures["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4" and "per A10G GPU" in report.figures
    assert not [f for f in report.findings if f.check == "mode"]  # DJLServing's engine modes do not apply
    one_gpu = validate_container(lmi_dir(tmp_path / "one", **{"option.tensor_parallel_degree": "1"}))
    assert not one_gpu.ok and any("gpu_memory_utilization" in f.message for f in one_gpu.errors)


def test_validate_refuses_an_option_by_name_and_a_neuron_instance(tmp_path, capsys):
    directory = lmi_dir(tmp_path, **{"option.amp": "f16"})
    assert main(["validate", str(directory), "--container", "vllm"]) == 3
    assert "option.amp" in capsys.readouterr().out
    report = validate_container(directory, "inf2.48xlarge")
    assert any("no NVIDIA GPU" in f.message for f in report.errors)


@pytest.mark.parametrize("model_py, kind", [
    (TEMPLATE, "lmi"), (SHIM, "djl"), (None, "none"),
    ("from model_hosting_container_standards.common.fastapi.middleware import output_formatter\n", "own"),
    ("async def custom_sagemaker_invocation_handler(request):\n    pass\n", "own")])
def test_which_model_py_serves_the_container(tmp_path, model_py, kind):
    assert script_kind(lmi_dir(tmp_path, model_py)) == kind


def test_package_ships_the_model_py_of_both_containers_instead_of_djls_alone(tmp_path, capsys):
    directory = lmi_dir(tmp_path, SHIM)
    out = tmp_path / "model.tar.gz"
    assert main(["package", str(directory), "-o", str(out), "--container", "vllm"]) == 0
    assert "model.py: the artifact has lmi render's model.py" in capsys.readouterr().err
    with tarfile.open(out) as tar:
        shipped = tar.extractfile("model.py").read().decode()
        assert shipped == TEMPLATE and "lmi_handlers/vllm_container/routes.py" in tar.getnames()
    own = "from model_hosting_container_standards.sagemaker import custom_ping_handler\n"
    (directory / "model.py").write_text(own)
    assert main(["package", str(directory), "-o", str(out), "--container", "vllm"]) == 0
    with tarfile.open(out) as tar:
        assert tar.extractfile("model.py").read().decode() == own


def test_docker_run_prints_the_containers_line(tmp_path, capsys):
    directory = lmi_dir(tmp_path)
    assert main(["docker-run", str(directory), "--container", "vllm"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("docker run --rm --name vllm-model --gpus all --ipc host -p 8080:8080 -v ")
    assert f"-e SM_VLLM_MODEL={MODEL} " in out and "-e SM_VLLM_TENSOR_PARALLEL_SIZE=4 " in out
    assert out.strip().endswith("public.ecr.aws/deep-learning-containers/vllm:0.27.1-gpu-py312-cu130-ubuntu22.04-"
                                "sagemaker") and "4 x A10G" in err
    assert main(["docker-run", str(directory), "--container", "vllm", "-i", "inf2.48xlarge"]) == 3


def test_serve_needs_vllm_and_one_directory(tmp_path, capsys):
    directory = lmi_dir(tmp_path)
    assert main(["serve", "--container", "vllm", str(directory), str(directory)]) == 2
    assert "one model directory" in capsys.readouterr().err
    assert main(["serve", "--container", "vllm", str(directory), "--management-port", "9"]) == 2
    assert main(["serve", "--container", "tgi", str(directory)]) == 2


def test_serve_says_how_to_get_vllm_where_it_is_missing(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: integration_tests/vllm/test_vllm_container.py serves with it")
    assert main(["serve", "--container", "vllm", str(lmi_dir(tmp_path))]) == 2
    assert "scripts/setup.sh --vllm" in capsys.readouterr().err


def test_the_local_servers_log_line_masks_secrets():
    from lmi_tools.containers.vllm.launch import Launch

    launch = Launch(["python", "-m", "vllm.entrypoints.openai.api_server", "--hf-token", "hf_abc", "--model", "m"],
                    {"SM_VLLM_HF_TOKEN": "hf_abc", "SM_VLLM_MODEL": "m", "PYTHONPATH": "/x"})
    assert "hf_abc" not in launch.shown() and "--hf-token '****' --model m" in launch.shown()
