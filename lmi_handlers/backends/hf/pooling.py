"""Embeddings on the hf backend: the model's own ``AutoModel`` (an encoder such as BERT, or a decoder's base
model), its last hidden states pooled as sentence-transformers' configuration says (``pooling/options.py``).

A dynamic batch's inputs run together, shortest first, in forwards of at most ``BATCH_TOKENS`` padded tokens; rows
are padded on the right under an attention mask, so a row's vector does not depend on its neighbours (padding
changes no real token's state; the tests hold the vectors to sentence-transformers' ``encode``). On the CPU a
forward takes the generation engine's thread count (``cpu/kernels.py``: every CPU, unless ``OMP_NUM_THREADS`` says).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ...config import HandlerConfig
from ...default_dtype import cpu_flags
from ...pooling.batch import Row
from ...pooling.options import PoolingOptions
from .backend import _version, resolve_device, torch_dtype
from .cpu.kernels import set_threads, step_threads
from ..tokenizer import HFTokenizer

logger = logging.getLogger(__name__)
#: Padded tokens in one forward: bounds the activations' memory whatever the batch.
BATCH_TOKENS = 16384


class HFPooler:
    name = "hf"

    def __init__(self, config: HandlerConfig):
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.torch = torch
        device = resolve_device(torch, config.device)
        self.threads = step_threads(torch, config.async_mode) if device == "cpu" else None
        source: dict[str, Any] = {"trust_remote_code": config.trust_remote_code}
        if config.properties.get("revision"):
            source["revision"] = str(config.properties["revision"])
        hf_config = AutoConfig.from_pretrained(config.model_id, **source)
        decoder = bool(getattr(hf_config, "is_decoder", False)) or any(
            a.endswith("ForCausalLM") for a in getattr(hf_config, "architectures", None) or [])
        self.pooling = PoolingOptions.from_model(config.model_id, config.properties, decoder)
        tokenizer = AutoTokenizer.from_pretrained(config.model_id, **source)
        dtype = torch_dtype(torch, config.dtype, device, cpu_flags(), config.model_id, **source)
        import transformers

        keyword = "dtype" if _version(transformers) >= (4, 56) else "torch_dtype"
        self.model = AutoModel.from_pretrained(config.model_id, **{keyword: dtype}, **source).eval().to(device)
        self.device = next(self.model.parameters()).device
        self.tokenizer = HFTokenizer(tokenizer)
        bounds = [getattr(hf_config, "max_position_embeddings", None), self.pooling.max_length, config.max_model_len]
        self.max_length = min(b for b in bounds if isinstance(b, int)) if any(isinstance(b, int) for b in bounds) \
            else 512
        self.vocab_size = len(tokenizer)
        dimensions = getattr(hf_config, "matryoshka_dimensions", None)
        self.matryoshka = tuple(dimensions) if dimensions else bool(getattr(hf_config, "is_matryoshka", False))
        self.pad_id = self.tokenizer.pad_id
        logger.info("loaded %s on %s (%s) for embeddings: %s pooling%s, up to %d tokens per input", config.model_id,
                    self.device, dtype, self.pooling.mode, ", normalized" if self.pooling.normalize else "",
                    self.max_length)

    def embed(self, rows: Sequence[Row]) -> list[list[float]]:
        """One vector per row, in order."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
        out: list[list[float]] = [[] for _ in rows]
        start = 0
        while start < len(order):
            end = start + 1  # rows sorted by length: the group's last row is its longest
            while end < len(order) and (end + 1 - start) * len(rows[order[end]].ids) <= BATCH_TOKENS:
                end += 1
            group = order[start:end]
            for index, vector in zip(group, self._forward([rows[i] for i in group])):
                out[index] = vector
            start = end
        return out

    def _forward(self, rows: Sequence[Row]) -> list[list[float]]:
        torch = self.torch
        width = max(len(row.ids) for row in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row.ids)] = torch.tensor(row.ids)
            mask[i, :len(row.ids)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.threads is not None:
            set_threads(torch, self.threads)  # kept per thread: this one may not be the loader's
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        pooled = self._pool(hidden, mask)
        vectors = []
        for i, row in enumerate(rows):
            vector = pooled[i, :row.dimensions] if row.dimensions else pooled[i]
            if row.normalize:
                vector = torch.nn.functional.normalize(vector, dim=-1)
            vectors.append(vector.tolist())
        return vectors

    def _pool(self, hidden: Any, mask: Any) -> Any:
        mode, torch = self.pooling.mode, self.torch
        if mode == "cls":
            return hidden[:, 0]
        if mode == "lasttoken":
            return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        if mode == "max":
            return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
