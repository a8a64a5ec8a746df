"""Parsing and resolving the neuronx options (standard library only: no torch, no model)."""

from __future__ import annotations

import pytest

from lmi_handlers.backends.neuronx.options import NeuronxOptions, plan_compile, visible_cores
from lmi_handlers.config import HandlerConfig
from lmi_handlers.errors import ConfigError

# config.json essentials of the seed examples' models (public Hugging Face configs).
OPT_13B = {"model_type": "opt", "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
           "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048, "torch_dtype": "float16"}
GPTJ_6B = {"model_type": "gptj", "n_layer": 28, "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "vocab_size": 50400,
           "n_positions": 2048, "torch_dtype": "float32"}
LLAMA_3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
              "torch_dtype": "bfloat16"}
MISTRAL_7B = {**LLAMA_3_8B, "model_type": "mistral", "vocab_size": 32000, "max_position_embeddings": 32768}
CODELLAMA_7B = {**LLAMA_3_8B, "num_key_value_heads": 32, "vocab_size": 32016, "max_position_embeddings": 16384}


def plan(model: dict, **props: object):
    config = HandlerConfig.from_properties({"model_id": "/models/m", "model_dir": "/models/m",
                                            **{k: str(v) for k, v in props.items()}})
    return plan_compile(config, NeuronxOptions.from_properties(config.properties), model)


@pytest.mark.parametrize("model,props,expected", [
    # OPT-13B on inf2.48xlarge: TP 8, batch 2, n_positions 256, fp16 (dynamic batching, naive strategy)
    (OPT_13B, {"tensor_parallel_degree": 8, "batch_size": 2, "n_positions": 256, "dtype": "fp16"},
     ("OPTForSampling", 8, 2, "f16", 256, False)),
    # GPT-J-6B on inf2.8xlarge: TP 2, rolling batch
    (GPTJ_6B, {"tensor_parallel_degree": 2, "n_positions": 1024, "rolling_batch": "auto",
               "max_rolling_batch_size": 4, "dtype": "fp16"}, ("GPTJForSampling", 2, 4, "f16", 1024, False)),
    # Llama-3-8B, Mistral-7B-Instruct-v0.2, CodeLlama-7b-Instruct on inf2.xlarge: TP 2, continuous batching
    (LLAMA_3_8B, {"tensor_parallel_degree": 2, "n_positions": 2048, "rolling_batch": "auto",
                  "max_rolling_batch_size": 4}, ("LlamaForSampling", 2, 4, "bf16", 2048, True)),
    (MISTRAL_7B, {"tensor_parallel_degree": 2, "n_positions": 2048, "rolling_batch": "auto",
                  "max_rolling_batch_size": 4, "dtype": "bf16"}, ("MistralForSampling", 2, 4, "bf16", 2048, True)),
    (CODELLAMA_7B, {"tensor_parallel_degree": 2, "n_positions": 4096, "rolling_batch": "auto",
                    "max_rolling_batch_size": 1}, ("LlamaForSampling", 2, 1, "bf16", 4096, False)),
])
def test_seed_examples_resolve(model, props, expected):
    settings = plan(model, **props)
    got = (settings.model_class, settings.tp_degree, settings.batch_size, settings.amp, settings.n_positions,
           settings.continuous_batching)
    assert got == expected
    if settings.continuous_batching:
        assert settings.context_length_estimate == (settings.n_positions,)


def test_defaults():
    settings = plan(LLAMA_3_8B, tensor_parallel_degree=2)
    assert settings.n_positions == 4096  # min(max_position_embeddings, 4096), not DJL v0.29's 128
    assert settings.amp == "bf16"  # the checkpoint's bf16; fp16 otherwise (DJL's default)
    assert (settings.batch_size, settings.continuous_batching) == (1, False)
    assert settings.context_length_estimate is None and settings.neuron_config == {} and settings.compiler_flags == ()
    assert plan(OPT_13B, tensor_parallel_degree=8).amp == "f16"
    assert plan({"model_type": "bloom", "n_head": 8, "n_layer": 2}).n_positions == 2048


def test_all_options_reach_the_settings():
    settings = plan(LLAMA_3_8B, tensor_parallel_degree=8, rolling_batch="auto", max_rolling_batch_size=8,
                    n_positions=1024, context_length_estimate="256, 1024", quantize="static_int8",
                    group_query_attention="replicated-heads", neuron_optimize_level=2,
                    enable_saturate_infinity="true", enable_mixed_precision_accumulation="false", fuse_qkv="true",
                    attention_layout="bsh", collectives_layout="BSH", cache_layout="bsh",
                    all_reduce_dtype="bfloat16", cast_logits_dtype="float16", unroll=4, amp="f16")
    assert settings.context_length_estimate == (256, 1024) and settings.unroll == 4 and settings.amp == "f16"
    assert settings.compiler_flags == ("-O2", "--enable-saturate-infinity")
    assert settings.neuron_config == {
        "quant": {"quant_dtype": "s8", "dequant_dtype": "f16"}, "group_query_attention": "replicated-heads",
        "attention_layout": "BSH", "collectives_layout": "BSH", "cache_layout": "BSH",
        "all_reduce_dtype": "bfloat16", "cast_logits_dtype": "float16", "fuse_qkv": True}
    assert settings.manifest()["context_length_estimate"] == [256, 1024]


