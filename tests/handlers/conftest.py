"""Fixtures of the neuronx tests (the transformers-neuronx stand-in, tiny models of each architecture)."""

from .neuronx_support import neuronx_standin, reference, tiny_arch  # noqa: F401 - registered as fixtures here
