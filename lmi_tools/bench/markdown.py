"""Markdown renderings: one report (``report.md``), and several reports side by side (``--compare``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: (label, path into a run summary, unit) for the tables.
ROWS: list[tuple[str, tuple[str, ...], str]] = [
    ("requests ok", ("requests", "ok"), "int"),
    ("error rate", ("requests", "error_rate"), "pct"),
    ("wall time (s)", ("wall_s",), "num"),
    ("requests/min (RPM)", ("requests_per_minute",), "num"),
    ("requests/s (embeddings/s with openai-embeddings)", ("requests_per_s",), "num"),
    ("tokens/min, in+out (TPM)", ("tokens_per_minute",), "int"),
    ("output tokens/min", ("output_tokens_per_minute",), "int"),
    ("output tokens/s", ("output_tokens_per_s",), "num"),
    ("input tokens/request", ("tokens", "input_per_request"), "num"),
    ("output tokens/request", ("tokens", "output_per_request"), "num"),
    ("TTFT p50 (ms)", ("latency_s", "time_to_first_token", "p50"), "ms"),
    ("TTFT p90 (ms)", ("latency_s", "time_to_first_token", "p90"), "ms"),
    ("TTFT p99 (ms)", ("latency_s", "time_to_first_token", "p99"), "ms"),
    ("ITL p50 (ms, excl. TTFT)", ("latency_s", "inter_token", "p50"), "ms"),
    ("ITL p90 (ms, excl. TTFT)", ("latency_s", "inter_token", "p90"), "ms"),
    ("TPOT mean (ms)", ("latency_s", "time_per_output_token", "mean"), "ms"),
    ("ITL incl. TTFT mean (ms, LLMPerf)", ("latency_s", "inter_token_with_ttft", "mean"), "ms"),
    ("E2E avg (s)", ("latency_s", "end_to_end", "mean"), "s"),
    ("E2E p50 (s)", ("latency_s", "end_to_end", "p50"), "s"),
    ("E2E p90 (s)", ("latency_s", "end_to_end", "p90"), "s"),
    ("E2E p99 (s)", ("latency_s", "end_to_end", "p99"), "s"),
    ("$ per 1M tokens (in+out)", ("cost", "per_1m_tokens"), "usd"),
    ("$ per 1M output tokens", ("cost", "per_1m_output_tokens"), "usd"),
    ("$ per 1M tokens, blended 3:1", ("cost", "blended_3_to_1_per_1m_tokens"), "usd"),
]


def lookup(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value * 1000:,.1f}"
    if unit == "s":
        return f"{value:,.3f}"
    if unit == "int":
        return f"{value:,.0f}"
    if unit == "pct":
        return f"{value * 100:.1f}%"
    if unit == "usd":
        return f"${value:,.2f}" if value >= 0.1 else f"${value:,.4f}"
    return f"{value:,.1f}"




def title_of(report: Mapping[str, Any]) -> str:
    settings = report.get("settings", {})
    target = settings.get("target", {})
    where = target.get("url") or f"endpoint {target.get('endpoint_name')}"
    prompt = settings.get("prompt", {}).get("tokens")
    tokens = f"prompt {prompt[0] if prompt and len(prompt) == 1 else prompt} tok, " if prompt else ""
    return (f"{target.get('api')} {where} - {tokens}max_new_tokens "
            f"{settings.get('request', {}).get('max_new_tokens')}")


def metric_table(columns: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Rows are metrics (ROWS), columns are runs: ``(header, summary)``."""
    lines = ["| metric | " + " | ".join(h for h, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for label, path, unit in ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt(lookup(s, path), unit) for _, s in columns) + " |")
    return lines


