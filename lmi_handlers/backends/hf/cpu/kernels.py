"""Which CPU kernels the hf backend runs, from two options, and where they may run (``common.py`` builds the compiled
ones).

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

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ....config import ConfigError, parse_choice
from .common import WIDE_ROWS, not_float32_on_cpu

logger = logging.getLogger(__name__)

AUTO = "auto"
OPTIONS = {"cpu_linear_kernel": (AUTO, "stock", "onednn", "compiled"),
           "cpu_attention_kernel": (AUTO, "torch", "compiled")}
STOCK = {"cpu_linear_kernel": "stock", "cpu_attention_kernel": "torch"}


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
