"""The one reader of a model's ``config.json`` (a mapping) for what the backends' plans and ``lmi validate`` share:
the positions it was built for, the dtype its checkpoint stores (and so what ``option.dtype=auto`` loads), and the
shape and bytes of its KV cache.

Families name these fields differently (``max_position_embeddings``/``n_positions``, ``num_key_value_heads``,
``n_head``...); each function tries the names in one order. A composite model's text part (``text_config``) holds
its decoder's shape. Standard library only.
"""

from __future__ import annotations

from typing import Any, Mapping

from .dtypes import AUTO, short

#: Positions assumed for a model whose config.json names none (transformers' own default for most families).
DEFAULT_POSITIONS = 2048
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def max_positions(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the model was built for, or None when ``config.json`` does not say."""
    return next((_positive_int(config.get(k)) for k in POSITION_KEYS if _positive_int(config.get(k))), None)


def stored_dtype(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's dtype as fp32, fp16 or bf16 (``dtype``, or ``torch_dtype`` before transformers 5), or None."""
    stored = short(config.get("dtype") or config.get("torch_dtype"))
    return None if stored == AUTO else stored


def kv_shape(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of the decoder: what one token's keys and values take per element."""
    text = config.get("text_config") or config
    pick = lambda *names: next((text[n] for n in names if text.get(n)), None)  # noqa: E731
    layers = pick("num_hidden_layers", "n_layer", "num_layers") or 1
    heads = pick("num_attention_heads", "n_head") or 1
    kv_heads = pick("num_key_value_heads") or heads
    head_dim = pick("head_dim") or (pick("hidden_size", "n_embd", "d_model") or heads) // heads
    return layers, kv_heads, head_dim


def kv_bytes_per_token(model_config: Mapping[str, Any], element_size: int) -> int:
    """Bytes of keys and values one token takes across all layers."""
    layers, kv_heads, head_dim = kv_shape(model_config)
    return 2 * layers * kv_heads * head_dim * element_size


def resolve_dtype(dtype: str, device: str, model_config: Mapping[str, Any]) -> str:
    """``option.dtype`` (fp32, fp16, bf16 or auto) on ``device``, as the weights will load."""
    if dtype != "auto":
        return dtype
    if device == "cpu":
        return "fp32"
    stored = stored_dtype(model_config)
    return stored if stored in ("fp16", "bf16") else "fp16"
