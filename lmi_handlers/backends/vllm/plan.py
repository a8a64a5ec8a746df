"""The vllm backend's plan, as ``lmi validate`` sizes it for an instance: a pure function of the options, the
model's ``config.json`` and one device's memory, refusing what vLLM would refuse at load.

- tensor parallelism: vLLM splits the attention heads over the GPUs, so their number must divide by the degree;
- sequence length: ``max_model_len`` (or ``n_positions``), else the model's positions;
- memory: vLLM takes ``gpu_memory_utilization`` (0.9 by default) of each GPU; the weights' share (``used``) comes
  off it and the rest holds the KV cache, of which each GPU keeps its share of the key/value heads. vLLM refuses to
  start when that cache cannot hold one full-length sequence.

On the CPU and on NeuronCores the plan does not bound memory (vLLM's CPU build sizes its cache from
``VLLM_CPU_KVCACHE_SPACE``; Neuron's is the compiler's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...config import HandlerConfig
from ...errors import ConfigError
from ..base import DeviceMemory
from ...dtypes import BYTES as DTYPE_BYTES
from ...model_config import DEFAULT_POSITIONS, kv_bytes_per_token, max_positions, resolve_dtype
from .options import Options

#: vLLM's default where the options leave it unset.
DEFAULT_UTILIZATION = 0.9


@dataclass(frozen=True)
class VllmPlan:
    """What vLLM's engine would be built with on one device."""

    dtype: str
    max_sequence_length: int
    batch_size: int
    #: Tokens the KV cache holds on each device (None: not bounded here).
    kv_tokens: int | None
    tensor_parallel_size: int = 1
    int8: bool = False
    warnings: tuple[str, ...] = ()
    #: Sequences take blocks from a shared pool as they grow.
    static_kv = False


def plan(config: HandlerConfig, options: Options, model_config: Mapping[str, Any],
         device_memory: DeviceMemory) -> VllmPlan:
    """The plan on ``device_memory`` (one GPU of ``tensor_parallel_degree``); raises ``ConfigError``."""
    tp = config.tensor_parallel_degree or options.tensor_parallel_size or 1
    text = model_config.get("text_config") or model_config
    heads = text.get("num_attention_heads") or text.get("n_head")
    if isinstance(heads, int) and heads % tp:
        raise ConfigError("tensor_parallel_degree", tp, f"vLLM splits the model's {heads} attention heads over the "
                          "GPUs, so the degree must divide them")
    dtype = resolve_dtype(options.dtype, device_memory.kind, model_config)
    length = options.max_model_len or max_positions(model_config) or DEFAULT_POSITIONS
    batch = options.max_num_seqs
    int8 = options.quantization in ("fp8", "int8", "bitsandbytes")
    if device_memory.kind != "cuda" or not device_memory.total:
        return VllmPlan(dtype, length, batch, None, tp, int8)
    kv_heads = text.get("num_key_value_heads") or heads or 1
    per_token = kv_bytes_per_token(model_config, DTYPE_BYTES[dtype]) * max(1, kv_heads // tp) // kv_heads
    utilization = options.gpu_memory_utilization or DEFAULT_UTILIZATION
    free = int(device_memory.total * utilization) - device_memory.used
    tokens = max(0, free) // max(1, per_token)
    if tokens < length:
        gib = device_memory.used / 2**30
        raise ConfigError("gpu_memory_utilization", utilization,
                          f"vLLM would refuse to start: {utilization:g} of a {device_memory.total / 2**30:.0f} GiB GPU "
                          f"less the weights' {gib:.1f} GiB leaves a KV cache of {tokens} tokens, fewer than one "
                          f"{length}-token sequence; raise it, lower option.max_model_len, or raise "
                          "option.tensor_parallel_degree")
    warnings = () if tokens >= length * min(batch, 4) else (
        f"the KV cache holds {tokens} tokens: at most {tokens // length} full-length sequences at once",)
    return VllmPlan(dtype, length, batch, tokens, tp, int8, warnings)
