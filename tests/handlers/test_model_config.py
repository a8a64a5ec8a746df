"""The one reader of config.json: the same fallbacks for the hf plan, the neuronx planner and lmi validate."""

from __future__ import annotations

import pytest

from lmi_handlers.model_config import DEFAULT_POSITIONS, kv_shape, max_positions, stored_dtype


@pytest.mark.parametrize("config, positions", [
    ({"max_position_embeddings": 8192, "n_positions": 1024}, 8192),
    ({"n_positions": 1024}, 1024),
    ({"seq_length": 4096}, 4096),
    ({"max_position_embeddings": None, "max_sequence_length": 2048}, 2048),
    ({"max_position_embeddings": True}, None),
    ({}, None),
])
def test_positions_in_one_order(config, positions):
    assert max_positions(config) == positions
    assert DEFAULT_POSITIONS == 2048


@pytest.mark.parametrize("config, dtype", [({"dtype": "bfloat16"}, "bf16"), ({"torch_dtype": "float16"}, "fp16"),
                                           ({"torch_dtype": "torch.float32"}, "fp32"), ({"dtype": "int8"}, None),
                                           ({}, None)])
def test_stored_dtype_under_either_name(config, dtype):
    assert stored_dtype(config) == dtype


def test_kv_shape_reads_a_composite_models_text_part():
    llama = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert kv_shape(llama) == (30, 3, 64)
    assert kv_shape({"model_type": "llava", "text_config": llama}) == (30, 3, 64)
    assert kv_shape({"n_layer": 12, "n_head": 12, "n_embd": 768}) == (12, 12, 64)
