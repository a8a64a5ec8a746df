"""A model's shape, read from its Hugging Face ``config.json``, and its parameter count.

Each family names its fields differently (``n_embd``/``hidden_size``, ``n_head``/``num_attention_heads``,
``ffn_dim``/``intermediate_size``/``n_inner``); ``read_architecture`` normalizes them. Parameters are
counted from the shapes of the transformers implementation of each family (embeddings, attention
with grouped KV heads, gated or plain MLP, biases, norms, an untied ``lm_head``); tests check the
counts against ``sum(p.numel())`` of the transformers models built on the meta device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lmi_handlers.model_config import DEFAULT_POSITIONS, max_positions, stored_dtype

from ..errors import UsageError

# model_type -> the family whose layout (and parameter formula) it shares.
FAMILIES = {
    "llama": "llama", "code_llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "llama",
    "opt": "opt", "gptj": "gptj", "gpt2": "gpt2", "gpt_neox": "gpt_neox", "bloom": "bloom",
}
# Families with a learned absolute position table: positions beyond it cannot be encoded at all.
LEARNED_POSITIONS = {"opt", "gpt2"}


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by where they live; ``quantizable`` is the decoder layers' weight matrices."""

    embeddings: int
    layers: int
    quantizable: int
    final_norm: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.embeddings + self.layers + self.final_norm + self.lm_head


@dataclass(frozen=True)
class Architecture:
    """The numbers validation needs, whatever the family calls them."""

    model_type: str
    family: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    #: Longest sequence the model was built for (``lmi_handlers.model_config.max_positions``).
    max_positions: int
    #: ``config.torch_dtype`` as fp32/fp16/bf16, or None when the config does not say.
    checkpoint_dtype: str | None
    tie_word_embeddings: bool
    #: "rope", "learned" or "alibi".
    positions: str
    experts: int = 1
    attention_bias: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    #: OPT only: the embedding width when it differs from ``hidden_size`` (opt-350m).
    embed_dim: int | None = None
    #: False for OPT models without a final LayerNorm (post-norm opt-350m).
    final_norm: bool = True
    #: True when ``model_type`` is not one we know: sized as a Llama-style decoder.
    estimated: bool = False

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    def parameters(self) -> ParameterCount:
        return _COUNTERS[self.family](self)


def load_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json`` (or a directory holding one) as a dict; problems are ``UsageError``s."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold a JSON object")
    return data


