"""Head padding and KV-cache arithmetic against the worked examples of reference neuron.md §3."""

from __future__ import annotations

import pytest

from lmi_tools.models.architecture import read_architecture
from lmi_tools.validation.sizing import (
    GIB, _replicated_kv_heads, footprint, kv_bytes_per_token, neuron_head_layout, padding_parameters,
)

from .model_shapes import LLAMA_2_7B, LLAMA_2_13B, LLAMA_2_70B

LLAMA_3_8B = {**LLAMA_2_7B, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
              "max_position_embeddings": 8192}
GPT_J = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048, "vocab_size": 50400}
KIB = 1024


def kv_per_token(config: dict, tp: int, dtype: str = "fp16") -> int:
    arch = read_architecture(config)
    return kv_bytes_per_token(arch, neuron_head_layout(arch, tp).effective_kv_heads, dtype)


def test_llama_2_7b_fp16_is_half_a_mib_per_token():
    assert kv_per_token(LLAMA_2_7B, 1) == 512 * KIB


def test_llama_2_13b_is_819200_bytes_per_token():
    assert kv_per_token(LLAMA_2_13B, 1) == 819_200


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama_3_8b_keeps_8_kv_heads_up_to_tp_8(tp):
    assert kv_per_token(LLAMA_3_8B, tp, "bf16") == 128 * KIB


def test_llama_3_8b_replicates_kv_heads_at_tp_24():
    arch = read_architecture(LLAMA_3_8B)
    layout = neuron_head_layout(arch, 24)
    assert (layout.padded_heads, layout.effective_kv_heads, layout.gqa_mode) == (48, 24, "replicated-heads")
    assert kv_per_token(LLAMA_3_8B, 24, "bf16") == 384 * KIB


def test_llama_2_70b_at_tp_24():
    arch = read_architecture(LLAMA_2_70B)
    layout = neuron_head_layout(arch, 24)
    assert (layout.padded_heads, layout.effective_kv_heads) == (72, 24)
    assert kv_per_token(LLAMA_2_70B, 24) == 960 * KIB
    # "140 GB weights / 24 cores ~ 5.8 GB per core" (padding adds a little)
    usage = footprint(arch, layout, "fp16", batch=1, positions=512)
    assert 5.8e9 < usage.weights / 24 < 6.2e9


def test_multi_head_models_pad_kv_with_q():
    arch = read_architecture(LLAMA_2_13B)  # 40 heads
    layout = neuron_head_layout(arch, 24)
    assert (layout.padded_heads, layout.effective_kv_heads, layout.gqa_mode) == (48, 48, "")
    assert padding_parameters(arch, layout) == 40 * 8 * 5120 * 128 * 4


@pytest.mark.parametrize("heads, kv, tp, expected", [
    (64, 8, 24, 24),    # partial replication to one KV head per core
    (32, 8, 24, 24),
    (72, 24, 32, 32),   # Q heads per core == group size: no replication, then at least tp
    (32, 4, 3, 33),     # nothing divides: replicate up to the Q heads, then pad with them
    (40, 8, 16, 16),
])
def test_replicated_heads_follow_get_qkv_padding(heads, kv, tp, expected):
    padded = -(-heads // tp) * tp
    assert _replicated_kv_heads(heads, kv, tp, padded) == expected


def test_gqa_modes_fall_back_like_transformers_neuronx():
    arch = read_architecture(LLAMA_3_8B)  # 8 KV heads, head_dim 128
    assert neuron_head_layout(arch, 8, "shard-over-heads").gqa_mode == "shard-over-heads"
    assert neuron_head_layout(arch, 8, "shard-over-batch", (4,)).gqa_mode == "shard-over-heads"
    assert neuron_head_layout(arch, 8, "shard-over-batch", (8, 16)).gqa_mode == "shard-over-batch"
    assert neuron_head_layout(arch, 8, "all-gather-heads").gqa_mode == "all-gather-heads"
    assert neuron_head_layout(arch, 24, "all-gather-heads").gqa_mode == "replicated-heads"
    assert neuron_head_layout(arch, 2, "replicated-heads").effective_kv_heads == 32


def test_gpt_j_heads_are_never_padded():
    # A TP degree that does not divide them is refused by the runtime's planner (test_validate).
    arch = read_architecture(GPT_J)
    layout = neuron_head_layout(arch, 24)
    assert layout.padded_heads == 16 and not layout.padded


def test_llama_2_7b_batch_4_at_2048_needs_tp_2():
    """Tuning guide: Llama-2-7B on inf2.xlarge with TP 2, batch 4, n_positions 2048."""
    arch = read_architecture(LLAMA_2_7B)
    one = footprint(arch, neuron_head_layout(arch, 1), "fp16", batch=4, positions=2048)
    assert one.kv_cache == 4 * GIB
    assert one.per_device > 16 * GIB
    two = footprint(arch, neuron_head_layout(arch, 2), "fp16", batch=4, positions=2048)
    assert two.per_device < 0.6 * 16 * GIB


def test_int8_stores_layer_matrices_in_one_byte():
    arch = read_architecture(LLAMA_2_13B)
    layout = neuron_head_layout(arch, 2)
    fp16 = footprint(arch, layout, "fp16", 4, 512)
    int8 = footprint(arch, layout, "fp16", 4, 512, int8=True)
    count = arch.parameters()
    assert fp16.weights - int8.weights == count.quantizable
    assert int8.kv_cache == fp16.kv_cache


def test_each_backends_head_layout_on_gpus():
    """hf splits whole layers over GPUs; vLLM splits the heads, copying KV heads where there are fewer than GPUs."""
    from lmi_tools.validation.sizing import head_layout

    arch = read_architecture({**LLAMA_3_8B, "num_key_value_heads": 2})
    assert head_layout("layers", arch, 4).effective_kv_heads == 2
    assert head_layout("heads", arch, 4).effective_kv_heads == 4  # one copy of a KV head on each GPU
    assert head_layout("heads", arch, 2).effective_kv_heads == 2
    assert head_layout("padded", arch, 4) == neuron_head_layout(arch, 4)
