"""The one init path: ``resolve(properties, target)`` turns the init call's raw properties into typed settings, once,
as a ``Deployment``. The handler's load resolves for this machine (``HERE``), ``lmi validate`` for an instance type,
and the tests for both; nothing else parses the properties.

Resolving takes three steps, each a function of the one before, each raising ``ConfigError`` (naming the option,
the value and what is allowed) for what loading would refuse:

- ``read_settings(properties) -> Settings``: the handler's own settings (``HandlerConfig``), its tool-call, LoRA
  and grammar-budget options, its scheduling policy and KV events (``scheduler.py``, ``kv_events.py``), the backend
  they ask for (``option.backend``, or the ``option.rolling_batch`` value a backend owns), which of DJL's Python
  engines calls the handler (``mode.serving_mode``, given the LMI image where ``lmi validate`` names one) and whether
  the model embeds (``option.task``);
- ``choose(settings, target) -> Choice``: the backend's registry entry and why (``auto`` is the first backend
  available here, or the one the instance's LMI image runs; a backend named here must be able to load);
- ``Choice.deploy(model) -> Deployment``: the backend's options, its adapter rule, and for an instance its checks of
  the model's files and its load plan; the warnings (options nobody reads, the plan's).

The handler runs ``resolve``; ``lmi validate`` runs the steps one at a time, to say which one refused and to go on
sizing what it can. On this machine the plan waits for the weights: the backend makes it at load, with the same
function (its package's ``plan``), from the memory the weights left.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence

from .adapters import LoraOptions
from .backends.base import Backend, DeviceMemory
from .backends.registry import BACKENDS, NAMES, Entry, for_instance
from .backends.registry import choose as choose_here
from .config import ROLLING_BATCH_MODES, HandlerConfig, check_unknown_keys
from .default_dtype import cpu_flags
from .errors import ConfigError
from .kv_events import KVEventsOptions
from .mode import Image, Mode, serving_mode
from .pooling import pooling_task
from .scheduler import priority_scheduling
from .structured.admission import GrammarBudget
from .structured.tools import ToolOptions

#: Device bytes no plan runs out of: a first plan on it says which dtype the weights load in.
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class Host:
    """Where a deployment runs: this machine (``HERE``), or an EC2 instance type as ``lmi validate`` states it."""

    #: The instance family (``g5``, ``inf2``...); None for this machine.
    family: str | None = None
    #: ``gpu``, ``neuron`` or ``cpu``: what the instance accelerates with.
    kind: str = "cpu"
    #: Bytes of one GPU (None: no GPU).
    gpu_bytes: int | None = None
    #: GPUs or NeuronCores: what ``option.tensor_parallel_degree=max`` becomes.
    accelerators: int = 1
    #: The LMI image that serves the model there, whose Java decides DJL's mode (``read_settings``); None here, where
    #: the properties already hold what Java decided.
    image: Image | None = None

    @property
    def here(self) -> bool:
        return self.family is None

    def device(self, config: HandlerConfig) -> DeviceMemory:
        """The device one worker runs on, ``option.device`` resolved as the handler resolves it: one of the GPUs where
        the host has them, else its CPU (a NeuronCore's memory is the Neuron compiler's, not a plan's). A CPU's flags
        (what ``dtype=auto`` follows there) are this machine's: ``lmi validate`` says what a CPU loads where it runs."""
        device = config.device if config.device != "auto" else ("cuda" if self.kind == "gpu" else "cpu")
        return DeviceMemory("cuda", self.gpu_bytes) if device == "cuda" else DeviceMemory("cpu", cpu_flags=cpu_flags())


HERE = Host()


@dataclass(frozen=True)
class Model:
    """What a plan for an instance reads of the model: its ``config.json`` (a mapping), and the bytes its weights take
    in a dtype, ``weights(dtype, int8)``, which ``lmi validate`` sizes (the runtime measures them after loading)."""

    config: Mapping[str, Any]
    weights: Callable[[str, bool], int]


@dataclass(frozen=True)
class Settings:
    """The handler's own settings, and the backend they ask for."""

    config: HandlerConfig
    #: ``option.backend`` as the registry reads it: a backend's name, or ``auto``.
    requested: str
    #: The option that asked for it.
    asked_by: str
    tools: ToolOptions
    lora: LoraOptions
    #: Which of DJL's Python engines calls the handler, and why (``mode.serving_mode``). ``config`` holds the
    #: properties as Java passes them on (its recommender's writes included), so ``config.async_mode`` is what the
    #: handler is told; the two differ only on an image without the async engine, which ignores the option.
    mode: Mode
    #: ``option.task`` asks for embeddings (``pooling/``): the backend loads a pooler, not a generator.
    embedding: bool
    #: What one request's grammar may cost (``structured/admission.py``).
    grammar: GrammarBudget
    #: ``option.scheduling_policy=priority``: requests may set ``priority`` (``scheduler.py``).
    by_priority: bool
    #: ``option.kv_events_config`` where it turns vLLM's KV events on, else None (``kv_events.py``).
    kv_events: KVEventsOptions | None


@dataclass(frozen=True)
class Choice(Settings):
    """The settings, and the backend they resolve to on ``target``."""

    target: Host
    backend: Entry
    #: Why this backend (the option that named it, or what ``auto`` found).
    why: str

    def unknown_keys(self) -> list[str]:
        """One warning per option neither the handler nor this backend reads."""
        return check_unknown_keys(self.config.properties, self.backend.keys)

    def deploy(self, model: Model | None = None) -> "Deployment":
        """The backend's options, parsed once, and what it refuses before loading; for an instance with ``model``,
        its checks of the model's files and its load plan."""
        options = self.backend.options(self.config.properties)
        if self.lora.enabled and self.backend.adapters is not None:
            self.backend.adapters.check(self.lora, self.backend.name)
        plan = None
        if not self.target.here:  # here, the backend's load checks the files it loads, and plans after the weights
            if self.backend.check_files is not None:
                self.backend.check_files(self.config, options)
            if model is not None and self.backend.plan is not None:
                plan = self.plan_for(options, model)
        warnings = (*self.unknown_keys(), *(plan.warnings if plan is not None else ()))
        return Deployment(**_fields(self, Choice), options=options, plan=plan, warnings=warnings)

    def plan_for(self, options: Any, model: Model, tp: int | None = None) -> Any:
        """The backend's load plan on one of the instance's devices, over ``tp`` of them (default: the settings'
        degree; ``max`` is every one). On a GPU the weights are sized in the dtype a first plan loads them in, spread
        over the ``tp`` GPUs, as the runtime measures them after loading. Raises ``ConfigError``."""
        assert self.backend.plan is not None
        tp = tp or self.config.tensor_parallel_degree or self.target.accelerators
        config = replace(self.config, tensor_parallel_degree=tp)
        memory = self.target.device(config)
        if memory.total is None:
            return self.backend.plan(config, options, model.config, memory)
        first = self.backend.plan(config, options, model.config, replace(memory, total=UNBOUNDED))
        used = model.weights(first.dtype, first.int8) // tp
        return self.backend.plan(config, options, model.config, replace(memory, used=used))


@dataclass(frozen=True)
class Deployment(Choice):
    """Everything the init call's properties say, typed: the settings, the backend and why, its options, its plan (for
    an instance, where the backend has one) and the warnings. Requests read these; nothing parses them again."""

    options: Any
    plan: Any
    warnings: tuple[str, ...]

    def load(self) -> Backend:
        """The backend, loaded by these settings (heavy imports inside)."""
        return self.backend.load(self)


def resolve(properties: Mapping[str, Any], target: Host = HERE, model: Model | None = None) -> Deployment:
    """The deployment ``properties`` describe on ``target``; raises ``ConfigError``."""
    architectures = list(model.config.get("architectures") or []) if model is not None else None
    return choose(read_settings(properties, target.image, architectures), target).deploy(model)


def read_settings(properties: Mapping[str, Any], image: Image | None = None,
                  architectures: Sequence[str] | None = None) -> Settings:
    """The handler's own settings and the backend they ask for; raises ``ConfigError``. ``image`` (the LMI image
    that serves the model) and ``architectures`` (its ``config.json``'s, None where DJL finds none) decide DJL's mode
    as ``mode.serving_mode`` says; here (None) the properties already carry what Java decided."""
    mode = serving_mode(properties, image, architectures)
    config = HandlerConfig.from_properties({**properties, **mode.properties})
    requested, asked_by = _requested(config)
    return Settings(config, requested, asked_by, ToolOptions.from_properties(config.properties),
                    LoraOptions.from_properties(config.properties), mode, pooling_task(config.properties),
                    GrammarBudget.from_properties(config.properties), priority_scheduling(config.properties),
                    KVEventsOptions.from_properties(config.properties))


def choose(settings: Settings, target: Host = HERE) -> Choice:
    """The backend ``settings`` ask for on ``target``: here, ``auto`` is the first available and a named one must
    load here; on an instance, ``auto`` is the one that instance's LMI image runs, and a named one is what it is
    (``lmi validate`` says where it does not run). Raises ``ConfigError``."""
    if target.here:
        entry, found = choose_here(settings.requested)
    else:
        entry, found = for_instance(settings.requested, target.family), f"the one {target.family} instances run"
    why = settings.asked_by if settings.requested != "auto" else f"{settings.asked_by}: {found}"
    if settings.embedding and not entry.embeds:
        poolers = ", ".join(name for name, other in BACKENDS.items() if other.embeds)
        raise ConfigError("task", settings.config.properties["task"], f"the {entry.name} backend ({why}) generates "
                          f"text only; an embedding model loads on {poolers} (option.backend)")
    return Choice(**_fields(settings, Settings), target=target, backend=entry, why=why)


def _requested(config: HandlerConfig) -> tuple[str, str]:
    """(``option.backend`` checked against the registry, the option that asked for it): an ``option.rolling_batch``
    value a backend owns selects that backend, and contradicts any other."""
    if config.backend not in NAMES:
        raise ConfigError("backend", config.properties["backend"], f"allowed values are {', '.join(NAMES)}")
    engines = {name: entry.name for entry in BACKENDS.values() for name in entry.rolling_batch}
    if config.rolling_batch not in (*ROLLING_BATCH_MODES, *engines):
        raise ConfigError("rolling_batch", config.properties["rolling_batch"],
                          f"allowed values are {', '.join((*ROLLING_BATCH_MODES, *engines))}")
    owner = engines.get(config.rolling_batch)
    if owner is None or config.backend == owner:
        return config.backend, f"option.backend={config.backend}"
    if config.backend != "auto":
        raise ConfigError("backend", config.properties["backend"], f"option.rolling_batch={config.rolling_batch} "
                          f"runs the {owner} backend's engine: set option.backend={owner} (or auto), or "
                          "option.rolling_batch=auto for this backend")
    return owner, f"option.rolling_batch={config.rolling_batch}"


def _fields(value: Any, step: type) -> dict[str, Any]:
    """The fields ``value`` has as a ``step`` (Settings, Choice), by name and not copied: the next step's start."""
    return {f.name: getattr(value, f.name) for f in fields(step)}