def _get(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is not None:
        return default
    raise UsageError(f"config.json has none of {', '.join(names)}",
                     hint="lmi validate needs the model's architecture numbers; pass --config with the "
                          "model's own config.json")


def read_architecture(config: Mapping[str, Any]) -> Architecture:
    """Normalize a ``config.json`` dict; unknown model types are read as Llama-style decoders."""
    model_type = str(config.get("model_type", "")).lower()
    family = FAMILIES.get(model_type)
    reader = _READERS[family or "llama"]
    fields = reader(config)
    hidden, heads = fields["hidden_size"], fields["heads"]
    fields.setdefault("head_dim", config.get("head_dim") or hidden // heads)
    fields.setdefault("kv_heads", heads)
    return Architecture(model_type=model_type or "unknown", family=family or "llama",
                        vocab_size=int(_get(config, "vocab_size")), checkpoint_dtype=stored_dtype(config),
                        max_positions=max_positions(config) or DEFAULT_POSITIONS,
                        estimated=family is None, **fields)



def _llama(config: Mapping[str, Any]) -> dict[str, Any]:
    model_type = config.get("model_type")
    heads = int(_get(config, "num_attention_heads"))
    return {
        "layers": int(_get(config, "num_hidden_layers")),
        "hidden_size": int(_get(config, "hidden_size")),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "intermediate_size": int(_get(config, "intermediate_size")),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "positions": "rope",
        "experts": int(config.get("num_local_experts") or 1),
        # Llama's attention_bias covers q/k/v/o; Qwen2 always has q/k/v biases and no o bias.
        "attention_bias": bool(config.get("attention_bias", False)),
        "qkv_bias": model_type == "qwen2",
        "mlp_bias": bool(config.get("mlp_bias", False)),
    }


def _opt(config: Mapping[str, Any]) -> dict[str, Any]:
    hidden = int(_get(config, "hidden_size"))
    return {
        "layers": int(_get(config, "num_hidden_layers")), "hidden_size": hidden,
        "heads": int(_get(config, "num_attention_heads")), "intermediate_size": int(_get(config, "ffn_dim")),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", True)), "positions": "learned",
        "embed_dim": int(config.get("word_embed_proj_dim") or hidden),
        # OPT has a final LayerNorm only in pre-norm models that keep it.
        "final_norm": bool(config.get("do_layer_norm_before", True)) and not config.get("_remove_final_layer_norm"),
    }


def _gpt_style(config: Mapping[str, Any], positions: str, tied: bool) -> dict[str, Any]:
    hidden = int(_get(config, "n_embd", "n_embed", "hidden_size"))
    return {
        "layers": int(_get(config, "n_layer", "num_hidden_layers")), "hidden_size": hidden,
        "heads": int(_get(config, "n_head", "num_attention_heads")),
        "intermediate_size": int(config.get("n_inner") or config.get("intermediate_size") or 4 * hidden),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", tied)), "positions": positions,
    }


_READERS = {
    "llama": _llama, "opt": _opt,
    "gptj": lambda c: _gpt_style(c, "rope", tied=False),
    "gpt2": lambda c: _gpt_style(c, "learned", tied=True),
    "gpt_neox": lambda c: _gpt_style(c, "rope", tied=False),
    "bloom": lambda c: _gpt_style(c, "alibi", tied=True),
}


def _count_llama(a: Architecture) -> ParameterCount:
    h, q, kv, i = a.hidden_size, a.heads * a.head_dim, a.kv_heads * a.head_dim, a.intermediate_size
    attention = h * q + 2 * h * kv + q * h
    attention_bias = (q + 2 * kv + h) * a.attention_bias + (q + 2 * kv) * a.qkv_bias
    mlp = 3 * h * i * a.experts + (h * a.experts if a.experts > 1 else 0)  # experts plus their router
    mlp_bias = (2 * i + h) * a.experts * a.mlp_bias
    per_layer = attention + attention_bias + mlp + mlp_bias + 2 * h
    return ParameterCount(embeddings=a.vocab_size * h, layers=a.layers * per_layer,
                          quantizable=a.layers * (attention + mlp), final_norm=h,
                          lm_head=0 if a.tie_word_embeddings else a.vocab_size * h)


def _count_opt(a: Architecture) -> ParameterCount:
    h, f, e = a.hidden_size, a.intermediate_size, a.embed_dim or a.hidden_size
    # Learned positions carry an offset of 2 rows (OPTLearnedPositionalEmbedding); the optional
    # projections map between a narrower embedding and the hidden size.
    embeddings = a.vocab_size * e + (a.max_positions + 2) * h + (2 * e * h if e != h else 0)
    linear = 4 * h * h + 2 * h * f
    per_layer = linear + 4 * h + f + h + 2 * 2 * h
    return ParameterCount(embeddings=embeddings, layers=a.layers * per_layer, quantizable=a.layers * linear,
                          final_norm=2 * h if a.final_norm else 0,
                          lm_head=0 if a.tie_word_embeddings else a.vocab_size * e)


def _count_gpt(a: Architecture, norms_per_layer: int, lm_head_bias: bool) -> ParameterCount:
    h, i = a.hidden_size, a.intermediate_size
    linear = 4 * h * h + 2 * h * i
    biases = {"gptj": i + h, "gpt2": 3 * h + h + i + h}.get(a.family, 3 * h + h + i + h)
    per_layer = linear + biases + norms_per_layer * 2 * h
    embeddings = a.vocab_size * h
    if a.positions == "learned":
        embeddings += a.max_positions * h
    if a.family == "bloom":
        embeddings += 2 * h  # word_embeddings_layernorm
    lm_head = 0 if a.tie_word_embeddings else a.vocab_size * h + a.vocab_size * lm_head_bias
    return ParameterCount(embeddings=embeddings, layers=a.layers * per_layer, quantizable=a.layers * linear,
                          final_norm=2 * h, lm_head=lm_head)


_COUNTERS = {
    "llama": _count_llama, "opt": _count_opt,
    "gptj": lambda a: _count_gpt(a, norms_per_layer=1, lm_head_bias=True),
    "gpt2": lambda a: _count_gpt(a, norms_per_layer=2, lm_head_bias=False),
    "gpt_neox": lambda a: _count_gpt(a, norms_per_layer=2, lm_head_bias=False),
    "bloom": lambda a: _count_gpt(a, norms_per_layer=2, lm_head_bias=False),
}
