"""Does the model fit the instance? TP degree, heads, accelerator memory, model copies, host RAM.

A TP degree passes when the instance has it, the runtime's neuronx planner accepts it (GPT-J and
GPT-NeoX cannot pad heads, for one) and the model fits the memory it leaves per core.

Memory per NeuronCore (16 GiB) or GPU is weights plus the KV cache, both split over the TP degree,
against the device memory less ``HEADROOM`` for compiled graphs (one per bucket), scratch and
runtime buffers on Neuron, or the CUDA context and activations on GPUs. No source gives a margin;
10 % is our choice (reference ``neuron.md`` §3.4). When a TP degree fails, the hint lists the
degrees (or, failing those, the instances) that pass every TP-dependent check.
"""

from __future__ import annotations

from dataclasses import replace

from lmi_handlers.backends.registry import BACKENDS
from lmi_handlers.config import ConfigError

from ..instances import INSTANCES, Instance
from .findings import Finding, Target, flag
from .runtime import plan_at
from .sizing import DTYPE_BYTES, GIB, Footprint, HeadLayout, footprint, gib
from .sizing import head_layout as layout_of

HEADROOM = 0.10
WARN_FRACTION = 0.80
HOST_WARN_FRACTION = 0.80
# Not in the documented Neuron topologies, yet DJLServing's CI runs it (reference neuron.md §3.1).
UNDOCUMENTED_NEURON_TP = 12


def unit(instance: Instance, plural: bool = True) -> str:
    if instance.kind == "neuron":
        return "NeuronCores" if plural else "NeuronCore"
    return f"{instance.gpu} GPUs" if plural else f"{instance.gpu} GPU"


def layout_name(target: Target) -> str:
    """How the backend spreads the heads on this instance's kind of device (its registry entry's ``head_layout``;
    the fit checks run only where the backend runs on the instance)."""
    return BACKENDS[target.backend].head_layout.get(target.instance.kind, "layers")


def head_layout(target: Target, tp: int) -> HeadLayout:
    assert target.arch is not None
    return layout_of(layout_name(target), target.arch, tp, target.props.get("group_query_attention"), (target.batch,))


def memory(target: Target, tp: int) -> Footprint:
    """Weights plus the KV cache the load plan sizes (``kv_tokens``), or one full-length row per sequence."""
    assert target.arch is not None
    usage = footprint(target.arch, head_layout(target, tp), target.dtype, target.batch, target.positions, target.int8)
    return replace(usage, kv_tokens=target.kv_tokens) if target.kv_tokens else usage


def check_tp(target: Target, tp: int) -> Finding:
    instance = target.instance
    if tp > instance.cores:
        return Finding("error", "tensor parallel", f"tensor_parallel_degree={tp} needs {tp} {unit(instance)}; "
                       f"{instance.name} has {instance.cores}")
    if instance.kind == "neuron" and tp not in instance.tp_degrees:
        if tp == UNDOCUMENTED_NEURON_TP:
            return Finding("warning", "tensor parallel", f"TP {tp} is not a documented Neuron topology "
                           f"({_join(instance.tp_degrees)} on {instance.name}), although DJLServing's CI runs it")
        return Finding("error", "tensor parallel", f"tensor_parallel_degree={tp} is not a degree the Neuron "
                       f"runtime supports on {instance.name}: it shards over {_join(instance.tp_degrees)} "
                       f"of its {instance.cores} NeuronCores")
    return Finding("ok", "tensor parallel", f"TP {tp} of {instance.cores} {unit(instance)}")


