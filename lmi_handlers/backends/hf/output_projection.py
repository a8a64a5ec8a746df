"""The output projection (last hidden state -> vocabulary logits) computed a slice of the vocabulary at a time.

On CPU, MKL multiplies a few rows by a large vocabulary matrix (SmolLM2: 49,152 x 576, 113 MB) faster from a few
rows up when the matrix is taken ``SLICE`` vocabulary rows at a time than in one product
(``benchmarks/engine.py projection``; figures in docs/engine.md, "Figures"); for one row it picks a matrix-vector kernel that gains nothing, so
one-row calls keep the stock product. Each logit is still one dot product over the hidden size in the same
kernel, so the logits come out bit for bit the same, and greedy output still equals ``model.generate``. A
check at load confirms it on this machine's BLAS and keeps the stock product wherever it does not hold.

torch is passed in by the backend; nothing here runs at import time.
"""

from __future__ import annotations

from typing import Any

SLICE = 1024
MIN_SLICES = 4  # below about 4,096 x hidden the whole matrix stays in cache and slicing gains nothing
CHECK_ROWS = (2, 3, 8, 33)  # even, odd, a vector width, past 32: the row counts a GEMM may block differently


def split_output_projection(torch: Any, model: Any) -> bool:
    """Make ``model``'s output projection compute in vocabulary slices where that is exact; True if it does."""
    head = model.get_output_embeddings()
    forward = sliced_forward(torch, head)
    if forward is None:
        return False
    head.forward = forward
    return True


def sliced_forward(torch: Any, head: Any) -> Any:
    """``head``'s forward in vocabulary slices, or None where slicing would gain nothing or not be exact."""
    if type(head) is not torch.nn.Linear or head.weight.device.type != "cpu" \
            or head.weight.dtype != torch.float32 or head.out_features < MIN_SLICES * SLICE:
        return None
    stock = head.forward
    linear = torch.nn.functional.linear

    def forward(hidden: Any) -> Any:
        if hidden.numel() <= hidden.shape[-1]:
            return stock(hidden)
        bias = head.bias
        return torch.cat([linear(hidden, head.weight[i:i + SLICE], None if bias is None else bias[i:i + SLICE])
                          for i in range(0, head.out_features, SLICE)], dim=-1)

    return forward if _identical(torch, stock, forward, head.in_features) else None


def _identical(torch: Any, stock: Any, split: Any, width: int) -> bool:
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in CHECK_ROWS:
            hidden = torch.randn(rows, 1, width, generator=generator)
            if not torch.equal(stock(hidden), split(hidden)):
                return False
    return True
