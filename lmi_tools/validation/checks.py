"""The configuration checks of ``lmi validate`` (hardware fit lives in ``fit.py``).

Each check takes the resolved ``Target`` and returns findings. What the runtime itself refuses or warns
about comes from the runtime (``runtime.py``); the rules here are the ones no runtime code holds:
DJLServing's (``reference/djl-contract.md`` §1.2-1.5 and §7: entry point, rolling batch, keys), the
instance's, and transformers-neuronx's accuracy notes (``reference/neuron.md`` §3); see
``docs/configuration.md``.
"""

from __future__ import annotations

from pathlib import Path

from lmi_handlers.backends.registry import BACKENDS, hosts
from lmi_handlers.config import ConfigError, parse_bool
from lmi_handlers.mode import RECOMMENDER_SINCE, Mode, java_true

from .adapters import check_adapters
from .entry_point import EntryPoint, resolve
from .findings import Finding, Target, flag
from .pooling import pooling_findings
from .fit import alternatives, fit_checks
from ..modeldir.handler_config import CONTAINER_MODEL_DIR

# Boolean options no runtime code parses: DJLServing's, and one the neuronx backend only logs about.
UNPARSED_BOOLEANS = ("low_cpu_mem_usage", "parallel_loading")
# Known accuracy issues of transformers-neuronx with 16-bit weights (release notes, neuron.md §1.11):
# (model_type, hidden_size, layers) -> compiler options to add.
ACCURACY_FLAGS = {
    ("llama", 5120, 40): ("enable_saturate_infinity", "enable_mixed_precision_accumulation"),  # Llama-2-13B
    ("llama", 8192, 80): ("enable_mixed_precision_accumulation",),  # Llama-2-70B
}


def run_checks(target: Target) -> list[Finding]:
    findings = [check_entry_point(target), *check_mode(target), *check_keys(target)]
    if target.config is None:
        return findings
    findings.append(check_model_source(target))
    backend = check_backend(target)
    findings.extend(backend)
    if not BACKENDS[target.backend].needs_model:
        findings.append(Finding("info", "hardware", f"{target.backend} backend: no weights, so the hardware checks "
                                                    "are skipped"))
        return findings
    pooled = pooling_findings(target)
    if pooled is not None:  # an embedding model: no KV cache to size
        return findings + pooled
    if target.refusal is not None:
        return findings + [refused(target, target.refusal)]
    if target.plan is not None:  # the runtime's own warnings, even where the hardware is wrong for the backend
        findings.extend(Finding("warning", target.backend, message) for message in target.plan.warnings)
    if any(f.level == "error" for f in backend) or target.arch is None:
        return findings
    findings.extend(check_positions(target))
    findings.extend(check_batching(target))
    findings.extend(check_dtype(target))
    findings.extend(fit_checks(target))
    findings.extend(check_adapters(target))
    return findings


def entry_point_of(model_dir: Path, props: dict[str, str]) -> EntryPoint:
    def exists(rel: str) -> bool:
        return (model_dir / rel).is_file()

    def read(rel: str) -> str:
        return (model_dir / rel).read_text(encoding="utf-8", errors="replace")

    return resolve(props.get("entryPoint"), exists, read, runtime_vendored=False)


def check_entry_point(target: Target) -> Finding:
    result = entry_point_of(target.model_dir, target.props)
    engine = target.props.get("engine")
    if result.ok and engine not in (None, "Python"):
        return Finding("error", "entry point", f"engine={engine}: only the Python engine runs lmi_handlers",
                       "set engine=Python")
    if result.ok and engine is None:
        return Finding("warning", "entry point", f"{result.detail}; engine is not set, DJLServing infers it",
                       "add engine=Python")
    return Finding("ok" if result.ok else "error", "entry point", result.detail, result.hint)


def check_mode(target: Target) -> list[Finding]:
    """Which of DJL's Python engines the target image runs the model with (the resolver's ``Settings.mode``), and
    whether the entry point answers that engine: ``lmi_handlers`` answers both; a ``handle`` of the model's own must
    be ``async def`` for the async engine and plain for the sync one."""
    image, mode = target.image, target.mode
    if image is None or mode is None:
        return []  # an image line it does not know: load_target said so
    entry = entry_point_of(target.model_dir, target.props)
    ignored = "async_mode" in target.props and java_true(target.props["async_mode"]) and not mode.asynchronous
    findings = [Finding("warning" if ignored else "info", "mode", f"{image}: DJL's {mode.name} engine ({mode.reason})",
                        "use an image from DJL 0.33.0 (LMI v15) on for async mode" if ignored else "")]
    if entry.own_handle and entry.async_handle != mode.asynchronous:
        findings.append(Finding("error", "mode", _own_handle_mismatch(mode.asynchronous), _mode_hint(mode)))
    # DJL's batching beside the async engine; the settings hold the recommender's writes as Java passes them on
    conflict = target.config.async_conflict() if mode.asynchronous and target.config is not None else None
    if conflict is not None:
        findings.append(Finding("error", "mode", str(conflict), "async mode batches in the handler's engine, up to "
                                "option.max_rolling_batch_size sequences"))
    return findings


