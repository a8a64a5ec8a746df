"""Embedding models: ``option.task=text-embedding`` (LMI's name; ``feature-extraction`` too) serves a model whose
answer is a vector per text, instead of generated text.

Its parts: the task option and how vectors are pooled (``options.py``), the request shapes LMI and OpenAI send
(``request.py``), the answer in each shape (``answer.py``), and a dynamic batch of requests answered together
(``batch.py``). The backends pool: the hf backend with transformers (``backends/hf/pooling.py``, as
sentence-transformers' configuration says), the vllm backend with vLLM's pooling runner (``backends/vllm/pooling.py``).
"""

from .options import KEYS, PoolingOptions, pooling_task

__all__ = ["KEYS", "PoolingOptions", "pooling_task"]
