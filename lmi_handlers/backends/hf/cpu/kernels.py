"""Which CPU kernels the hf backend runs, from two options, where they may run, and how the compiled ones are built.

- ``option.cpu_linear_kernel``: ``auto`` (the default), ``stock`` (torch's product), ``onednn``
  (``onednn_linear.py``) or ``compiled`` (``compiled_linear.py``);
- ``option.cpu_attention_kernel``: ``auto`` (the default), ``torch`` (torch's operators) or ``compiled``
  (``decode_attention.py``).

``auto`` (``choose``) takes, for a float32 model on the CPU, the compiled kernel where it builds and passes its
load check on this CPU, else for the linear layers oneDNN where torch has it, else the stock path; on a GPU, in
another dtype or with quantized weights it is the stock path. A build that fails under ``auto`` never fails the
load: the next choice is taken and the log says why. The choice and its reasons are logged once per process.
``stock`` and ``torch`` are what exactness tests pin: greedy output equal to the stock model's bit for bit.

Every kernel but torch's own takes float32 on the CPU only, so those choices, named explicitly, are refused before
any weights load where the options put the model elsewhere; ``lmi validate`` applies the same rule before a
deployment.

The compiled kernels are C++ beside their modules, built at load by ``torch.utils.cpp_extension`` with the
machine's compiler and ninja (once; torch keeps the build under ``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), with the vector flags of the CPU capability torch itself dispatches to: AVX-512,
AVX2, or none (``ATEN_CPU_CAPABILITY=avx2`` or ``default`` picks a lower one, as the tests do to check each build).
Each build's name carries its capability and a key of the Python environment and torch version, so two
environments sharing the cache (the two test environments) keep their own builds instead of rebuilding over each
other's.

torch's thread count (``default_threads``) is left to ``OMP_NUM_THREADS`` where it is set. Else it follows the
step: a narrow step (decode rows) runs one thread less than the CPUs this process may run on, at least one, so that
the server's own threads (HTTP, tokenizing, streaming, the step loop) keep a core instead of preempting torch's
workers in the middle of a product; a wide step (``WIDE_ROWS`` tokens or more: prompts being prefilled) runs on
every CPU, since its products are large enough to share and the server has little to stream meanwhile. A wide
step's logits are the same bits on one thread as on two (torch's product and attention split rows, not the sums;
``tests/handlers/test_cpu_kernels.py`` checks it), so the answers do not depend on the policy
(``benchmarks/threads.py`` measures it; docs/engine.md has the figures).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from ....config import ConfigError, parse_choice

logger = logging.getLogger(__name__)

AUTO = "auto"
OPTIONS = {"cpu_linear_kernel": (AUTO, "stock", "onednn", "compiled"),
           "cpu_attention_kernel": (AUTO, "torch", "compiled")}
STOCK = {"cpu_linear_kernel": "stock", "cpu_attention_kernel": "torch"}
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


@dataclass(frozen=True)
class CpuKernels:
    linear: str = AUTO
    attention: str = AUTO


@dataclass(frozen=True)
class Chosen:
    """What runs: ``linear`` is stock, onednn or compiled, ``attention`` torch or compiled, with the built compiled
    modules (None where not compiled) and why ``auto`` chose so."""

    linear: str
    attention: str
    linear_kernel: Any = None
    attention_kernel: Any = None
    reasons: tuple[str, ...] = ()


def parse_kernels(props: Mapping[str, Any]) -> CpuKernels:
    linear, attention = (parse_choice(props, key, allowed[0], allowed) for key, allowed in OPTIONS.items())
    return CpuKernels(linear, attention)


def check_target(kernels: CpuKernels, device: str, dtype: str) -> None:
    """``device`` resolved (cpu or cuda), ``dtype`` as ``option.dtype`` says it (auto is float32 on the CPU).
    ``auto`` always passes: elsewhere it is the stock path."""
    for key, value in zip(OPTIONS, (kernels.linear, kernels.attention)):
        if value not in (AUTO, STOCK[key]) and (device != "cpu" or dtype not in ("auto", "fp32")):
            raise not_float32_on_cpu(key, value, f"option.dtype={dtype} on {device}")


_logged: set[str] = set()  # the choices this process has logged


def choose(torch: Any, kernels: CpuKernels, float32_cpu: bool, quantized: bool) -> Chosen:
    """The kernels to run, ``auto`` resolved (``float32_cpu``: the model loads float32 on the CPU); explicit
    compiled kernels are built here, before the weights load, so a machine without a compiler is refused in
    seconds. The choice and its reasons are logged once per process (a draft model chooses the same again)."""
    chosen = _choose(torch, kernels, float32_cpu, quantized)
    line = f"CPU kernels: linear layers {chosen.linear}, decode attention {chosen.attention}" + \
        (f" (auto: {'; '.join(chosen.reasons)})" if chosen.reasons else "")
    if line not in _logged:
        _logged.add(line)
        logger.info("%s", line)
    return chosen


def _choose(torch: Any, kernels: CpuKernels, float32_cpu: bool, quantized: bool) -> Chosen:
    reasons: list[str] = []
    linear, linear_kernel = _choose_linear(torch, kernels.linear, float32_cpu, quantized, reasons)
    attention, attention_kernel = _choose_attention(torch, kernels.attention, float32_cpu, reasons)
    return Chosen(linear, attention, linear_kernel, attention_kernel, tuple(reasons))


def _choose_linear(torch: Any, value: str, float32_cpu: bool, quantized: bool, reasons: list[str]) -> tuple[str, Any]:
    from . import compiled_linear

    if value == "compiled":
        return value, compiled_linear.build_kernel(torch)
    if value != AUTO:
        return value, None
    if not float32_cpu or quantized:
        reasons.append("linear stock: " + ("the weights are quantized" if quantized else "not float32 on the CPU"))
        return "stock", None
    kernel = _built(torch, compiled_linear, reasons)
    if kernel is not None:
        return "compiled", kernel
    if torch.backends.mkldnn.is_available():
        reasons.append("linear onednn")
        return "onednn", None
    reasons.append("linear stock: this torch has no oneDNN")
    return "stock", None


def _choose_attention(torch: Any, value: str, float32_cpu: bool, reasons: list[str]) -> tuple[str, Any]:
    from . import decode_attention

    if value == "compiled":
        return value, decode_attention.build_kernel(torch)
    if value != AUTO:
        return value, None
    if not float32_cpu:
        reasons.append("attention torch: not float32 on the CPU")
        return "torch", None
    kernel = _built(torch, decode_attention, reasons)
    return ("compiled", kernel) if kernel is not None else ("torch", None)


def _built(torch: Any, module: Any, reasons: list[str]) -> Any:
    """``module``'s compiled kernel if it builds and passes its load check on this CPU, else None with the reason."""
    name = Path(module.SOURCE).stem
    try:
        kernel = module.build_kernel(torch)
    except ConfigError as exc:
        reasons.append(f"{name} not used: {exc.allowed}")
        logger.warning("option.%s=auto: %s", exc.key, exc.allowed)
        return None
    failed = module.load_check(torch, kernel)
    if failed:
        reasons.append(f"{name} not used: its load check failed ({failed})")
        logger.warning("the %s kernel failed its load check on this CPU: %s", name, failed)
        return None
    reasons.append(f"{name} built and checked")
    return kernel


