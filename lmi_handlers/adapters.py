"""LoRA adapters as DJLServing manages and calls them, for every backend.

* options: ``option.enable_lora``, ``option.max_loras`` (distinct adapters in one batch), ``option.max_lora_rank``,
  ``option.max_cpu_loras`` (adapters registered at once), parsed once into ``LoraOptions``;
* an adapter is a peft LoRA folder (``adapter_config.json`` and its weights); ``read_adapter`` reads and checks
  its configuration (``AdapterSpec``) before any weights load;
* ``Adapters``: the registered adapters of one model, by name. DJLServing registers each folder of ``adapters/``
  beside serving.properties at start, and those of the management API, through the handler functions
  ``register_adapter``/``update_adapter``/``unregister_adapter``; the backend loads the weights
  (``backend.load_adapter``). A request holds its adapter's object: unregistering one only stops new requests;
* which adapter a request names (``requested_adapters``): the body's ``adapters`` field (one name, or one per
  input; ``""`` is the base model), the ``adapter`` query parameter and SageMaker's adapter header, in DJL's order.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import AdapterNotFound, ConfigError, InvalidRequest, invalid_field
from .safetensors_header import read_header
from .values import parse_bool, parse_int

logger = logging.getLogger(__name__)

#: The header SageMaker sets from ``invoke_endpoint(InferenceComponentName=...)`` of an adapter component.
SAGEMAKER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
#: The folder beside serving.properties whose sub-folders are registered at start.
FOLDER = "adapters"
#: The options ``LoraOptions`` reads.
KEYS = frozenset({"enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"})
#: An adapter folder's files, as peft's ``save_pretrained`` writes them (safetensors, else torch.save's format).
CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
#: The first bytes of torch.save's files: a zip archive, or a pickle (before torch 1.6).
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")
_uids = itertools.count(1)


@dataclass(frozen=True)
class LoraOptions:
    enabled: bool = False
    #: Distinct adapters in one batch: a request for another one waits until one of them leaves the batch.
    max_loras: int = 4
    #: The largest rank an adapter may have.
    max_lora_rank: int = 16
    #: Adapters registered (held in memory) at once; None: no limit.
    max_cpu_loras: int | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "LoraOptions":
        options = cls(enabled=parse_bool(props, "enable_lora", False),
                      max_loras=parse_int(props, "max_loras", 4, maximum=256),
                      max_lora_rank=parse_int(props, "max_lora_rank", 16, maximum=4096),
                      max_cpu_loras=parse_int(props, "max_cpu_loras", None))
        if options.max_cpu_loras is not None and options.max_cpu_loras < options.max_loras:
            raise ConfigError("max_cpu_loras", options.max_cpu_loras,
                              f"must be at least option.max_loras ({options.max_loras})")
        return options


@dataclass(frozen=True)
class AdapterRule:
    """How a backend serves LoRA adapters (its package's ``ADAPTERS``; a backend without one serves none): what it
    refuses at load, and what ``lmi validate`` checks each adapter against."""

    #: The largest ``option.max_lora_rank`` it serves; None: any.
    max_rank: int | None = None
    #: Module names an adapter may not adapt.
    refused_modules: tuple[str, ...] = ()

    def check(self, options: LoraOptions, backend: str) -> None:
        """``ConfigError`` for LoRA options the backend cannot serve."""
        if options.enabled and self.max_rank is not None and options.max_lora_rank > self.max_rank:
            raise ConfigError("max_lora_rank", options.max_lora_rank, f"the {backend} backend serves ranks up to "
                              f"{self.max_rank}")


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter's configuration as its ``adapter_config.json`` states it."""

    name: str
    src: str
    rank: int
    alpha: float
    #: Module names (or suffixes) it adapts, as peft's ``target_modules``.
    targets: tuple[str, ...]
    base_model: str = ""
    use_rslora: bool = False
    #: ``target_modules`` when the config gives one string: peft matches it against whole module names (a regex).
    pattern: str | None = None

    @property
    def scaling(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.use_rslora else self.rank)


def read_adapter(name: str, src: str, options: LoraOptions) -> AdapterSpec:
    """``src``'s configuration and weights file, checked against what this runtime applies and ``options``; an
    ``InvalidRequest`` naming the adapter and the file otherwise."""
    if "\x00" in src:
        raise invalid_field("src", src, f"adapter {name}: a path may not hold a NUL byte")
    if not os.path.isdir(src):
        raise invalid_field("src", src, f"adapter {name}: not a local directory (a peft adapter folder)")
    refuse = lambda why: InvalidRequest(f"adapter {name} ({src}): {why}", field="src", value=src)  # noqa: E731
    config = _config(os.path.join(src, CONFIG), refuse)
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise refuse(f"peft_type {config.get('peft_type')} is not supported; only LORA adapters are")
    unsupported = [key for key in ("use_dora", "fan_in_fan_out", "modules_to_save", "rank_pattern", "alpha_pattern",
                                   "layers_to_transform") if config.get(key)]
    if config.get("bias", "none") != "none":
        unsupported.append(f"bias={config['bias']}")
    if unsupported:
        raise refuse(f"{', '.join(unsupported)} not supported; train it with plain LoRA on linear layers")
    targets, rank, alpha = config.get("target_modules"), config.get("r"), config.get("lora_alpha", config.get("r"))
    pattern = targets if isinstance(targets, str) else None
    targets = (targets,) if isinstance(targets, str) else targets
    if not (isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)) or \
            type(rank) is not int or rank < 1 or type(alpha) not in (int, float):
        raise refuse(f"{CONFIG} needs a rank r >= 1, a number lora_alpha and target_modules (names or a pattern) "
                     f"(r={rank!r}, lora_alpha={alpha!r}, target_modules={config.get('target_modules')!r})")
    if rank > options.max_lora_rank:
        raise refuse(f"rank {rank} exceeds option.max_lora_rank={options.max_lora_rank}; raise it or use a "
                     "smaller adapter")
    _check_weights(src, refuse)
    return AdapterSpec(name, src, rank, float(alpha), tuple(targets), str(config.get("base_model_name_or_path") or ""),
                       bool(config.get("use_rslora", False)), pattern)


