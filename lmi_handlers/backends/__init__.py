"""Backends: one package per backend (``hf/``, ``neuronx/``, ``vllm/`` and ``scripted``), named in one table
(``registry.py``); ``base.py`` is the contract they implement.

Each package imports its heavy dependencies lazily, so choosing one costs nothing until it loads.
"""

from .registry import BACKENDS

__all__ = ["BACKENDS"]
