"""Which CPU kernels the hf backend runs, from two options, and where they may run (``common.py`` builds the compiled
ones).

- ``option.cpu_linear_kernel``: ``auto`` (the default), ``stock`` (torch's product), ``onednn``
  (``onednn_linear.py``) or ``compiled`` (``compiled_linear.py``);
- ``option.cpu_attention_kernel``: ``auto`` (the default), ``torch`` (torch's operators) or ``compiled``
  (``decode_attention.py``).

``auto`` (``choose``) takes, for a float32 model on the CPU, the compiled kernel where it builds and passes its
load check on this CPU, else for the linear layers oneDNN where torch has it, else the stock path. For a bfloat16
model on the CPU it measures the linear layers' candidates that run here (the compiled kernel where it builds
with AVX-512 BF16 and passes its check, oneDNN where torch multiplies bfloat16 with it, torch's product) on
decode's row counts over weights larger than the caches (``fastest_linear``), and takes the fastest: on a CPU with
AMX oneDNN's tiles can beat the compiled kernel, which uses AVX-512 BF16; the decode attention is the compiled
kernel where it builds and passes its check, as in float32. On a GPU, in float16 or with quantized weights it is
the stock path. A build that fails under ``auto`` never fails the load: the next choice is taken and the log says
why. The choice and its reasons (with the measured times) are logged once per process. ``stock`` and ``torch`` are
what exactness tests pin: greedy output equal to the stock model's bit for bit.

Every kernel but torch's own takes float32 or bfloat16 on the CPU only, so those choices, named explicitly, are
refused before any weights load where the options put the model elsewhere; ``lmi validate`` applies the same rule
before a deployment.

torch's thread count (``step_threads``) is every CPU this process may run on, or ``OMP_NUM_THREADS`` where it is
set, for every step (the compiled kernels split their products over torch's threads with OpenMP), and each step
sets it on its own thread, since torch keeps a count per thread. In DJL's async mode the model loads on the event
loop's thread, which keeps one torch thread (the kernels are measured there, on one thread): libgomp gives each
thread that starts parallel work a pool of workers, and once the pools' workers and the process's first thread
outnumber the CPUs (a pool on the event loop's thread beside the engine thread's) every worker sleeps in the kernel
between two parallel regions instead of spinning, so each operator of a step first waits for its workers to wake
(docs/engine.md has the figures).
The logits are the same bits on any thread count (each kernel and torch's product give a thread whole outputs, not
part of a sum; ``tests/handlers/test_cpu_kernels.py`` checks it), so no answer depends on it (``benchmarks/threads.py``
and ``serve_sweep.py`` measure the policy; docs/engine.md has the figures).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ....config import ConfigError, parse_choice
from .common import KERNEL_DTYPES, not_on_cpu

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
    """``device`` and ``dtype`` resolved (cpu or cuda; fp32, fp16 or bf16). ``auto`` always passes: elsewhere it is
    the stock path."""
    for key, value in zip(OPTIONS, (kernels.linear, kernels.attention)):
        if value not in (AUTO, STOCK[key]) and (device != "cpu" or dtype not in KERNEL_DTYPES):
            raise not_on_cpu(key, value, f"{dtype} on {device}")


_logged: set[str] = set()  # the choices this process has logged


def choose(torch: Any, kernels: CpuKernels, cpu_dtype: str | None, quantized: bool) -> Chosen:
    """The kernels to run, ``auto`` resolved (``cpu_dtype``: fp32 or bf16 where the model loads so on the CPU, else
    None); explicit compiled kernels are built here, before the weights load, so a machine without a compiler is
    refused in seconds. The choice and its reasons are logged once per process (a draft model chooses the same
    again)."""
    chosen = _choose(torch, kernels, cpu_dtype if cpu_dtype in KERNEL_DTYPES else None, quantized)
    line = f"CPU kernels: linear layers {chosen.linear}, decode attention {chosen.attention}" + \
        (f" (auto: {'; '.join(chosen.reasons)})" if chosen.reasons else "")
    if line not in _logged:
        _logged.add(line)
        logger.info("%s", line)
    return chosen


def _choose(torch: Any, kernels: CpuKernels, cpu_dtype: str | None, quantized: bool) -> Chosen:
    reasons: list[str] = []
    linear, linear_kernel = _choose_linear(torch, kernels.linear, cpu_dtype, quantized, reasons)
    attention, attention_kernel = _choose_attention(torch, kernels.attention, cpu_dtype, reasons)
    return Chosen(linear, attention, linear_kernel, attention_kernel, tuple(reasons))


def _choose_linear(torch: Any, value: str, cpu_dtype: str | None, quantized: bool,
                   reasons: list[str]) -> tuple[str, Any]:
    from . import compiled_linear

    if value == "compiled":
        return value, compiled_linear.build_kernel(torch)
    if value != AUTO:
        return value, None
    if cpu_dtype is None or quantized:
        reasons.append("linear stock: " + ("the weights are quantized" if quantized else
                                           "not float32 or bfloat16 on the CPU"))
        return "stock", None
    kernel = _built(torch, compiled_linear, reasons, cpu_dtype)
    if cpu_dtype == "bf16":
        return _measured_bf16_linear(torch, kernel, reasons)
    if kernel is not None:
        return "compiled", kernel
    if torch.backends.mkldnn.is_available():
        reasons.append("linear onednn")
        return "onednn", None
    reasons.append("linear stock: this torch has no oneDNN")
    return "stock", None


def _measured_bf16_linear(torch: Any, kernel: Any, reasons: list[str]) -> tuple[str, Any]:
    """The fastest of the bfloat16 linear kernels that run here (``kernel``: the compiled one, None where it did not
    build or pass its check), with the times in the reason."""
    candidates = {"compiled": kernel} if kernel is not None else {}
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        candidates["onednn"] = None
    if not candidates:
        reasons.append("linear stock: neither the compiled kernel nor oneDNN multiplies bfloat16 here")
        return "stock", None
    times = fastest_linear(torch, kernel, list(candidates))
    best = fastest(times)
    reasons.append(f"linear {best}: the fastest bfloat16 product here, ms at {'/'.join(map(str, MEASURED_ROWS))} "
                   "rows: " + "; ".join(f"{name} {'/'.join(f'{ms:.1f}' for ms in spent)}"
                                        for name, spent in times.items()))
    return best, candidates.get(best)


def _choose_attention(torch: Any, value: str, cpu_dtype: str | None, reasons: list[str]) -> tuple[str, Any]:
    from . import decode_attention

    if value == "compiled":
        return value, decode_attention.build_kernel(torch)
    if value != AUTO:
        return value, None
    if cpu_dtype is None:
        reasons.append("attention torch: not float32 or bfloat16 on the CPU")
        return "torch", None
    kernel = _built(torch, decode_attention, reasons, cpu_dtype)
    return ("compiled", kernel) if kernel is not None else ("torch", None)


def _built(torch: Any, module: Any, reasons: list[str], dtype: str) -> Any:
    """``module``'s compiled kernel if it builds and passes its load check in ``dtype`` on this CPU, else None with
    the reason."""
    name = Path(module.SOURCE).stem
    try:
        kernel = module.build_kernel(torch)
    except ConfigError as exc:
        reasons.append(f"{name} not used: {exc.allowed}")
        logger.warning("option.%s=auto: %s", exc.key, exc.allowed)
        return None
    failed = module.load_check(torch, kernel, torch.bfloat16 if dtype == "bf16" else torch.float32)
    if failed:
        reasons.append(f"{name} not used: its load check failed ({failed})")
        logger.warning("the %s kernel failed its load check on this CPU: %s", name, failed)
        return None
    reasons.append(f"{name} built and checked")
    return kernel


def default_threads() -> int | None:
    """Every CPU this process may run on, or None where ``OMP_NUM_THREADS`` already says torch's thread count."""
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def step_threads(torch: Any, async_mode: bool) -> int:
    """The thread count each step sets on its own thread; the loading thread keeps it too, except in DJL's async mode,
    where it is the event loop's and keeps one (module docstring)."""
    threads = default_threads() or set_threads(torch, None)
    set_threads(torch, 1 if async_mode else threads)
    return threads


