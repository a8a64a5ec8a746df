"""``lmi validate`` on the ``adapters/`` folder: each LoRA adapter's configuration as the runtime reads it
(``lmi_handlers.adapters.read_adapter``: rank against ``option.max_lora_rank``, what it adapts), its factors' shapes
against the model's layers (from the safetensors header, no weights read) and the modules the backend's adapter rule
refuses (its registry entry's ``adapters``; a backend without one serves none), and the memory all of them take in
the model's dtype beside the base weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmi_handlers.adapters import FOLDER, LoraOptions, read_adapter
from lmi_handlers.backends.registry import BACKENDS
from lmi_handlers.config import ConfigError
from lmi_handlers.errors import InvalidRequest
from lmi_handlers.safetensors_header import read_header

from .findings import Finding, Target, flag
from .fit import human_bytes
from .sizing import DTYPE_BYTES


def check_adapters(target: Target) -> list[Finding]:
    folder = target.model_dir / FOLDER
    adapters = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not adapters:
        return []
    if not flag(target.props, "enable_lora"):
        return [Finding("warning", "adapters", f"{len(adapters)} adapters in {FOLDER}/ ship but are not loaded: "
                                               "option.enable_lora is off", "set option.enable_lora=true")]
    try:
        options = LoraOptions.from_properties(target.props)
    except ConfigError as exc:
        return [Finding("error", "adapters", str(exc))]
    rule = BACKENDS[target.backend].adapters
    if rule is None:
        return [Finding("error", "adapters", f"{len(adapters)} adapters in {FOLDER}/, but the {target.backend} "
                                             "backend serves no LoRA adapters: registering them is refused",
                        "remove them, or serve the model with a backend that serves adapters")]
    findings, total = [], 0
    for path in adapters:
        try:
            spec = read_adapter(path.name, str(path), options)
            total += _check_factors(target, path, spec.rank, rule.refused_modules)
        except InvalidRequest as exc:
            findings.append(Finding("error", "adapters", str(exc), "fix or remove it: the base model would serve "
                                                                   "without it"))
    limit = options.max_cpu_loras
    if limit is not None and len(adapters) > limit:
        findings.append(Finding("error", "adapters", f"{len(adapters)} adapters in {FOLDER}/, "
                                                     f"option.max_cpu_loras={limit}: the rest would be refused"))
    if not any(f.level == "error" for f in findings):
        findings.append(Finding("ok", "adapters", f"{len(adapters)} LoRA adapters, {human_bytes(total)} in "
                                                  f"{target.dtype} beside the base weights (at most "
                                                  f"{options.max_loras} in one batch)"))
    return findings


def _check_factors(target: Target, path: Path, rank: int, refused: tuple[str, ...]) -> int:
    """Bytes the adapter's factors take in the model's dtype; ``InvalidRequest`` when a factor's shape fits no
    layer of the model, or it adapts a module the backend refuses (``refused``)."""
    header = _safetensors_header(path / "adapter_model.safetensors")
    widths = _layer_widths(target)
    total = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if any(part in refused for part in key.split(".")):
            raise InvalidRequest(f"adapter {path.name} ({path}): target module {key.rsplit('.lora_', 1)[0]} is not "
                                 "supported: adapters may adapt the decoder's linear layers only")
        shape = info.get("shape", [])
        side = shape[1] if ".lora_A" in key else shape[0] if ".lora_B" in key else None
        if len(shape) != 2 or (widths and side not in widths):
            raise InvalidRequest(f"adapter {path.name} ({path}): factor {key} has shape {shape} at rank {rank}, "
                                 f"which fits no layer of this model ({target.arch.model_type if target.arch else '?'},"
                                 f" widths {sorted(widths)}): it was trained for another base model")
        total += shape[0] * shape[1] * DTYPE_BYTES.get(target.dtype, 2)
    return total


def _layer_widths(target: Target) -> set[int]:
    """The input and output widths of the decoder's linear layers."""
    arch = target.arch
    if arch is None:
        return set()
    return {arch.hidden_size, arch.intermediate_size, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim}


def _safetensors_header(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}  # an adapter_model.bin: its shapes need torch; the runtime checks them at registration
    return read_header(path)  # read_adapter has checked it already
