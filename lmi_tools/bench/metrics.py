"""Every benchmark figure, as pure functions over a ``RunLog`` (no I/O, no clock).

Notation (reference/sagemaker.md §6): C concurrency, N successful requests, T_wall the measured wall time,
L_i, in_i, out_i a request's end-to-end latency, input and output tokens, P_h the price per instance-hour.

* T_wall = last end - first send over every recorded request (the measured phase; warm-up excluded).
* RPM = N / T_wall * 60; TPM = sum(in_i + out_i) / T_wall * 60 (the AWS inf2 example's method), and
  output-only TPM = sum(out_i) / T_wall * 60; output tokens/s = sum(out_i) / T_wall (wall clock, LLMPerf).
* cost per 1M tokens = 1e6 / TPM / 60 * P_h (1e6/TPM minutes per 1M tokens, /60 hours, * P_h dollars).
* blended 3:1 price = P_h * 1e6 / (3600 * 4 * output tokens/s): one blended unit is 3 input + 1 output token.
* TTFT = first token event - send. ITL = gaps between consecutive token events, the first token excluded
  (pooled over requests); TPOT_i = (last token - first token) / (out_i - 1); LLMPerf's ITL_i includes TTFT:
  (last token - send) / out_i.
* Percentiles interpolate linearly between closest ranks (numpy's default), unlike awscurl (index based) and
  Locust (rounded response times).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

from .records import RequestRecord, RunLog

PERCENTILES = (50, 90, 99)
BLENDED_INPUT_PER_OUTPUT = 3


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Iterable[float]) -> dict[str, float] | None:
    """count, mean, min, p50, p90, p99, max of the values; None when there are none."""
    data = list(values)
    if not data:
        return None
    out: dict[str, float] = {"count": len(data), "mean": sum(data) / len(data), "min": min(data)}
    out.update({f"p{q}": percentile(data, q) for q in PERCENTILES})
    out["max"] = max(data)
    return out


# --- per request --------------------------------------------------------------------------------

def end_to_end(record: RequestRecord) -> float:
    return record.end - record.send


def time_to_first_token(record: RequestRecord) -> float | None:
    return None if record.first_token is None else record.first_token - record.send


def inter_token_gaps(record: RequestRecord) -> list[float]:
    """Gaps between consecutive token events; the wait for the first token is not one of them."""
    times = record.token_times
    return [b - a for a, b in zip(times, times[1:])]


def time_per_output_token(record: RequestRecord) -> float | None:
    """(last token - first token) / (out - 1): the decode time per token, TTFT excluded."""
    out = record.output_tokens
    if out is None or out < 2 or len(record.token_times) < 2:
        return None
    return (record.token_times[-1] - record.token_times[0]) / (out - 1)


def itl_including_ttft(record: RequestRecord) -> float | None:
    """LLMPerf's inter-token latency: all gaps including TTFT, over the output tokens."""
    out = record.output_tokens
    if not out or not record.token_times:
        return None
    return (record.token_times[-1] - record.send) / out


def request_output_rate(record: RequestRecord) -> float | None:
    """out_i / L_i: one request's output tokens per second."""
    latency = end_to_end(record)
    if record.output_tokens is None or latency <= 0:
        return None
    return record.output_tokens / latency


# --- run level ----------------------------------------------------------------------------------

def wall_time(records: Sequence[RequestRecord]) -> float:
    """First send to last end over every record (successful or not)."""
    if not records:
        return 0.0
    return max(r.end for r in records) - min(r.send for r in records)


def per_minute(amount: float, seconds: float) -> float | None:
    return amount / seconds * 60 if seconds > 0 else None


def cost_per_million_tokens(tokens_per_minute: float | None, price_per_hour: float) -> float | None:
    """1e6 / TPM / 60 * P_h: minutes per 1M tokens, in hours, times the hourly price."""
    if not tokens_per_minute:
        return None
    return 1e6 / tokens_per_minute / 60 * price_per_hour


def blended_price_3_to_1(output_tokens_per_s: float | None, price_per_hour: float) -> float | None:
    """P_h * 1e6 / (3600 * 4 * output tokens/s): $ per 1M tokens of a 3-input-to-1-output mix."""
    if not output_tokens_per_s:
        return None
    return price_per_hour * 1e6 / (3600 * (BLENDED_INPUT_PER_OUTPUT + 1) * output_tokens_per_s)


def _sum_known(values: list[int | None]) -> int | None:
    """The sum when every value is known, else None (a partial sum would understate TPM)."""
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def token_totals(ok: Sequence[RequestRecord]) -> dict[str, Any]:
    inputs, outputs = _sum_known([r.input_tokens for r in ok]), _sum_known([r.output_tokens for r in ok])
    n = len(ok)
    return {
        "input": inputs, "output": outputs,
        "input_per_request": inputs / n if inputs is not None and n else None,
        "output_per_request": outputs / n if outputs is not None and n else None,
        "input_to_output": inputs / outputs if inputs is not None and outputs else None,
        "sources": {"input": dict(Counter(r.input_tokens_source or "unknown" for r in ok)),
                    "output": dict(Counter(r.output_tokens_source or "unknown" for r in ok))},
        # Without ignore_eos, answers end on the model's EOS or a stop sequence before max_new_tokens: this says
        # how many did, so output tokens/request is read as the model's own answer length, not the cap.
        "finish_reasons": dict(Counter(r.finish_reason or "unknown" for r in ok)),
        "output_range": [min(r.output_tokens for r in ok), max(r.output_tokens for r in ok)]
        if ok and outputs is not None else None,
    }