def set_threads(torch: Any, count: int | None) -> int:
    """Set this thread's torch thread count (None: keep it); the count. torch gives a thread, on its first read or
    parallel work, the count any thread set last: read first, so that libtorch's first-use setup has run and does not
    undo this count later (a compiled extension's first parallel work on the thread still would: docs/engine.md)."""
    current = torch.get_num_threads()
    if count is not None and count != current:
        torch.set_num_threads(count)
    return count or current


# ``fastest_linear`` measures at decode's row counts over weights of more bytes than most CPUs' last-level cache, so
# that they stream from memory as a model's do.
MEASURED_ROWS = (1, 16, 64)
MEASURED_LAYERS, MEASURED_SHAPE = 8, (2048, 2048)  # 64 MiB of bfloat16


def fastest_linear(torch: Any, kernel: Any, names: list[str]) -> dict[str, list[float]]:
    """Milliseconds of one bfloat16 product over ``MEASURED_LAYERS`` layers at each of ``MEASURED_ROWS`` (best of 3,
    interleaved) for torch's product (``stock``) and each of ``names`` (``compiled``, built as ``kernel``, and
    ``onednn``)."""
    from .compiled_linear import compile_linears
    from .onednn_linear import prepack_linears

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(MEASURED_SHAPE, generator=generator).to(torch.bfloat16) for _ in range(MEASURED_LAYERS)]
    models = {name: _linears(torch, weights) for name in ("stock", *names)}
    if "compiled" in models:
        compile_linears(torch, kernel, models["compiled"])
    if "onednn" in models:
        prepack_linears(torch, models["onednn"])
    inputs = [torch.randn(rows, MEASURED_SHAPE[1], generator=generator).to(torch.bfloat16) for rows in MEASURED_ROWS]
    best = {name: [float("inf")] * len(inputs) for name in models}
    with torch.inference_mode():
        for _ in range(3):
            for name, layers in models.items():
                for index, x in enumerate(inputs):
                    began = time.perf_counter()
                    for layer in layers:
                        layer(x)
                    best[name][index] = min(best[name][index], (time.perf_counter() - began) * 1000)
    return best


def _linears(torch: Any, weights: list[Any]) -> Any:
    layers = []
    for weight in weights:
        layer = torch.nn.utils.skip_init(torch.nn.Linear, weight.shape[1], weight.shape[0], bias=False,
                                         dtype=weight.dtype)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layers.append(layer)
    return torch.nn.Sequential(*layers)


def fastest(times: dict[str, list[float]]) -> str:
    """The name whose times, each over the best at its row count, sum least."""
    floor = [min(spent[i] for spent in times.values()) for i in range(len(MEASURED_ROWS))]
    return min(times, key=lambda name: sum(ms / low for ms, low in zip(times[name], floor)))
