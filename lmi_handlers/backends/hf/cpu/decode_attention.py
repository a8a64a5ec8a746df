"""The decode rows' attention of a packed step read straight from the paged pool (``option.cpu_attention_kernel``).

With torch's operators (``packed_attention.py``) a step gathers a copy of every decode row's keys and values out
of the pool, then runs two batched products per row and KV head, a dozen operator calls per layer. The kernel in
``decode_attention.cpp`` reads each key and value once from its slot and does the scores, the softmax (torch's
own vectorized exp) and the weighted sum in one call, a group's query heads together, with the next keys and
values prefetched, which makes decode steps faster the more rows they have (``benchmarks/engine.py kernels``;
figures in docs/engine.md, "Figures"). The sums run in another order, so outputs differ from
torch's by about 1e-7; greedy output equals ``model.generate`` (tests).

It is C++ (``common.build``), because torch has no operator that attends over a block table. Float32 on
the CPU only. torch is passed in by the backend; nothing here runs at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .common import build

SOURCE = Path(__file__).with_name("decode_attention.cpp")


def build_kernel(torch: Any) -> Any:
    """The compiled ``decode_attention`` function; ``ConfigError`` naming the option when it cannot be built."""
    return build(torch, "cpu_attention_kernel", SOURCE).decode_attention


def decode_reader(kernel: Any, tables: Any, lengths: Any, block_size: int) -> Callable[..., Any]:
    """``attend(query [rows, heads, dim], keys, values [kv_heads, slots, dim], scale)`` -> ``[rows, heads, dim]``
    for decode rows whose first ``lengths`` positions lie in the blocks of ``tables``."""
    return lambda query, keys, values, scale: kernel(query, keys, values, tables, lengths, block_size, scale)


def load_check(torch: Any, kernel: Any) -> str | None:
    """None if ``kernel`` attends as softmax in float64 does on this CPU over rows ending inside, at and past a
    block's end; else what differed (``option.cpu_attention_kernel=auto`` then takes torch's operators)."""
    generator = torch.Generator().manual_seed(0)
    heads, groups, dim, block_size = 4, 2, 24, 4
    lengths = torch.tensor([1, 4, 5, 11])
    tables = torch.arange(12).view(4, 3)  # row r reads blocks 3r .. 3r + 2
    keys, values = (torch.randn(groups, 48, dim, generator=generator) for _ in range(2))
    query = torch.randn(len(lengths), heads, dim, generator=generator)
    got = kernel(query, keys, values, tables, lengths, block_size, dim ** -0.5)
    for row, length in enumerate(lengths.tolist()):
        slots = torch.arange(row * 3 * block_size, row * 3 * block_size + length)
        q = query[row].double().view(groups, heads // groups, dim)
        weights = torch.softmax(q @ keys[:, slots].double().transpose(1, 2) * dim ** -0.5, dim=-1)
        want = (weights @ values[:, slots].double()).reshape(heads, dim)
        error = float((got[row].double() - want).abs().max())
        if not error <= 2e-6:
            return f"a row of {length} positions: error {error:.1e}"
    return None
