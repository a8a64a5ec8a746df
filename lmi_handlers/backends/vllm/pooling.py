"""Embeddings on the vllm backend: vLLM's engine with its pooling runner (``runner="pooling"``, what LMI's
``option.task=text-embedding`` maps to), which pools as vLLM reads the model (sentence-transformers' files
included). A dynamic batch's inputs go to the engine together, as token ids, each with its own ``PoolingParams``
(normalized or not, and a Matryoshka model's dimensions), and the engine steps until every one is pooled.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from ...adapters import LoraOptions
from ...config import HandlerConfig
from ...pooling.batch import Row
from ...pooling.options import PoolingOptions
from ...structured.tools import ToolOptions
from .engine import VllmBackend
from .options import Options

_batches = itertools.count()


class VllmPooler(VllmBackend):
    engine_overrides = {"runner": "pooling"}

    def __init__(self, config: HandlerConfig, options: Options, tools: ToolOptions, lora: LoraOptions):
        super().__init__(config, options, tools, lora)
        architectures = getattr(self.model_config.hf_config, "architectures", None) or []
        self.pooling = PoolingOptions.from_model(config.model_id, config.properties,
                                                 decoder=any(a.endswith("ForCausalLM") for a in architectures))
        self.max_length = self.max_sequence_length
        dimensions = getattr(self.model_config, "matryoshka_dimensions", None)
        self.matryoshka = tuple(dimensions) if dimensions else bool(self.model_config.is_matryoshka)
        # vLLM's LLMEngine, stepped by ``embed``; the loop's watcher ends this worker if vLLM's engine process dies,
        # as on generation.
        self.watch = self.make_engine()

    def embed(self, rows: Sequence[Row]) -> list[list[float]]:
        from vllm.pooling_params import PoolingParams

        batch = next(_batches)
        ids = [f"embed-{batch}-{i}" for i in range(len(rows))]
        for request_id, row in zip(ids, rows):
            params = PoolingParams(task="embed", use_activation=row.normalize, dimensions=row.dimensions)
            self.llm.add_request(request_id, {"prompt_token_ids": list(row.ids)}, params)
        vectors: dict[str, list[float]] = {}
        try:
            while len(vectors) < len(rows):
                for output in self.llm.step():
                    if output.finished:
                        vectors[output.request_id] = output.outputs.data.tolist()
        except BaseException:
            self.llm.abort_request([i for i in ids if i not in vectors])
            raise
        return [vectors[request_id] for request_id in ids]
