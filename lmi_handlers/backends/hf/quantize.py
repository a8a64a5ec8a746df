"""Weight quantization for the hf backend (``option.quantize``), a load-time transform of the model.

``static_int8`` (the spelling LMI uses for transformers-neuronx's int8 weight storage, and the same scheme):
every ``nn.Linear`` of the decoder layers and the LM head keeps its weight as int8 with one scale per output
channel (symmetric, absmax / 127); the embeddings, norms, the KV cache and everything between the matrices
keep the model's dtype. A decode step streams a quarter of the fp32 bytes, which is what bounds a CPU decode
step. The product runs in torch's ``_weight_int8pack_mm`` kernel with bf16 activations (its fast path; fp32
activations take a path much slower than an fp32 matmul), where the device has it, else as a
matmul with the weight cast back on the fly.

With tied embeddings (SmolLM2, Llama-3.2) the LM head becomes an int8 copy beside the full-precision input
table. ``docs/engine.md`` ("Figures") has the measured memory, speed and quality, and the kernels that were tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

METHODS = ("static_int8",)
#: From this many rows (prompt tokens of a prefill, or sequences of a decode batch) an int8 layer dequantizes into
#: a GEMM instead of ``_weight_int8pack_mm``: the kernel keeps up with the fp32 GEMM for a few rows only
#: (docs/engine.md, "Figures").
GEMM_ROWS = 16


@dataclass(frozen=True)
class QuantizedWeights:
    """What ``quantize_weights`` did: matrices replaced, and the model's parameter bytes before and after."""

    method: str
    layers: int
    bytes_before: int
    bytes_after: int
    kernel: str


def parse_method(value: Any) -> str | None:
    """``option.quantize`` for the hf backend: unset, or one of ``METHODS``; a clear error otherwise."""
    text = str(value or "").strip().lower()
    if not text:
        return None
    if text not in METHODS:
        raise ConfigError("quantize", value, f"the hf backend quantizes weights with {', '.join(METHODS)} (int8 "
                          "weight-only, per output channel); checkpoints already quantized with AWQ or GPTQ load "
                          "through their config.json's quantization_config without this option")
    return text


def model_bytes(model: Any) -> int:
    """Bytes of every parameter and buffer (tied tensors counted once)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def quantize_weights(model: Any, method: str) -> QuantizedWeights:
    """Replace the decoder layers' ``nn.Linear`` modules in place (see the module docstring)."""
    import torch

    before = model_bytes(model)
    layers = _decoder_layers(model)
    replaced, kernels = 0, set()
    for layer in layers:
        for name, module in list(layer.named_modules()):
            if isinstance(module, torch.nn.Linear):
                parent_name, _, child = name.rpartition(".")
                quantized = Int8Linear.from_linear(module)
                setattr(layer.get_submodule(parent_name) if parent_name else layer, child, quantized)
                kernels.add(quantized.kernel)
                replaced += 1
    if not replaced:
        raise ConfigError("quantize", method, f"found no linear layers to quantize in {type(model).__name__}")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear):  # a tied head shares the embedding's tensor: quantize a view of it
        model.set_output_embeddings(Int8Linear.from_linear(head))
        replaced += 1
    return QuantizedWeights(method, replaced, before, model_bytes(model), "/".join(sorted(kernels)))


def _decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks (``model.layers``, ``transformer.h``...): the largest ``ModuleList`` of the model."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _int8_linear_class() -> type:
    import torch

    class Int8LinearModule(torch.nn.Module):
        """``y = x W^T + b`` with ``W`` stored as int8 rows times one scale per row."""

        def __init__(self, weight: Any, scales: Any, bias: Any, kernel: str):
            super().__init__()
            self.register_buffer("weight_int8", weight)
            self.register_buffer("scales", scales)
            self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
            self.in_features, self.out_features, self.kernel = weight.shape[1], weight.shape[0], kernel

        @classmethod
        def from_linear(cls, linear: Any) -> "Int8LinearModule":
            weight = linear.weight.detach()
            scales = weight.abs().amax(dim=1).clamp(min=1e-8).float() / 127.0
            quantized = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            kernel = _pick_kernel(quantized, scales)
            scales = scales.to(torch.bfloat16 if kernel == "int8pack_mm" else weight.dtype)
            bias = None if linear.bias is None else linear.bias.detach()
            return cls(quantized, scales, bias, kernel)

        def forward(self, x: Any) -> Any:
            flat = x.reshape(-1, self.in_features)
            if self.kernel == "int8pack_mm" and flat.shape[0] < GEMM_ROWS:
                # bf16 activations: torch's fast path (fp32 ones take a slow one)
                out = torch._weight_int8pack_mm(flat.to(torch.bfloat16).contiguous(), self.weight_int8,
                                                self.scales).to(x.dtype)
            elif self.kernel == "int8pack_mm":
                # Many rows (a prefill): int8pack_mm is a matrix-vector kernel, twice as slow as a GEMM here, so
                # dequantize into an fp32 GEMM. Same inputs as the kernel (bf16 activations, int8 weights, exact in
                # fp32) and the same bf16 result, so prefill and decode rows compute the same numbers.
                widened = flat.to(torch.bfloat16).float() @ self.weight_int8.float().t()
                out = (widened * self.scales.float()).to(torch.bfloat16).to(x.dtype)
            else:
                out = (flat @ self.weight_int8.to(flat.dtype).t()) * self.scales
            if self.bias is not None:
                out = out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, int8, {self.kernel}"

    return Int8LinearModule


def _pick_kernel(weight: Any, scales: Any) -> str:
    """``int8pack_mm`` when torch has it for this device with bf16 activations (checked on a tiny input), else
    ``dequant``."""
    import torch

    kernel = getattr(torch, "_weight_int8pack_mm", None)
    if kernel is None:
        return "dequant"
    try:
        probe = torch.ones(1, weight.shape[1], dtype=torch.bfloat16, device=weight.device)
        expected = (probe.float() @ weight.float().t()) * scales.float()
        got = kernel(probe, weight, scales.to(torch.bfloat16)).float()
        if torch.allclose(got, expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max())):
            return "int8pack_mm"
    except (RuntimeError, NotImplementedError):
        pass
    return "dequant"


class _LazyClass:
    """``Int8Linear`` is built on first use, so importing this module does not import torch."""

    _cls: type | None = None

    def __getattr__(self, name: str) -> Any:
        if _LazyClass._cls is None:
            _LazyClass._cls = _int8_linear_class()
        return getattr(_LazyClass._cls, name)


Int8Linear: Any = _LazyClass()
