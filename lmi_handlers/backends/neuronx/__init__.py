"""The ``neuronx`` backend: transformers-neuronx on Inferentia2 (``backend.py``), its options and compile plan
(``options.py``), compiled-artifact cache (``artifacts.py``) and continuous-batching runners (``runners.py``).
This module is what the registry (``backends/registry.py``) reads; it imports only the standard library."""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from ...config import HandlerConfig
from ..base import Backend, DeviceMemory, check_model_files
from .options import KEYS, CompileSettings, plan_compile
from .options import NeuronxOptions as Options

__all__ = ["HEAD_LAYOUT", "INSTANCE_FAMILIES", "KEYS", "LENGTH_KEY", "Options", "available", "load", "plan"]

#: Inferentia2 and Trainium: the backend compiles for their NeuronCores.
INSTANCE_FAMILIES = ("inf2", "trn1", "trn1n", "trn2")
#: transformers-neuronx pads the heads to a multiple of the TP degree (and replicates KV heads where they do not
#: shard).
HEAD_LAYOUT = {"neuron": "padded"}
#: The option that bounds prompt + output tokens (what transformers-neuronx compiles for).
LENGTH_KEY = "n_positions"


def available() -> str | None:
    if importlib.util.find_spec("transformers_neuronx") is None:
        return ("the neuronx backend needs transformers-neuronx, which the LMI neuronx image has on inf2/trn1 hosts "
                "and this machine has not")
    return None


def plan(config: HandlerConfig, options: Options, model_config: Mapping[str, Any],
         device_memory: DeviceMemory) -> CompileSettings:
    """The compile plan (``options.plan_compile``); ``tensor_parallel_degree=max`` is the NeuronCores the
    environment gives this worker. The graphs are what the options say whatever the memory, so it is not read."""
    return plan_compile(config, options, model_config)


def load(deployment: Any) -> Backend:
    check_model_files(deployment.config.model_id)
    from .backend import NeuronxBackend

    return NeuronxBackend(deployment.config, deployment.options)
