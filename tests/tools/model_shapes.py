"""Architecture numbers of the models the tests and presets use (verified against the published
config.json files; see docs/configuration.md), as config.json dicts."""

from __future__ import annotations

LLAMA_2_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "float16"}
LLAMA_2_13B = {**LLAMA_2_7B, "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40,
               "num_key_value_heads": 40, "intermediate_size": 13824}
LLAMA_2_70B = {**LLAMA_2_7B, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
               "num_key_value_heads": 8, "intermediate_size": 28672}

# Preset model id -> the numbers the bundled config must carry: model_type, layers, hidden size, heads,
# KV heads, intermediate (ffn) size, vocabulary, max positions, torch_dtype.
PRESET_MODELS = {
    "meta-llama/Meta-Llama-3-8B": ("llama", 32, 4096, 32, 8, 14336, 128256, 8192, "bf16"),
    "mistralai/Mistral-7B-Instruct-v0.2": ("mistral", 32, 4096, 32, 8, 14336, 32000, 32768, "bf16"),
    "codellama/CodeLlama-7b-Instruct-hf": ("llama", 32, 4096, 32, 32, 11008, 32016, 16384, "bf16"),
    "facebook/opt-13b": ("opt", 40, 5120, 40, 40, 20480, 50272, 2048, "fp16"),
    "EleutherAI/gpt-j-6b": ("gptj", 28, 4096, 16, 16, 16384, 50400, 2048, "fp32"),
    "meta-llama/Llama-2-13b-chat-hf": ("llama", 40, 5120, 40, 40, 13824, 32000, 4096, "fp16"),
}
