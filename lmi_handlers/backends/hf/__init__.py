"""The ``hf`` backend: transformers models on CPU or CUDA, run by our paged-KV engine (``backend.py``).

Its parts: the options (``options.py``) and load plan (``plan.py``), the tokenizer surface, the paged KV pool and
prefix blocks, packed attention, the output projection, weight quantization, speculative decoding, and the
compiled CPU kernels (``cpu/``). This module is what the registry (``backends/registry.py``) reads; it imports
only the standard library.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ...adapters import AdapterRule
from ...config import HandlerConfig
from ...errors import ConfigError
from ..base import Backend, check_model_files
from .lora import REFUSED
from .options import KEYS
from .options import HfOptions as Options
from .plan import plan

__all__ = ["ADAPTERS", "HEAD_LAYOUT", "INSTANCE_FAMILIES", "KEYS", "Options", "available", "check_files", "load",
           "plan"]

#: The machine's own CPU (``lmi serve``) and the GPU families.
INSTANCE_FAMILIES = ("cpu", "g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en")
#: LoRA adapters on the decoder's linear layers, of any rank ``option.max_lora_rank`` allows (``lora.py``).
ADAPTERS = AdapterRule(refused_modules=REFUSED)
#: Embedding models load a pooler (``pooling.py``).
EMBEDS = True
#: Several GPUs take whole layers each (``device_map="auto"``): the heads stay as the model has them.
HEAD_LAYOUT = {"gpu": "layers"}


def available() -> str | None:
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    return f"the hf backend needs {' and '.join(missing)}, which this Python lacks" if missing else None


def check_files(config: HandlerConfig, options: Options) -> None:
    """What loading checks in the model's files before the weights: a draft model's tokenizer against the
    target's, where both are directories here (``lmi validate`` runs this too); raises ``ConfigError``."""
    draft = options.speculative.draft if options.speculative is not None else None
    if draft is None or not os.path.isdir(config.model_id) or not os.path.isdir(draft):
        return
    from .speculative import check_draft_tokenizer, load_draft_tokenizer

    try:
        target = load_draft_tokenizer(config.model_id)
    except ConfigError:
        return  # no tokenizer beside the target's config: the load names that itself
    check_draft_tokenizer(config.model_id, draft, target, load_draft_tokenizer(draft))


def load(deployment: Any) -> Backend:
    config = deployment.config
    if not deployment.options.gguf_file:  # a GGUF file carries its own config and tokenizer
        check_model_files(config.model_id)
    if deployment.embedding:  # option.task=text-embedding: vectors, not text (pooling.py)
        from .pooling import HFPooler

        return HFPooler(config)  # type: ignore[return-value]
    from .backend import HFBackend

    return HFBackend(config, deployment.options, deployment.grammar)
