"""Which CPU kernels the hf backend runs, from two options, where they may run, and how the compiled ones are built.

- ``option.cpu_linear_kernel``: ``stock`` (torch's product), ``onednn`` (``onednn_linear.py``) or ``compiled``
  (``compiled_linear.py``);
- ``option.cpu_attention_kernel``: ``torch`` (torch's operators) or ``compiled`` (``decode_attention.py``).

Every kernel but torch's own takes float32 on the CPU only, so those choices are refused before any weights load
where the options put the model elsewhere; ``lmi validate`` applies the same rule before a deployment.

The compiled kernels are C++ beside their modules, built at load by ``torch.utils.cpp_extension`` with the
machine's compiler and ninja (about 20 s once; torch keeps the build under ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), with the vector flags of the CPU capability torch itself dispatches to: AVX-512,
AVX2, or none (``ATEN_CPU_CAPABILITY=avx2`` or ``default`` picks a lower one, as the tests do to check each build).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ....config import ConfigError, parse_choice

OPTIONS = {"cpu_linear_kernel": ("stock", "onednn", "compiled"), "cpu_attention_kernel": ("torch", "compiled")}
# The vector width torch itself was dispatched to on this CPU: ATen's vector types follow these macros.
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


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


def float32_cpu_linears(torch: Any, model: Any, key: str, value: str) -> list[Any]:
    """``model``'s ``nn.Linear`` layers, refused (``ConfigError``) unless every one is float32 on the CPU."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    weights = {(m.weight.device.type, m.weight.dtype) for m in layers}
    if weights - {("cpu", torch.float32)}:
        raise not_float32_on_cpu(key, value, ", ".join(sorted(f"{dtype} on {device}" for device, dtype in weights)))
    return layers


def not_float32_on_cpu(key: str, value: str, found: str) -> ConfigError:
    return ConfigError(key, value, f"this kernel runs float32 on the CPU, not {found}: remove the option, or load "
                       "float32 on the CPU (option.dtype=fp32, option.device=cpu)")


def build(torch: Any, key: str, source: Path) -> Any:
    """The extension module compiled from ``source`` for ``option.<key>=compiled``; ``ConfigError`` naming the option
    when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        capability = torch.backends.cpu.get_cpu_capability()
        # One build folder per capability: a cache shared by two CPUs (or ATEN_CPU_CAPABILITY set) keeps both builds
        # instead of rebuilding over each other.
        return load(f"lmi_{source.stem}_{capability.lower()}", [str(source)],
                    extra_cflags=["-O3", *CAPABILITY_FLAGS.get(capability, [])])
    except Exception as exc:  # no compiler, no ninja, a failed build: each says so in its message
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(key, "compiled", f"building the kernel failed ({reason}): install a C++ compiler and ninja, "
                          "or remove the option") from exc
