"""``option.dtype=auto``: one rule for our engine (bfloat16 on a CPU with native bfloat16, float32 on other CPUs, the
checkpoint's 16-bit type on CUDA) and vLLM's own, each with its reason; the plans of both backends follow it, and
the CPU's flags are read without torch."""

import pytest

from lmi_handlers.backends import hf, vllm
from lmi_handlers.backends.base import DeviceMemory
from lmi_handlers.config import HandlerConfig
from lmi_handlers.default_dtype import auto_dtype, cpu_flags, cpu_model, option_or_auto, vllm_auto_dtype

ZEN4 = frozenset({"fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
AVX2_ONLY = frozenset({"fpu", "avx2", "fma"})
SKYLAKE = frozenset({"avx2", "avx512f", "avx512bw"})  # AVX-512 without its BF16 extension


@pytest.mark.parametrize("flags, dtype, named", [(ZEN4, "bf16", "avx512_bf16"),
                                                 (SAPPHIRE_RAPIDS, "bf16", "avx512_bf16, amx_bf16"),
                                                 (AVX2_ONLY, "fp32", "no native bfloat16"),
                                                 (SKYLAKE, "fp32", "no native bfloat16"),
                                                 (frozenset(), "fp32", "no native bfloat16")])
def test_auto_on_the_cpu_follows_the_cpus_native_bfloat16_whatever_the_checkpoint(flags, dtype, named):
    for stored in ("fp32", "fp16", "bf16", None):
        choice = auto_dtype("cpu", stored, flags)
        assert choice.dtype == dtype and named in choice.reason


@pytest.mark.parametrize("stored, dtype", [("fp16", "fp16"), ("bf16", "bf16"), ("fp32", "fp16"), (None, "fp16")])
def test_auto_on_cuda_is_the_checkpoints_16_bit_type_whatever_the_host_cpu(stored, dtype):
    assert auto_dtype("cuda", stored, ZEN4).dtype == auto_dtype("cuda", stored, frozenset()).dtype == dtype


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("stored, dtype", [("fp16", "fp16"), ("bf16", "bf16"), ("fp32", "bf16"), (None, "bf16")])
def test_vllms_auto_casts_float32_checkpoints_to_bfloat16_and_keeps_16_bit_ones(device, stored, dtype):
    # vLLM 0.32: platforms/cpu.py supported_dtypes (bfloat16 first on x86 and Arm), config/model.py
    # _resolve_auto_dtype; on GPUs of compute capability 8.0 or more bfloat16 is first too.
    choice = vllm_auto_dtype(device, stored)
    assert choice.dtype == dtype and "vLLM" in choice.reason


def test_an_explicit_dtype_wins_and_says_so():
    assert option_or_auto("fp32", auto_dtype("cpu", "bf16", ZEN4)).dtype == "fp32"
    assert option_or_auto("fp32", auto_dtype("cpu", "bf16", ZEN4)).reason == "option.dtype=fp32"
    assert option_or_auto("auto", auto_dtype("cpu", "bf16", ZEN4)).dtype == "bf16"


def test_cpu_flags_and_model_are_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                   "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(x86) == {"fpu", "avx512f", "avx512_bf16"} and cpu_model(x86) == "AMD EPYC 9R14"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(arm) == {"fp", "asimd", "bf16"} and cpu_model(arm) == "unknown"
    assert cpu_flags(tmp_path / "missing") == frozenset() and cpu_model(tmp_path / "missing") == "unknown"


SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "hidden_size": 576, "max_position_embeddings": 8192, "torch_dtype": "float32"}


@pytest.mark.parametrize("props, flags, dtype, reason", [
    ({}, ZEN4, "bf16", "natively"), ({}, AVX2_ONLY, "fp32", "no native"),
    ({"dtype": "fp32"}, ZEN4, "fp32", "option.dtype=fp32"), ({"dtype": "bf16"}, AVX2_ONLY, "bf16", "option.dtype")])
def test_the_hf_plan_loads_what_the_rule_says_and_sizes_its_kv_cache_in_it(props, flags, dtype, reason):
    config = HandlerConfig.from_properties({"model_id": "m", **props})
    plan = hf.plan(config, hf.Options.from_properties(config.properties), SMOLLM2, DeviceMemory("cpu", cpu_flags=flags))
    assert plan.dtype == dtype and reason in plan.dtype_reason
    assert plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * (4 if dtype == "fp32" else 2)


@pytest.mark.parametrize("flags", [ZEN4, AVX2_ONLY])
def test_the_vllm_plan_says_vllms_own_choice_on_the_cpu_whatever_its_flags(flags):
    config = HandlerConfig.from_properties({"model_id": "m", "rolling_batch": "vllm"})
    plan = vllm.plan(config, vllm.Options.from_properties(config.properties), SMOLLM2,
                     DeviceMemory("cpu", cpu_flags=flags))
    assert plan.dtype == "bf16" and "vLLM" in plan.dtype_reason
