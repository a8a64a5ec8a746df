"""Reports: ``report.json`` (settings, definitions, every run's summary), ``report.md``, one request log per
concurrency (``requests-c<C>.jsonl``), PNG plots; and ``--compare`` tables over several reports."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import UsageError
from . import plots
from .markdown import markdown, title_of
from .metrics import DEFINITIONS, end_to_end, time_to_first_token
from .runner import RunResult

FORMAT = "lmi-bench-report/1"


def build_report(settings: Mapping[str, Any], results: Sequence[RunResult]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": {"lmi-handlers": _version("lmi-handlers")},
        "settings": dict(settings),
        "definitions": DEFINITIONS,
        "runs": [{"concurrency": r.log.concurrency, "started_at": r.log.started_at,
                  "log": f"requests-c{r.log.concurrency}.jsonl", "summary": r.summary} for r in results],
    }


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def write_reports(report: dict[str, Any], results: Sequence[RunResult], out_dir: Path,
                  with_plots: bool = True) -> list[Path]:
    """Write the logs, report.json, the PNG plots and report.md into ``out_dir``; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for run, result in zip(report["runs"], results):
        path = out_dir / run["log"]
        with path.open("w", encoding="utf-8") as out:
            for line in result.log.to_lines():
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
        written.append(path)
    if with_plots:
        report["plots"] = [p.name for p in _plots(report, results, out_dir)]
        written += [out_dir / name for name in report["plots"]]
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(markdown(report), encoding="utf-8")
    return written + [out_dir / "report.json", out_dir / "report.md"]


def _plots(report: dict[str, Any], results: Sequence[RunResult], out_dir: Path) -> list[Path]:
    title = title_of(report)
    e2e = {r.log.concurrency: [end_to_end(x) for x in r.log.records if x.ok] for r in results}
    ttft = {r.log.concurrency: [t for x in r.log.records if x.ok and (t := time_to_first_token(x)) is not None]
            for r in results}
    summaries = [r.summary for r in results]
    return [plots.latency_cdf(out_dir / "latency_cdf.png", e2e, ttft, title),
            plots.throughput_vs_concurrency(out_dir / "throughput_vs_concurrency.png", summaries, title),
            plots.ttft_vs_concurrency(out_dir / "ttft_vs_concurrency.png", summaries, title)]


def load_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"report {path} does not exist") from None
    except ValueError as exc:
        raise UsageError(f"report {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"{path} is not an lmi bench report (format {FORMAT!r})",
                         hint="give the report.json files that lmi bench wrote")
    return data
