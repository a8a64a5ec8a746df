"""The neuronx backend's settings: DJL's transformers-neuronx option names, parsed and checked.

``NeuronxOptions.from_properties`` reads what the user wrote (``option.n_positions`` ...);
``plan_compile`` resolves it against the model's ``config.json`` and the handler settings into
``CompileSettings``: everything that shapes the compiled graphs, i.e. what must match for
compiled artifacts to be reused. Every check raises ``ConfigError`` naming the key, the value and
what is allowed, before anything is compiled. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ...config import HandlerConfig, parse_bool, parse_choice, parse_int
from ...errors import ConfigError
from ...dtypes import LONG
from ...model_config import DEFAULT_POSITIONS, max_positions, stored_dtype

#: HF ``model_type`` -> transformers-neuronx class (the library's own auto-class mapping).
MODEL_CLASSES = {
    "llama": "LlamaForSampling", "code_llama": "LlamaForSampling", "mistral": "MistralForSampling",
    "mixtral": "MixtralForSampling", "opt": "OPTForSampling", "gptj": "GPTJForSampling",
    "gpt2": "GPT2ForSamplingWithContextBroadcasting", "gpt_neox": "GPTNeoXForSampling",
    "bloom": "BloomForSampling",
}
CONTINUOUS_BATCHING_TYPES = ("llama", "code_llama", "mistral")
#: No prefill graphs, quantization, serialization or flexible TP; attention ignores start_ids.
SERIAL_TYPES = ("gptj", "gpt_neox")
#: transformers-neuronx refuses n_positions beyond the position embeddings for these.
BOUNDED_TYPES = ("opt", "gpt2", "gptj")
AMPS = ("f32", "f16", "bf16")
DTYPE_TO_AMP = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
AMP_TO_DTYPE = {amp: dtype for dtype, amp in DTYPE_TO_AMP.items()}
GQA_VALUES = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")
TORCH_DTYPES = tuple(LONG.values())
#: The options this backend reads (the names DJLServing's transformers-neuronx handler uses).
KEYS = frozenset({
    "n_positions", "context_length_estimate", "compiled_graph_path", "load_in_8bit", "quantize",
    "group_query_attention", "rolling_batch_strategy", "neuron_optimize_level",
    "enable_mixed_precision_accumulation", "enable_saturate_infinity", "fuse_qkv", "attention_layout",
    "collectives_layout", "cache_layout", "all_reduce_dtype", "cast_logits_dtype", "amp", "unroll",
    "low_cpu_mem_usage",
})
#: DJL's later default (its v0.29 default of 128 is too small for most prompts).
MAX_DEFAULT_POSITIONS = 4096


@dataclass(frozen=True)
class NeuronxOptions:
    """What ``serving.properties`` says about the neuronx backend (unresolved; None = not set)."""

    n_positions: int | None = None
    context_length_estimate: tuple[int, ...] | None = None
    amp: str | None = None
    compiled_graph_path: str | None = None
    quantize: bool = False
    group_query_attention: str | None = None
    rolling_batch_strategy: str | None = None
    neuron_optimize_level: int | None = None
    enable_mixed_precision_accumulation: bool = False
    enable_saturate_infinity: bool = False
    fuse_qkv: bool = False
    attention_layout: str | None = None
    collectives_layout: str | None = None
    cache_layout: str | None = None
    all_reduce_dtype: str | None = None
    cast_logits_dtype: str | None = None
    unroll: int | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "NeuronxOptions":
        quantize = parse_choice(props, "quantize", "", ("static_int8",)) == "static_int8"
        path = str(props.get("compiled_graph_path") or "").strip() or None
        if path and path.startswith(("http://", "https://")):
            raise ConfigError("compiled_graph_path", path, "expected a directory or an s3://bucket/prefix URI")
        return cls(
            n_positions=parse_int(props, "n_positions", None, minimum=2),
            context_length_estimate=_int_list(props, "context_length_estimate"),
            amp=parse_choice(props, "amp", "", AMPS) or None,
            compiled_graph_path=path,
            quantize=quantize or parse_bool(props, "load_in_8bit", False),
            group_query_attention=parse_choice(props, "group_query_attention", "", GQA_VALUES) or None,
            rolling_batch_strategy=parse_choice(props, "rolling_batch_strategy", "",
                                                ("continuous_batching", "naive_rolling_batch")) or None,
            neuron_optimize_level=parse_int(props, "neuron_optimize_level", None, minimum=1, maximum=3),
            enable_mixed_precision_accumulation=parse_bool(props, "enable_mixed_precision_accumulation", False),
            enable_saturate_infinity=parse_bool(props, "enable_saturate_infinity", False),
            fuse_qkv=parse_bool(props, "fuse_qkv", False),
            attention_layout=_upper_choice(props, "attention_layout", ("HSB", "BSH")),
            collectives_layout=_upper_choice(props, "collectives_layout", ("HSB", "BSH")),
            cache_layout=_upper_choice(props, "cache_layout", ("SBH", "BSH")),
            all_reduce_dtype=parse_choice(props, "all_reduce_dtype", "", TORCH_DTYPES) or None,
            cast_logits_dtype=parse_choice(props, "cast_logits_dtype", "", TORCH_DTYPES) or None,
            unroll=parse_int(props, "unroll", None),
        )


def _int_list(props: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    text = str(props.get(key) or "").strip()
    if not text:
        return None
    try:
        values = tuple(int(part) for part in text.strip("[]").split(",") if part.strip())
    except ValueError:
        raise ConfigError(key, props[key], "expected a comma-separated list of integers, e.g. 256,512,1024") from None
    if not values or min(values) < 1:
        raise ConfigError(key, props[key], "expected positive integers, e.g. 256,512,1024")
    return tuple(sorted(set(values)))


def _upper_choice(props: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value = str(props.get(key) or "").strip().upper()
    if value and value not in allowed:
        raise ConfigError(key, props[key], f"allowed values are {', '.join(allowed)}")
    return value or None


@dataclass(frozen=True)
class CompileSettings:
    """Everything that shapes the compiled graphs (compared before compiled artifacts are reused)."""

    model_type: str
    model_class: str
    batch_size: int
    tp_degree: int
    amp: str
    n_positions: int
    context_length_estimate: tuple[int, ...] | None
    continuous_batching: bool
    unroll: int | None
    neuron_config: dict[str, Any]
    compiler_flags: tuple[str, ...]
    #: The model's shape: layers, widths, heads, vocabulary (from config.json).
    model_shape: dict[str, Any]
    warnings: tuple[str, ...] = field(default=(), compare=False)

    # What every backend's plan says (``lmi validate`` reads these): dtype, int8 weights, sequence length and the
    # KV cache's tokens, here static: one full-length row per batch slot.
    @property
    def dtype(self) -> str:
        return AMP_TO_DTYPE[self.amp]

    @property
    def int8(self) -> bool:
        return "quant" in self.neuron_config

    @property
    def max_sequence_length(self) -> int:
        return self.n_positions

    @property
    def kv_tokens(self) -> int:
        return self.batch_size * self.n_positions

    #: Every batch slot holds a full-length KV row (no pool to share).
    static_kv = True

    def manifest(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("warnings")
        data["context_length_estimate"] = list(self.context_length_estimate or []) or None
        data["compiler_flags"] = list(self.compiler_flags)
        return data


SHAPE_KEYS = ("num_hidden_layers", "n_layer", "hidden_size", "n_embd", "num_attention_heads", "n_head",
              "num_key_value_heads", "intermediate_size", "ffn_dim", "n_inner", "vocab_size", "rotary_dim",
              "rotary_pct", "num_local_experts", "num_experts_per_tok", "max_position_embeddings", "n_positions")


def plan_compile(config: HandlerConfig, options: NeuronxOptions, model: Mapping[str, Any]) -> CompileSettings:
    """Resolve the options against the model (its ``config.json`` as a dict) and the handler settings."""
    model_type = str(model.get("model_type", ""))
    if model_type not in MODEL_CLASSES:
        raise ConfigError("model_id", config.model_id, f"its config.json says model_type={model_type!r}; the "
                          f"neuronx backend serves {', '.join(sorted(MODEL_CLASSES))}")
    batch = config.max_rolling_batch_size if config.continuous else config.batch_size
    tp = _tp_degree(config)
    amp = _amp(config, options, model)
    n_positions = _n_positions(options, model, model_type)
    continuous = _continuous(options, model_type, batch)
    warnings = list(_warnings(model, model_type, tp, amp, n_positions, batch))
    _check_serial(options, model, model_type, tp)
    if options.unroll is not None and _layers(model) % options.unroll:
        raise ConfigError("unroll", options.unroll, f"must divide the model's {_layers(model)} layers")
    if options.cache_layout == "BSH" and not continuous:
        raise ConfigError("cache_layout", "BSH", "BSH needs continuous batching (llama/mistral with "
                          "max_rolling_batch_size > 1); use SBH")
    return CompileSettings(
        model_type=model_type, model_class=MODEL_CLASSES[model_type], batch_size=batch, tp_degree=tp, amp=amp,
        n_positions=n_positions,
        context_length_estimate=_context_estimate(options, n_positions, continuous),
        continuous_batching=continuous, unroll=options.unroll, neuron_config=_neuron_config(options, amp), compiler_flags=_flags(options),
        model_shape={k: model[k] for k in SHAPE_KEYS if isinstance(model.get(k), (int, float))},
        warnings=tuple(warnings))


def _tp_degree(config: HandlerConfig) -> int:
    if config.tensor_parallel_degree is not None:
        return config.tensor_parallel_degree
    cores = visible_cores(os.environ)
    if cores is None:
        raise ConfigError("tensor_parallel_degree", "max", "cannot tell how many NeuronCores are visible "
                          "(NEURON_RT_VISIBLE_CORES is not set); give a number such as 2, 8 or 24")
    return cores


def visible_cores(env: Mapping[str, str]) -> int | None:
    """NeuronCores given to this process (DJL sets NEURON_RT_VISIBLE_CORES per worker, e.g. ``0-3``)."""
    if env.get("NEURON_RT_NUM_CORES", "").isdigit():
        return int(env["NEURON_RT_NUM_CORES"])
    spec = env.get("NEURON_RT_VISIBLE_CORES", "")
    try:
        ranges = [part.partition("-") for part in spec.split(",") if part.strip()]
        return sum(int(high or low) - int(low) + 1 for low, _, high in ranges) or None
    except ValueError:
        return None


def _amp(config: HandlerConfig, options: NeuronxOptions, model: Mapping[str, Any]) -> str:
    from_dtype = DTYPE_TO_AMP.get(config.dtype)
    if options.amp and from_dtype and options.amp != from_dtype:
        raise ConfigError("amp", options.amp, f"contradicts option.dtype={config.dtype} ({from_dtype}); set one of "
                          "them")
    if options.amp or from_dtype:
        return options.amp or from_dtype  # type: ignore[return-value]
    return "bf16" if stored_dtype(model) == "bf16" else "f16"  # DJL's default is fp16


def _n_positions(options: NeuronxOptions, model: Mapping[str, Any], model_type: str) -> int:
    limit = max_positions(model)
    if options.n_positions is None:
        return min(limit or DEFAULT_POSITIONS, MAX_DEFAULT_POSITIONS)
    if model_type in BOUNDED_TYPES and limit is not None and options.n_positions > limit:
        raise ConfigError("n_positions", options.n_positions, f"{model_type} has learned or checked positions up "
                          f"to {limit}; transformers-neuronx refuses more. Use at most {limit}")
    return options.n_positions


def _continuous(options: NeuronxOptions, model_type: str, batch: int) -> bool:
    if options.rolling_batch_strategy == "continuous_batching":
        if model_type not in CONTINUOUS_BATCHING_TYPES:
            raise ConfigError("rolling_batch_strategy", "continuous_batching", "transformers-neuronx supports "
                              f"continuous batching for llama and mistral only, not {model_type}; use "
                              "naive_rolling_batch")
        return True
    if options.rolling_batch_strategy == "naive_rolling_batch":
        return False
    return model_type in CONTINUOUS_BATCHING_TYPES and batch > 1


def _context_estimate(options: NeuronxOptions, n_positions: int, continuous: bool) -> tuple[int, ...] | None:
    estimate = options.context_length_estimate
    if estimate and max(estimate) > n_positions:
        raise ConfigError("context_length_estimate", ",".join(map(str, estimate)),
                          f"every prefill bucket must be <= n_positions ({n_positions})")
    if continuous:
        # A prompt must fit one prefill graph: the largest bucket has to cover n_positions.
        if estimate and max(estimate) != n_positions:
            raise ConfigError("context_length_estimate", ",".join(map(str, estimate)),
                              f"with continuous batching the largest bucket must equal n_positions ({n_positions}) "
                              f"so that any prompt fits, e.g. {','.join(map(str, estimate))},{n_positions}")
        return estimate or (n_positions,)
    return estimate


def _layers(model: Mapping[str, Any]) -> int:
    return int(model.get("num_hidden_layers") or model.get("n_layer") or 1)


def _heads(model: Mapping[str, Any]) -> int:
    return int(model.get("num_attention_heads") or model.get("n_head") or 1)


def _check_serial(options: NeuronxOptions, model: Mapping[str, Any], model_type: str, tp: int) -> None:
    if model_type not in SERIAL_TYPES:
        return
    name = {"gptj": "GPT-J", "gpt_neox": "GPT-NeoX"}[model_type]
    if options.context_length_estimate:
        raise ConfigError("context_length_estimate", options.context_length_estimate, f"{name} has no prefill "
                          "graphs in transformers-neuronx (prompts go through one token at a time); remove it")
    if options.quantize:
        raise ConfigError("quantize", "static_int8", f"transformers-neuronx cannot quantize {name}; remove "
                          "option.quantize / option.load_in_8bit")
    if options.compiled_graph_path:
        raise ConfigError("compiled_graph_path", options.compiled_graph_path, f"transformers-neuronx cannot save "
                          f"or load compiled {name} models; remove it and keep a Neuron compile cache instead "
                          "(NEURON_COMPILE_CACHE_URL, which `lmi docker-run` mounts)")
    if model_type == "gpt_neox" and options.unroll is not None:
        raise ConfigError("unroll", options.unroll, "GPT-NeoX does not support unroll in transformers-neuronx")
    if _heads(model) % tp:
        raise ConfigError("tensor_parallel_degree", tp, f"{name} has no flexible tensor parallelism: its "
                          f"{_heads(model)} attention heads must divide evenly over the NeuronCores")


def _warnings(model: Mapping[str, Any], model_type: str, tp: int, amp: str, n_positions: int, batch: int):
    limit = max_positions(model)
    if limit is not None and n_positions > limit and model_type not in BOUNDED_TYPES:
        yield f"n_positions={n_positions} exceeds the {limit} positions {model_type} was trained on"
    if model_type == "gpt_neox" and amp != "f32":
        yield "transformers-neuronx advises amp f32 (option.dtype=fp32) for GPT-NeoX: it is sensitive to fp16"
    if model_type in SERIAL_TYPES and batch > 1:
        yield (f"transformers-neuronx's {model_type} attention does not mask left padding: prompts of different "
               "lengths batched together attend to pad tokens; use a batch of 1 for outputs that do not depend on "
               "their neighbours")
    heads = _heads(model)
    if model_type not in SERIAL_TYPES and heads % tp:
        padded = -(-heads // tp) * tp
        yield (f"{heads} attention heads do not divide over tp_degree={tp}; transformers-neuronx pads them to "
               f"{padded} ({100 * (padded - heads) / heads:.0f}% more attention weights and compute)")


def _neuron_config(options: NeuronxOptions, amp: str) -> dict[str, Any]:
    """The ``NeuronConfig`` keywords besides continuous batching, as plain data."""
    settings: dict[str, Any] = {}
    if options.quantize:
        settings["quant"] = {"quant_dtype": "s8", "dequant_dtype": amp}
    for name in ("group_query_attention", "attention_layout", "collectives_layout", "cache_layout",
                 "all_reduce_dtype", "cast_logits_dtype"):
        if getattr(options, name) is not None:
            settings[name] = getattr(options, name)
    if options.fuse_qkv:
        settings["fuse_qkv"] = True
    return settings


def _flags(options: NeuronxOptions) -> tuple[str, ...]:
    """Compiler flags to add to NEURON_CC_FLAGS (only when asked for, unlike DJL which adds a flag
    whenever its key is present, even as ``false``)."""
    flags = []
    if options.neuron_optimize_level is not None:
        flags.append(f"-O{options.neuron_optimize_level}")
    if options.enable_mixed_precision_accumulation:
        flags.append("--enable-mixed-precision-accumulation")
    if options.enable_saturate_infinity:
        flags.append("--enable-saturate-infinity")
    return tuple(flags)