def _settings_lines(settings: Mapping[str, Any]) -> list[str]:
    target, request = settings.get("target", {}), settings.get("request", {})
    load, price = settings.get("load", {}), settings.get("price") or {}
    where = target.get("url") or (f"endpoint `{target.get('endpoint_name')}` (endpoint_url "
                                  f"{target.get('endpoint_url') or 'AWS'}, region {target.get('region')})")
    eos = "sent" if request.get("ignore_eos") else (
        "not sent" if request.get("ignore_eos_supported") else "not supported by this API")
    amount = (f"{load.get('requests')} measured requests" if load.get("requests") else "") + (
        " or " if load.get("requests") and load.get("duration_s") else "") + (
        f"{load.get('duration_s'):g} s" if load.get("duration_s") else "")
    warmup = load.get("warmup")
    lines = [
        f"- **Target**: `{target.get('api')}` {where}; streaming: {'yes' if target.get('stream') else 'no'}",
        f"- **Prompt**: {settings.get('prompt', {}).get('description')}; "
        f"{settings.get('prompt', {}).get('variants')} variant(s)",
        f"- **Request**: max_new_tokens {request.get('max_new_tokens')}; ignore_eos {eos}"
        + (f"; extra body `{request.get('extra_body')}`" if request.get("extra_body") else ""),
        f"- **Load**: closed loop at concurrency {', '.join(map(str, load.get('concurrencies', [])))}; "
        f"{amount} per level; warm-up {warmup if warmup is not None else 'one request per client'} (not "
        f"counted); request timeout {load.get('request_timeout_s')} s; hard limit {load.get('max_duration_s')} s",
        f"- **Tokenizer**: {settings.get('tokenizer') or 'none (counts from the server, else token events)'}",
    ]
    if price.get("per_hour") is not None:
        lines.append(f"- **Price**: ${price['per_hour']}/hour ({price.get('source')})")
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    runs = report.get("runs", [])
    out = ["# lmi bench report", "", f"{title_of(report)}  ", f"created {report.get('created')}", ""]
    out += _settings_lines(report.get("settings", {})) + ["", "## Results", ""]
    out += metric_table([(f"C={r['concurrency']}", r["summary"]) for r in runs])
    out += ["", "## Token counts", "", "| C | input tokens | output tokens | output per request (min-max) | input:output | finish reasons | counted by |",
            "|---:|---:|---:|---:|---:|---|---|"]
    for run in runs:
        tokens = run["summary"].get("tokens", {})
        sources = tokens.get("sources", {})
        counted = "; ".join(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in sources.get(kind, {}).items())
                            for kind in ("input", "output"))
        span = tokens.get("output_range")
        reasons = ", ".join(f"{k} {v}" for k, v in tokens.get("finish_reasons", {}).items()) or "-"
        out.append(f"| {run['concurrency']} | {fmt(tokens.get('input'), 'int')} | {fmt(tokens.get('output'), 'int')}"
                   f" | {f'{span[0]}-{span[1]}' if span else '-'} | {fmt(tokens.get('input_to_output'), 'num')}"
                   f" | {reasons} | {counted} |")
    errors = [(run["concurrency"], message, count) for run in runs
              for message, count in run["summary"].get("errors", {}).items()]
    if errors:
        out += ["", "## Errors (most frequent)", ""]
        out += [f"- C={c}: {count} x {message}" for c, message, count in errors]
    if report.get("plots"):
        out += ["", "## Plots", ""] + [f"![{name}]({name})" for name in report["plots"]]
    out += ["", "## Definitions", ""]
    out += [f"- **{name}**: {text}" for name, text in report.get("definitions", {}).items()]
    return "\n".join(out) + "\n"


def compare_markdown(named: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Several reports side by side: their settings, then one column per (report, concurrency)."""
    out = ["# lmi bench comparison", "", "| report | target | prompt | max_new_tokens | tokenizer | price/h |",
           "|---|---|---|---:|---|---:|"]
    for name, report in named:
        settings = report.get("settings", {})
        target = settings.get("target", {})
        price = (settings.get("price") or {}).get("per_hour")
        out.append(f"| {name} | `{target.get('api')}` {target.get('url') or target.get('endpoint_name')} | "
                   f"{settings.get('prompt', {}).get('description')} | "
                   f"{settings.get('request', {}).get('max_new_tokens')} | {settings.get('tokenizer') or '-'} | "
                   f"{'-' if price is None else f'${price}'} |")
    out += [""] + metric_table([(f"{name} C={run['concurrency']}", run["summary"])
                                 for name, report in named for run in report.get("runs", [])])
    return "\n".join(out) + "\n"
