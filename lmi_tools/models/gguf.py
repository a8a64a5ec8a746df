"""Turn a GGUF file into an ordinary Hugging Face model directory (config, safetensors, tokenizer, chat
template, generation config) that loads with ``from_pretrained(local_dir)`` in transformers 5.x and 4.43.4.

transformers reads GGUF itself (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` and ``accelerate``
packages) and dequantizes every tensor to full precision, but refuses to save a model loaded that way; so a
fresh model is built from the same config and given the dequantized state dict. The files 5.x writes are then
made readable by 4.43.4 as well (``make_compatible``).

Idempotent: the directory records the GGUF it came from (``gguf_source.json``, with its sha256); converting
the same file again into it does nothing. Conversion writes into a temporary sibling directory and renames it
into place, so a reader never sees a half-written model and two conversions at once do not mix files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from ..errors import ToolError, UsageError
from ..outputs import check_writable

MARKER = "gguf_source.json"
INSTALL_GGUF = "pip install 'lmi-handlers[gguf]'  (or: pip install gguf accelerate)"


def require_gguf_support() -> None:
    """transformers needs ``gguf`` (the reader) and ``accelerate`` (its loader) to open a GGUF file."""
    missing = [name for name in ("gguf", "accelerate", "transformers", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise ToolError(f"reading GGUF files needs {', '.join(missing)}, which is not installed",
                        hint=INSTALL_GGUF if set(missing) <= {"gguf", "accelerate"}
                        else "pip install 'lmi-handlers[hf,gguf]' (torch first, as scripts/setup.sh does)")


def source_of(gguf: Path) -> dict:
    """What identifies a GGUF file: its name, size and sha256."""
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"gguf": gguf.name, "bytes": gguf.stat().st_size, "sha256": digest.hexdigest()}


def converted_from(out_dir: Path) -> dict | None:
    """The source recorded in a directory this module wrote, or None."""
    try:
        return json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


def convert_gguf(gguf: str | Path, out_dir: str | Path, say: Callable[[str], None] = print) -> Path:
    """Write ``out_dir`` from ``gguf`` unless it already holds this file's conversion; returns ``out_dir``."""
    gguf, out_dir = Path(gguf).resolve(), Path(out_dir)
    if not gguf.is_file():
        raise UsageError(f"GGUF file {gguf} does not exist")
    source = source_of(gguf)
    if converted_from(out_dir) == source:
        say(f"{out_dir} is up to date (converted from {gguf.name})")
        return out_dir
    check_writable(out_dir, folder=True)
    if out_dir.exists() and any(out_dir.iterdir()) and converted_from(out_dir) is None:
        raise UsageError(f"{out_dir} exists and is not a directory converted by lmi",
                         hint="give an empty or new directory")
    require_gguf_support()
    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _convert(gguf, partial, say)
        make_compatible(partial)
        (partial / MARKER).write_text(json.dumps(source, indent=2) + "\n")
        _move_into_place(partial, out_dir, source)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    say(f"wrote {out_dir}")
    return out_dir


def _convert(gguf: Path, out: Path, say: Callable[[str], None]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    say(f"[1/3] reading and dequantizing {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, NotImplementedError) as exc:
        # transformers names the unsupported architecture or quantization type.
        raise ToolError(f"transformers cannot read {gguf.name}: {exc}") from None
    say(f"[2/3] rebuilding {type(loaded).__name__} ({sum(p.numel() for p in loaded.parameters()) / 1e6:.0f}M "
        f"parameters, {loaded.dtype}) as an ordinary model")
    config = loaded.config
    del config.quantization_config  # the weights are no longer quantized; a loader must not look for GGUF
    model = AutoModelForCausalLM.from_config(config).to(loaded.dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    say("[3/3] writing safetensors, tokenizer, chat template and generation config")
    out.mkdir(parents=True)
    model.eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    say(f"converted in {time.monotonic() - started:.0f} s")


def _move_into_place(partial: Path, out_dir: Path, source: dict) -> None:
    if out_dir.exists():
        if converted_from(out_dir) == source:  # another conversion of the same file finished first
            return
        shutil.rmtree(out_dir)  # an older conversion of ours (checked by the caller), now replaced
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(out_dir)


def make_compatible(model_dir: Path) -> None:
    """Rewrite what transformers 5.x saved so that 4.43.4 (the oldest LMI image's) reads the same model.

    Each change keeps the file valid for 5.x too:
    - config.json: 4.x reads ``rope_theta`` and ``torch_dtype`` at the top level (5.x: ``rope_parameters``,
      ``dtype``); without ``rope_theta`` 4.x silently falls back to 10000 and the model talks nonsense.
    - tokenizer.json: tokenizers before 0.20 reads BPE merges only as ``"a b"`` strings, not pairs.
    - tokenizer_config.json: ``TokenizersBackend`` does not exist in 4.x (``PreTrainedTokenizerFast`` loads in
      both); 4.x reads the chat template from this file, 5.x from ``chat_template.jinja``; 4.x cleans up
      spaces before punctuation when decoding unless told not to, 5.x does not.
    """
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    _write_json(config_file, config)

    tokenizer_file = model_dir / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    merges = tokenizer.get("model", {}).get("merges")
    if merges and isinstance(merges[0], list) and not any(" " in part for pair in merges for part in pair):
        tokenizer["model"]["merges"] = [" ".join(pair) for pair in merges]
    _write_json(tokenizer_file, tokenizer)

    settings_file = model_dir / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "backend"):  # how 5.x loaded it, not what the tokenizer is
        settings.pop(key, None)
    if settings.get("tokenizer_class") == "TokenizersBackend":
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        settings.setdefault("chat_template", template.read_text(encoding="utf-8"))
    if "max_position_embeddings" in config:
        settings["model_max_length"] = config["max_position_embeddings"]
    settings.setdefault("clean_up_tokenization_spaces", False)
    _write_json(settings_file, settings)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
