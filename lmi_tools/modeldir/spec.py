"""The deployment spec: the one file a user edits; ``lmi render`` turns it into a model directory.

A spec is TOML (``*.toml``, read with ``tomllib``) or JSON (``*.json``) with the fields of
``DeploySpec``. Extra ``option.*`` keys go in an ``[options]`` table and extra model-server keys
(``job_queue_size``, ...) in ``[server]``; both are checked against the keys the runtime and
DJLServing know, so a typo fails here rather than as a warning in the container log.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lmi_handlers.backends.registry import BACKENDS, NAMES, for_instance
from lmi_handlers.config import HANDLER_KEYS, INT_OPTIONS, OUTPUT_FORMATTERS, SERVER_KEYS
from lmi_handlers.dtypes import NAMES as DTYPE_NAMES

from lmi_handlers.mode import Image, serving_mode

from ..errors import UsageError
from ..instances import INSTANCES, lookup
from .image import default_image, parse_image

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 uses the backport declared in pyproject.toml
    import tomli as tomllib

# DJLServing's model-level settings: written without the ``option.`` prefix.
SERVER_ONLY_KEYS = frozenset({
    "job_queue_size", "max_idle_time", "minWorkers", "maxWorkers", "gpu.minWorkers", "gpu.maxWorkers",
    "cpu.minWorkers", "cpu.maxWorkers", "nc.minWorkers", "nc.maxWorkers", "load_on_devices",
    "retry_threshold", "log_request_metric", "metrics_aggregation",
})
# Set by DJLServing's Python engine itself, never by a user.
ENGINE_SET_KEYS = frozenset({"model_dir", "device_id", "cluster_size", "requestId", "recommended_entry_point"})
# Fields of the spec that own an option: [options] must not set them a second time.
FIELD_OPTIONS = frozenset({
    "model_id", "backend", "tensor_parallel_degree", "n_positions", "max_model_len", "dtype", "rolling_batch",
    "max_rolling_batch_size", "max_rolling_batch_prefill_tokens", "batch_size", "model_loading_timeout",
    "predict_timeout", "output_formatter", "max_new_tokens", "quantize", "trust_remote_code", "revision",
    "entryPoint", "engine", "max_batch_delay", "async_mode",
})
OptionValue = Union[bool, int, float, str, list[int]]
UNSET: Any = object()


def handler_field(key: str, default: Any = UNSET) -> Any:
    """A spec field for the handler's integer ``option.<key>``: its default and range as the handler states them
    (``lmi_handlers.config.INT_OPTIONS``), or ``default`` where the spec leaves it unset."""
    option = INT_OPTIONS[key]
    return Field(option.default if default is UNSET else default, ge=option.minimum, le=option.maximum)


class DeploySpec(BaseModel):
    """What to serve, where and how; every field maps to one ``serving.properties`` line.

    Example (TOML)::

        model_id = "facebook/opt-13b"
        instance_type = "inf2.48xlarge"
        tensor_parallel_degree = 8
        n_positions = 256
        batch_size = 2
        dtype = "fp16"
    """

    model_config = ConfigDict(extra="forbid")

    #: One line shown in the rendered file's header.
    description: str = ""
    #: Hugging Face hub id, ``s3://`` prefix, or a local directory (relative paths are resolved against
    #: the model directory, as the runtime does). Omit it when the weights sit in the model directory.
    model_id: str | None = None
    #: EC2/SageMaker instance type (``ml.`` prefix allowed), see ``lmi_tools/instances.py``.
    instance_type: str
    #: A backend of ``lmi_handlers/backends/registry.py``; ``auto`` is the first that runs on the instance type.
    #: The rendered file names it.
    backend: str = "auto"
    tensor_parallel_degree: int = handler_field("tensor_parallel_degree")
    #: Longest prompt + output in tokens: the backend's length option (``option.max_model_len``, or
    #: ``option.n_positions`` on neuronx).
    n_positions: int | None = handler_field("max_model_len")
    #: Dynamic batching: requests per handler call (not with rolling batch).
    batch_size: int = handler_field("batch_size")
    #: Milliseconds DJLServing waits to fill a dynamic batch.
    max_batch_delay: int = Field(100, ge=0)
    #: Continuous batching (``option.rolling_batch=scheduler``) with up to ``max_rolling_batch_size`` sequences.
    rolling_batch: bool = False
    max_rolling_batch_size: int = handler_field("max_rolling_batch_size")
    max_rolling_batch_prefill_tokens: int | None = handler_field("max_rolling_batch_prefill_tokens")
    dtype: Literal[DTYPE_NAMES] = "auto"  # type: ignore[valid-type]
    #: int8 weights (neuronx only).
    quantize: Literal["static_int8"] | None = None
    #: Seconds for loading (and, on Neuron, compiling) the model, and for each request or rolling step.
    model_loading_timeout: int = Field(1800, ge=1)
    predict_timeout: int = Field(240, ge=1)
    #: Response format; unset means per request (stream flag and Accept header).
    output_formatter: str | None = None
    #: Unset: the handler's default.
    max_new_tokens: int | None = handler_field("max_new_tokens", default=None)
    trust_remote_code: bool = False
    revision: str | None = None
    #: Extra ``option.*`` keys (e.g. ``context_length_estimate = [256, 512]``).
    options: dict[str, OptionValue] = Field(default_factory=dict)
    #: Extra model-server keys (e.g. ``job_queue_size = 100``).
    server: dict[str, OptionValue] = Field(default_factory=dict)
    #: The LMI image the directory targets, ``<line>:<DJL version>`` (``djl-lmi:0.36.0``); unset: the instance's
    #: default (``lmi_tools/modeldir/image.py``). Written as ``# lmi: image=``.
    image: str | None = None
    #: DJL's async mode (``option.async_mode``): unset, what that image runs an LLM in by default.
    async_mode: bool | None = None
    #: Lines of the rendered requirements.txt (DJLServing pip-installs it when a worker starts).
    requirements: list[str] = Field(default_factory=list)

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, value: str) -> str:
        if value.removeprefix("ml.") not in INSTANCES:
            raise ValueError(f"unknown instance type; known: {', '.join(sorted(INSTANCES))}")
        return value

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        if value not in NAMES:
            raise ValueError(f"allowed values are {', '.join(NAMES)}")
        return value

    @field_validator("output_formatter")
    @classmethod
    def _formatter(cls, value: str | None) -> str | None:
        if value is not None and value not in OUTPUT_FORMATTERS:
            raise ValueError(f"allowed values are {', '.join(OUTPUT_FORMATTERS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "DeploySpec":
        if self.rolling_batch and self.batch_size > 1:
            raise ValueError("batch_size > 1 (dynamic batching) cannot be combined with rolling_batch = true")
        if self.async_mode and self.batch_size > 1:
            raise ValueError("batch_size > 1 (dynamic batching) cannot be combined with async_mode = true, where "
                             "DJLServing sends each request on its own and the handler's engine batches them")
        instance = lookup(self.instance_type)
        backend = BACKENDS[self.resolved_backend]
        if not backend.runs_on(instance.family):
            raise ValueError(backend.not_on(self.instance_type))
        general = HANDLER_KEYS | (SERVER_KEYS - SERVER_ONLY_KEYS - ENGINE_SET_KEYS)
        _check_keys(self.options, general.union(*(e.keys for e in BACKENDS.values())), "options")
        _check_keys(self.server, SERVER_ONLY_KEYS, "server")
        foreign = sorted(key for key in set(self.options) - general - backend.keys)
        if foreign:
            readers = sorted({e.name for e in BACKENDS.values() if e.keys & set(foreign)})
            raise ValueError(f"options {', '.join(foreign)} are read by the {' and '.join(readers)} backend only, "
                             f"and this spec uses {backend.name}")
        return self

    @property
    def resolved_backend(self) -> str:
        return for_instance(self.backend, lookup(self.instance_type).family).name

    @property
    def target_image(self) -> Image:
        family = lookup(self.instance_type).family
        return parse_image(self.image) if self.image else default_image(family, {"backend": self.resolved_backend})

    @property
    def resolved_async_mode(self) -> bool:
        """``async_mode``, else what the image runs an LLM with these batching settings in by default."""
        if self.async_mode is not None:
            return self.async_mode
        batching = {"batch_size": str(self.batch_size)}
        return serving_mode(batching, self.target_image, ["ForCausalLM"]).asynchronous

    @property
    def positions_key(self) -> str:
        return BACKENDS[self.resolved_backend].length_key


def _check_keys(table: dict[str, Any], known: frozenset[str], name: str) -> None:
    for key in table:
        if key in FIELD_OPTIONS:
            raise ValueError(f"{name}.{key}: set it with the spec field {key!r} instead")
        if key not in known:
            guess = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            raise ValueError(f"{name}.{key} is not a key lmi_handlers or DJLServing reads{hint}")


def load_spec(path: str | Path) -> DeploySpec:
    """Read and check a spec; every problem is a ``UsageError`` naming the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read spec {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise UsageError(f"{path} is not valid {kind}: {exc}",
                         hint="specs are TOML (*.toml) or JSON (*.json)") from None
    return parse_spec(data, str(path))


def parse_spec(data: Any, source: str = "spec") -> DeploySpec:
    try:
        return DeploySpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise UsageError(f"{source}: {problems}", hint="the spec fields are listed in docs/configuration.md") from None


def _describe(error: Any) -> str:
    field = ".".join(str(p) for p in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "is not a spec field"
    value = error.get("input")
    shown = f" (got {value!r})" if error["type"] != "extra_forbidden" and not isinstance(value, dict) else ""
    return f"{field}: {message}{shown}" if field else message
