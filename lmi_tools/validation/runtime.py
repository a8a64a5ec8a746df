"""What the runtime itself makes of a model directory for an instance: the runtime's own resolver
(``lmi_handlers/deployment.py``), given the instance as its target and the model's ``config.json`` and weights.

The tooling never re-states the runtime's rules: ``lmi validate`` runs the resolver's steps (the handler's settings,
the backend for the instance, the backend's options and load plan) and reports their ``ConfigError`` and warnings.
On a GPU the runtime measures what the weights hold after loading; here they are sized (``sizing.weight_bytes``).
"""

from __future__ import annotations

from typing import Any

from lmi_handlers.deployment import Host, Model, choose
from lmi_handlers.mode import Image

from ..instances import GIB, Instance
from .findings import Target
from .sizing import gpu_head_layout, weight_bytes


def host(instance: Instance, image: Image | None = None) -> Host:
    """The instance as the resolver's target: its family, one GPU's memory, its GPUs or NeuronCores, and the LMI
    image that serves the model there."""
    gpu = instance.memory_per_core_gib * GIB if instance.kind == "gpu" else None
    return Host(family=instance.family, kind=instance.kind, gpu_bytes=gpu, accelerators=instance.cores, image=image)


def model(target: Target) -> Model | None:
    """The model as a plan reads it: its ``config.json`` and its weights' bytes in a dtype (None: not read)."""
    arch = target.arch
    if target.model_config is None or arch is None:
        return None
    return Model(target.model_config, lambda dtype, int8: weight_bytes(arch, gpu_head_layout(arch, 1), dtype, int8))


def plan_at(target: Target, tp: int) -> Any:
    """The load plan the backend makes on ``target.instance`` for this model over ``tp`` devices; raises
    ``ConfigError``."""
    assert target.choice is not None and target.model_config is not None
    choice = choose(target.choice, host(target.instance, target.image))
    return choice.plan_for(choice.backend.options(choice.config.properties), model(target), tp)
