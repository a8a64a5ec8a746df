"""What the backend itself makes of a model directory for an instance: its options and its load plan.

The tooling never re-states the runtime's rules. After ``HandlerConfig`` (``modeldir/handler_config.py``) it calls
the backend's ``Options.from_properties``, ``check_files`` and ``plan`` from the registry
(``lmi_handlers/backends/registry.py``) with what the container would give them, and reports their
``ConfigError`` and warnings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmi_handlers.backends.base import DeviceMemory
from lmi_handlers.backends.registry import BACKENDS, Entry
from lmi_handlers.config import HandlerConfig
from lmi_handlers.default_dtype import cpu_flags

from ..instances import GIB, Instance
from .findings import Target
from .sizing import gpu_head_layout, weight_bytes

#: Device bytes no plan runs out of.
UNBOUNDED = 1 << 62


def instance_memory(config: HandlerConfig, instance: Instance) -> DeviceMemory:
    """The device a worker on ``instance`` runs on, as the handler resolves ``option.device``: one of the GPUs
    where it has them, else the host CPU, which is this machine's (its flags: what ``dtype=auto`` follows there);
    NeuronCores' memory is the neuronx compiler's, not a plan's."""
    device = config.device if config.device != "auto" else ("cuda" if instance.kind == "gpu" else "cpu")
    if device == "cuda":
        return DeviceMemory("cuda", instance.memory_per_core_gib * GIB)
    return DeviceMemory("cpu", cpu_flags=cpu_flags())


def plan_at(target: Target, tp: int) -> Any:
    """The load plan the backend makes for this model (its ``config.json``) over ``tp`` devices (what
    ``tensor_parallel_degree=max`` becomes in a worker that has them); raises ``ConfigError``.

    On a GPU the runtime measures what the weights hold after loading; here they are sized in the dtype the plan
    loads them in, spread over the ``tp`` GPUs. A first plan on a device too large to bound anything says which
    dtype (its refusals are those that do not depend on memory)."""
    assert target.config is not None and target.model_config is not None and target.arch is not None
    entry, arch = BACKENDS[target.backend], target.arch
    config = replace(target.config, tensor_parallel_degree=tp)
    options, memory = entry.options(config.properties), instance_memory(config, target.instance)
    if memory.total is None:
        return entry.plan(config, options, target.model_config, memory)
    plan = entry.plan(config, options, target.model_config, replace(memory, total=UNBOUNDED))
    weights = weight_bytes(arch, gpu_head_layout(arch, tp), plan.dtype, plan.int8) // tp
    return entry.plan(config, options, target.model_config, replace(memory, used=weights))


def check_files(entry: Entry, config: HandlerConfig) -> None:
    """The backend's options as it parses them at load, and what it checks in the model's files before loading
    (its package's ``check_files``, where it has one); raises ``ConfigError``."""
    options = entry.options(config.properties)
    if entry.check_files is not None:
        entry.check_files(config, options)