def check_heads(target: Target, tp: int) -> list[Finding]:
    arch = target.arch
    assert arch is not None
    layout = head_layout(target, tp)
    if tp == 1 and layout_name(target) != "padded":
        return [Finding("ok", "attention heads", f"{arch.heads} heads on one GPU")]
    if layout_name(target) == "layers":
        return [Finding("ok", "attention heads", f"the {target.backend} backend splits layers over GPUs "
                        "(device_map=auto), so heads need not divide the TP degree")]
    if layout_name(target) == "heads":  # the plan refuses a degree that does not divide the heads
        copied = f"; its {arch.kv_heads} KV heads are copied to each GPU" if arch.kv_heads < tp else ""
        return [Finding("ok", "attention heads", f"the {target.backend} backend splits the {arch.heads} attention "
                        f"heads over TP {tp}{copied}")]
    findings = []
    if arch.gqa and layout.replicated:
        findings.append(Finding("warning", "attention heads", f"{arch.kv_heads} KV heads do not shard over TP {tp}: "
                                f"replicated-heads copies them to {layout.effective_kv_heads}, so the KV cache is "
                                f"{layout.effective_kv_heads / arch.kv_heads:.1f}x larger"))
    requested = target.props.get("group_query_attention")
    if requested and arch.gqa and layout.gqa_mode != requested:
        findings.append(Finding("warning", "attention heads", f"group_query_attention={requested} does not apply "
                                f"at TP {tp}; transformers-neuronx falls back to {layout.gqa_mode}"))
    if not findings and not layout.padded:  # padded Q heads: the planner's own warning says so
        per_core = f"{layout.padded_heads // tp} Q / {max(layout.effective_kv_heads // tp, 1)} KV heads per core"
        findings.append(Finding("ok", "attention heads", f"{arch.heads} Q / {arch.kv_heads} KV heads over TP {tp}: "
                                f"{per_core}"))
    return findings


def check_memory(target: Target, tp: int) -> Finding:
    usage = memory(target, tp)
    capacity = target.instance.memory_per_core_gib * GIB
    share = usage.per_device / capacity
    text = (f"per {unit(target.instance, False)}: weights {gib(usage.weights / tp)} + KV cache "
            f"{gib(usage.kv_cache / tp)} = {gib(usage.per_device)} of {gib(capacity)} ({share:.0%}); KV for "
            f"{kv_tokens(target, usage)} at {human_bytes(usage.kv_per_token)}/token")
    if share > 1 - HEADROOM:
        return Finding("error", "memory", f"{text}, over the {1 - HEADROOM:.0%} usable")
    if share > WARN_FRACTION:
        return Finding("warning", "memory", f"{text}: little room for compiled graphs and buffers",
                       "lower the batch size or sequence length, or raise the TP degree")
    return Finding("ok", "memory", text)


def planner_refusal(target: Target, tp: int) -> Finding | None:
    """The backend's load plan's refusal of this TP degree, if it refuses it."""
    if BACKENDS[target.backend].plan is None or target.config is None or target.model_config is None:
        return None
    try:
        plan_at(target, tp)
    except ConfigError as exc:
        return Finding("error", target.backend, str(exc))
    return None


def tp_findings(target: Target, tp: int) -> list[Finding]:
    findings = [check_tp(target, tp)]
    if findings[0].level == "error":
        return findings
    refusal = planner_refusal(target, tp)
    if refusal is not None:
        return findings + [refusal]
    findings.extend(check_heads(target, tp))
    if not any(f.level == "error" for f in findings):
        findings.append(check_memory(target, tp))
    return findings


def working_tp_degrees(target: Target) -> list[int]:
    """The instance's TP degrees that pass the TP, heads and memory checks."""
    return [tp for tp in target.instance.tp_degrees if not any(f.level == "error" for f in tp_findings(target, tp))]


def alternatives(target: Target) -> str:
    degrees = working_tp_degrees(target)
    if degrees:
        return f"TP degrees that fit on {target.instance.name}: {_join(degrees)}"
    family = target.instance.family
    options = []
    unpriced = float("inf")
    for other in sorted(INSTANCES.values(), key=lambda i: (i.cores, i.price_per_hour or unpriced)):
        if other.name.startswith(family + ".") and other.cores > target.instance.cores:
            fitting = working_tp_degrees(replace(target, instance=other))
            if fitting:
                options.append(f"{other.name} (TP {_join(fitting)})")
    if options:
        return f"nothing fits on {target.instance.name}; it fits on {', '.join(options[:2])}"
    return (f"nothing fits on any {family} instance at this batch size and sequence length; lower them, "
            "or quantize (option.quantize=static_int8 on neuronx)")


