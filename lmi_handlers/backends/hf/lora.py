"""LoRA adapters on the transformers backend: each adapter's low-rank product applied to its own rows.

An adapter's weights (peft's ``adapter_model.safetensors`` or ``.bin``) load into ``LoraWeights``: per adapted
module, ``A`` (``[rank, in]``), ``B`` (``[out, rank]``) and the scaling. The first adapter that adapts a module
wraps it (``LoraLinear``); the base weights are never merged or changed. Before each forward the runner says
which tokens belong to which adapter (``LoraRows.select``: runs of consecutive tokens, as the forward lays them
out); a wrapped module then adds ``B(A(x)) * scaling`` to the outputs of each adapter's tokens, in the order
peft's ``lora.Linear`` does, and zero to base-model tokens. A batch with several adapters does this in two
products per module for all its tokens (``LoraRows``), not one per adapter. A batch without adapters runs the
base modules alone.

Refused at registration, naming the adapter: a target that is not a linear layer of the decoder (embeddings,
the output projection), a name in ``target_modules`` or a weight's module that the model does not have, shapes
that do not match the model (an adapter trained for another base model), or a weights file that does not load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ...adapters import WEIGHTS, AdapterSpec
from ...errors import InvalidRequest

logger = logging.getLogger(__name__)

#: Modules a LoRA may not adapt here: the input embeddings and the output projection (tied, sliced or compiled).
REFUSED = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out")


@dataclass
class LoraWeights:
    """One adapter's factors by module name: (A, B, scaling)."""

    modules: dict[str, tuple[Any, Any, float]] = field(default_factory=dict)
    bytes: int = 0
    rank: int = 0
    scaling: float = 1.0


class LoraRows:
    """Which tokens of the current forward belong to which adapter; shared by every wrapped module.

    A forward whose tokens all belong to one adapter applies that adapter's factors as they are. Otherwise the
    factors of the batch's distinct adapters are concatenated along the rank, so that every module does two
    products for the whole batch however many adapters it holds: ``x @ A_cat^T``, masked to the columns of each
    token's own adapter, then ``@ B_cat^T`` and each token's scaling. Base-model tokens mask every column and add
    zero. The concatenations are kept for the last few sets of adapters (``KEEP``), since a busy batch keeps its
    set for many steps.
    """

    KEEP = 4

    def __init__(self, torch: Any, device: Any, dtype: Any):
        self.torch, self.device, self.dtype = torch, device, dtype
        #: The adapter of every token (uniform) or the batch's adapters with the tokens' masks; None for the base.
        self.current: LoraBatch | None = None
        self._stacks: dict[tuple[int, ...], dict[str, Any]] = {}

    @contextlib.contextmanager
    def select(self, adapters: Sequence[Any], lengths: Sequence[int]) -> Iterator[None]:
        """For one forward: ``adapters[i]`` (an ``adapters.Adapter`` or None) owns the ``lengths[i]`` tokens after
        those of the runs before it, in the flattened order of the forward's input ids."""
        if all(a is None for a in adapters):
            yield
            return
        first = adapters[0]
        self.current = LoraBatch(first.weights) if all(a is first for a in adapters) else \
            self._mixed(adapters, lengths)
        try:
            yield
        finally:
            self.current = None

    def _mixed(self, adapters: Sequence[Any], lengths: Sequence[int]) -> LoraBatch:
        torch = self.torch
        distinct = sorted({a.uid: a for a in adapters if a is not None}.values(), key=lambda a: a.uid)
        position = {a.uid: i for i, a in enumerate(distinct)}
        base = len(distinct)  # base-model tokens: no column, scaling 0
        owner = torch.repeat_interleave(torch.tensor([base if a is None else position[a.uid] for a in adapters]),
                                        torch.tensor(list(lengths)))
        columns = torch.repeat_interleave(torch.arange(base), torch.tensor([a.spec.rank for a in distinct]))
        scaling = torch.tensor([a.weights.scaling for a in distinct] + [0.0], dtype=self.dtype)
        key = tuple(a.uid for a in distinct)
        stacks = self._stacks.pop(key, None) or {}
        self._stacks[key] = stacks  # most recent last
        while len(self._stacks) > self.KEEP:
            del self._stacks[next(iter(self._stacks))]
        return LoraBatch(None, [a.weights for a in distinct], stacks,
                         (owner[:, None] == columns[None, :]).to(self.device),
                         scaling[owner][:, None].to(self.device))


