"""The handler's own settings from the init call's properties (``serving.properties`` without ``option.``).

DJLServing sends every option once, on the empty init call, as strings. ``HandlerConfig.from_properties``
converts each key with an explicit rule; a bad value raises ``ConfigError`` naming the key, the value
and what is allowed. ``check_unknown_keys`` says which keys nobody reads (with a did-you-mean suggestion), so
that none is silently dropped. Parsing has no side effects: no environment writes, no device probing.

The names a backend owns (``option.backend``, and the ``option.rolling_batch`` values that select one) are the
registry's: ``deployment.py`` checks them, and this module never imports the registry.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from . import dtypes
from .adapters import KEYS as LORA_KEYS
from .errors import ConfigError
from .kv_events import KEYS as KV_EVENTS_KEYS
from .mode import java_true
from .schemas import RequestLimits
from .pooling.options import KEYS as POOLING_KEYS
from .scheduler import KEYS as SCHEDULER_KEYS
from .structured.admission import KEYS as GRAMMAR_KEYS
from .structured.reasoning import KEYS as REASONING_KEYS
from .structured.tools import KEYS as TOOL_KEYS
from .tracing import KEYS as TRACING_KEYS
from .values import as_text, parse_bool, parse_choice, parse_float, parse_int  # noqa: F401 - the parsers' old home

OUTPUT_FORMATTERS = ("json", "jsonlines", "sse", "json_chat", "jsonlines_chat", "sse_chat")
# The handler's own option.rolling_batch values: off, and on with the backend's engine. A backend's package may own
# more, each selecting that backend (vllm: "vllm"); deployment.py reads them from the registry.
ROLLING_BATCH_MODES = ("disable", "auto", "scheduler")
# Rolling-batch engines of the built-in LMI handlers that this handler does not drive.
LMI_ENGINES = ("lmi-dist", "tnx", "trtllm")
# DJLServing's Neuron image rewrites option.rolling_batch=auto to "tnx" before the handler sees it
# (LmiConfigRecommender, v0.29), so "tnx" can only mean "auto" here. The GPU image's rewrite to lmi-dist (with
# MPI mode) cannot be undone on this side and stays refused; its rewrite to vllm selects the vllm backend.
DJL_REWRITES = {"tnx": "auto"}


@dataclass(frozen=True)
class IntOption:
    """An integer option's default (None: unset) and range, for the handler and for ``lmi render``'s spec."""

    default: int | None
    minimum: int = 1
    maximum: int | None = None


# The handler's integer options: the one place their defaults and ranges are stated.
INT_OPTIONS = {
    "max_new_tokens": IntOption(30),
    "batch_size": IntOption(1, maximum=999),
    "max_rolling_batch_size": IntOption(32, maximum=999),
    "max_rolling_batch_prefill_tokens": IntOption(None),
    "tensor_parallel_degree": IntOption(1),
    "max_model_len": IntOption(None),
}

# Keys DJLServing itself (or its Python engine) puts into the init properties.
SERVER_KEYS = frozenset({
    "engine", "entryPoint", "handler", "model_dir", "device_id", "cluster_size", "job_queue_size",
    "max_batch_delay", "max_idle_time", "minWorkers", "maxWorkers", "gpu.minWorkers", "gpu.maxWorkers",
    "cpu.minWorkers", "cpu.maxWorkers", "nc.minWorkers", "nc.maxWorkers", "load_on_devices",
    "model_loading_timeout", "predict_timeout", "parallel_loading", "enable_venv", "pythonExecutable",
    "env", "batchifier", "retry_threshold", "log_request_metric", "metrics_aggregation", "mpi_mode",
    "async_mode", "pipeline_parallel_degree", "input_formatter", "model_name", "requestId",
    "recommended_entry_point", "max_dynamic_batch_size", "chunked_read_timeout", "metric_dimension",
})
# LMI options that other handlers use and this one does not: accepted with a notice.
UNUSED_LMI_KEYS = frozenset({
    "enable_streaming", "device_map", "load_in_4bit",
    "enforce_eager",
    "bedrock_compat", "chat_template", "waiting_steps",
})


def _int(props: Mapping[str, Any], key: str) -> Any:
    option = INT_OPTIONS[key]
    return parse_int(props, key, option.default, option.minimum, option.maximum)


@dataclass(frozen=True)
class HandlerConfig:
    """The handler's settings. Every field comes from one ``option.<name>`` key."""

    model_dir: str
    #: Local directory (or hub id) of the weights; defaults to the model directory itself.
    model_id: str
    #: ``option.backend`` as written (lower case): a backend of ``backends/registry.py`` or ``auto``, which
    #: ``deployment.py`` checks and resolves (``option.rolling_batch=vllm`` selects vllm).
    backend: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    #: Default ``max_new_tokens`` for requests that do not set it (LMI's default is 30).
    max_new_tokens: int = 30
    #: Empty means "choose per request" from its ``stream`` flag and Accept header.
    output_formatter: str = ""
    tgi_compat: bool = False
    batch_size: int = 1
    #: ``ROLLING_BATCH_MODES``, or a name a backend owns (``deployment.py`` checks it against the registry).
    rolling_batch: str = "disable"
    max_rolling_batch_size: int = 32
    #: Upper bound on prompt tokens prefilled in one rolling-batch step (None: no bound; 512 when chunking).
    max_rolling_batch_prefill_tokens: int | None = None
    #: Cut long prompts into chunks of that budget so running streams keep their pace (hf backend).
    enable_chunked_prefill: bool = False
    trust_remote_code: bool = False
    #: None stands for ``max`` (every visible device).
    tensor_parallel_degree: int | None = 1
    #: Upper bound on prompt + generated tokens (default: what the model supports).
    max_model_len: int | None = None
    #: Per-request bounds checked before tokenizing (``option.max_prompt_chars``, ``option.max_prompts_per_request``).
    limits: RequestLimits = RequestLimits()
    #: ``option.async_mode``: DJL's async engine awaits ``handle`` once per request and the handler's own step loop
    #: batches them (``async_service.py``); read as Java reads it (``mode.py``).
    async_mode: bool = False
    #: All init properties as received, for backend-specific options.
    properties: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def rolling(self) -> bool:
        return is_rolling(self.rolling_batch)

    @property
    def continuous(self) -> bool:
        """Sequences join a running batch: DJL's rolling batch, or async mode's requests in the handler's engine."""
        return self.rolling or self.async_mode

    def async_conflict(self) -> ConfigError | None:
        """Why DJL's async engine cannot serve these settings: with DJL's rolling batch or dynamic batching on, Java
        would send it batches (the handler's engine batches in async mode)."""
        if not (self.rolling or self.batch_size > 1):
            return None
        key, value = ("rolling_batch", self.rolling_batch) if self.rolling else ("batch_size", self.batch_size)
        return ConfigError(key, value, "DJL's async mode (option.async_mode=true) sends each request on its own and "
                           "the handler's engine batches them; DJL's rolling batch and dynamic batching would send it "
                           "batches: set option.rolling_batch=disable and batch_size=1 (option.backend names the "
                           "engine)")

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "HandlerConfig":
        props = {k: v for k, v in props.items() if not callable(v)}
        model_dir = as_text(props.get("model_dir", "")) or os.getcwd()
        rolling = props.get("rolling_batch")
        if rolling is not None and as_text(rolling).lower() in DJL_REWRITES:
            props["rolling_batch"] = DJL_REWRITES[as_text(rolling).lower()]
        elif rolling is not None and as_text(rolling).lower() in LMI_ENGINES:
            raise ConfigError("rolling_batch", rolling,
                              "that engine belongs to LMI's built-in handlers (LMI images rewrite "
                              "option.rolling_batch=auto into it); lmi_handlers runs its own continuous batching: "
                              "set option.rolling_batch=scheduler")
        tp = props.get("tensor_parallel_degree")
        config = cls(
            model_dir=model_dir,
            model_id=_resolve_model_id(as_text(props.get("model_id", "")), model_dir),
            backend=as_text(props.get("backend", "")).lower() or "auto",
            dtype=dtypes.option(props),
            device=parse_choice(props, "device", "auto", ("auto", "cpu", "cuda")),
            max_new_tokens=_int(props, "max_new_tokens"),
            output_formatter=parse_choice(props, "output_formatter", "", OUTPUT_FORMATTERS),
            tgi_compat=parse_bool(props, "tgi_compat", False),
            batch_size=_int(props, "batch_size"),
            rolling_batch=as_text(props.get("rolling_batch", "")).lower() or "disable",
            max_rolling_batch_size=_int(props, "max_rolling_batch_size"),
            max_rolling_batch_prefill_tokens=_int(props, "max_rolling_batch_prefill_tokens"),
            enable_chunked_prefill=parse_bool(props, "enable_chunked_prefill", False),
            trust_remote_code=parse_bool(props, "trust_remote_code", False),
            tensor_parallel_degree=None if tp is not None and as_text(tp) == "max"
            else _int(props, "tensor_parallel_degree"),
            max_model_len=_int(props, "max_model_len"),
            limits=RequestLimits(
                max_prompt_chars=parse_int(props, "max_prompt_chars", RequestLimits.max_prompt_chars),
                max_prompts_per_request=parse_int(props, "max_prompts_per_request",
                                                  RequestLimits.max_prompts_per_request)),
            async_mode=java_true(props.get("async_mode", "false")),
            properties=dict(props),
        )
        if config.rolling and config.batch_size > 1:
            raise ConfigError("batch_size", config.batch_size,
                              "dynamic batching (batch_size > 1) cannot be combined with rolling batch; "
                              "set option.rolling_batch=disable or batch_size=1")
        return config


