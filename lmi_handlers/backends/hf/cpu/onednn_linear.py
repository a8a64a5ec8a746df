"""The hf backend's linear layers through oneDNN with prepacked weights, on CPU (``option.cpu_linear_kernel``).

torch's CPU build multiplies float32 linear layers with MKL. oneDNN, which torch also ships (and which
torch's inductor and vLLM's CPU build use for the same products), runs them from weights reordered once
into its blocked layout; on some CPUs that is much faster for decode's few rows (``benchmarks/engine.py linear``;
figures in docs/engine.md, "Figures"). From ``common.WIDE_ROWS`` rows (a prefill chunk) a layer
runs torch's own product on the stock weights instead, as fast or faster there. The sums are taken in another
order, so logits move in the fifth digit: greedy output equals ``model.generate`` on the same prepacked model, not
on the stock one; ``stock`` is the choice where greedy output must equal the stock model's bit for bit. ``auto``
(the default) takes oneDNN where the compiled kernel cannot run (``kernels.choose``).

The prepacked weights are a second copy of the linear weights (the stock ones stay: tied embeddings and
the load checks read them). torch is passed in by the backend; nothing here runs at import time.
"""

from __future__ import annotations

from typing import Any

from ....config import ConfigError
from .common import WIDE_ROWS, float32_cpu_linears

PACK_ROWS = 16  # the batch size oneDNN picks its weight layout for; any row count runs on it


def prepack_linears(torch: Any, model: Any) -> int:
    """Route every ``nn.Linear`` of ``model`` through oneDNN with its weight prepacked; how many layers.
    Refused (``ConfigError``) where the model is not float32 on the CPU or torch has no oneDNN."""
    layers = float32_cpu_linears(torch, model, "cpu_linear_kernel", "onednn")
    if not torch.backends.mkldnn.is_available():
        raise ConfigError("cpu_linear_kernel", "onednn", "this torch build has no oneDNN (mkldnn): use stock")
    for layer in layers:
        layer.forward = _prepacked_forward(torch, layer)
    return len(layers)


def _prepacked_forward(torch: Any, layer: Any) -> Any:
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), PACK_ROWS)
    weight, bias = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
    linear, product = torch.ops.mkldnn._linear_pointwise, torch.nn.functional.linear

    def forward(hidden: Any) -> Any:
        if hidden.numel() >= WIDE_ROWS * hidden.shape[-1]:  # a prefill's rows: torch's product, as fast or faster
            return product(hidden, weight, bias)
        out = linear(hidden.reshape(-1, hidden.shape[-1]), packed, bias, "none", [], "")
        return out.view(*hidden.shape[:-1], out.shape[-1])

    return forward