@pytest.mark.parametrize("model,props,key,fragment", [
    (LLAMA_3_8B, {"n_positions": "lots"}, "n_positions", "integer"),
    (LLAMA_3_8B, {"context_length_estimate": "128,abc"}, "context_length_estimate", "comma-separated"),
    (LLAMA_3_8B, {"n_positions": 512, "context_length_estimate": "1024"}, "context_length_estimate", "<= n_positions"),
    (LLAMA_3_8B, {"rolling_batch": "auto", "max_rolling_batch_size": 4, "n_positions": 2048,
                  "context_length_estimate": "512"}, "context_length_estimate", "must equal n_positions"),
    (LLAMA_3_8B, {"amp": "fp8"}, "amp", "f32, f16, bf16"),
    (LLAMA_3_8B, {"amp": "f32", "dtype": "bf16"}, "amp", "contradicts"),
    (LLAMA_3_8B, {"quantize": "awq"}, "quantize", "static_int8"),
    (LLAMA_3_8B, {"load_in_8bit": "maybe"}, "load_in_8bit", "true or false"),
    (LLAMA_3_8B, {"group_query_attention": "shard-everything"}, "group_query_attention", "shard-over-heads"),
    (LLAMA_3_8B, {"neuron_optimize_level": 4}, "neuron_optimize_level", "<= 3"),
    (LLAMA_3_8B, {"attention_layout": "SBH"}, "attention_layout", "HSB, BSH"),
    (LLAMA_3_8B, {"cache_layout": "BSH"}, "cache_layout", "continuous batching"),
    (LLAMA_3_8B, {"cast_logits_dtype": "fp32"}, "cast_logits_dtype", "float32"),
    (LLAMA_3_8B, {"unroll": 5}, "unroll", "divide"),
    (LLAMA_3_8B, {"compiled_graph_path": "https://example.com/x"}, "compiled_graph_path", "s3://"),
    (LLAMA_3_8B, {"tensor_parallel_degree": "max"}, "tensor_parallel_degree", "NEURON_RT_VISIBLE_CORES"),
    (OPT_13B, {"n_positions": 4096}, "n_positions", "at most 2048"),
    (GPTJ_6B, {"n_positions": 4096}, "n_positions", "at most 2048"),
    (OPT_13B, {"rolling_batch_strategy": "continuous_batching"}, "rolling_batch_strategy", "llama and mistral"),
    (GPTJ_6B, {"context_length_estimate": "128"}, "context_length_estimate", "no prefill graphs"),
    (GPTJ_6B, {"load_in_8bit": "true"}, "quantize", "cannot quantize"),
    (GPTJ_6B, {"compiled_graph_path": "/artifacts"}, "compiled_graph_path", "NEURON_COMPILE_CACHE_URL"),
    (GPTJ_6B, {"tensor_parallel_degree": 3}, "tensor_parallel_degree", "no flexible tensor parallelism"),
    ({"model_type": "gpt_neox", "num_attention_heads": 8}, {"unroll": 1}, "unroll", "GPT-NeoX"),
    ({"model_type": "t5"}, {}, "model_id", "model_type='t5'"),
])
def test_bad_values_name_key_value_and_what_is_allowed(monkeypatch, model, props, key, fragment):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    monkeypatch.delenv("NEURON_RT_NUM_CORES", raising=False)
    with pytest.raises(ConfigError) as caught:
        plan(model, **{"tensor_parallel_degree": 2, **props})
    assert caught.value.key == key and f"option.{key}=" in str(caught.value) and fragment in str(caught.value)


def test_warnings_explain_what_transformers_neuronx_would_do():
    neox = {"model_type": "gpt_neox", "num_attention_heads": 8, "max_position_embeddings": 2048}
    warnings = plan(neox, tensor_parallel_degree=2, batch_size=4, dtype="fp16", n_positions=4096).warnings
    assert any("amp f32" in w for w in warnings)
    assert any("does not mask left padding" in w for w in warnings)
    assert any("exceeds the 2048 positions" in w for w in warnings)
    assert any("pads them" in w for w in plan({**LLAMA_3_8B, "num_attention_heads": 40},
                                             tensor_parallel_degree=24).warnings)


def test_strategy_choice():
    assert plan(MISTRAL_7B, tensor_parallel_degree=2, batch_size=4).continuous_batching  # dynamic batching too
    assert not plan(MISTRAL_7B, tensor_parallel_degree=2, batch_size=4,
                    rolling_batch_strategy="naive_rolling_batch").continuous_batching
    assert plan(LLAMA_3_8B, tensor_parallel_degree=2, rolling_batch_strategy="continuous_batching").continuous_batching
    assert not plan({**MISTRAL_7B, "model_type": "mixtral"}, tensor_parallel_degree=2, batch_size=4).continuous_batching


@pytest.mark.parametrize("env,cores", [({"NEURON_RT_VISIBLE_CORES": "0-3"}, 4), ({"NEURON_RT_VISIBLE_CORES": "0,1,4-5"}, 4),
                                       ({"NEURON_RT_NUM_CORES": "8"}, 8), ({}, None),
                                       ({"NEURON_RT_VISIBLE_CORES": "x"}, None)])
def test_visible_cores(env, cores):
    assert visible_cores(env) == cores


def test_djl_neuron_image_rewrite_of_auto_is_accepted():
    """DJLServing's Neuron image turns option.rolling_batch=auto into "tnx" before the handler sees it."""
    config = HandlerConfig.from_properties({"rolling_batch": "tnx", "max_rolling_batch_size": "4"})
    assert config.rolling_batch == "auto" and config.rolling
    with pytest.raises(ConfigError, match="built-in handlers"):
        HandlerConfig.from_properties({"rolling_batch": "lmi-dist"})