def fit_checks(target: Target) -> list[Finding]:
    findings = tp_findings(target, target.tp)
    if any(f.level == "error" for f in findings):
        hint = alternatives(target)
        findings = [replace(f, hint=hint) if f.level == "error" else f for f in findings]
        return findings
    findings.append(check_copies(target))
    findings.append(check_host_memory(target))
    return findings


def copies(target: Target) -> int:
    return target.instance.cores // target.tp


def check_copies(target: Target) -> Finding:
    instance, tp, count = target.instance, target.tp, copies(target)
    idle = instance.cores - count * tp
    text = f"{count} model {'copy' if count == 1 else 'copies'} of TP {tp} on {instance.cores} {unit(instance)}"
    if idle:
        return Finding("warning", "model copies", f"{text}; {idle} {unit(instance)} idle",
                       f"a TP degree that divides {instance.cores} uses them all")
    if count > 1 and instance.kind == "neuron":
        text += "; each loads and compiles on its own (the Neuron persistent cache or compiled_graph_path helps)"
    return Finding("ok", "model copies", text)


def loading_bytes(target: Target) -> int:
    """Host RAM to load one copy: the checkpoint as stored, or the serving dtype when larger."""
    arch = target.arch
    assert arch is not None
    stored = DTYPE_BYTES.get(arch.checkpoint_dtype or target.dtype, 4)
    per_copy = arch.parameters().total * max(stored, DTYPE_BYTES[target.dtype])
    return per_copy * (copies(target) if flag(target.props, "parallel_loading") else 1)


def check_host_memory(target: Target) -> Finding:
    need, host = loading_bytes(target), target.instance.host_memory_gib * GIB
    parallel = " (parallel_loading: all copies at once)" if flag(target.props, "parallel_loading") else ""
    text = f"loading needs about {gib(need)} of host RAM{parallel}; {target.instance.name} has {gib(host)}"
    if need > host * HOST_WARN_FRACTION:
        bigger = [i.name for i in INSTANCES.values() if i.kind == target.instance.kind and i.cores >= target.tp
                  and i.host_memory_gib * GIB * HOST_WARN_FRACTION >= need]
        hint = "weights are read layer by layer where the checkpoint allows, but the OS, Python and the compiler " \
               "need room too" + (f"; more host RAM: {', '.join(bigger[:2])}" if bigger else "")
        return Finding("warning", "host memory", text, hint)
    return Finding("ok", "host memory", text)


def figures(target: Target) -> dict[str, str]:
    arch, tp = target.arch, target.tp
    assert arch is not None
    count = arch.parameters().total
    usage, layout = memory(target, tp), head_layout(target, tp)
    return {
        "parameters": f"{count:,} ({count / 1e9:.2f} B)",
        "weights": f"{gib(usage.weights)} ({'int8 + ' if target.int8 else ''}{target.dtype})",
        "heads per copy": f"{layout.padded_heads} Q / {layout.effective_kv_heads} KV (model: {arch.heads} / "
                          f"{arch.kv_heads})",
        "kv cache per token": f"{usage.kv_per_token:,} B ({human_bytes(usage.kv_per_token)})",
        "kv cache": f"{gib(usage.kv_cache)} ({kv_tokens(target, usage)})",
        f"per {unit(target.instance, False)}": f"{gib(usage.per_device)} of "
                                               f"{target.instance.memory_per_core_gib} GiB",
        "model copies": f"{copies(target)} x TP {tp}",
        "host RAM to load": gib(loading_bytes(target)),
    }


def kv_tokens(target: Target, usage: Footprint) -> str:
    """The KV cache's tokens: one full-length row per sequence, or the pool the plan sizes."""
    rows = f"{target.batch} x {target.positions} tokens"
    if usage.kv_tokens == target.batch * target.positions:
        return rows
    return (f"a pool of {usage.kv_tokens:,} tokens: {usage.kv_tokens // target.positions} of {target.batch} "
            f"sequences at full length ({target.positions} tokens) at once")


def human_bytes(value: float) -> str:
    for suffix, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:.4g} {suffix}"
    return f"{value:.0f} B"


def _join(values) -> str:
    return ", ".join(str(v) for v in values)