@dataclass
class LoraBatch:
    """One forward's adapters: ``uniform`` when every token has that one adapter; else the distinct adapters'
    weights, their factors concatenated by module (filled as modules ask), each token's column mask ``[tokens,
    total rank]`` and scaling ``[tokens, 1]``."""

    uniform: LoraWeights | None
    adapters: list[LoraWeights] = field(default_factory=list)
    stacks: dict[str, Any] = field(default_factory=dict)
    mask: Any = None
    scaling: Any = None

    def stacked(self, torch: Any, name: str) -> tuple[Any, Any] | None:
        """The module's ``(A_cat, B_cat)`` over the batch's adapters (zeros for one that does not adapt it), or
        None when none of them adapts it."""
        if name not in self.stacks:
            present = [w.modules[name] for w in self.adapters if name in w.modules]
            if not present:
                self.stacks[name] = None
            else:
                a0, b0, _ = present[0]
                factors = [w.modules.get(name) or (a0.new_zeros(w.rank, a0.shape[1]), b0.new_zeros(b0.shape[0], w.rank),
                                                   0.0) for w in self.adapters]
                self.stacks[name] = (torch.cat([f[0] for f in factors]), torch.cat([f[1] for f in factors], dim=1))
        return self.stacks[name]


def load_lora(torch: Any, model: Any, rows: LoraRows, spec: AdapterSpec) -> LoraWeights:
    """``spec``'s factors on the model's device and dtype, checked against the model; wraps the modules it adapts."""
    _check_targets(model, spec)
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
    weights = LoraWeights(rank=spec.rank, scaling=spec.scaling)
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
    """The adapter's tensors by name; its file was checked at registration (``adapters.read_adapter``), yet a file
    can still fail to load (a tensor's bytes that do not fit its dtype): a 400 naming the adapter and the file."""
    name = WEIGHTS[0] if os.path.isfile(os.path.join(spec.src, WEIGHTS[0])) else WEIGHTS[1]
    try:
        if name == WEIGHTS[0]:
            from safetensors.torch import load_file

            state = load_file(os.path.join(spec.src, name))
        else:
            state = torch.load(os.path.join(spec.src, name), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the loaders raise on a bad file is the file's fault: name it
        raise _refused(spec, f"{name} cannot be loaded: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise _refused(spec, f"{name} does not hold a mapping of names to tensors")
    return state


def _check_targets(model: Any, spec: AdapterSpec) -> None:
    """Every name in ``target_modules`` names modules of this model, matched as peft matches them (a module's full
    name, or its last parts after a dot; a string config is a pattern of whole names); ``all-linear`` matches any
    model. peft itself skips a listed name that matches nothing; here it means another base model."""
    names = [name for name, _ in model.named_modules() if name and not name.endswith(".lora_base")]
    if spec.pattern is not None:
        try:
            pattern = re.compile(spec.pattern)
        except re.error as exc:
            raise _refused(spec, f"target_modules {spec.pattern!r} is not a regular expression ({exc})") from None
        if spec.pattern != "all-linear" and not any(pattern.fullmatch(name) for name in names):
            raise _refused(spec, f"target_modules {spec.pattern!r} matches no module of this model: it was trained "
                                 f"for another base model ({spec.base_model or 'not named'})")
        return
    missing = [t for t in spec.targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_linear(module)})
        raise _refused(spec, f"target_modules names {', '.join(missing)}, which this model does not have (its "
                             f"linear layers: {', '.join(linear[:20])}): it was trained for another base model "
                             f"({spec.base_model or 'not named'})")


def _is_linear(module: Any) -> bool:
    try:
        _features(module)
    except (ValueError, AttributeError):
        return False
    return True


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
                batch = self.lora_rows.current
                if batch is None:
                    return out
                linear = torch.nn.functional.linear
                if batch.uniform is not None:
                    factors = batch.uniform.modules.get(self.lora_name)
                    if factors is None:
                        return out
                    a, b, scaling = factors
                    return out + linear(linear(x, a), b) * scaling
                stacked = batch.stacked(torch, self.lora_name)
                if stacked is None:
                    return out
                a, b = stacked
                low = linear(x.reshape(-1, x.shape[-1]), a).mul_(batch.mask)
                return out + (linear(low, b) * batch.scaling).view(out.shape)

        _LINEAR = LoraLinear
    return _LINEAR
