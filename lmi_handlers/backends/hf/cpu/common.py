"""What the hf backend's CPU kernels share: the width from which torch's own product takes over, the rule that they
take float32 or bfloat16 on the CPU, and how the compiled ones are built.

The compiled kernels are C++ beside their modules, built at load by ``torch.utils.cpp_extension`` with the
machine's compiler and ninja (once; torch keeps the build under ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), with the vector flags of the CPU capability torch itself dispatches to: AVX-512,
AVX2, or none (``ATEN_CPU_CAPABILITY=avx2`` or ``default`` picks a lower one, as the tests do to check each build),
plus AVX-512 BF16 where the CPU has it (the compiled linear kernel's bfloat16 path needs it). Each build's name
carries that target and a key of the Python environment and torch version, so two environments sharing the cache
(the two test environments) keep their own builds instead of rebuilding over each other's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

from ....default_dtype import cpu_flags
from ....errors import ConfigError

logger = logging.getLogger(__name__)

# From this many rows a product (a prefill chunk, or a packed step with one) goes through torch's own product, with
# the stock weights, under either prepacked kernel: their layouts are made for decode's few rows, and from this
# width torch's product is as fast or faster (``benchmarks/engine.py widths``; docs/engine.md has the figures).
WIDE_ROWS = 320
# The vector width torch itself was dispatched to on this CPU: ATen's vector types follow these macros.
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}
#: Dtypes (``option.dtype``'s names) the CPU kernels other than torch's own run.
KERNEL_DTYPES = ("fp32", "bf16")


def cpu_linears(torch: Any, model: Any, key: str, value: str) -> list[Any]:
    """``model``'s ``nn.Linear`` layers, refused (``ConfigError``) unless all are float32, or all bfloat16, on the
    CPU."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    weights = {(m.weight.device.type, m.weight.dtype) for m in layers}
    if weights not in ({("cpu", torch.float32)}, {("cpu", torch.bfloat16)}):
        raise not_on_cpu(key, value, ", ".join(sorted(f"{dtype} on {device}" for device, dtype in weights)))
    return layers


def not_on_cpu(key: str, value: str, found: str) -> ConfigError:
    return ConfigError(key, value, f"this kernel runs float32 or bfloat16 on the CPU, not {found}: remove the "
                       "option, or load on the CPU in one of them (option.dtype=fp32 or bf16, option.device=cpu)")


def environment_key(torch: Any) -> str:
    """A short key of this Python environment and its torch: builds of two environments never share a folder."""
    return hashlib.sha1(f"{sys.prefix}|{torch.__version__}".encode()).hexdigest()[:8]


@contextlib.contextmanager
def _building_alone(name: str) -> Iterator[None]:
    """Holds an ``flock`` on the extension's build folder while torch builds or loads it. torch's own ``lock`` file
    outlives a build that was killed, and then stalls every later load of that extension for ever. An flock dies
    with its holder, so a ``lock`` found while holding ours was left by a dead build: it is removed."""
    import fcntl

    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(name, verbose=False))
    with open(folder / "lmi.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        left = folder / "lock"
        if left.exists():
            logger.warning("removing %s, left by a kernel build that did not finish", left)
            left.unlink()
        yield


def build_target(torch: Any) -> tuple[str, list[str]]:
    """What the kernels build for here, as a name and the compiler's flags: the capability torch dispatches to, with
    AVX-512 BF16 beside AVX-512 where the CPU has it."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = CAPABILITY_FLAGS.get(capability, [])
    if capability == "AVX512" and "avx512_bf16" in cpu_flags():
        return "avx512bf16", [*flags, "-mavx512bf16"]
    return capability.lower(), flags


def build(torch: Any, key: str, source: Path) -> Any:
    """The extension module compiled from ``source`` for ``option.<key>=compiled``; ``ConfigError`` naming the option
    when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        target, flags = build_target(torch)
        # One build folder per target and environment: a cache shared by two CPUs (or ATEN_CPU_CAPABILITY set), or
        # by two virtual environments with their own torch, keeps every build instead of rebuilding over another.
        name = f"lmi_{source.stem}_{target}_{environment_key(torch)}"
        with _building_alone(name):
            # OpenMP: the kernels' at::parallel_for splits their work over torch's threads only where built with it.
            return load(name, [str(source)], extra_cflags=["-O3", "-fopenmp", *flags], extra_ldflags=["-fopenmp"])
    except Exception as exc:  # no compiler, no ninja, a failed build: each says so in its message
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(key, "compiled", f"building the kernel failed ({reason}): install a C++ compiler and ninja, "
                          "or remove the option") from exc
