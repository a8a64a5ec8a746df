"""Typed configuration from the init call's properties (``serving.properties`` without ``option.``).

DJLServing sends every option once, on the empty init call, as strings. ``HandlerConfig.from_properties``
converts each key with an explicit rule; a bad value raises ``ConfigError`` naming the key, the value
and what is allowed. Unknown keys are warned about (with a did-you-mean suggestion), never silently
dropped. Parsing has no side effects: no environment writes, no device probing.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .errors import ConfigError
from .schemas import RequestLimits

logger = logging.getLogger(__name__)

OUTPUT_FORMATTERS = ("json", "jsonlines", "sse", "json_chat", "jsonlines_chat", "sse_chat")
# "vllm" runs the steps in vLLM's engine (the vllm backend); the others in our engine.
ROLLING_BATCH_MODES = ("disable", "auto", "scheduler", "vllm")
# Rolling-batch engines of the built-in LMI handlers that this handler does not drive.
LMI_ENGINES = ("lmi-dist", "tnx", "trtllm")
# DJLServing's Neuron image rewrites option.rolling_batch=auto to "tnx" before the handler sees it
# (LmiConfigRecommender, v0.29), so "tnx" can only mean "auto" here. The GPU image's rewrite to lmi-dist (with
# MPI mode) cannot be undone on this side and stays refused; its rewrite to vllm selects the vllm backend.
DJL_REWRITES = {"tnx": "auto"}
DTYPES = {"auto": "auto", "fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16",
          "bf16": "bf16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class IntOption:
    """An integer option's default (None: unset) and range, for the handler and for ``lmi render``'s spec."""

    default: int | None
    minimum: int = 1
    maximum: int | None = None


#: ``option.dtype``'s values as the handler names them (the spec's choices).
DTYPE_NAMES = tuple(dict.fromkeys(DTYPES.values()))
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
    "enable_streaming", "task", "device_map", "load_in_4bit",
    "enforce_eager",
    "bedrock_compat", "chat_template", "waiting_steps",
})


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else str(value)


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no")


def parse_bool(props: Mapping[str, Any], key: str, default: bool) -> bool:
    if key not in props:
        return default
    text = _text(props[key]).lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(key, props[key], "expected true or false")


def parse_int(props: Mapping[str, Any], key: str, default: int | None, minimum: int = 1,
              maximum: int | None = None) -> int | None:
    if key not in props or _text(props[key]) == "":
        return default
    try:
        value = int(_text(props[key]))
    except ValueError:
        raise ConfigError(key, props[key], "expected an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(key, props[key], f"expected an integer >= {minimum}{upper}")
    return value


def _int(props: Mapping[str, Any], key: str) -> Any:
    option = INT_OPTIONS[key]
    return parse_int(props, key, option.default, option.minimum, option.maximum)


def parse_float(props: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    """A number in ``(low, high]``."""
    if key not in props or _text(props[key]) == "":
        return default
    try:
        value = float(_text(props[key]))
    except ValueError:
        raise ConfigError(key, props[key], f"expected a number in ({low:g}, {high:g}]") from None
    if not low < value <= high:
        raise ConfigError(key, props[key], f"expected a number in ({low:g}, {high:g}]")
    return value


def parse_choice(props: Mapping[str, Any], key: str, default: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if key not in props or _text(props[key]) == "":
        return default
    value = _text(props[key])
    if value.lower() not in allowed:
        raise ConfigError(key, props[key], f"allowed values are {', '.join(allowed)}")
    return value.lower()


@dataclass(frozen=True)
class HandlerConfig:
    """The handler's settings. Every field comes from one ``option.<name>`` key."""

    model_dir: str
    #: Local directory (or hub id) of the weights; defaults to the model directory itself.
    model_id: str
    #: A backend of ``backends/registry.py`` (vllm, neuronx, hf, scripted) or ``auto``: the first the registry finds
    #: available here. ``option.rolling_batch=vllm`` selects vllm.
    backend: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    #: Default ``max_new_tokens`` for requests that do not set it (LMI's default is 30).
    max_new_tokens: int = 30
    #: Empty means "choose per request" from its ``stream`` flag and Accept header.
    output_formatter: str = ""
    tgi_compat: bool = False
    batch_size: int = 1
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
    #: All init properties as received, for backend-specific options.
    properties: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def rolling(self) -> bool:
        return is_rolling(self.rolling_batch)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "HandlerConfig":
        props = {k: v for k, v in props.items() if not callable(v)}
        model_dir = _text(props.get("model_dir", "")) or os.getcwd()
        rolling = props.get("rolling_batch")
        if rolling is not None and _text(rolling).lower() in DJL_REWRITES:
            props["rolling_batch"] = DJL_REWRITES[_text(rolling).lower()]
        elif rolling is not None and _text(rolling).lower() in LMI_ENGINES:
            raise ConfigError("rolling_batch", rolling,
                              "that engine belongs to LMI's built-in handlers (LMI images rewrite "
                              "option.rolling_batch=auto into it); lmi_handlers runs its own continuous batching: "
                              "set option.rolling_batch=scheduler")
        tp = props.get("tensor_parallel_degree")
        config = cls(
            model_dir=model_dir,
            model_id=_resolve_model_id(_text(props.get("model_id", "")), model_dir),
            backend=requested_backend(props),
            dtype=DTYPES[parse_choice(props, "dtype", "auto", DTYPES)],
            device=parse_choice(props, "device", "auto", ("auto", "cpu", "cuda")),
            max_new_tokens=_int(props, "max_new_tokens"),
            output_formatter=parse_choice(props, "output_formatter", "", OUTPUT_FORMATTERS),
            tgi_compat=parse_bool(props, "tgi_compat", False),
            batch_size=_int(props, "batch_size"),
            rolling_batch=parse_choice(props, "rolling_batch", "disable", ROLLING_BATCH_MODES),
            max_rolling_batch_size=_int(props, "max_rolling_batch_size"),
            max_rolling_batch_prefill_tokens=_int(props, "max_rolling_batch_prefill_tokens"),
            enable_chunked_prefill=parse_bool(props, "enable_chunked_prefill", False),
            trust_remote_code=parse_bool(props, "trust_remote_code", False),
            tensor_parallel_degree=None if tp is not None and _text(tp) == "max"
            else _int(props, "tensor_parallel_degree"),
            max_model_len=_int(props, "max_model_len"),
            limits=RequestLimits(
                max_prompt_chars=parse_int(props, "max_prompt_chars", RequestLimits.max_prompt_chars),
                max_prompts_per_request=parse_int(props, "max_prompts_per_request",
                                                  RequestLimits.max_prompts_per_request)),
            properties=dict(props),
        )
        if config.rolling and config.batch_size > 1:
            raise ConfigError("batch_size", config.batch_size,
                              "dynamic batching (batch_size > 1) cannot be combined with rolling batch; "
                              "set option.rolling_batch=disable or batch_size=1")
        return config