def _own_handle_mismatch(asynchronous: bool) -> str:
    if asynchronous:
        return ("model.py defines a plain handle(), but DJL's async engine awaits handle: every request would fail "
                "with a 424 ('object Output can't be used in await expression')")
    return "model.py defines an async handle(), but DJL's sync engine calls handle and cannot await its answer"


def _mode_hint(mode: Mode) -> str:
    if mode.asynchronous:
        return ("write 'async def handle(inputs)' answering djl_python.async_utils' outputs, or import handle from "
                "lmi_handlers.entrypoint (it answers both engines); or keep the sync engine: option.async_mode=false "
                "and option.rolling_batch set explicitly (e.g. disable), which keeps LMI's recommender off")
    return "set option.async_mode=true (DJL 0.33.0 on), or write a plain 'def handle(inputs)'"


def check_keys(target: Target) -> list[Finding]:
    if target.choice is None:
        return []  # no backend resolved for the instance: the properties or backend check says why
    backend = target.choice.backend.name
    findings = [Finding("warning", "options", message, "remove it or fix its name")
                for message in target.choice.unknown_keys()]
    for key in UNPARSED_BOOLEANS:
        try:
            parse_bool(target.props, key, False)
        except ConfigError as exc:
            findings.append(Finding("error", "options", str(exc), f"use option.{key}=true or false"))
    for key, value in sorted(target.props.items()):
        if value != value.rstrip():
            findings.append(Finding("warning", "options", f"{key} ends in whitespace, which DJLServing keeps as "
                                    "part of the value", "remove the trailing spaces"))
    if target.non_ascii:
        findings.append(Finding("warning", "options", "serving.properties has non-ASCII characters; DJLServing "
                                "reads it as ISO-8859-1", "write them as \\uXXXX escapes"))
    return findings or [Finding("ok", "options", f"every option is one {backend} reads")]


def check_model_source(target: Target) -> Finding:
    assert target.config is not None
    model_id, resolved = target.props.get("model_id", ""), target.config.model_id
    if not model_id:
        return Finding("ok", "weights", "weights in the model directory itself")
    if model_id.startswith("s3://"):
        return Finding("info", "weights", f"DJLServing downloads {model_id} before the handler loads")
    if Path(resolved).is_dir():
        return Finding("ok", "weights", f"local directory {resolved}")
    if Path(model_id).is_absolute():
        return Finding("warning", "weights", f"{model_id} is an absolute path that does not exist on this machine; "
                       "the handler loads it only if it exists in the container (it is not a hub id)",
                       f"use a path relative to the model directory, or {CONTAINER_MODEL_DIR}/... for the model "
                       "directory as the container mounts it")
    return Finding("info", "weights", f"{model_id} is downloaded from the Hugging Face hub at load time",
                   "the container needs internet access (and HF_TOKEN for gated models), or give a local "
                   "directory or s3:// prefix")


def check_backend(target: Target) -> list[Finding]:
    instance, backend = target.instance, BACKENDS[target.backend]
    if not backend.runs_on(instance.family):
        return [Finding("error", "backend", backend.not_on(instance.name),
                        f"use option.backend={' or '.join(hosts(instance.family))} (or auto) on {instance.name}")]
    arch = target.arch
    if arch is None:
        return []
    if arch.estimated:
        return [Finding("warning", "backend", f"model_type {arch.model_type!r} is not one lmi knows: sized as a "
                        "Llama-style decoder, so the figures are estimates")]
    return [Finding("ok", "backend", f"{backend.name} on {instance.name} for {arch.model_type}")]


def refused(target: Target, exc: ConfigError) -> Finding:
    """The backend refuses these settings at load (its options or its load plan): the model would not load."""
    hint = alternatives(target) if exc.key == "tensor_parallel_degree" else \
        f"the {target.backend} backend refuses to load with this (its options or load plan)"
    return Finding("error", target.backend, str(exc), hint)


def check_positions(target: Target) -> list[Finding]:
    """The sequence length the load plan settles on, against the model's positions and the option that bounds it."""
    arch, positions, key = target.arch, target.positions, BACKENDS[target.backend].length_key
    assert arch is not None and target.config is not None
    if not target.positions_set:
        # Where every sequence holds a full-length row, the length decides memory (and compiled graphs).
        level = "warning" if positions < arch.max_positions or getattr(target.plan, "static_kv", False) else "info"
        return [Finding(level, "sequence length", f"option.{key} is not set: the {target.backend} backend plans for "
                        f"{positions} tokens per sequence (the model has {arch.max_positions} positions)",
                        f"set option.{key} to the longest prompt + output you serve")]
    wanted = int(target.props[key])
    if positions > arch.max_positions:
        return []  # the plan's own warning or refusal says it
    if wanted > positions:
        return [Finding("warning", "sequence length", f"option.{key}={wanted} is beyond the {positions} tokens per "
                        f"sequence the {target.backend} backend plans for (the model has {arch.max_positions} "
                        f"positions{_window(target)}): it caps it there", f"use option.{key} <= {positions}")]
    return [Finding("ok", "sequence length", f"option.{key}={wanted} <= {arch.max_positions}")]


