"""``lmi validate`` for an embedding model (``option.task=text-embedding``): what the handler's load would refuse
(rolling batch, a pooling configuration it cannot follow), and how it will pool. An embedding model holds no KV
cache, so the generation checks (sequence length, KV cache, rolling batch size) do not apply to it."""

from __future__ import annotations

from pathlib import Path

from lmi_handlers.config import ConfigError
from lmi_handlers.pooling.options import PoolingOptions

from .findings import Finding, Target


def is_embedding(target: Target) -> bool:
    """Whether the resolver's settings embed (``option.task``; a task it refuses is the properties check's error)."""
    return target.choice is not None and target.choice.embedding


def pooling_findings(target: Target) -> list[Finding] | None:
    """The embedding model's findings; None for a model that generates."""
    if not is_embedding(target):
        return None
    assert target.config is not None
    findings = []
    if target.config.rolling:
        findings.append(Finding("error", "task", f"option.rolling_batch={target.config.rolling_batch} with "
                                "option.task=text-embedding: the handler refuses to load (embeddings are answered "
                                "whole, in dynamic batches)", "set option.rolling_batch=disable, and batch_size and "
                                "max_batch_delay for dynamic batching"))
    elif target.config.batch_size == 1:
        findings.append(Finding("info", "batching", "batch_size=1: each embedding request runs alone",
                                "batch_size=32 and max_batch_delay=20 batch concurrent requests"))
    local = Path(target.config.model_id)
    if local.is_dir():
        decoder = "ForCausalLM" in " ".join((target.model_config or {}).get("architectures") or [])
        try:
            options = PoolingOptions.from_model(str(local), target.props, decoder)
        except ConfigError as exc:
            return findings + [Finding("error", "pooling", str(exc))]
        longest = f", inputs up to {options.max_length} tokens" if options.max_length else ""
        findings.append(Finding("ok", "pooling", f"{options.mode} pooling{', normalized' if options.normalize else ''}"
                                                 f"{longest}"))
    findings.append(Finding("info", "hardware", "an embedding model holds no KV cache: the sequence-length and KV "
                                                "cache checks apply to text generation only"))
    return findings


def embedding_figures(figures: dict[str, str]) -> dict[str, str]:
    """The sizing figures without the KV cache's (and the per-device total, which counts it)."""
    return {name: value for name, value in figures.items() if not name.startswith(("kv cache", "per "))}
