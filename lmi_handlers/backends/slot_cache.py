"""The KV cache and decode attention behind the transformers backend's batched path (see ``hf.py``).

``SlotCache`` is a transformers ``Cache`` whose per-layer buffers hold one row per active sequence,
so sequences join and leave at any step; ``grouped_decode_attention`` is the attention used for
one-token decode steps over it. torch and transformers are imported when these are first built.
"""

from __future__ import annotations

import inspect
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
        grouped = query.view(rows, groups, heads // groups, head_dim)
        scores = torch.matmul(grouped, key.transpose(-1, -2)) * (scaling or head_dim ** -0.5)
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, :key.shape[-2]]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        out = torch.matmul(probs, value)  # [rows, groups, heads per group, head_dim]
        return out.reshape(rows, heads, 1, head_dim).transpose(1, 2), None

    AttentionInterface.register(GROUPED_ATTENTION, attention)
    return GROUPED_ATTENTION


_slot_cache_class: Any = None


def make_slot_cache(torch: Any, max_rows: int, max_columns: int) -> Any:
    """A ``SlotCache`` instance; the class subclasses transformers' ``Cache`` and is built on first use."""
    global _slot_cache_class
    if _slot_cache_class is None:
        _slot_cache_class = _build_slot_cache_class(torch)
    return _slot_cache_class(max_rows, max_columns)


def _build_slot_cache_class(torch: Any) -> Any:
    from transformers.cache_utils import Cache

    takes_layers = "layers" in inspect.signature(Cache.__init__).parameters

    class SlotCache(Cache):
        """Per-layer key/value buffers ``[rows, kv_heads, columns, head_dim]`` that grow on demand.

        ``plan`` says, before each forward, which rows take part, where this forward's keys are
        written (the same columns for every row during prefill, one column per row during decode)
        and how many columns attention reads.
        """

        def __init__(self, max_rows: int, max_columns: int) -> None:
            if takes_layers:
                super().__init__(layers=[])
            else:
                super().__init__()
            # Doubling stops at these (more is allocated only when a step really needs it).
            self.max_rows, self.max_columns = max_rows, max_columns
            self.keys: list[Any] = []
            self.values: list[Any] = []
            self._rows = (0, 0)
            self._width = 0
            self._columns: Any = None
            self._view = 0
            self._row_index: Any = None

        def plan(self, first: int, stop: int, width: int, columns: Any, view: int) -> None:
            self._rows, self._width, self._columns, self._view = (first, stop), width, columns, view
            self._row_index = None if columns is None else torch.arange(first, stop, device=columns.device)

        def update(self, key_states: Any, value_states: Any, layer_idx: int, cache_kwargs: Any = None,
                   *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            keys, values = self._buffers(layer_idx, key_states)
            first, stop = self._rows
            if self._columns is None:
                keys[first:stop, :, :self._width] = key_states
                values[first:stop, :, :self._width] = value_states
            else:
                keys[self._row_index, :, self._columns] = key_states[:, :, 0]
                values[self._row_index, :, self._columns] = value_states[:, :, 0]
            return keys[first:stop, :, :self._view], values[first:stop, :, :self._view]

        def _buffers(self, layer: int, like: Any) -> tuple[Any, Any]:
            rows_needed, cols_needed = self._rows[1], max(self._view, self._width)
            while len(self.keys) <= layer:
                self.keys.append(None)
                self.values.append(None)
            current = self.keys[layer]
            have_rows, have_cols = (0, 0) if current is None else (current.shape[0], current.shape[2])
            if have_rows < rows_needed or have_cols < cols_needed:
                # Each dimension only grows, doubling when it must (up to the backend's limits), so growth is
                # rare and amortized without reserving far more than the batch and sequence limits need.
                rows = have_rows if have_rows >= rows_needed else max(rows_needed, min(2 * have_rows, self.max_rows))
                cols = have_cols if have_cols >= cols_needed else max(
                    cols_needed, min(max(2 * have_cols, 64), self.max_columns))
                shape = (rows, like.shape[1], cols, like.shape[3])
                new_keys = torch.zeros(shape, dtype=like.dtype, device=like.device)
                new_values = torch.zeros(shape, dtype=like.dtype, device=like.device)
                if current is not None:
                    new_keys[:have_rows, :, :have_cols] = current
                    new_values[:have_rows, :, :have_cols] = self.values[layer]
                self.keys[layer], self.values[layer] = new_keys, new_values
            return self.keys[layer], self.values[layer]

        def move_row(self, src: int, dst: int, columns: int) -> None:
            for keys, values in zip(self.keys, self.values):
                if keys is not None:
                    keys[dst, :, :columns] = keys[src, :, :columns]
                    values[dst, :, :columns] = values[src, :, :columns]

        def get_seq_length(self, layer_idx: int | None = 0) -> int:
            return max(self._view - 1, 0) if self._columns is not None else 0

        def get_max_length(self) -> Any:
            return None

        def get_max_cache_shape(self, layer_idx: int = 0) -> Any:
            return -1

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return self._view, 0

        def __len__(self) -> int:
            return len(self.keys)

    return SlotCache

