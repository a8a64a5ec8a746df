"""The decode rows' attention of a packed step read straight from the paged pool (``option.cpu_attention_kernel``).

With torch's operators (``packed_attention.py``) a step gathers a copy of every decode row's keys and values out
of the pool, then runs two batched products per row and KV head, a dozen operator calls per layer. The kernel in
``decode_attention.cpp`` reads each key and value once from its slot and does the scores, the softmax (torch's
own vectorized exp) and the weighted sum in one call, a group's query heads together, with the next keys and
values prefetched: on this project's AMD EPYC, one thread, SmolLM2 engine decode steps with oneDNN linear layers
1.09x faster at one row, 1.21x at 16, 1.27-1.50x at 64 (``benchmarks/engine.py kernels``). The sums run in
another order, so outputs differ from torch's by about 1e-7; greedy output equals ``model.generate`` (tests).

It is C++ (``kernels.build``), because torch has no operator that attends over a block table. Float32 on
the CPU only. torch is passed in by the backend; nothing here runs at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .kernels import build

SOURCE = Path(__file__).with_name("decode_attention.cpp")


def build_kernel(torch: Any) -> Any:
    """The compiled ``decode_attention`` function; ``ConfigError`` naming the option when it cannot be built."""
    return build(torch, "cpu_attention_kernel", SOURCE).decode_attention


def decode_reader(kernel: Any, tables: Any, lengths: Any, block_size: int) -> Callable[..., Any]:
    """``attend(query [rows, heads, dim], keys, values [kv_heads, slots, dim], scale)`` -> ``[rows, heads, dim]``
    for decode rows whose first ``lengths`` positions lie in the blocks of ``tables``."""
    return lambda query, keys, values, scale: kernel(query, keys, values, tables, lengths, block_size, scale)
