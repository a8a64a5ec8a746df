"""An embedding answer's bytes: LMI's (the vector, or a list of vectors for a list of inputs, as LMI's embedding
guide shows) or OpenAI's (``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
"usage"}``, each embedding a list of floats or, with ``encoding_format=base64``, its little-endian float32 bytes in
base64, as the ``openai`` client decodes them)."""

from __future__ import annotations

import array
import base64
import os
import sys
import time
from typing import Sequence

from ..encoding import dumps
from .request import EmbeddingRequest


def answer_body(request: EmbeddingRequest, vectors: Sequence[Sequence[float]], tokens: int, model: str) -> str:
    if not request.openai:
        return dumps([list(v) for v in vectors] if request.many else list(vectors[0]))
    data = [{"object": "embedding", "index": i, "embedding": _encoded(vector, request.encoding_format)}
            for i, vector in enumerate(vectors)]
    return dumps({"id": f"embd-{os.urandom(12).hex()}", "object": "list", "created": int(time.time()),
                  "model": request.model or model, "data": data,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _encoded(vector: Sequence[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return list(vector)
    packed = array.array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")
