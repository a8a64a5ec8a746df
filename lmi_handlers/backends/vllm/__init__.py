"""The ``vllm`` backend: vLLM's engine driven by the handler inside DJL's rolling-batch protocol.

``option.rolling_batch=vllm`` (LMI's own line) or ``option.backend=vllm`` selects it wherever vLLM imports, vLLM's
CPU build included; ``option.backend=auto`` picks it only where vLLM imports and a GPU or NeuronCore is present
(``available``). Its parts: the options (``options.py``, with vLLM's engine arguments in ``engine_args.py``), the
plan ``lmi validate`` sizes (``plan.py``), one sequence's request to vLLM (``sampling.py``), LoRA adapters in vLLM's
terms (``adapters.py``), structured output and tool parsers (``structured.py``), and the engine with its step loop
(``engine.py``). This module is what the registry (``backends/registry.py``) reads; it imports only the standard
library.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

from .adapters import RULE as ADAPTERS
from .options import KEYS, Options
from .plan import plan

__all__ = ["ADAPTERS", "AUTO_FAMILIES", "HEAD_LAYOUT", "INSTANCE_FAMILIES", "KEYS", "Options", "ROLLING_BATCH",
           "STEP_LOOP", "available", "loadable", "load", "plan"]

#: The GPU families, whose LMI images ship vLLM (``auto`` picks it there).
AUTO_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en")
#: Where vLLM runs: the GPU families, Inferentia2/Trainium through vLLM's Neuron plugin, and this machine's CPU
#: (vLLM's CPU build, when asked for).
INSTANCE_FAMILIES = ("cpu", *AUTO_FAMILIES, "inf2", "trn1")
#: Embedding models load a pooler (``pooling.py``).
EMBEDS = True
#: LMI's own line for vLLM's engine: ``option.rolling_batch=vllm`` selects this backend.
ROLLING_BATCH = ("vllm",)
#: Tensor parallelism splits the attention heads over the GPUs; on NeuronCores the Neuron plugin (NxD Inference)
#: pads them, as the Neuron compilers do.
HEAD_LAYOUT = {"gpu": "heads", "neuron": "padded"}


def available() -> str | None:
    """None when ``auto`` should pick vLLM here: it imports and a GPU or NeuronCore is present."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if not _accelerator():
        return "no NVIDIA GPU or NeuronCore on this host (vLLM's CPU build is used only when asked for)"
    return None


def loadable() -> str | None:
    """An explicit choice loads wherever vLLM imports (its CPU build included)."""
    if importlib.util.find_spec("vllm") is None:
        return ("this backend needs vLLM, which LMI's GPU images have and this Python has not; from a clone of "
                "lmi-handlers, scripts/setup.sh --vllm builds .venv-vllm (vLLM's CPU build with lmi beside it: run "
                ".venv-vllm/bin/lmi serve, docs/vllm.md), or set option.rolling_batch=auto")
    return None


def load(deployment: Any) -> Any:
    from ..base import check_model_files

    check_model_files(deployment.config.model_id)
    if deployment.embedding:  # option.task=text-embedding: vLLM's pooling runner (pooling.py)
        from .pooling import VllmPooler

        return VllmPooler(deployment.config, deployment.options, deployment.tools, deployment.lora)
    from .engine import VllmBackend

    return VllmBackend(deployment.config, deployment.options, deployment.tools, deployment.lora, deployment.grammar)


def step_loop(backend: Any) -> Any:
    """The loop the handler runs instead of our engine: vLLM schedules and steps by itself."""
    return backend.make_engine()


STEP_LOOP = step_loop


def _accelerator() -> bool:
    """An NVIDIA GPU or an Inferentia/Trainium device, seen through /dev and /proc (no torch import)."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/neuron[0-9]*")
                or os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"))
