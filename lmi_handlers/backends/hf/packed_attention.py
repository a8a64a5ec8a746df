"""The attention of a packed step of the transformers backend's paged runner (``hf.py``).

A packed step runs every chunk of the batch (one-token decodes, prompts, prompt pieces) through the model
as one row of tokens, ``[1, tokens]``, so the weights are read from memory once per step however many
chunks there are and nothing is padded. Per layer the paged cache writes the new keys and values and
hands this attention the whole pool; ``Packed`` says which pool slots each chunk reads:

- the one-token chunks, which lead the row, attend together: a KV group's query heads are folded into
  the query dimension and two batched matmuls run against the slots as stored, which is cheaper than
  repeating each KV head for its query heads (transformers' SDPA path) for one query token; or, with
  ``option.cpu_attention_kernel=compiled``, one call of the kernel that reads the pool in place
  (``decode_attention.py``);
- each longer chunk attends to its own slots with transformers' SDPA function under a causal mask.

torch and transformers are imported when the attention is first registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PACKED_ATTENTION = "lmi_packed"
# Architectures whose attention is plain scaled dot-product over the cache (no softcapping, sinks or
# per-layer windows), so that a chunk's attention depends on nothing but its query, keys and mask.
PACKED_ATTENTION_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "granite"})
# On the CPU the decode rows attend in equal groups whose gathered keys and values take about this much, so that
# the two products read a copy still in cache: faster than all rows at once, the more so the longer the contexts,
# and faster than groups of half the size (docs/engine.md, "Figures"); the tiny models' rows fit
# one group.
DECODE_GATHER_BYTES = 4 << 20


@dataclass(frozen=True)
class Packed:
    """Where each chunk of a packed row reads. ``decode``: how many one-token chunks lead the row;
    ``decode_read`` ``[decode, view]`` their slots in position order and ``decode_mask`` ``[decode, 1, view]``
    (0 or the dtype's minimum) what each may see, or instead ``decode_attend`` (``decode_attention.decode_reader``),
    which reads the pool itself; ``chunks``: per longer chunk, its (offset in the row, length, slots ``[view]``,
    causal mask ``[1, 1, length, view]``)."""

    decode: int
    decode_read: Any
    decode_mask: Any
    chunks: tuple[tuple[int, int, Any, Any], ...]
    decode_attend: Any = None


def decode_groups(packed: Packed, pool: Any) -> list[tuple[int, int]]:
    """The decode rows as (first, last) groups of equal size whose gathered keys and values take at most about
    ``DECODE_GATHER_BYTES`` on the CPU; one group elsewhere; none where ``decode_attend`` reads them."""
    if not packed.decode or packed.decode_attend is not None:
        return []
    per_row = packed.decode_read.shape[1] * pool.shape[0] * pool.shape[2] * pool.element_size() * 2
    count = -(-packed.decode * per_row // DECODE_GATHER_BYTES) if pool.device.type == "cpu" else 1
    size = -(-packed.decode // count)  # groups of equal size
    return [(first, min(first + size, packed.decode)) for first in range(0, packed.decode, size)]


def switch_attention(config: Any, name: str) -> str:
    """Make ``name`` the attention implementation of ``config``'s model; returns the one it had. A packed step
    switches twice per forward, so this writes the attribute the property reads: transformers 5's setter,
    which checks the name and walks sub-configurations, costs a measurable share of a tiny model's step."""
    stock = config._attn_implementation
    if "_attn_implementation_internal" in vars(config):
        vars(config)["_attn_implementation_internal"] = name
    else:
        config._attn_implementation = name
    return stock


def packed_attention(model: Any) -> str | None:
    """Register (once) and name the packed attention, or None where the model or transformers cannot use it
    (transformers < 4.48 has no ``AttentionInterface`` and does not pass our ``Packed`` down to attention)."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:
        return None
    if getattr(model.config, "model_type", None) not in PACKED_ATTENTION_MODELS:
        return None
    import torch

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                  scaling: float | None = None, lmi_packed: Packed | None = None, **kwargs: Any) -> tuple[Any, None]:
        # query: [1, heads, tokens, head_dim]; key, value: the layer's pool, [kv_heads, slots, head_dim].
        _, heads, _, head_dim = query.shape
        groups = key.shape[0]
        parts = []
        if lmi_packed.decode_attend is not None:  # set only where decode rows lead the row
            rows = query[0, :, :lmi_packed.decode].transpose(0, 1)  # [rows, heads, head_dim]
            parts.append(lmi_packed.decode_attend(rows, key, value, scaling or head_dim ** -0.5))
        for first, last in decode_groups(lmi_packed, key):
            rows, slots = last - first, lmi_packed.decode_read[first:last].flatten()
            grouped = query[0, :, first:last].view(groups, heads // groups, rows, head_dim).transpose(1, 2)
            keys = key.index_select(1, slots).view(groups, rows, -1, head_dim)
            scores = torch.matmul(grouped, keys.transpose(-1, -2)) * (scaling or head_dim ** -0.5)
            probs = torch.softmax(scores + lmi_packed.decode_mask[first:last], dim=-1,
                                  dtype=torch.float32).to(value.dtype)
            out = torch.matmul(probs, value.index_select(1, slots).view(groups, rows, -1, head_dim))
            parts.append(out.transpose(0, 1).reshape(rows, heads, head_dim))  # [rows, groups, per group, dim]
        for offset, length, slots, mask in lmi_packed.chunks:
            keys, values = key.index_select(1, slots)[None], value.index_select(1, slots)[None]
            out, _ = sdpa_attention_forward(module, query[:, :, offset:offset + length], keys, values, mask,
                                            dropout=dropout, scaling=scaling)
            parts.append(out[0])  # [length, heads, head_dim]
        return (parts[0] if len(parts) == 1 else torch.cat(parts))[None], None

    AttentionInterface.register(PACKED_ATTENTION, attention)
    return PACKED_ATTENTION
