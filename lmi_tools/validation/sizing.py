"""Memory arithmetic: attention heads after tensor-parallel padding, KV cache and weight bytes.

Head padding follows transformers-neuronx (``utils.get_qkv_padding`` and
``decoder.check_gqa_fallback`` at tnx 0.13, reference ``neuron.md`` §3.2-3.3):

* Q heads are padded up to a multiple of the TP degree (GPT-J and GPT-NeoX cannot pad at all: the
  runtime's planner refuses a TP degree that does not divide their heads);
* multi-head models (KV heads == Q heads) pad K/V together with Q;
* grouped-query models shard KV heads over the cores when ``kv_heads % tp == 0``; otherwise tnx
  falls back to ``replicated-heads`` and copies KV heads (to ``tp`` where it can, else up to the Q
  heads), which multiplies the KV cache.

The KV cache of a compiled Neuron model is static: ``2 x layers x kv_heads x head_dim x bytes x
batch x n_positions`` (§3.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmi_handlers.dtypes import BYTES as DTYPE_BYTES
from lmi_handlers.backends.neuronx.options import SERIAL_TYPES

from ..models.architecture import Architecture

GIB = 1024**3


@dataclass(frozen=True)
class HeadLayout:
    """Q and KV heads as they are laid out over ``tp`` cores."""

    tp: int
    heads: int
    kv_heads: int
    padded_heads: int
    effective_kv_heads: int
    #: The GQA strategy in effect after tnx's fallbacks ("" for multi-head models).
    gqa_mode: str

    @property
    def padded(self) -> bool:
        return self.padded_heads != self.heads

    @property
    def replicated(self) -> bool:
        return self.effective_kv_heads != self.kv_heads


def round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


def neuron_head_layout(arch: Architecture, tp: int, gqa: str | None = None,
                       batch_sizes: tuple[int, ...] = (1,)) -> HeadLayout:
    """Heads after transformers-neuronx pads and replicates them for ``tp`` cores."""
    if arch.model_type in SERIAL_TYPES:  # no padding in their transformers-neuronx code
        return HeadLayout(tp, arch.heads, arch.kv_heads, arch.heads, arch.kv_heads, "")
    padded = round_up(arch.heads, tp)
    if not arch.gqa:
        return HeadLayout(tp, arch.heads, arch.kv_heads, padded, padded, "")
    mode = _gqa_fallback(arch, tp, gqa or "shard-over-heads", batch_sizes)
    kv = _replicated_kv_heads(arch.heads, arch.kv_heads, tp, padded) if mode == "replicated-heads" else arch.kv_heads
    return HeadLayout(tp, arch.heads, arch.kv_heads, padded, kv, mode)


def _gqa_fallback(arch: Architecture, tp: int, mode: str, batch_sizes: tuple[int, ...]) -> str:
    """The strategy tnx ends up with (``decoder.check_gqa_fallback``)."""
    if mode == "replicated-heads":
        return mode
    if mode == "shard-over-batch":
        if all(b % tp == 0 for b in batch_sizes):
            return mode
        mode = "shard-over-heads"
    if mode == "all-gather-heads":
        fits = (arch.kv_heads * arch.head_dim) % tp == 0
        pad = round_up(arch.heads, tp) - arch.heads
        if fits and pad % arch.kv_heads == 0:
            return mode
        mode = "shard-over-heads"
    return mode if arch.kv_heads % tp == 0 else "replicated-heads"


def _replicated_kv_heads(heads: int, kv_heads: int, tp: int, padded: int) -> int:
    """KV heads under ``replicated-heads`` (``utils.get_qkv_padding``)."""
    ratio = heads // kv_heads  # full replication: one KV head per Q head
    extra = padded - heads
    if kv_heads < tp and tp % kv_heads == 0 and (heads % tp == 0 or (extra > 0 and extra % kv_heads == 0)):
        ratio = tp // kv_heads  # partial replication: just enough for one per core
    elif padded / tp == heads / kv_heads:
        ratio = 1
    replicated = max(kv_heads * ratio, tp)
    return padded if replicated == heads else replicated


def gpu_head_layout(arch: Architecture, tp: int) -> HeadLayout:
    """Whole layers per GPU (``layers``: the transformers backend's ``device_map="auto"``): heads stay as they are."""
    return HeadLayout(tp, arch.heads, arch.kv_heads, arch.heads, arch.kv_heads, "")


def split_head_layout(arch: Architecture, tp: int) -> HeadLayout:
    """The heads split over the GPUs (``heads``: vLLM's tensor parallelism): each GPU keeps its share of the KV heads,
    and at least one, so fewer KV heads than GPUs are copied to every GPU."""
    return HeadLayout(tp, arch.heads, arch.kv_heads, arch.heads, max(arch.kv_heads, tp), "")


def head_layout(name: str, arch: Architecture, tp: int, gqa: str | None = None,
                batch_sizes: tuple[int, ...] = (1,)) -> HeadLayout:
    """The heads over ``tp`` devices in the layout a backend names (its registry entry's ``head_layout``)."""
    if name == "padded":
        return neuron_head_layout(arch, tp, gqa, batch_sizes)
    return split_head_layout(arch, tp) if name == "heads" else gpu_head_layout(arch, tp)


def kv_bytes_per_token(arch: Architecture, kv_heads: int, dtype: str) -> int:
    """Keys and values of one token over all layers."""
    return 2 * arch.layers * kv_heads * arch.head_dim * DTYPE_BYTES[dtype]


def padding_parameters(arch: Architecture, layout: HeadLayout) -> int:
    """Extra weight parameters from padded Q/O heads and padded or replicated K/V heads."""
    per_head = arch.hidden_size * arch.head_dim
    extra_q = (layout.padded_heads - layout.heads) * per_head * 2  # q_proj columns and o_proj rows
    extra_kv = (layout.effective_kv_heads - layout.kv_heads) * per_head * 2  # k_proj and v_proj
    return arch.layers * (extra_q + extra_kv)


def weight_bytes(arch: Architecture, layout: HeadLayout, dtype: str, int8: bool = False) -> int:
    """All weights, padding included; int8 stores the decoder layers' matrices in one byte each."""
    count = arch.parameters()
    padding = padding_parameters(arch, layout)
    if not int8:
        return (count.total + padding) * DTYPE_BYTES[dtype]
    return (count.quantizable + padding) + (count.total - count.quantizable) * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class Footprint:
    """Accelerator memory of one model copy spread over ``tp`` cores or GPUs."""

    tp: int
    weights: int
    kv_per_token: int
    kv_tokens: int

    @property
    def kv_cache(self) -> int:
        return self.kv_per_token * self.kv_tokens

    @property
    def per_device(self) -> float:
        return (self.weights + self.kv_cache) / self.tp


def footprint(arch: Architecture, layout: HeadLayout, dtype: str, batch: int, positions: int,
              int8: bool = False) -> Footprint:
    return Footprint(tp=layout.tp, weights=weight_bytes(arch, layout, dtype, int8),
                     kv_per_token=kv_bytes_per_token(arch, layout.effective_kv_heads, dtype),
                     kv_tokens=batch * positions)


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"
