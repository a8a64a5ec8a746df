"""The configuration checks of ``lmi validate`` (hardware fit lives in ``fit.py``).

Each check takes the resolved ``Target`` and returns findings. Sources for every rule:
``reference/neuron.md`` §3 (Neuron rules), ``reference/djl-contract.md`` §1.2-1.5 and §7 (entry
point, rolling batch, keys); see ``docs/configuration.md``.
"""

from __future__ import annotations

from pathlib import Path

from lmi_handlers.config import FALSE_WORDS, TRUE_WORDS, check_unknown_keys

from .entry_point import resolve
from .fit import fit_checks
from .findings import Finding, Target, backend_option_keys, flag, quiet

# Model types transformers-neuronx has a model class for (NeuronAutoModelForCausalLM, tnx 0.11).
NEURONX_MODEL_TYPES = ("llama", "code_llama", "mistral", "mixtral", "opt", "gpt2", "gptj", "gpt_neox", "bloom")
# transformers-neuronx continuous batching exists for these only (reference neuron.md §1.10).
CONTINUOUS_BATCHING_TYPES = ("llama", "code_llama", "mistral")
# Known accuracy issues of transformers-neuronx with 16-bit weights (release notes, neuron.md §1.11):
# (model_type, hidden_size, layers) -> compiler options to add.
# Boolean options of the neuronx backend and the server that HandlerConfig does not parse itself.
BOOLEAN_KEYS = ("load_in_8bit", "enable_mixed_precision_accumulation", "enable_saturate_infinity", "fuse_qkv",
                "low_cpu_mem_usage", "parallel_loading")
ACCURACY_FLAGS = {
    ("llama", 5120, 40): ("enable_saturate_infinity", "enable_mixed_precision_accumulation"),  # Llama-2-13B
    ("llama", 8192, 80): ("enable_mixed_precision_accumulation",),  # Llama-2-70B
}


def run_checks(target: Target) -> list[Finding]:
    findings = [check_entry_point(target), *check_keys(target)]
    if target.config is None:
        return findings
    findings.append(check_model_source(target))
    backend = check_backend(target)
    findings.extend(backend)
    if target.backend == "scripted":
        findings.append(Finding("info", "hardware", "scripted backend: no weights, so the hardware checks are "
                                                    "skipped"))
        return findings
    if any(f.level == "error" for f in backend) or target.arch is None:
        return findings
    findings.extend(check_positions(target))
    findings.extend(check_batching(target))
    findings.extend(check_dtype(target))
    findings.extend(fit_checks(target))
    return findings


def check_entry_point(target: Target) -> Finding:
    root = target.model_dir

    def exists(rel: str) -> bool:
        return (root / rel).is_file()

    def read(rel: str) -> str:
        return (root / rel).read_text(encoding="utf-8", errors="replace")

    result = resolve(target.props.get("entryPoint"), exists, read, runtime_vendored=False)
    engine = target.props.get("engine")
    if result.ok and engine not in (None, "Python"):
        return Finding("error", "entry point", f"engine={engine}: only the Python engine runs lmi_handlers",
                       "set engine=Python")
    if result.ok and engine is None:
        return Finding("warning", "entry point", f"{result.detail}; engine is not set, DJLServing infers it",
                       "add engine=Python")
    return Finding("ok" if result.ok else "error", "entry point", result.detail, result.hint)


def check_keys(target: Target) -> list[Finding]:
    backend = target.props.get("backend", "auto").strip().lower()
    if backend == "auto":
        backend = "neuronx" if target.instance.kind == "neuron" else "hf"
    with quiet("lmi_handlers.config"):
        unknown = check_unknown_keys(target.props, backend_option_keys(backend))
    findings = [Finding("warning", "options", message, "remove it or fix its name") for message in unknown]
    for key in BOOLEAN_KEYS:
        value = target.props.get(key)
        if value is not None and value.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
            findings.append(Finding("error", "options", f"option.{key}={value} is not a boolean",
                                    f"use option.{key}=true or false"))
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
    return Finding("info", "weights", f"{model_id} is downloaded from the Hugging Face hub at load time",
                   "the container needs internet access (and HF_TOKEN for gated models), or give a local "
                   "directory or s3:// prefix")


def check_backend(target: Target) -> list[Finding]:
    kind, backend = target.instance.kind, target.backend
    if backend == "neuronx" and kind != "neuron":
        return [Finding("error", "backend", f"backend neuronx needs Inferentia2/Trainium; {target.instance.name} "
                        "has GPUs", "use option.backend=hf (or auto) on GPU instances")]
    if backend == "hf" and kind == "neuron":
        return [Finding("error", "backend", f"backend hf would run on the CPU of {target.instance.name}, not on "
                        "its NeuronCores", "use option.backend=neuronx (or auto)")]
    arch = target.arch
    if arch is None:
        return []
    if backend == "neuronx" and arch.model_type not in NEURONX_MODEL_TYPES:
        return [Finding("error", "backend", f"transformers-neuronx has no model class for model_type "
                        f"{arch.model_type!r}", f"supported: {', '.join(NEURONX_MODEL_TYPES)}; or serve it on a "
                        "GPU instance with the hf backend")]
    if arch.estimated:
        return [Finding("warning", "backend", f"model_type {arch.model_type!r} is not one lmi knows: sized as a "
                        "Llama-style decoder, so the figures are estimates")]
    return [Finding("ok", "backend", f"{backend} on {target.instance.name} for {arch.model_type}")]