@dataclass(frozen=True)
class StepThreads:
    """torch's thread count for a narrow step and for a wide one (module docstring)."""

    narrow: int
    wide: int

    def for_step(self, tokens: int) -> int:
        return self.wide if tokens >= WIDE_ROWS else self.narrow


def default_threads() -> StepThreads | None:
    """The thread counts to set, or None where ``OMP_NUM_THREADS`` already says them (module docstring)."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return StepThreads(narrow=max(1, cpus - 1), wide=cpus)


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


def build(torch: Any, key: str, source: Path) -> Any:
    """The extension module compiled from ``source`` for ``option.<key>=compiled``; ``ConfigError`` naming the option
    when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        capability = torch.backends.cpu.get_cpu_capability()
        # One build folder per capability and environment: a cache shared by two CPUs (or ATEN_CPU_CAPABILITY set),
        # or by two virtual environments with their own torch, keeps every build instead of rebuilding over another.
        name = f"lmi_{source.stem}_{capability.lower()}_{environment_key(torch)}"
        with _building_alone(name):
            return load(name, [str(source)], extra_cflags=["-O3", *CAPABILITY_FLAGS.get(capability, [])])
    except Exception as exc:  # no compiler, no ninja, a failed build: each says so in its message
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise ConfigError(key, "compiled", f"building the kernel failed ({reason}): install a C++ compiler and ninja, "
                          "or remove the option") from exc
