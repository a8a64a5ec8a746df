"""LoRA adapters on the transformers backend: each adapter's low-rank product applied to its own rows.

An adapter's weights (peft's ``adapter_model.safetensors`` or ``.bin``) load into ``LoraWeights``: per adapted
module, ``A`` (``[rank, in]``), ``B`` (``[out, rank]``) and the scaling. The first adapter that adapts a module
wraps it (``LoraLinear``); the base weights are never merged or changed. Before each forward the runner says
which tokens belong to which adapter (``LoraRows.select``: runs of consecutive tokens, as the forward lays them
out); a wrapped module then adds ``B(A(x)) * scaling`` to the outputs of each adapter's tokens, exactly as
peft's ``lora.Linear`` does, and leaves base-model tokens as the base module computed them. A batch without
adapters runs the base modules alone.

Refused at registration, naming the adapter: a target that is not a linear layer of the decoder (embeddings,
the output projection), a module the model does not have, or shapes that do not match the model (an adapter
trained for another base model).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ...adapters import AdapterSpec
from ...errors import InvalidRequest

logger = logging.getLogger(__name__)

#: Modules a LoRA may not adapt here: the input embeddings and the output projection (tied, sliced or compiled).
REFUSED = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out")


@dataclass
class LoraWeights:
    """One adapter's factors by module name: (A, B, scaling)."""

    modules: dict[str, tuple[Any, Any, float]] = field(default_factory=dict)
    bytes: int = 0


class LoraRows:
    """Which tokens of the current forward belong to which adapter; shared by every wrapped module."""

    def __init__(self, torch: Any, device: Any):
        self.torch, self.device = torch, device
        #: (weights, token indices into the flattened batch, or None for every token)
        self.groups: tuple[tuple[LoraWeights, Any], ...] = ()

    @contextlib.contextmanager
    def select(self, adapters: Sequence[Any], lengths: Sequence[int]) -> Iterator[None]:
        """For one forward: ``adapters[i]`` (an ``adapters.Adapter`` or None) owns the ``lengths[i]`` tokens after
        those of the runs before it, in the flattened order of the forward's input ids."""
        if all(a is None for a in adapters):
            yield
            return
        first = adapters[0]
        if all(a is first for a in adapters):
            self.groups = ((first.weights, None),)
        else:
            indices: dict[int, tuple[Any, list[int]]] = {}
            offset = 0
            for adapter, length in zip(adapters, lengths):
                if adapter is not None:
                    indices.setdefault(adapter.uid, (adapter.weights, []))[1].extend(range(offset, offset + length))
                offset += length
            self.groups = tuple((weights, self.torch.tensor(rows, device=self.device))
                                for weights, rows in indices.values())
        try:
            yield
        finally:
            self.groups = ()


def load_lora(torch: Any, model: Any, rows: LoraRows, spec: AdapterSpec) -> LoraWeights:
    """``spec``'s factors on the model's device and dtype, checked against the model; wraps the modules it adapts."""
    state = _read_state(torch, spec)
    dtype = next(model.parameters()).dtype
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in state.items():
        module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        factor = part.split(".")[0]  # "A.weight" or "A.<adapter name>.weight"
        if factor not in ("A", "B") or not module:
            raise _refused(spec, f"weight {key} is not a LoRA factor (lora_A or lora_B); only LoRA weights are "
                                 "supported")
        pairs.setdefault(module, {})[factor] = tensor
    if not pairs:
        raise _refused(spec, "its weights hold no lora_A/lora_B factors")
    weights = LoraWeights()
    for name, factors in sorted(pairs.items()):
        base = _target(model, spec, name)
        a, b = factors.get("A"), factors.get("B")
        in_features, out_features = _features(base)
        if a is None or b is None or a.shape != (spec.rank, in_features) or b.shape != (out_features, spec.rank):
            shapes = [tuple(f.shape) if f is not None else None for f in (a, b)]
            raise _refused(spec, f"module {name} of this model is {in_features} -> {out_features} but the "
                                 f"adapter's factors are {shapes} at rank {spec.rank}: it was trained for another base "
                                 f"model ({spec.base_model or 'not named'})")
        device = _device(base)
        weights.modules[name] = (a.to(device, dtype).contiguous(), b.to(device, dtype).contiguous(), spec.scaling)
        weights.bytes += (a.numel() + b.numel()) * dtype.itemsize
    for name in weights.modules:
        _wrap(torch, model, name, rows)
    return weights


def _read_state(torch: Any, spec: AdapterSpec) -> dict[str, Any]:
    path = os.path.join(spec.src, "adapter_model.safetensors")
    if os.path.isfile(path):
        from safetensors.torch import load_file

        return load_file(path)
    path = os.path.join(spec.src, "adapter_model.bin")
    if os.path.isfile(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    raise _refused(spec, "no adapter_model.safetensors or adapter_model.bin in its folder")


def _target(model: Any, spec: AdapterSpec, name: str) -> Any:
    if any(part in REFUSED for part in name.split(".")):
        raise _refused(spec, f"target module {name} is not supported: adapters here may adapt the linear layers of "
                             "the decoder, not the embeddings or the output projection")
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise _refused(spec, f"this model has no module {name}: it was trained for another base model "
                             f"({spec.base_model or 'not named'})") from None
    module = getattr(module, "lora_base", module)  # wrapped already by another adapter
    try:
        _features(module)
    except ValueError:
        raise _refused(spec, f"target module {name} ({type(module).__name__}) is not a linear layer; only linear "
                             "layers are supported") from None
    return module


def _features(module: Any) -> tuple[int, int]:
    if isinstance(getattr(module, "in_features", None), int) and isinstance(getattr(module, "out_features", None), int):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if weight is not None and weight.dim() == 2 and type(module).__name__ != "Embedding":
        return int(weight.shape[1]), int(weight.shape[0])
    raise ValueError(type(module).__name__)


def _device(module: Any) -> Any:
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return "cpu"


def _refused(spec: AdapterSpec, why: str) -> InvalidRequest:
    return InvalidRequest(f"adapter {spec.name} ({spec.src}): {why}", field="src", value=spec.src)


def _wrap(torch: Any, model: Any, name: str, rows: LoraRows) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    module = getattr(parent, child)
    if not hasattr(module, "lora_base"):
        setattr(parent, child, _linear_class(torch)(module, name, rows))


_LINEAR: Any = None


def _linear_class(torch: Any) -> Any:
    global _LINEAR
    if _LINEAR is None:
        class LoraLinear(torch.nn.Module):
            """A linear layer plus, for the tokens of each adapter that adapts it, that adapter's low-rank
            product (peft's order: base output + B(A(x)) * scaling)."""

            def __init__(self, base: Any, name: str, rows: LoraRows):
                super().__init__()
                self.lora_base, self.lora_name, self.lora_rows = base, name, rows

            def forward(self, x: Any) -> Any:
                out = self.lora_base(x)
                groups = self.lora_rows.groups
                if not groups:
                    return out
                linear = torch.nn.functional.linear
                for weights, index in groups:
                    factors = weights.modules.get(self.lora_name)
                    if factors is None:
                        continue
                    a, b, scaling = factors
                    if index is None:
                        out = out + linear(linear(x, a), b) * scaling
                    else:
                        flat = out.reshape(-1, out.shape[-1])
                        rows = x.reshape(-1, x.shape[-1]).index_select(0, index)
                        out = flat.index_add(0, index, linear(linear(rows, a), b) * scaling).view(out.shape)
                return out

        _LINEAR = LoraLinear
    return _LINEAR
