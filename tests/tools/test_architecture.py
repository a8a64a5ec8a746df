"""config.json -> Architecture, and parameter counts checked against transformers' own models."""

from __future__ import annotations

import json

import pytest

from lmi_tools.models.architecture import load_config, read_architecture
from lmi_tools.errors import UsageError
from lmi_tools.modeldir.resources import known_model_config

from .model_shapes import LLAMA_2_7B, LLAMA_2_13B, LLAMA_2_70B, PRESET_MODELS

SMALL_CONFIGS = {
    "gpt2": dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2, n_positions=128, vocab_size=1000),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                     intermediate_size=256, max_position_embeddings=128, vocab_size=1000),
    "bloom": dict(model_type="bloom", n_embed=64, n_head=4, n_layer=2, vocab_size=1000),
    "mixtral": dict(model_type="mixtral", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=2, intermediate_size=128, num_local_experts=4, vocab_size=1000,
                    max_position_embeddings=128),
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
                  tie_word_embeddings=True),
    "opt-350m-shape": dict(model_type="opt", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, ffn_dim=256,
                           max_position_embeddings=128, vocab_size=1000, word_embed_proj_dim=32,
                           do_layer_norm_before=False),
    "llama-biases": dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
                         attention_bias=True, mlp_bias=True, head_dim=32),
}


def bundled(model_id: str) -> dict:
    path = known_model_config(model_id)
    assert path is not None, f"no bundled config for {model_id}"
    return load_config(path)


def transformers_count(config: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):  # shapes only: no memory, no initialization
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_id", sorted(PRESET_MODELS))
def test_bundled_configs_carry_the_published_numbers(model_id):
    arch = read_architecture(bundled(model_id))
    numbers = (arch.model_type, arch.layers, arch.hidden_size, arch.heads, arch.kv_heads, arch.intermediate_size,
               arch.vocab_size, arch.max_positions, arch.checkpoint_dtype)
    assert numbers == PRESET_MODELS[model_id]


def test_gptj_fields_are_normalized():
    arch = read_architecture(bundled("EleutherAI/gpt-j-6b"))
    assert (arch.family, arch.head_dim, arch.positions, arch.tie_word_embeddings) == ("gptj", 256, "rope", False)


@pytest.mark.parametrize("config", [*(bundled(m) for m in sorted(PRESET_MODELS)), LLAMA_2_7B, LLAMA_2_70B],
                         ids=[*sorted(PRESET_MODELS), "llama-2-7b", "llama-2-70b"])
def test_parameter_count_matches_transformers(config):
    assert read_architecture(config).parameters().total == transformers_count(config)


@pytest.mark.parametrize("name", sorted(SMALL_CONFIGS))
def test_parameter_count_matches_transformers_for_each_family(name):
    config = SMALL_CONFIGS[name]
    assert read_architecture(config).parameters().total == transformers_count(config)


@pytest.mark.parametrize("config, total", [
    (LLAMA_2_7B, 6_738_415_616),   # "7B": the published Llama-2-7B size
    (LLAMA_2_13B, 13_015_864_320),
    (LLAMA_2_70B, 68_976_648_192),
])
def test_known_llama_totals(config, total):
    assert read_architecture(config).parameters().total == total


def test_quantizable_part_is_the_layer_matrices():
    count = read_architecture(LLAMA_2_7B).parameters()
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert count.quantizable == 32 * per_layer
    assert count.total - count.quantizable == 2 * 32000 * 4096 + 32 * 2 * 4096 + 4096


def test_unknown_model_type_is_estimated_as_llama_style():
    arch = read_architecture({**LLAMA_2_7B, "model_type": "somethingnew"})
    assert arch.estimated and arch.family == "llama"
    assert arch.parameters().total == read_architecture(LLAMA_2_7B).parameters().total


def test_missing_fields_name_what_is_missing():
    with pytest.raises(UsageError, match="num_attention_heads"):
        read_architecture({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2})


def test_load_config_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="not a readable JSON"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(UsageError, match="JSON object"):
        load_config(tmp_path)
