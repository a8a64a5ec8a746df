"""The attention the transformers backend uses for one-token decode steps over its paged cache (``hf.py``).

torch and transformers are imported when it is first registered.
"""

from __future__ import annotations

from typing import Any

GROUPED_ATTENTION = "lmi_grouped_decode"
# Architectures whose attention is plain scaled dot-product over the cache (no softcapping, sinks or
# per-layer windows), where one query token can use the grouped kernel below.
GROUPED_ATTENTION_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "granite"})


def grouped_decode_attention(model: Any) -> str | None:
    """Register (once) and name an attention for one-token decode steps, or None where unsupported.

    transformers' SDPA path repeats each KV head for its query heads and runs a kernel built for long
    queries; for a single query token it is cheaper to fold a KV group's query heads into the query
    dimension and do two batched matmuls against the cache as stored. Prefill (several query tokens)
    still goes to transformers' own SDPA function.
    """
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:  # transformers < 4.48: keep the stock attention
        return None
    if getattr(model.config, "model_type", None) not in GROUPED_ATTENTION_MODELS:
        return None
    import torch

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
        if query.shape[2] != 1 or kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") \
                is not None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        rows, heads, _, head_dim = query.shape
        groups = key.shape[1]
        # KV groups lead, rows second: the paged cache gathers keys and values in that memory order, so
        # the matmuls read them in place (a [rows, groups, ...] product would copy both per layer).
        grouped = query.view(rows, groups, heads // groups, head_dim).transpose(0, 1)
        scores = torch.matmul(grouped, key.transpose(0, 1).transpose(-1, -2)) * (scaling or head_dim ** -0.5)
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, :key.shape[-2]].transpose(0, 1)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        out = torch.matmul(probs, value.transpose(0, 1))  # [groups, rows, heads per group, head_dim]
        return out.transpose(0, 1).reshape(rows, 1, heads, head_dim), None

    AttentionInterface.register(GROUPED_ATTENTION, attention)
    return GROUPED_ATTENTION
