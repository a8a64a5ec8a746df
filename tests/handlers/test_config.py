"""HandlerConfig: typed options, errors that name key/value/allowed, warnings for unknown keys."""

import pytest

from lmi_handlers.config import HandlerConfig, check_unknown_keys
from lmi_handlers.errors import ConfigError


def test_defaults_use_the_model_directory(tmp_path):
    config = HandlerConfig.from_properties({"model_dir": str(tmp_path)})
    assert config.model_id == str(tmp_path)
    assert (config.dtype, config.device, config.max_new_tokens, config.rolling_batch) == ("auto", "auto", 30,
                                                                                         "disable")
    assert config.trust_remote_code is False and not config.rolling


def test_typed_values(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    config = HandlerConfig.from_properties({
        "model_dir": str(tmp_path), "model_id": "weights", "dtype": "bfloat16", "device": "CPU",
        "max_new_tokens": "64", "output_formatter": "jsonlines", "rolling_batch": "auto",
        "max_rolling_batch_size": "8", "trust_remote_code": "true", "tensor_parallel_degree": "max",
    })
    assert config.model_id == str(weights)  # relative ids resolve against the model directory
    assert (config.dtype, config.device, config.max_new_tokens) == ("bf16", "cpu", 64)
    assert (config.output_formatter, config.rolling, config.max_rolling_batch_size) == ("jsonlines", True, 8)
    assert config.trust_remote_code and config.tensor_parallel_degree is None


def test_a_hub_id_passes_through(tmp_path):
    assert HandlerConfig.from_properties({"model_dir": str(tmp_path), "model_id": "org/model"}).model_id == "org/model"


@pytest.mark.parametrize("key, value, allowed", [
    ("dtype", "fp8", "allowed values are auto, fp32, float32, fp16, float16, bf16, bfloat16"),
    ("device", "tpu", "allowed values are auto, cpu, cuda"),
    ("max_new_tokens", "many", "expected an integer"),
    ("max_new_tokens", "0", "expected an integer >= 1"),
    ("batch_size", "1000", "expected an integer >= 1 and <= 999"),
    ("rolling_batch", "lmi-dist", "lmi_handlers runs its own continuous batching"),
    ("trust_remote_code", "maybe", "expected true or false"),
    ("output_formatter", "xml", "allowed values are json, jsonlines, sse"),
    ("model_id", "s3://bucket/model/", "downloaded by DJLServing"),
])
def test_bad_values_name_key_value_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError) as info:
        HandlerConfig.from_properties({key: value})
    message = str(info.value)
    assert f"option.{key}={value!r}" in message and allowed in message


def test_rolling_batch_with_dynamic_batching_is_refused():
    with pytest.raises(ConfigError, match="cannot be combined with rolling batch"):
        HandlerConfig.from_properties({"rolling_batch": "auto", "batch_size": "4"})


def test_unknown_keys_warn_with_a_suggestion():
    warnings = check_unknown_keys({"max_new_token": "5", "engine": "Python", "zzz_custom": "1",
                                   "enable_streaming": "true", "batch_000.x": "y"})
    assert any("did you mean option.max_new_tokens?" in w for w in warnings)
    assert any("unknown option.zzz_custom is ignored" == w for w in warnings)
    assert any("enable_streaming is an LMI option that lmi_handlers does not use" in w for w in warnings)
    assert len(warnings) == 3  # engine is DJL's own key; batch_ properties are per-request


def test_backend_keys_are_known():
    assert check_unknown_keys({"n_positions": "128"}, backend_keys={"n_positions"}) == []


def test_callables_from_the_engine_are_ignored(tmp_path):
    config = HandlerConfig.from_properties({"model_dir": str(tmp_path), "output_formatter": lambda x: x})
    assert config.output_formatter == ""


def test_cuda_without_a_visible_device_is_a_config_error():
    from types import SimpleNamespace

    from lmi_handlers.backends.hf.backend import resolve_device

    no_gpu = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False))
    with pytest.raises(ConfigError, match="option.device='cuda' is invalid: no CUDA device is visible"):
        resolve_device(no_gpu, "cuda")
    assert resolve_device(no_gpu, "auto") == "cpu"


@pytest.mark.parametrize("value, rolling", [(None, False), ("", False), ("disable", False), (" Disable ", False),
                                            ("scheduler", True), ("auto", True), ("tnx", True)])
def test_one_rule_for_rolling_batch(tmp_path, value, rolling):
    from lmi_handlers.config import is_rolling

    assert is_rolling(value) is rolling
    props = {"model_dir": str(tmp_path)} if value is None else {"model_dir": str(tmp_path), "rolling_batch": value}
    assert HandlerConfig.from_properties(props).rolling is rolling  # the handler reads it the same way


def test_request_limits_come_from_options(tmp_path):
    config = HandlerConfig.from_properties({"model_dir": str(tmp_path), "max_prompt_chars": "500",
                                            "max_prompts_per_request": "4"})
    assert (config.limits.max_prompt_chars, config.limits.max_prompts_per_request) == (500, 4)
    assert HandlerConfig.from_properties({"model_dir": str(tmp_path)}).limits.max_prompts_per_request == 64
    with pytest.raises(ConfigError, match="max_prompts_per_request='0'"):
        HandlerConfig.from_properties({"model_dir": str(tmp_path), "max_prompts_per_request": "0"})
    assert check_unknown_keys({"max_prompt_chars": "5", "max_prompts_per_request": "2"}) == []


def test_suggestions_are_spelled_as_serving_properties_writes_them():
    warnings = check_unknown_keys({"batchsize": "4", "max_batch_dely": "100"})
    assert any(w.endswith("did you mean batch_size?") for w in warnings)
    assert any(w.endswith("did you mean max_batch_delay?") for w in warnings)