def is_rolling(value: Any) -> bool:
    """Whether an ``option.rolling_batch`` value turns rolling batch on: anything but ``disable`` (unset is
    ``disable``). DJLServing's front end decides the same way, so ``lmi serve`` asks this too."""
    return as_text(value or "disable").lower() != "disable"


def _resolve_model_id(model_id: str, model_dir: str) -> str:
    if not model_id:
        return model_dir
    if model_id.startswith("s3://"):
        raise ConfigError("model_id", model_id,
                          "an s3:// model_id is downloaded by DJLServing before the handler starts; "
                          "give a local directory or a Hugging Face hub id")
    candidate = model_id if os.path.isabs(model_id) else os.path.join(model_dir, model_id)
    return candidate if os.path.isdir(candidate) else model_id


HANDLER_KEYS = frozenset({
    "model_id", "backend", "dtype", "device", "max_new_tokens", "output_formatter", "tgi_compat",
    "batch_size", "rolling_batch", "max_rolling_batch_size", "max_rolling_batch_prefill_tokens", "enable_chunked_prefill",
    "trust_remote_code", "tensor_parallel_degree", "max_model_len", "revision", "max_prompt_chars",
    "max_prompts_per_request",
}) | frozenset(TOOL_KEYS) | LORA_KEYS | frozenset(REASONING_KEYS) | frozenset(POOLING_KEYS) | frozenset(GRAMMAR_KEYS) \
    | frozenset(SCHEDULER_KEYS) | frozenset(KV_EVENTS_KEYS) | frozenset(TRACING_KEYS)


def _as_written(key: str) -> str:
    """How ``key`` is spelled in serving.properties: DJLServing's own keys (``batch_size``...) have no prefix."""
    return key if key in SERVER_KEYS or key == "batch_size" else f"option.{key}"


def check_unknown_keys(props: Mapping[str, Any], backend_keys: Iterable[str] = ()) -> list[str]:
    """One warning per key nobody reads, with a did-you-mean suggestion (``deployment.py`` logs them at load)."""
    known = HANDLER_KEYS | SERVER_KEYS | frozenset(backend_keys)
    warnings = []
    for key in sorted(props):
        if key in known or key.startswith("batch_"):
            continue
        if key in UNUSED_LMI_KEYS:
            message = f"option.{key} is an LMI option that lmi_handlers does not use; it is ignored"
        else:
            guess = difflib.get_close_matches(key, sorted(known | UNUSED_LMI_KEYS), n=1, cutoff=0.75)
            hint = f"; did you mean {_as_written(guess[0])}?" if guess else ""
            message = f"unknown option.{key} is ignored{hint}"
        warnings.append(message)
    return warnings
