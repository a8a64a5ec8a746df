"""Backends: ``hf`` (transformers), ``neuronx`` (transformers-neuronx on inf2) and ``scripted``.

Each module imports its heavy dependencies lazily, so choosing one costs nothing until it loads.
"""

from __future__ import annotations

import importlib.util

from ..config import HandlerConfig
from .base import Backend


def choose_backend(config: HandlerConfig) -> str:
    if config.backend != "auto":
        return config.backend
    # Inside the LMI neuronx image transformers_neuronx is installed; everywhere else it is not.
    return "neuronx" if importlib.util.find_spec("transformers_neuronx") else "hf"


def load_backend(config: HandlerConfig) -> Backend:
    name = choose_backend(config)
    if name == "scripted":
        from .scripted import ScriptedBackend

        return ScriptedBackend(config)
    if name == "neuronx":
        from .neuronx import NeuronxBackend

        return NeuronxBackend(config)
    from .hf import HFBackend

    return HFBackend(config)