def requested_backend(props: Mapping[str, Any]) -> str:
    """``option.backend``; ``option.rolling_batch=vllm`` selects vllm, and contradicts any other backend."""
    backend = parse_choice(props, "backend", "auto", backend_names())
    if _text(props.get("rolling_batch", "")).lower() != "vllm" or backend == "vllm":
        return backend
    if backend != "auto":
        raise ConfigError("backend", props["backend"], "option.rolling_batch=vllm runs vLLM's engine: set "
                          "option.backend=vllm (or auto), or option.rolling_batch=auto for this backend")
    return "vllm"


def backend_names() -> tuple[str, ...]:
    """What ``option.backend`` allows: ``auto`` and every backend of the registry."""
    from .backends.registry import NAMES  # the registry reads this module: imported when first asked

    return NAMES


def is_rolling(value: Any) -> bool:
    """Whether an ``option.rolling_batch`` value turns rolling batch on: anything but ``disable`` (unset is
    ``disable``). DJLServing's front end decides the same way, so ``lmi serve`` asks this too."""
    return _text(value or "disable").lower() != "disable"


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
    # tool calling (structured/tools.py)
    "enable_auto_tool_choice", "tool_call_parser",
}) | {"enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"} | {  # LoRA adapters (adapters.LoraOptions)
    "scheduling_policy", "kv_events_config", "otlp_traces_endpoint"}  # vLLM's names: scheduler, kv_events, tracing


def _as_written(key: str) -> str:
    """How ``key`` is spelled in serving.properties: DJLServing's own keys (``batch_size``...) have no prefix."""
    return key if key in SERVER_KEYS or key == "batch_size" else f"option.{key}"


def check_unknown_keys(props: Mapping[str, Any], backend_keys: Iterable[str] = ()) -> list[str]:
    """Log (and return) one warning per key nobody reads, with a did-you-mean suggestion."""
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
        logger.warning(message)
        warnings.append(message)
    return warnings