def throughput(ok: Sequence[RequestRecord], wall: float, tokens: dict[str, Any]) -> dict[str, Any]:
    inputs, outputs = tokens["input"], tokens["output"]
    both = inputs + outputs if inputs is not None and outputs is not None else None
    return {
        "requests_per_minute": per_minute(len(ok), wall),
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "tokens_per_minute": per_minute(both, wall) if both is not None else None,
        "output_tokens_per_minute": per_minute(outputs, wall) if outputs is not None else None,
        "output_tokens_per_s": outputs / wall if outputs is not None and wall > 0 else None,
        "tokens_per_s": both / wall if both is not None and wall > 0 else None,
    }


def latencies(ok: Sequence[RequestRecord]) -> dict[str, Any]:
    def collect(fn) -> list[float]:
        return [v for v in map(fn, ok) if v is not None]

    return {
        "end_to_end": distribution(map(end_to_end, ok)),
        "time_to_first_token": distribution(collect(time_to_first_token)),
        "inter_token": distribution(gap for r in ok for gap in inter_token_gaps(r)),
        "time_per_output_token": distribution(collect(time_per_output_token)),
        "inter_token_with_ttft": distribution(collect(itl_including_ttft)),
        "request_output_tokens_per_s": distribution(collect(request_output_rate)),
    }


def estimates(ok: Sequence[RequestRecord], concurrency: int, itl: dict[str, float] | None) -> dict[str, Any]:
    """Figures other tools report, derived from the same log: read their definitions before comparing."""
    latency_sum = sum(end_to_end(r) for r in ok)
    return {
        # the optimization-toolkit estimate: every in-flight request decodes at the median ITL
        "output_tokens_per_s_from_itl_p50": concurrency / itl["p50"] if itl and itl["p50"] > 0 else None,
        # awscurl's tps: as if every client were always busy
        "requests_per_s_from_latency_sum": len(ok) / latency_sum * concurrency if latency_sum > 0 else None,
    }


def costs(rates: dict[str, Any], price_per_hour: float | None) -> dict[str, Any] | None:
    if price_per_hour is None:
        return None
    return {
        "price_per_hour": price_per_hour,
        "per_1m_tokens": cost_per_million_tokens(rates["tokens_per_minute"], price_per_hour),
        "per_1m_output_tokens": cost_per_million_tokens(rates["output_tokens_per_minute"], price_per_hour),
        "blended_3_to_1_per_1m_tokens": blended_price_3_to_1(rates["output_tokens_per_s"], price_per_hour),
    }


def summarize(log: RunLog, price_per_hour: float | None = None) -> dict[str, Any]:
    """Every figure of one run, as a JSON-ready dict."""
    records = log.records
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    started = len(records) + log.cancelled
    wall = wall_time(records)
    tokens = token_totals(ok)
    rates = throughput(ok, wall, tokens)
    lat = latencies(ok)
    return {
        "concurrency": log.concurrency,
        "streaming": log.streaming,
        "requests": {"started": started, "ok": len(ok), "errors": failed, "cancelled": log.cancelled,
                     "error_rate": (failed + log.cancelled) / started if started else None},
        "wall_s": wall,
        **rates,
        "tokens": tokens,
        "latency_s": lat,
        "estimates": estimates(ok, log.concurrency, lat["inter_token"]),
        "cost": costs(rates, price_per_hour),
        "errors": dict(Counter(r.error for r in records if r.error).most_common(5)),
    }


#: How each reported figure is defined; copied into every report.
DEFINITIONS = {
    "wall_s": "T_wall = last end - first send over the measured requests (warm-up excluded), seconds",
    "requests_per_minute": "RPM = N_ok / T_wall * 60 (successful requests)",
    "requests_per_s": "N_ok / T_wall: with --api openai-embeddings (one text per request), embeddings per second",
    "tokens_per_minute": "TPM = sum(in_i + out_i) / T_wall * 60 over successful requests (input AND output "
                         "tokens, the AWS inf2 example's method)",
    "output_tokens_per_minute": "sum(out_i) / T_wall * 60",
    "output_tokens_per_s": "sum(out_i) / T_wall (wall clock, as LLMPerf's mean_output_throughput)",
    "error_rate": "(failed + cancelled) / started; a failure is a transport error, a non-2xx status or an error "
                  "reported inside the stream",
    "time_to_first_token": "first token event - send; without streaming, arrival of the whole answer - send",
    "inter_token": "gaps between consecutive token events of a request, pooled over requests; the first token "
                   "(TTFT) is NOT included",
    "time_per_output_token": "(last token event - first token event) / (out_i - 1) per request; excludes TTFT",
    "inter_token_with_ttft": "LLMPerf's ITL: (last token event - send) / out_i per request; INCLUDES TTFT",
    "end_to_end": "L_i = end (last byte) - send",
    "request_output_tokens_per_s": "out_i / L_i per request",
    "percentiles": "linear interpolation between closest ranks (numpy's default)",
    "per_1m_tokens": "1e6 / TPM / 60 * price_per_hour (TPM counting input + output tokens)",
    "per_1m_output_tokens": "1e6 / output TPM / 60 * price_per_hour",
    "blended_3_to_1_per_1m_tokens": "price_per_hour * 1e6 / (3600 * 4 * output tokens/s): one blended unit is 3 "
                                    "input + 1 output tokens; compare with tokens.input_to_output",
    "output_tokens_per_s_from_itl_p50": "estimate: C / ITL p50 (every in-flight request decodes at the median "
                                        "ITL; ignores prefill and idle time)",
    "requests_per_s_from_latency_sum": "awscurl's tps: N_ok / sum(L_i) * C (as if every client were always busy)",
    "token_counts": "input and output tokens from the server (LMI details, TGI details, OpenAI usage) when it "
                    "reports them, else from --tokenizer (prompt with special tokens, output without), else the "
                    "number of token events",
}