def _window(target: Target) -> str:
    window = (target.model_config or {}).get("sliding_window")
    return f", a sliding window of {window}" if isinstance(window, int) and window == target.positions else ""


def check_batching(target: Target) -> list[Finding]:
    config, arch = target.config, target.arch
    assert config is not None and arch is not None
    raw = target.props.get("rolling_batch")
    findings = []
    image = target.image
    auto = raw.strip().lower() == "auto" if raw is not None else "tnx" not in getattr(image, "features", "tnx")
    if auto and image is not None and image.release < RECOMMENDER_SINCE:
        # Before DJL 0.35 the recommender rewrites auto (the default, but on transformers-neuronx images) into an
        # engine of LMI's own handlers; from 0.35 on it turns async mode on instead (check_mode says so).
        written = "=auto" if raw is not None else " is not set (auto)"
        findings.append(Finding("warning", "batching", f"option.rolling_batch{written}: {image}'s LMI recommender "
                                "rewrites auto to its own engine (tnx, lmi-dist, vllm) when it finds a config.json, "
                                "and lmi_handlers refuses lmi-dist", "use option.rolling_batch=scheduler (the same "
                                "continuous batching here, left alone by DJLServing)"))
    if config.continuous:  # the batch the backend runs, as its plan says (vllm: max_num_seqs, which LMI sends)
        how = "async mode, the handler's engine batching requests" if config.async_mode else "rolling batch"
        batch = target.batch if target.plan is not None else config.max_rolling_batch_size
        findings.append(Finding("ok", "batching", f"{how}: up to {batch} sequences per step"))
        plan = target.plan
        if plan is not None and plan.batch_size > 1 and not getattr(plan, "continuous_batching", True):
            findings.append(Finding("warning", "batching", f"the {target.backend} backend runs {arch.model_type} "
                                    "without continuous batching (transformers-neuronx has it for few architectures): "
                                    "sequences cannot join a running batch cheaply",
                                    "use batch_size (dynamic batching) for this model"))
    else:
        delay = target.props.get("max_batch_delay", "100")
        findings.append(Finding("ok", "batching", f"dynamic batching: up to {config.batch_size} requests per call "
                                f"(max_batch_delay {delay} ms)" if config.batch_size > 1 else
                                "one request at a time (no batching)"))
    return findings


def check_dtype(target: Target) -> list[Finding]:
    arch, dtype, props = target.arch, target.dtype, target.props
    assert arch is not None and target.config is not None
    stored = arch.checkpoint_dtype or "unknown"
    detail = f"dtype {dtype}" + (" (auto)" if target.config.dtype == "auto" else "") + f", checkpoint {stored}"
    findings = []
    if target.int8:
        findings.append(Finding("ok", "dtype", f"{detail}; int8 weight storage (layers' matrices), KV cache {dtype}"))
    elif flag(props, "load_in_8bit") and "load_in_8bit" not in BACKENDS[target.backend].keys:
        findings.append(Finding("warning", "dtype", f"the {target.backend} backend does not read load_in_8bit; it "
                                f"loads {dtype} weights", f"use option.quantize=static_int8 for int8 weights on "
                                f"{target.backend}"))
    else:
        findings.append(Finding("ok", "dtype", detail))
    if dtype == "fp16" and stored == "bf16":
        findings.append(Finding("warning", "dtype", "the checkpoint is bfloat16; fp16 has a smaller range and "
                                "can overflow in some layers", "prefer option.dtype=bf16"))
    if dtype == "fp32":
        findings.append(Finding("warning", "dtype", "fp32 doubles weight and KV memory and is slower",
                                "use bf16 or fp16 unless the model needs fp32"))
    findings.extend(_neuron_accuracy(target))
    return findings


def _neuron_accuracy(target: Target) -> list[Finding]:
    arch = target.arch
    assert arch is not None
    flags = ACCURACY_FLAGS.get((arch.model_type, arch.hidden_size, arch.layers), ())
    if not set(flags) <= BACKENDS[target.backend].keys:  # the compiler options of transformers-neuronx
        return []
    missing = [f for f in flags if not flag(target.props, f)]
    if missing:
        return [Finding("warning", "dtype", "transformers-neuronx lists accuracy issues for this model shape "
                        "with 16-bit weights", " and ".join(f"option.{f}=true" for f in missing))]
    return []
