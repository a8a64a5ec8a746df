"""The decode rows' attention of a packed step read straight from the paged pool (``option.cpu_attention_kernel``).

With torch's operators (``packed_attention.py``) a step gathers a copy of every decode row's keys and values out
of the pool, then runs two batched products per row and KV head, a dozen operator calls per layer. The kernel in
``decode_attention.cpp`` reads each key and value once from its slot and does the scores, the softmax (torch's
own vectorized exp) and the weighted sum in one call: on this project's AMD EPYC, one thread, in isolation 2-9x
faster for the tiny model's layers and 2.3x for SmolLM2's at 16 rows; whole SmolLM2 decode steps 7-23% faster
(``benchmarks/engine.py attention``). The sums run in another order, so outputs differ from torch's by about 1e-7;
greedy output equals ``model.generate`` (tests).

It is C++, built at load with the machine's compiler through ``torch.utils.cpp_extension`` (about 20 s once;
torch keeps the build under ``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), because torch
has no operator that attends over a block table. Float32 on the CPU only; without a C++ compiler and ninja the
option is refused at load. torch is passed in by the backend; nothing here runs at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..config import ConfigError

SOURCE = Path(__file__).with_name("decode_attention.cpp")
# The vector width torch itself was dispatched to on this CPU: ATen's vector types follow these macros.
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


def build_kernel(torch: Any) -> Any:
    """The compiled ``decode_attention`` function; ``ConfigError`` naming the option when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        flags = CAPABILITY_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])
        return load("lmi_decode_attention", [str(SOURCE)], extra_cflags=["-O3", *flags]).decode_attention
    except Exception as exc:  # no compiler, no ninja, a failed build: each says so in its message
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError("cpu_attention_kernel", "compiled", f"building the kernel failed ({reason}): install a C++ "
                          "compiler and ninja, or remove the option") from exc


def decode_reader(kernel: Any, tables: Any, lengths: Any, block_size: int) -> Callable[..., Any]:
    """``attend(query [rows, heads, dim], keys, values [kv_heads, slots, dim], scale)`` -> ``[rows, heads, dim]``
    for decode rows whose first ``lengths`` positions lie in the blocks of ``tables``."""
    return lambda query, keys, values, scale: kernel(query, keys, values, tables, lengths, block_size, scale)
