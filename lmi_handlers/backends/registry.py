"""The backends, one table: what each is called, its options, whether it can run here, its load plan, the
instances it runs on and how it loads. ``deployment.py`` is the one reader that turns properties into a backend and
its settings; the tools read the table for what it says about each backend.

Each backend is a package (or module) under ``backends/`` whose ``__init__`` exports, importing only the standard
library:

- ``Options``: a frozen dataclass with ``from_properties(props)``: its options, parsed once (``ConfigError`` naming
  ``option.<key>``, the value and what is allowed); ``KEYS``: the option keys it reads;
- ``available() -> str | None``: None when it can run on this machine, else why not (what ``auto`` asks);
- ``plan(config, options, model_config, device_memory)``, where it has one: a pure function of the handler
  settings, its options, the model's ``config.json`` (a mapping) and ``base.DeviceMemory``, which raises the
  ``ConfigError`` loading would raise and returns what it loads with; the plan object has ``dtype``, ``int8``,
  ``max_sequence_length``, ``batch_size``, ``kv_tokens``, ``static_kv`` (every sequence holds a full-length row) and
  ``warnings``. The backend's load runs the same function and ``lmi validate`` runs it for an instance;
- ``INSTANCE_FAMILIES``: the instance families it runs on (``cpu`` for the local machine, ``base.ANY_FAMILY`` for
  any);
- ``load(deployment) -> Backend`` (``deployment.Deployment``: the settings, the options parsed once; heavy imports
  inside);

and, where they differ from the defaults: ``ROLLING_BATCH`` (the ``option.rolling_batch`` values that select it:
vllm's ``vllm``), ``ADAPTERS`` (an ``adapters.AdapterRule``: it serves LoRA adapters, within that rule),
``HEAD_LAYOUT`` (how it spreads attention heads over a tensor-parallel degree, by instance kind: ``layers`` for
whole layers per device, ``heads`` for the heads split over the devices, ``padded`` for heads padded to a multiple
of the degree as the Neuron compilers do; ``lmi validate`` sizes memory by it), ``check_files(config, options)``
(what loading checks in the model's files before the weights, e.g. a draft tokenizer), ``LENGTH_KEY`` (the option
bounding prompt + output, ``max_model_len``), ``NEEDS_MODEL`` (False: no weights to size), ``STEP_LOOP`` (see
``Entry.step_loop``), ``loadable()`` (whether an explicit choice can load here, where that is less than what
``auto`` asks) and ``AUTO_FAMILIES`` (the families whose LMI image makes ``auto`` pick it, where fewer than
``INSTANCE_FAMILIES``), ``EMBEDS`` (True: it loads a pooler for ``option.task=text-embedding``).

A new backend is one package and one line in ``BACKENDS``. Tools ask this table; none compares backend names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

from ..adapters import AdapterRule
from ..errors import ConfigError
from . import hf, neuronx, scripted, vllm
from .base import ANY_FAMILY, Backend


@dataclass(frozen=True)
class Entry:
    """One backend of the table (read from its package by ``entry``)."""

    name: str
    options_type: Any
    keys: frozenset[str]
    available: Callable[[], "str | None"]
    instance_families: tuple[str, ...]
    #: ``load(deployment)``: the backend, loaded by the deployment's settings and options.
    load: Callable[[Any], Backend]
    #: The load plan; None for a backend without one (nothing to size or refuse beyond its options).
    plan: Callable[..., Any] | None = None
    #: What loading checks in the model's files before the weights load (``check_files(config, options)``), which
    #: ``lmi validate`` runs too; None: nothing beyond the options.
    check_files: Callable[[Any, Any], None] | None = None
    #: Whether ``option.backend=auto`` may pick it (in the table's order).
    auto: bool = True
    #: Whether it loads a model (``lmi validate`` sizes its weights and KV cache).
    needs_model: bool = True
    #: The option that bounds prompt + output tokens.
    length_key: str = "max_model_len"
    #: None: the package's engine (``engine.py`` + ``scheduler.py``) drives ``load``'s backend one step at a time.
    #: A backend that schedules by itself (vLLM) names its own step loop here (its package's ``STEP_LOOP``), and the
    #: handler's rolling path runs that loop instead of the engine.
    step_loop: Callable[..., Any] | None = None
    #: Whether an explicit ``option.backend=<name>`` can load here; None: ``available``.
    loadable: Callable[[], "str | None"] | None = None
    #: The instance families on which ``auto`` picks it; None: all of ``instance_families``.
    auto_families: tuple[str, ...] | None = None
    #: The ``option.rolling_batch`` values that select it.
    rolling_batch: tuple[str, ...] = ()
    #: How it serves LoRA adapters; None: it serves none.
    adapters: AdapterRule | None = None
    #: How it spreads attention heads over a tensor-parallel degree, by instance kind (gpu, neuron).
    head_layout: Mapping[str, str] = field(default_factory=dict)
    #: Whether it loads a pooler for an embedding model (``option.task=text-embedding``).
    embeds: bool = False

    def options(self, props: Mapping[str, Any]) -> Any:
        """Its typed options; raises ``ConfigError``."""
        return self.options_type.from_properties(props)

    def runs_on(self, family: str) -> bool:
        return ANY_FAMILY in self.instance_families or family in self.instance_families

    def not_on(self, instance: str) -> str:
        """Why it cannot serve on ``instance`` (whose family it does not run on)."""
        return f"backend {self.name} runs on {', '.join(self.instance_families)} instances; {instance} is not one"


def entry(package: ModuleType, *, auto: bool = True) -> Entry:
    """The table line of a backend package (see the module docstring for what it exports)."""
    return Entry(name=package.__name__.rsplit(".", 1)[-1], options_type=package.Options, keys=frozenset(package.KEYS),
                 available=package.available, instance_families=tuple(package.INSTANCE_FAMILIES), load=package.load,
                 plan=getattr(package, "plan", None), check_files=getattr(package, "check_files", None), auto=auto,
                 needs_model=getattr(package, "NEEDS_MODEL", True),
                 length_key=getattr(package, "LENGTH_KEY", "max_model_len"),
                 step_loop=getattr(package, "STEP_LOOP", None), loadable=getattr(package, "loadable", None),
                 auto_families=getattr(package, "AUTO_FAMILIES", None),
                 rolling_batch=tuple(getattr(package, "ROLLING_BATCH", ())),
                 adapters=getattr(package, "ADAPTERS", None), head_layout=dict(getattr(package, "HEAD_LAYOUT", {})),
                 embeds=getattr(package, "EMBEDS", False))


#: Every backend, in the order ``auto`` asks them.
BACKENDS: dict[str, Entry] = {e.name: e for e in (entry(vllm), entry(neuronx), entry(hf), entry(scripted, auto=False))}
#: What ``option.backend`` allows.
NAMES = ("auto", *BACKENDS)


def choose(name: str) -> tuple[Entry, str]:
    """The backend ``option.backend=name`` means on this machine, and why: ``auto`` is the first that is available; a
    named one must be able to load here (refused before any download from the hub)."""
    if name != "auto":
        chosen = BACKENDS[name]
        reason = (chosen.loadable or chosen.available)()
        if reason is not None:
            here = [e.name for e in BACKENDS.values() if e.auto and e.name != name and e.available() is None]
            hint = f"; to run this model directory here, set option.backend={' or '.join(here)} (or auto)" if here \
                else ""
            raise ConfigError("backend", name, reason + hint)
        return chosen, "it loads here"
    reasons = []
    for candidate in (e for e in BACKENDS.values() if e.auto):
        reason = candidate.available()
        if reason is None:
            return candidate, "the first available here" + (f" (not {'; not '.join(reasons)})" if reasons else "")
        reasons.append(f"{candidate.name}: {reason}")
    raise ConfigError("backend", name, f"no backend can run on this machine: {'; '.join(reasons)}")


def for_instance(name: str, family: str) -> Entry:
    """The backend ``option.backend=name`` means on an instance of ``family`` (``auto``: the first that runs there,
    as the LMI image of that instance makes it available)."""
    if name != "auto":
        return BACKENDS[name]
    for candidate in BACKENDS.values():
        if candidate.auto and candidate.runs_on(family) and family in (candidate.auto_families or (family,)):
            return candidate
    raise ConfigError("backend", name, f"no backend runs on {family} instances")


def hosts(family: str) -> list[str]:
    """The backends ``auto`` may pick that run on ``family``, for hints."""
    return [e.name for e in BACKENDS.values() if e.runs_on(family) and e.auto]

