"""The hf backend's linear layers through a compiled kernel for few rows (``option.cpu_linear_kernel=compiled``).

A decode step multiplies a few dozen rows by every weight, so on the CPU it is as fast as the weights stream from
memory. oneDNN's prepacked product (``onednn_linear.py``) streamed SmolLM2's float32 weights at 15-17 GB/s at 16
rows on this project's AMD EPYC, one thread, where the core reads 30-37 GB/s. The kernel in
``compiled_linear.cpp`` multiplies weights packed once into panels of one vector's width, read straight through
with software prefetch, and holds each tile's sums in vector registers: SmolLM2's own decode step, one thread,
37.1 against 47.0 ms at 16 rows (1.27x), 109.0 against 117.2 ms at 64 (``benchmarks/engine.py linear``).

Like oneDNN it sums in another order than torch's product (logits move in the sixth digit), so greedy output equals
``model.generate`` on the same kernels, not on the stock model; the packed weights are a second copy (the stock
ones stay: tied embeddings and the load checks read them), all in one buffer on 2 MB pages
(``memory.huge_page_empty``: the step streams them, and 4 KB pages cost a TLB miss every 4 KB). Float32 on the
CPU only, built at load (``kernels.build``). torch is passed in by the backend; nothing here runs at import
time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .kernels import build, float32_cpu_linears
from .memory import huge_page_empty

SOURCE = Path(__file__).with_name("compiled_linear.cpp")


def build_kernel(torch: Any) -> Any:
    """The compiled module (``width``, ``pack_weight``, ``linear``); ``ConfigError`` naming the option when it
    cannot be built."""
    return build(torch, "cpu_linear_kernel", SOURCE)


def compile_linears(torch: Any, kernel: Any, model: Any) -> int:
    """Route every ``nn.Linear`` of ``model`` through ``kernel``; how many layers. Refused (``ConfigError``) where
    the model is not float32 on the CPU."""
    layers = float32_cpu_linears(torch, model, "cpu_linear_kernel", "compiled")
    shapes = [(-(-layer.out_features // kernel.width), layer.in_features, kernel.width) for layer in layers]
    # One buffer on huge pages for every packed weight: a step streams all of them (memory.huge_page_empty).
    arena = huge_page_empty(torch, (sum(math.prod(shape) for shape in shapes),), torch.float32)
    offset = 0
    for layer, shape in zip(layers, shapes):
        packed = arena[offset:offset + math.prod(shape)].view(shape)
        offset += packed.numel()
        kernel.pack_weight(layer.weight.detach(), packed)
        layer.forward = _compiled_forward(torch, kernel, layer, packed)
    return len(layers)


def _compiled_forward(torch: Any, kernel: Any, layer: Any, packed: Any) -> Any:
    bias = torch.zeros(packed.shape[0] * packed.shape[2])
    if layer.bias is not None:
        bias[:layer.out_features] = layer.bias.detach()
    linear, out = kernel.linear, layer.out_features

    def forward(hidden: Any) -> Any:
        return linear(hidden.reshape(-1, hidden.shape[-1]), packed, bias, out).view(*hidden.shape[:-1], out)

    return forward
