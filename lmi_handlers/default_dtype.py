"""What ``option.dtype=auto`` loads: the one rule, for our engine and for vLLM's, with the reason said.

Our engine (the hf backend), as vLLM does on a CPU that computes bfloat16 natively:

- on the CPU, bfloat16 where the CPU has native bfloat16 instructions (``NATIVE_BF16``: AVX-512 BF16's
  ``vdpbf16ps`` or AMX's tiles; the compiled kernels and oneDNN multiply bfloat16 there at full speed), else
  float32 (elsewhere bfloat16 products are emulated, slower than float32's);
- on CUDA the checkpoint's 16-bit type, float16 where it stores float32.

vLLM (the vllm backend passes ``auto`` through, and vLLM decides): the checkpoint's type where the platform supports
it, float32 checkpoints cast to the platform's first type. On an x86 or Arm CPU that is bfloat16 whatever the CPU
(vLLM 0.32 ``platforms/cpu.py`` ``supported_dtypes``; ``config/model.py`` ``_resolve_auto_dtype``), a float16
checkpoint staying float16; on a GPU of compute capability 8.0 or more (every GPU of the instance table) bfloat16
first too.

The CPU's flags come from ``/proc/cpuinfo`` (``cpu_flags``), without torch, so ``lmi validate`` reports what a CPU
target loads on the machine it runs on. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: CPU flags (``/proc/cpuinfo``'s names) under which bfloat16 products run natively.
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class DtypeChoice:
    """A dtype (fp32, fp16 or bf16) and why it was chosen."""

    dtype: str
    reason: str


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU flags (the first processor's ``flags``, or ``Features`` on Arm); empty where unknown."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """This machine's CPU model name (``model name``), or ``unknown``."""
    try:
        lines = Path(cpuinfo).read_text(errors="replace").splitlines()
    except OSError:
        return "unknown"
    return next((value.strip() for key, _, value in (line.partition(":") for line in lines)
                 if key.strip() == "model name"), "unknown")


def native_bf16(flags: frozenset[str]) -> tuple[str, ...]:
    """The flags of ``NATIVE_BF16`` the CPU has."""
    return tuple(flag for flag in NATIVE_BF16 if flag in flags)


def auto_dtype(device: str, stored: str | None, flags: frozenset[str]) -> DtypeChoice:
    """Our engine's ``auto`` on ``device`` (cpu or cuda), for a checkpoint stored as ``stored`` (fp32, fp16, bf16 or
    None: unknown) on a CPU with ``flags``."""
    if device == "cpu":
        native = native_bf16(flags)
        if native:
            return DtypeChoice("bf16", f"this CPU computes bfloat16 natively ({', '.join(native)})")
        return DtypeChoice("fp32", f"this CPU has no native bfloat16 ({' or '.join(NATIVE_BF16)})")
    if stored in ("fp16", "bf16"):
        return DtypeChoice(stored, f"the checkpoint's own 16-bit type on {device}")
    return DtypeChoice("fp16", f"float16 on {device}: the checkpoint stores {stored or 'no dtype'}")


def vllm_auto_dtype(device: str, stored: str | None) -> DtypeChoice:
    """vLLM's ``auto`` on ``device`` for a checkpoint stored as ``stored`` (module docstring)."""
    if stored in ("fp16", "bf16"):
        return DtypeChoice(stored, f"vLLM keeps the checkpoint's {stored} on {device}")
    return DtypeChoice("bf16", f"vLLM casts the {stored or 'float32'} checkpoint to its {device} platform's first "
                       "type, bfloat16")


def option_or_auto(dtype: str, auto: DtypeChoice) -> DtypeChoice:
    """``option.dtype`` as written (fp32, fp16, bf16 or auto) against what ``auto`` would choose."""
    return auto if dtype == "auto" else DtypeChoice(dtype, f"option.dtype={dtype}")
