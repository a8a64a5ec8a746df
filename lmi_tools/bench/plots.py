"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import UsageError


def require_matplotlib() -> None:
    """Fail before a run, not after it, when plots cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("PNG plots need matplotlib", hint="pip install 'lmi-handlers[bench]', or pass --no-plots") \
            from None


def _pyplot():
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, series: Mapping[int, Sequence[float]], scale: float, xlabel: str, title: str) -> None:
    for concurrency, values in sorted(series.items()):
        if not values:
            continue
        ordered = sorted(v * scale for v in values)
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=f"C={concurrency} (n={n})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def latency_cdf(path: Path, e2e: Mapping[int, Sequence[float]], ttft: Mapping[int, Sequence[float]],
                title: str) -> Path:
    """End-to-end latency and time-to-first-token CDFs, one line per concurrency."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _cdf(left, e2e, 1.0, "end-to-end latency (s)", "End-to-end latency CDF")
    _cdf(right, ttft, 1000.0, "time to first token (ms)", "Time to first token CDF")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _concurrency_axis(ax, concurrencies: Sequence[int]) -> None:
    if len(concurrencies) > 1 and max(concurrencies) / max(min(concurrencies), 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(concurrencies))
    ax.set_xticklabels([str(c) for c in concurrencies])
    ax.set_xlabel("concurrency (clients)")
    ax.grid(True, alpha=0.3)


def _get(summary: Mapping[str, Any], *keys: str) -> float | None:
    value: Any = summary
    for key in keys:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return float(value)


def _series(summaries: Sequence[Mapping[str, Any]], *keys: str, scale: float = 1.0) -> list[float]:
    values = [_get(s, *keys) for s in summaries]
    return [v * scale if v is not None else float("nan") for v in values]


def throughput_vs_concurrency(path: Path, summaries: Sequence[Mapping[str, Any]], title: str) -> Path:
    """Tokens/s (output, and input + output) and requests per minute against concurrency, side by side."""
    plt = _pyplot()
    xs = [s["concurrency"] for s in summaries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(xs, _series(summaries, "output_tokens_per_s"), "o-", label="output tokens/s")
    left.plot(xs, _series(summaries, "tokens_per_s"), "s--", label="input + output tokens/s")
    left.set_ylabel("tokens/s (wall clock)")
    left.set_title("Token throughput")
    left.legend(fontsize=8)
    right.plot(xs, _series(summaries, "requests_per_minute"), "o-", color="tab:green", label="requests/min")
    right.set_ylabel("requests per minute (RPM)")
    right.set_title("Request throughput")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        _concurrency_axis(ax, xs)
    fig.suptitle(f"Throughput vs concurrency - {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_vs_concurrency(path: Path, summaries: Sequence[Mapping[str, Any]], title: str) -> Path:
    """Time to first token p50/p90/p99 against concurrency, with inter-token latency p50 for scale."""
    plt = _pyplot()
    xs = [s["concurrency"] for s in summaries]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, style in (("p50", "o-"), ("p90", "s-"), ("p99", "^-")):
        ax.plot(xs, _series(summaries, "latency_s", "time_to_first_token", key, scale=1000), style,
                label=f"TTFT {key}")
    ax.plot(xs, _series(summaries, "latency_s", "inter_token", "p50", scale=1000), "x:", color="gray",
            label="inter-token p50 (excl. TTFT)")
    ax.set_ylabel("milliseconds")
    ax.set_ylim(bottom=0)
    _concurrency_axis(ax, xs)
    ax.set_title(f"Time to first token vs concurrency\n{title}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
