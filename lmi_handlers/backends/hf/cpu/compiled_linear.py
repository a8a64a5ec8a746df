"""The hf backend's linear layers through a compiled kernel for few rows (``option.cpu_linear_kernel=compiled``).

A decode step multiplies a few dozen rows by every weight, so on the CPU it is as fast as the weights stream from
memory, and oneDNN's prepacked product (``onednn_linear.py``) streams them well below what a core can read. The
kernel in ``compiled_linear.cpp`` multiplies weights packed once into panels of one vector's width, read straight
through with software prefetch, and holds each tile's sums in vector registers (``benchmarks/engine.py linear``;
the figures are in docs/engine.md, "Figures"). From ``common.WIDE_ROWS`` rows (a prefill chunk)
a layer runs torch's own product on the stock weights instead: the panels are laid out for decode's few rows.

Like oneDNN it sums in another order than torch's product (logits move in the sixth digit), so greedy output equals
``model.generate`` on the same kernels, not on the stock model; the packed weights are a second copy (the stock
ones stay: tied embeddings and the load checks read them), all in one buffer on 2 MB pages
(``memory.huge_page_empty``: the step streams them, and 4 KB pages cost a TLB miss every 4 KB). Float32 on the
CPU only, built at load (``common.build``). torch is passed in by the backend; nothing here runs at import
time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .common import WIDE_ROWS, build, float32_cpu_linears
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
    product, weight = torch.nn.functional.linear, layer.weight.detach()
    stock_bias = None if layer.bias is None else layer.bias.detach()

    def forward(hidden: Any) -> Any:
        if hidden.numel() >= WIDE_ROWS * hidden.shape[-1]:  # a prefill's rows: torch's product, as fast or faster
            return product(hidden, weight, stock_bias)
        return linear(hidden.reshape(-1, hidden.shape[-1]), packed, bias, out).view(*hidden.shape[:-1], out)

    return forward


def load_check(torch: Any, kernel: Any) -> str | None:
    """None if ``kernel`` multiplies a small layer as the product in float64 does on this CPU, over every row block
    and a padded last panel; else what differed (``option.cpu_linear_kernel=auto`` then takes the next choice)."""
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(33, 20)
    torch.nn.init.normal_(layer.bias, generator=generator)
    compiled = torch.nn.Sequential(layer)
    compile_linears(torch, kernel, compiled)
    with torch.inference_mode():
        for rows in (*range(1, 18), 64):
            x = torch.randn(rows, 33, generator=generator)
            want = x.double() @ layer.weight.double().T + layer.bias.double()
            scale = x.double().abs() @ layer.weight.double().abs().T + layer.bias.double().abs()
            error = float(((compiled(x).double() - want).abs() / scale).max())
            if not error <= 1e-6:
                return f"{rows} rows: relative error {error:.1e}"
    return None
