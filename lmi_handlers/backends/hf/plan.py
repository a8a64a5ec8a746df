"""The hf backend's load plan: a pure function of its options, the handler settings, the model's ``config.json``
and the device's memory. The backend loads by it and ``lmi validate`` runs it, so both refuse the same settings
with the same ``ConfigError`` and size the same KV pool.

- dtype: ``option.dtype``, or for ``auto`` float32 on the CPU and on CUDA the checkpoint's 16-bit type (float16
  when it stores float32);
- sequence length: the model's positions, at most ``option.max_model_len``, and within a sliding window where the
  model has one (the paged cache's mask is a full causal one: staying within the window keeps them in agreement);
- the KV pool: ``paged_cache.plan_pool`` over the bytes a token's keys and values take in that dtype;
- refusals: CPU kernels off a float32 CPU model, a pool that cannot hold one full-length sequence.

Standard library only: ``model_config`` is ``config.json`` as a mapping (the runtime passes the loaded config's
``to_dict()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...config import HandlerConfig
from ...dtypes import BYTES as DTYPE_BYTES
from ...model_config import DEFAULT_POSITIONS, kv_bytes_per_token, max_positions, resolve_dtype
from ..base import DeviceMemory
from .cpu.kernels import check_target
from .options import HfOptions
from .paged_cache import PoolPlan, plan_pool


@dataclass(frozen=True)
class HfPlan:
    """What the hf backend loads with."""

    device: str
    #: fp32, fp16 or bf16: the weights' and the KV cache's.
    dtype: str
    #: Longest prompt + generated tokens of one sequence.
    max_sequence_length: int
    #: Sequences active at once.
    batch_size: int
    kv_bytes_per_token: int
    pool: PoolPlan
    #: Weights stored in int8 (``option.quantize``).
    int8: bool = False
    warnings: tuple[str, ...] = ()

    @property
    def kv_tokens(self) -> int:
        return self.pool.tokens

    #: Sequences take blocks from a shared pool as they grow.
    static_kv = False


def plan(config: HandlerConfig, options: HfOptions, model_config: Mapping[str, Any],
         device_memory: DeviceMemory) -> HfPlan:
    """The plan for ``device_memory.kind`` (cpu or cuda, resolved); raises ``ConfigError``."""
    device = device_memory.kind
    check_target(options.kernels, device, config.dtype)
    dtype = resolve_dtype(config.dtype, device, model_config)
    length = sequence_length(config, model_config)
    batch = max(config.max_rolling_batch_size, config.batch_size)
    per_token = kv_bytes_per_token(model_config, DTYPE_BYTES[dtype])
    cuda = (device_memory.total, device_memory.used) if device == "cuda" and device_memory.total else None
    pool = plan_pool(options.pool, bytes_per_token=per_token, max_batch_size=batch, max_sequence_length=length,
                     cuda_memory=cuda)
    return HfPlan(device=device, dtype=dtype, max_sequence_length=length, batch_size=batch,
                  kv_bytes_per_token=per_token, pool=pool, int8=options.quantize is not None)


def sequence_length(config: HandlerConfig, model_config: Mapping[str, Any]) -> int:
    length = max_positions(model_config) or DEFAULT_POSITIONS
    if config.max_model_len:
        length = min(length, config.max_model_len)
    window = model_config.get("sliding_window")
    if isinstance(window, int) and not isinstance(window, bool) and 0 < window < length:
        length = window
    return length
