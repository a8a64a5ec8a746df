"""Memory for the hf backend on the CPU: glibc's malloc told to keep freed memory for reuse, and the packed
weights a decode step streams on 2 MB pages.

A decode step on the CPU allocates and frees tensors of a few megabytes every step (logits and sampling
distributions: 16 rows of a 49,152-token vocabulary are 3 MB). By default glibc maps such blocks fresh and
returns them to the kernel when they are freed, or trims the top of its heap, so every step faults its tensors in
again page by page. Kept instead, sampling (what a chat request without sampling fields asks for) takes about half
the time a step or less (``benchmarks/engine.py sampling``; figures in docs/engine.md,
"Figures"). The numbers computed are the same; the process's resident memory stays at its
peak rather than shrinking after it.

``mallopt`` through ctypes (standard library), where the C library has it: glibc. Elsewhere nothing changes.

A decode step also streams every weight from memory: hundreds of megabytes in 4 KB pages, so a TLB miss every
4 KB. ``huge_page_empty`` maps a buffer fresh and asks Linux to back it with transparent huge pages
(``MADV_HUGEPAGE``, which THP's default ``madvise`` mode honours) before anything touches it; the compiled linear
kernel packs its weights into one, which shortens its decode steps. Where the system has no huge pages the buffer
is ordinary memory. Not the KV pool: its blocks are first written while serving, and a first write into 2 MB pages
zeroes 2 MB, in every layer's keys and values at once (hundreds of megabytes in one step: inter-token stalls under
load), for no gain in attention.
"""

from __future__ import annotations

import ctypes
import math
import mmap
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks below this come from the heap: glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 1 << 30  # free memory at the top of the heap kept up to this much


def keep_freed_memory() -> bool:
    """Set the process's malloc to reuse freed blocks; True if the C library took both settings."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


HUGE_PAGE = 2 << 20


def huge_page_empty(torch: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialized CPU tensor of ``shape`` in fresh memory aligned to, and advised for, 2 MB pages; memory is
    committed as it is first written, as ``torch.empty``'s. The tensor keeps its mapping alive."""
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if size == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # (Windows has no anonymous private maps)
        return torch.empty(shape, dtype=dtype)
    # private and anonymous (shared memory follows another THP setting), never touched: first writes fault huge pages
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start:start + size].view(dtype).view(shape)
