"""Build small Llama-family models locally: random weights, a tokenizer trained here, no network.

The tokenizer is byte-level BPE trained with ``tokenizers`` on a deterministic corpus (a short
English text plus seeded pseudo-words), with BOS/EOS/PAD and chat-role special tokens and a chat
template. Weights are random (seeded). Everything is saved with ``save_pretrained`` so it loads
through the ordinary ``from_pretrained(local_dir)`` path, exactly like a downloaded model.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SEED_TEXT = """\
Large language models are served with DJLServing in AWS LMI containers on Inferentia2 and on NVIDIA
GPUs. A handler loads the model on the first call, then answers single requests, dynamic batches,
streams and rolling batches. The server sends every option once; the handler keeps them. Tokens
arrive one at a time, and the client reads them as they come. Engineers validate a configuration
before deploying it, package the model directory, and measure latency and throughput.
The quick brown fox jumps over the lazy dog. Hello, world! What is the capital of France? Paris.
"""


@dataclass(frozen=True)
class TinySpec:
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 2048
    max_position_embeddings: int = 512
    seed: int = 0


PRESETS = {
    # Fast enough for every test: a few MB, loads in well under a second.
    "tiny": TinySpec(),
    # The 115M-parameter Llama shape of the rolling-batch benchmark (issue 4).
    "bench-115m": TinySpec(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           intermediate_size=1536, vocab_size=8192, max_position_embeddings=2048),
}


def corpus(seed: int, words: int = 60_000) -> list[str]:
    """Deterministic training text: the seed text, then sentences of seeded pseudo-words."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
              "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    lexicon = ["".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                       for _ in range(rng.randint(1, 3))) for _ in range(6000)]
    lines = SEED_TEXT.splitlines() * 20
    sentence: list[str] = []
    for _ in range(words):
        sentence.append(rng.choice(lexicon))
        if rng.random() < 0.08:
            lines.append(" ".join(sentence).capitalize() + rng.choice([".", ".", "?", "!", ","]))
            sentence = []
    return lines


def train_tokenizer(spec: TinySpec):
    """A ``PreTrainedTokenizerFast`` trained on ``corpus(spec.seed)``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(spec.seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   additional_special_tokens=SPECIAL_TOKENS[3:], chat_template=CHAT_TEMPLATE)


def build_tiny_model(out_dir: str | Path, spec: TinySpec | str = "tiny") -> Path:
    """Write a model directory (config, safetensors weights, tokenizer, generation config)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if isinstance(spec, str):
        spec = PRESETS[spec]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size, max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tiny_spec.txt").write_text("".join(f"{k}={v}\n" for k, v in asdict(spec).items()))
    return out


# --- one tiny model per transformers-neuronx architecture (the neuronx backend's tests) --------------

#: HF ``model_type`` values ``build_tiny_arch`` can write: every architecture transformers-neuronx serves.
ARCHITECTURES = ("llama", "mistral", "mixtral", "opt", "gptj", "gpt2", "gpt_neox", "bloom")

_tokenizers: dict = {}


def _shared_tokenizer(spec: TinySpec):
    # Training takes about a second; the architectures of one spec share the same tokenizer.
    if spec not in _tokenizers:
        _tokenizers[spec] = train_tokenizer(spec)
    return _tokenizers[spec]


def _arch_config(model_type: str, spec: TinySpec, vocab: int, special: dict):
    import transformers

    h, layers, heads = spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads
    positions = spec.max_position_embeddings
    if model_type in ("llama", "mistral", "mixtral"):
        extra = {} if model_type == "llama" else {"sliding_window": None}
        if model_type == "mixtral":
            extra.update(num_local_experts=4, num_experts_per_tok=2)
        cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "mixtral": transformers.MixtralConfig}[model_type]
        return cls(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=spec.num_key_value_heads, intermediate_size=spec.intermediate_size,
                   max_position_embeddings=positions, tie_word_embeddings=False, **extra, **special)
    if model_type == "opt":
        return transformers.OPTConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                      num_attention_heads=heads, ffn_dim=4 * h, word_embed_proj_dim=h,
                                      max_position_embeddings=positions, do_layer_norm_before=True, **special)
    if model_type == "gptj":
        return transformers.GPTJConfig(vocab_size=vocab, n_embd=h, n_layer=layers, n_head=heads,
                                       rotary_dim=h // heads // 2, n_positions=positions, **special)
    if model_type == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=h, n_layer=layers, n_head=heads,
                                       n_positions=positions, **special)
    if model_type == "gpt_neox":
        return transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                          num_attention_heads=heads, intermediate_size=spec.intermediate_size,
                                          rotary_pct=0.5, max_position_embeddings=positions,
                                          use_parallel_residual=True, tie_word_embeddings=False, **special)
    if model_type == "bloom":
        return transformers.BloomConfig(vocab_size=vocab, hidden_size=h, n_layer=layers, n_head=heads, **special)
    raise ValueError(f"unknown model_type {model_type!r}; expected one of {', '.join(ARCHITECTURES)}")


def build_tiny_arch(out_dir: str | Path, model_type: str, spec: TinySpec | str = "tiny") -> Path:
    """Like ``build_tiny_model``, for any of ``ARCHITECTURES`` (random weights, the shared tokenizer).

    Matrices are drawn with std 0.3, far above transformers' init: at width 64 its init makes GPT-2,
    OPT and BLOOM repeat one token forever, and varied greedy output is what exposes a cache or
    position mistake. Each architecture gets its own seed. ``bloom`` uses ALiBi and has no
    ``max_position_embeddings``.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if isinstance(spec, str):
        spec = PRESETS[spec]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _shared_tokenizer(spec)
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    config = _arch_config(model_type, spec, len(tokenizer), special)
    torch.manual_seed(spec.seed + ARCHITECTURES.index(model_type))
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tiny_spec.txt").write_text("".join(f"{k}={v}\n" for k, v in asdict(spec).items())
                                       + f"model_type={model_type}\n")
    return out
