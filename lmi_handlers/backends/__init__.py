"""Backends: ``hf`` (transformers), ``neuronx`` (transformers-neuronx on inf2), ``vllm`` and ``scripted``.

Each module imports its heavy dependencies lazily, so choosing one costs nothing until it loads.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from ..config import HandlerConfig
from ..errors import ConfigError
from . import vllm
from .base import Backend

logger = logging.getLogger(__name__)


def choose_backend(config: HandlerConfig) -> str:
    if config.backend != "auto":
        return config.backend
    unavailable = vllm.available()
    if unavailable is None:
        logger.info("backend auto: vllm (vLLM imports and a GPU or NeuronCore is present)")
        return "vllm"
    # Inside the LMI neuronx image transformers_neuronx is installed; everywhere else it is not.
    name = "neuronx" if importlib.util.find_spec("transformers_neuronx") else "hf"
    logger.info("backend auto: %s (not vllm: %s)", name, unavailable)
    return name


def load_backend(config: HandlerConfig) -> Backend:
    name = choose_backend(config)
    if name == "scripted":
        from .scripted import ScriptedBackend

        return ScriptedBackend(config)
    if not config.properties.get("gguf_file"):  # a GGUF file carries its own config and tokenizer
        _check_model_files(config.model_id)
    if name == "vllm":
        return vllm.load(config)
    if name == "neuronx":
        if importlib.util.find_spec("transformers_neuronx") is None:  # fail before any download from the hub
            raise ConfigError("backend", config.backend, "the neuronx backend needs transformers-neuronx, which the "
                              "LMI neuronx image has on inf2/trn1 hosts and this machine has not; to run this model "
                              "directory here, set option.backend=hf (or auto)")
        from .neuronx.backend import NeuronxBackend

        return NeuronxBackend(config)
    from .hf.backend import HFBackend

    return HFBackend(config)


def _check_model_files(model_id: str) -> None:
    """A local model without config.json would otherwise fail deep inside transformers with a misleading hint
    (about sentencepiece, for a missing tokenizer); name the real cause instead."""
    if os.path.isdir(model_id) and not os.path.isfile(os.path.join(model_id, "config.json")):
        raise ConfigError("model_id", model_id, "this directory has no config.json; it needs the model's "
                          "config.json, tokenizer and weights (set option.model_id to where they are; lmi validate "
                          "checks this before deploying)")