def _config(path: str, refuse: Callable[[str], InvalidRequest]) -> Mapping[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except OSError as exc:
        raise refuse(f"no readable {CONFIG} ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise refuse(f"{CONFIG} is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(config, dict):
        raise refuse(f"{CONFIG} is a JSON {type(config).__name__}; expected an object (what peft writes)")
    return config


def _check_weights(src: str, refuse: Callable[[str], InvalidRequest]) -> None:
    """The weights file is there and is what it claims to be (a safetensors header that fits the file, or the
    start of torch.save's formats), before any library loads it."""
    path = os.path.join(src, WEIGHTS[0])
    if os.path.isfile(path):
        try:
            read_header(path)
        except (OSError, ValueError) as exc:
            raise refuse(f"{WEIGHTS[0]} is not a safetensors file: {exc}") from None
        return
    path = os.path.join(src, WEIGHTS[1])
    if not os.path.isfile(path):
        raise refuse(f"no {WEIGHTS[0]} or {WEIGHTS[1]} in its folder")
    with open(path, "rb") as file:
        if not file.read(4).startswith(TORCH_MAGIC):
            raise refuse(f"{WEIGHTS[1]} is not a file torch.save wrote (neither a zip archive nor a pickle)")


@dataclass(eq=False)
class Adapter:
    """A registered adapter: its spec, the backend's loaded weights, and the registration's options."""

    spec: AdapterSpec
    weights: Any
    options: dict[str, str] = field(default_factory=dict)
    #: Unique per registration: a re-registered name never shares prefix-cache blocks with its predecessor.
    uid: int = field(default_factory=lambda: next(_uids))

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "src": self.spec.src, "rank": self.spec.rank, "alpha": self.spec.alpha,
                "target_modules": list(self.spec.targets), "base_model": self.spec.base_model,
                "bytes": getattr(self.weights, "bytes", 0), **self.options}


class Adapters:
    """The adapters registered on one model, by name."""

    def __init__(self, options: LoraOptions, load: Callable[[AdapterSpec], Any] | None):
        self.options = options
        self._load = load
        self.by_name: dict[str, Adapter] = {}

    def register(self, name: str, src: str, options: Mapping[str, str] = {}) -> Adapter:
        if not self.options.enabled:
            raise InvalidRequest(f"adapter {name}: this model does not serve adapters; set option.enable_lora=true",
                                 field="name", value=name)
        if self._load is None:
            raise InvalidRequest(f"adapter {name}: this backend does not serve LoRA adapters", field="name", value=name)
        if not name or "/" in name:
            raise invalid_field("name", name, "expected a non-empty adapter name without '/'")
        if name in self.by_name:
            raise InvalidRequest(f"adapter {name} is already registered; delete it first", field="name", value=name)
        limit = self.options.max_cpu_loras
        if limit is not None and len(self.by_name) >= limit:
            raise InvalidRequest(f"adapter {name}: {len(self.by_name)} adapters are registered, "
                                 f"option.max_cpu_loras={limit}; delete one first", field="name", value=name)
        spec = read_adapter(name, src, self.options)
        adapter = Adapter(spec, self._load(spec), {k: str(v) for k, v in options.items()})
        self.by_name[name] = adapter
        logger.info("adapter %s registered from %s (rank %d, %s)", name, src, spec.rank, ", ".join(spec.targets))
        return adapter

    def update(self, name: str, options: Mapping[str, str]) -> Adapter:
        adapter = self.get(name)
        adapter.options.update({k: str(v) for k, v in options.items()})
        return adapter

    def unregister(self, name: str) -> Adapter:
        """Forget ``name``: new requests get a 404; requests already holding it finish with it."""
        adapter = self.get(name)
        del self.by_name[name]
        logger.info("adapter %s unregistered", name)
        return adapter

    def for_inputs(self, names: Any, count: int) -> list[Adapter | None]:
        """Each input's adapter (None: the base model) from what a request names (``requested_adapters``)."""
        return [self.get(name) if name else None for name in adapter_names(names, count)]

    def get(self, name: str) -> Adapter:
        adapter = self.by_name.get(name)
        if adapter is None:
            known = ", ".join(sorted(self.by_name)) or ("none" if self.options.enabled else
                                                        "none (option.enable_lora is off)")
            raise AdapterNotFound(f"adapter {name!r} is not registered on this model; registered adapters: {known}",
                                  field="adapters", value=name)
        return adapter


def requested_adapters(item: Any, data: Any) -> tuple[Any, Any]:
    """The body without its ``adapters`` field (a copy; the caller's is untouched), and what the request names:
    DJL's order is the body's field, then the ``adapter`` query parameter (Input content), then SageMaker's
    header (a property), each replacing the one before; None when it names none."""
    names: Any = None
    if isinstance(data, Mapping) and "adapters" in data:
        data = dict(data)
        names = data.pop("adapters")
    if item.contains_key("adapter"):
        names = item.get_as_string("adapter")
    header = next((v for k, v in item.get_properties().items() if k.lower() == SAGEMAKER_HEADER.lower()), None)
    return data, header if header is not None else names


def adapter_names(names: Any, count: int) -> list[str]:
    """The adapter of each of a request's ``count`` inputs (``""``: the base model): one name serves them all, a
    list names one per input."""
    if names is None:
        return [""] * count
    if isinstance(names, str):
        return [names] * count
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid_field("adapters", names, 'expected an adapter name, or a list of names ("" for the base model)')
    if len(names) != count:
        raise invalid_field("adapters", names, f"expected one adapter name per input: {count} inputs, "
                                               f"{len(names)} names")
    return names