def check_positions(target: Target) -> list[Finding]:
    arch, key, positions = target.arch, _positions_key(target), target.positions
    assert arch is not None
    findings = []
    raw = target.props.get(key)
    if raw is not None and not target.positions_set:
        return [Finding("error", "sequence length", f"option.{key}={raw} is not a positive integer",
                        f"e.g. option.{key}=4096")]
    if not target.positions_set:
        findings.append(Finding("warning" if target.backend == "neuronx" else "info", "sequence length",
                                f"option.{key} is not set: memory below assumes the model's {arch.max_positions} "
                                "positions", f"set option.{key} to the longest prompt + output you serve"))
    elif positions > arch.max_positions:
        learned = arch.positions == "learned"
        findings.append(Finding(
            "error" if learned else "warning", "sequence length",
            f"option.{key}={positions} is beyond the model's {arch.max_positions} positions"
            + (f": {arch.model_type} has a learned table of {arch.max_positions} positions" if learned
               else " (quality degrades past the trained context)"),
            f"use option.{key} <= {arch.max_positions}"))
    else:
        findings.append(Finding("ok", "sequence length", f"option.{key}={positions} <= {arch.max_positions}"))
    findings.extend(_context_buckets(target))
    return findings


def _positions_key(target: Target) -> str:
    return "n_positions" if target.backend == "neuronx" else "max_model_len"


def _context_buckets(target: Target) -> list[Finding]:
    text = target.props.get("context_length_estimate", "").strip()
    if target.backend != "neuronx" or not text:
        return []
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        return [Finding("error", "sequence length", f"option.context_length_estimate={text} is not a comma-"
                        "separated list of positive integers", "e.g. option.context_length_estimate=256,512")]
    too_long = [int(p) for p in parts if int(p) > target.positions]
    if too_long:
        return [Finding("error", "sequence length", f"context buckets {too_long} exceed n_positions="
                        f"{target.positions}; transformers-neuronx rejects that", "keep every bucket <= n_positions")]
    return []


def check_batching(target: Target) -> list[Finding]:
    config, arch = target.config, target.arch
    assert config is not None and arch is not None
    raw = target.props.get("rolling_batch")
    findings = []
    if raw is None:
        findings.append(Finding("warning", "batching", "option.rolling_batch is not set: recent LMI containers "
                                "then switch a model with a config.json to their async vLLM mode, which a sync "
                                "handler cannot serve", "set option.rolling_batch=disable or scheduler"))
    elif raw.strip().lower() == "auto":
        findings.append(Finding("warning", "batching", "option.rolling_batch=auto: DJLServing's LMI recommender "
                                "rewrites auto to its own engine (tnx, lmi-dist, vllm) when it finds a config.json, "
                                "and lmi_handlers refuses those", "use option.rolling_batch=scheduler (the same "
                                "continuous batching here, left alone by DJLServing)"))
    if config.rolling:
        findings.append(Finding("ok", "batching", f"rolling batch: up to {config.max_rolling_batch_size} "
                                "sequences per step"))
        if target.backend == "neuronx" and arch.model_type not in CONTINUOUS_BATCHING_TYPES:
            findings.append(Finding("warning", "batching", f"transformers-neuronx has continuous batching for "
                                    f"llama and mistral only, not {arch.model_type}: sequences cannot join a "
                                    "running batch cheaply", "use batch_size (dynamic batching) for this model"))
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
    elif target.backend == "hf" and ("quantize" in props or flag(props, "load_in_8bit")):
        findings.append(Finding("warning", "dtype", "quantize / load_in_8bit are neuronx options; the hf backend "
                                f"loads {dtype} weights", "remove them, or size the model for 16-bit weights"))
    elif props.get("quantize", "").strip() and props["quantize"].strip().lower() != "static_int8":
        findings.append(Finding("error", "dtype", f"option.quantize={props['quantize']} is not supported",
                                "use option.quantize=static_int8 (int8 weights)"))
    else:
        findings.append(Finding("ok", "dtype", detail))
    if dtype == "fp16" and stored == "bf16":
        findings.append(Finding("warning", "dtype", "the checkpoint is bfloat16; fp16 has a smaller range and "
                                "can overflow in some layers", "prefer option.dtype=bf16"))
    if dtype == "fp32":
        findings.append(Finding("warning", "dtype", "fp32 doubles weight and KV memory and is slower",
                                "use bf16 or fp16 unless the model needs fp32"))
    if target.backend == "neuronx":
        findings.extend(_neuron_accuracy(target))
    return findings


def _neuron_accuracy(target: Target) -> list[Finding]:
    arch = target.arch
    assert arch is not None
    if arch.model_type == "gpt_neox" and target.dtype != "fp32":
        return [Finding("warning", "dtype", "transformers-neuronx advises fp32 for GPT-NeoX (16-bit is "
                        "numerically sensitive)", "set option.dtype=fp32")]
    flags = ACCURACY_FLAGS.get((arch.model_type, arch.hidden_size, arch.layers), ())
    missing = [f for f in flags if not flag(target.props, f)]
    if missing:
        return [Finding("warning", "dtype", "transformers-neuronx lists accuracy issues for this model shape "
                        "with 16-bit weights", " and ".join(f"option.{f}=true" for f in missing))]
    return []
