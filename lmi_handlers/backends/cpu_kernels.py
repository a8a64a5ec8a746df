"""Which CPU kernels the hf backend runs, from two options, and where they may run.

- ``option.cpu_linear_kernel``: ``stock`` (torch's product) or ``onednn`` (``onednn_linear.py``);
- ``option.cpu_attention_kernel``: ``torch`` (torch's operators) or ``compiled`` (``decode_attention.py``).

Both kernels take float32 on the CPU only, so either choice is refused before any weights load where the options
put the model elsewhere; ``lmi validate`` applies the same rule before a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConfigError, parse_choice

OPTIONS = {"cpu_linear_kernel": ("stock", "onednn"), "cpu_attention_kernel": ("torch", "compiled")}


@dataclass(frozen=True)
class CpuKernels:
    linear: str = "stock"
    attention: str = "torch"


def parse_kernels(props: Mapping[str, Any]) -> CpuKernels:
    linear, attention = (parse_choice(props, key, allowed[0], allowed) for key, allowed in OPTIONS.items())
    return CpuKernels(linear, attention)


def check_target(kernels: CpuKernels, device: str, dtype: str) -> None:
    """``device`` resolved (cpu or cuda), ``dtype`` as ``option.dtype`` says it (auto is float32 on the CPU)."""
    for key, value in zip(OPTIONS, (kernels.linear, kernels.attention)):
        if value != OPTIONS[key][0] and (device != "cpu" or dtype not in ("auto", "fp32")):
            raise not_float32_on_cpu(key, value, f"option.dtype={dtype} on {device}")


def not_float32_on_cpu(key: str, value: str, found: str) -> ConfigError:
    return ConfigError(key, value, f"this kernel runs float32 on the CPU, not {found}: remove the option, or load "
                       "float32 on the CPU (option.dtype=fp32, option.device=cpu)")
