"""The hf backend's options, parsed once from the init properties: the KV pool (``paged_cache.PoolOptions``), the
CPU kernels (``cpu/kernels.py``), weight quantization (``quantize.py``), speculative decoding (``speculative.py``)
and a GGUF file. Each part keeps its own parser beside the code that uses it; this gathers them. Standard library
only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .cpu.kernels import OPTIONS as CPU_KERNEL_OPTIONS
from .cpu.kernels import CpuKernels, parse_kernels
from .paged_cache import POOL_KEYS, PoolOptions
from .quantize import parse_method
from .speculative import SPECULATIVE_KEYS, SpeculativeOptions, parse_options

KEYS = POOL_KEYS | SPECULATIVE_KEYS | frozenset(CPU_KERNEL_OPTIONS) | frozenset({"quantize", "gguf_file"})


@dataclass(frozen=True)
class HfOptions:
    """What ``serving.properties`` says about the hf backend."""

    pool: PoolOptions = PoolOptions()
    kernels: CpuKernels = CpuKernels()
    #: ``option.quantize``: a method of ``quantize.METHODS``, or None.
    quantize: str | None = None
    #: None without ``option.speculative_draft_model``.
    speculative: SpeculativeOptions | None = None
    #: ``option.gguf_file``: a .gguf file in the model directory, or None.
    gguf_file: str | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "HfOptions":
        """Raises ``ConfigError`` naming the first option that is invalid."""
        return cls(quantize=parse_method(props.get("quantize")), kernels=parse_kernels(props),
                   speculative=parse_options(props), pool=PoolOptions.from_properties(props),
                   gguf_file=str(props.get("gguf_file") or "").strip() or None)
