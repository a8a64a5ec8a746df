"""The vllm backend's options: LMI's names in serving.properties mapped onto vLLM's engine arguments.

LMI's vLLM handler reads a few options under its own names (``tensor_parallel_degree``, ``max_rolling_batch_size``,
``max_rolling_batch_prefill_tokens``, ``quantize``, ``speculative_draft_model``...) and passes every other vLLM
engine argument through as ``option.<engine argument>`` (its user guide's "pass through" options). ``Options``
does the same: the LMI names are parsed and checked here, with the standard library only; pass-through values (the
options that name one of ``engine_args.ENGINE_ARGS``) stay strings until ``typed_passthrough`` types them against
vLLM's ``EngineArgs`` at load time. On Neuron, vLLM's Neuron plugin reads ``n_positions`` as the model length and
its overrides from ``override_neuron_config``.

Defaults are LMI's where LMI sends one: ``max_num_seqs`` is the rolling batch size, 32 unless
``option.max_rolling_batch_size`` says otherwise (LMI's vLLM handler sends it; vLLM's own default is larger), so
the handler, the plan and ``lmi validate`` agree on it.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping

from ... import dtypes
from ...config import INT_OPTIONS, parse_bool, parse_float, parse_int
from ...errors import ConfigError
from .engine_args import ENGINE_ARGS

#: LMI's speculative options -> keys of vLLM's ``speculative_config``.
SPECULATIVE = {"speculative_length": "num_speculative_tokens", "draft_model_tp_size": "draft_tensor_parallel_size",
               "ngram_prompt_lookup_max": "prompt_lookup_max", "ngram_prompt_lookup_min": "prompt_lookup_min"}
#: Option keys with an LMI name (or an alias LMI documents), each mapped to the engine argument it sets.
LMI_NAMES = {
    "dtype": "dtype", "max_model_len": "max_model_len", "n_positions": "max_model_len",
    "trust_remote_code": "trust_remote_code", "revision": "revision",
    "tensor_parallel_degree": "tensor_parallel_size", "pipeline_parallel_degree": "pipeline_parallel_size",
    "max_rolling_batch_size": "max_num_seqs", "max_num_seqs": "max_num_seqs",
    "max_rolling_batch_prefill_tokens": "max_num_batched_tokens", "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_chunked_prefill": "enable_chunked_prefill", "enable_prefix_caching": "enable_prefix_caching",
    "gpu_memory_utilization": "gpu_memory_utilization", "quantize": "quantization", "quantization": "quantization",
    "cpu_offload_gb_per_gpu": "cpu_offload_gb", "enforce_eager": "enforce_eager",
    "speculative_config": "speculative_config", "speculative_draft_model": "speculative_config", **{key: "speculative_config" for key in SPECULATIVE},
    "override_neuron_config": "additional_config",
}
#: The keys this backend reads: by name, and every other vLLM engine argument (``passthrough``).
KEYS = frozenset(LMI_NAMES) | ENGINE_ARGS
#: What LMI sends as ``max_num_seqs`` when ``option.max_rolling_batch_size`` is unset.
MAX_NUM_SEQS = INT_OPTIONS["max_rolling_batch_size"].default
#: Keys that belong to the handler or to DJLServing, never passed to vLLM even where an engine argument has the name.
NOT_PASSED = frozenset({"model_id", "model_dir", "backend", "device", "rolling_batch", "batch_size", "max_new_tokens",
                        "output_formatter", "tgi_compat", "max_prompt_chars", "max_prompts_per_request", "entryPoint",
                        "engine", "seed", "tokenizer",
                        # the handler's embedding task (lmi_handlers/pooling/): the pooler names vLLM's runner
                        "task", "normalize"})


@dataclass(frozen=True)
class Options:
    """What the vllm backend asks of vLLM's engine; None leaves vLLM's own default."""

    dtype: str = "auto"
    max_model_len: int | None = None
    trust_remote_code: bool = False
    revision: str | None = None
    #: None stands for ``max``: every GPU (or NeuronCore) of the host, counted at load.
    tensor_parallel_size: int | None = 1
    pipeline_parallel_size: int = 1
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None
    quantization: str | None = None
    cpu_offload_gb: float | None = None
    enforce_eager: bool | None = None
    speculative_config: Mapping[str, Any] | None = None
    #: The Neuron plugin's overrides (``option.override_neuron_config``, a JSON object).
    override_neuron_config: Mapping[str, Any] | None = None
    #: Every other engine argument as written: (key, text), typed at load by ``typed_passthrough``.
    passthrough: tuple[tuple[str, str], ...] = ()
    #: The option key each engine argument came from, for error messages.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "Options":
        tp = props.get("tensor_parallel_degree")
        values: dict[str, Any] = dict(
            dtype=dtypes.option(props),
            max_model_len=parse_int(props, "max_model_len", None) or parse_int(props, "n_positions", None),
            trust_remote_code=parse_bool(props, "trust_remote_code", False),
            revision=_text(props.get("revision")) or None,
            tensor_parallel_size=None if _text(tp) == "max" else parse_int(props, "tensor_parallel_degree", 1),
            pipeline_parallel_size=parse_int(props, "pipeline_parallel_degree", 1),
            max_num_seqs=parse_int(props, "max_rolling_batch_size", None, maximum=4096)
            or parse_int(props, "max_num_seqs", MAX_NUM_SEQS, maximum=4096),
            max_num_batched_tokens=parse_int(props, "max_rolling_batch_prefill_tokens", None)
            or parse_int(props, "max_num_batched_tokens", None),
            enable_chunked_prefill=_optional_bool(props, "enable_chunked_prefill"),
            enable_prefix_caching=_optional_bool(props, "enable_prefix_caching"),
            gpu_memory_utilization=parse_float(props, "gpu_memory_utilization", 0, 0, 1) or None,
            quantization=(_text(props.get("quantize")) or _text(props.get("quantization"))).lower() or None,
            cpu_offload_gb=_number(props, "cpu_offload_gb_per_gpu"),
            enforce_eager=_optional_bool(props, "enforce_eager"),
            speculative_config=_speculative(props),
            override_neuron_config=_json_object(props, "override_neuron_config"),
        )
        sources = {LMI_NAMES[key]: key for key in LMI_NAMES if _text(props.get(key))}
        passthrough = tuple((key, _text(value)) for key, value in sorted(props.items())
                            if key in ENGINE_ARGS and key not in LMI_NAMES and key not in NOT_PASSED and _text(value))
        return cls(**values, passthrough=passthrough, sources=sources)

    def engine_args(self, model: str, accepted: Mapping[str, Any] = {}) -> dict[str, Any]:
        """Keyword arguments for vLLM's ``EngineArgs``: the set options, then the pass-through ones that name a
        field of ``accepted`` (EngineArgs' fields and their defaults), typed like those defaults."""
        args: dict[str, Any] = {"model": model, "tokenizer": model, "dtype": dtypes.LONG.get(self.dtype, self.dtype),
                                "trust_remote_code": self.trust_remote_code,
                                "tensor_parallel_size": self.tensor_parallel_size or 1,
                                "pipeline_parallel_size": self.pipeline_parallel_size,
                                "max_num_seqs": self.max_num_seqs}
        for name in ("max_model_len", "revision", "max_num_batched_tokens", "enable_chunked_prefill",
                     "enable_prefix_caching", "gpu_memory_utilization", "quantization", "cpu_offload_gb",
                     "enforce_eager"):
            if getattr(self, name) is not None:
                args[name] = getattr(self, name)
        if self.speculative_config:
            args["speculative_config"] = dict(self.speculative_config)
        if self.override_neuron_config:
            args["additional_config"] = {"override_neuron_config": dict(self.override_neuron_config)}
        args.update(typed_passthrough(self.passthrough, accepted))
        return args

    def source(self, engine_arg: str) -> str:
        """The option key that set ``engine_arg`` (its own name for a pass-through one)."""
        return self.sources.get(engine_arg, engine_arg)


def typed_passthrough(items: tuple[tuple[str, str], ...], accepted: Mapping[str, Any]) -> dict[str, Any]:
    """The pass-through options that name an engine argument, each typed like that argument's default (a JSON
    object or list for the structured ones); a value that does not parse is a ConfigError naming its key."""
    out = {}
    for key, text in items:
        if key not in accepted:
            continue
        default = accepted[key]
        if isinstance(default, bool):
            out[key] = parse_bool({key: text}, key, default)
        elif isinstance(default, int):
            out[key] = parse_int({key: text}, key, default, minimum=-(2**63))
        elif isinstance(default, float):
            out[key] = _number({key: text}, key)
        elif text[:1] in "[{":
            out[key] = _json({key: text}, key)
        else:
            out[key] = _json_scalar(text)
    return out


def engine_arg_defaults(engine_args_class: type) -> dict[str, Any]:
    """EngineArgs' field names with their defaults (None where a field has a factory default)."""
    return {f.name: None if f.default is MISSING else f.default for f in fields(engine_args_class)}


def neuron_config(options: Options) -> dict[str, Any]:
    """What vLLM's Neuron plugin (NxD Inference) is given: the engine arguments it reads, and the overrides it
    passes to NxD Inference's ``NeuronConfig`` (``additional_config.override_neuron_config``)."""
    args = options.engine_args("<model>")
    return {key: args[key] for key in ("tensor_parallel_size", "max_model_len", "max_num_seqs", "dtype",
                                       "additional_config") if key in args}


def _text(value: Any) -> str:
    return "" if value is None else (value.strip() if isinstance(value, str) else str(value))


def _optional_bool(props: Mapping[str, Any], key: str) -> bool | None:
    return parse_bool(props, key, False) if _text(props.get(key)) else None


def _number(props: Mapping[str, Any], key: str) -> float | None:
    if not _text(props.get(key)):
        return None
    try:
        return float(_text(props[key]))
    except ValueError:
        raise ConfigError(key, props[key], "expected a number") from None


def _json(props: Mapping[str, Any], key: str) -> Any:
    try:
        return json.loads(_text(props[key]))
    except ValueError as exc:
        raise ConfigError(key, props[key], f"expected JSON ({exc})") from None


def _json_object(props: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    if not _text(props.get(key)):
        return None
    value = _json(props, key)
    if not isinstance(value, dict):
        raise ConfigError(key, props[key], "expected a JSON object")
    return value


def _json_scalar(text: str) -> Any:
    """``none``/``null`` as None, a quoted JSON string as its text; anything else stays the text written."""
    if text.lower() in ("none", "null"):
        return None
    if text.startswith('"'):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _speculative(props: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` from LMI's speculative options (or ``option.speculative_config`` as JSON)."""
    explicit = _json_object(props, "speculative_config")
    draft = _text(props.get("speculative_draft_model"))
    rest = [key for key in SPECULATIVE if _text(props.get(key))]
    if explicit is not None and (draft or rest):
        raise ConfigError("speculative_config", props["speculative_config"],
                          "set either option.speculative_config or LMI's speculative options, not both")
    if explicit is not None:
        return explicit
    if not draft:
        if rest:
            raise ConfigError(rest[0], props[rest[0]], "it only applies with option.speculative_draft_model "
                              "(a draft model, or ngram for prompt lookup)")
        return None
    config: dict[str, Any] = {"method": "ngram"} if draft.lower() == "ngram" else {"model": draft}
    config["num_speculative_tokens"] = parse_int(props, "speculative_length", 5, maximum=64)
    for key in rest:
        if key != "speculative_length":
            config[SPECULATIVE[key]] = parse_int(props, key, None)
    return config
