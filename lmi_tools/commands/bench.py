"""``lmi bench``: load-test an LLM endpoint and write JSON, Markdown and PNG reports (docs/benchmarking.md)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import ToolError, UsageError


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def bench(
    targets: Optional[list[str]] = typer.Argument(
        None, help="TARGET URL (path names the API: /predictions/<model>, /invocations, /endpoints/<name>/"
                   "invocations-response-stream, /generate_stream, /v1/completions, /v1/chat/completions) or "
                   "sagemaker:<endpoint>; with --compare: report.json files"),
    api: Optional[str] = typer.Option(None, help="lmi, sagemaker, tgi, openai-completions or openai-chat "
                                                 "(default: from TARGET's path)"),
    serve: Optional[Path] = typer.Option(None, help="Start `lmi serve` with this model directory and "
                                                    "benchmark it (TARGET may then be omitted)"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="Concurrent clients (closed loop)"),
    sweep: Optional[str] = typer.Option(None, help="Comma-separated concurrencies run one after the other, "
                                                   "e.g. 1,4,16 (replaces -c)"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", help="Measured requests per concurrency "
                                                                          "(default 100 unless --duration)"),
    duration: Optional[float] = typer.Option(None, help="Seconds of load per concurrency"),
    warmup: Optional[int] = typer.Option(None, help="Uncounted requests before each level (default: one per "
                                                    "client)"),
    prompt_tokens: int = typer.Option(128, help="Prompt length in tokens of --tokenizer (words without one)"),
    prompt: Optional[list[str]] = typer.Option(None, help="Send this prompt instead of generated filler text; "
                                                          "repeat it for several prompts, sent in turn"),
    max_new_tokens: int = typer.Option(128, help="Tokens to generate per request"),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer directory (AutoTokenizer) for prompt length and "
                                                       "token counts; default with --serve: the model's"),
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Stream answers (default: yes, "
                                                                             "unless TARGET's path says no)"),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Ask the server to ignore EOS so "
                                                                               "every answer has max_new_tokens"),
    model: Optional[str] = typer.Option(None, help="The OpenAI `model` field"),
    extra_body: Optional[str] = typer.Option(None, help="JSON object merged into every request body"),
    header: Optional[list[str]] = typer.Option(None, "--header", "-H", help="Extra HTTP header 'Name: value'"),
    region: Optional[str] = typer.Option(None, help="AWS region for sagemaker targets"),
    price_per_hour: Optional[float] = typer.Option(None, help="Instance price in $/hour, for cost per 1M tokens"),
    instance_type: Optional[str] = typer.Option(None, help="Take --price-per-hour from lmi's instance table"),
    output: Path = typer.Option(Path("bench-out"), "--output", "-o", help="Directory for the reports"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots"),
    request_timeout: float = typer.Option(120.0, help="Seconds before an unanswered request is an error"),
    max_duration: float = typer.Option(1800.0, help="Hard cap on each level's sending time, in seconds"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (stderr)"),
    compare: bool = typer.Option(False, "--compare", help="Print the given report.json files side by side"),
    self_test: bool = typer.Option(False, "--self-test", help="Measure this load generator's own ceiling "
                                                              "against a trivial local endpoint"),
) -> None:
    """Load-test an LLM endpoint: TTFT, inter-token latency, end-to-end latency, throughput and cost."""
    targets = targets or []
    if compare:
        return _compare(targets)
    if self_test:
        return _self_test(_levels(concurrency, sweep) if sweep else (1, 16, 64), duration or 3.0, progress)
    from ..bench.apis import RequestShape
    from ..bench.runner import LoadSettings

    _check_positive(max_new_tokens=max_new_tokens, prompt_tokens=prompt_tokens, requests=requests,
                    duration=duration, request_timeout=request_timeout, max_duration=max_duration)
    if warmup is not None and warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {warmup}")
    load = LoadSettings(_levels(concurrency, sweep), requests=requests or (None if duration else 100),
                        duration=duration, warmup=warmup, request_timeout=request_timeout, max_duration=max_duration)
    price, price_source = _price(price_per_hour, instance_type)
    options = dict(api=api, stream=stream, region=region, tokenizer=tokenizer, prompt=prompt,
                   prompt_tokens=prompt_tokens, price=price, price_source=price_source, headers=_headers(header or []),
                   shape=RequestShape(max_new_tokens, ignore_eos=ignore_eos, model=model, extra=_json(extra_body)))
    if serve is None and len(targets) != 1:
        raise UsageError("give one TARGET (or --serve MODEL_DIR)", hint="e.g. lmi bench "
                         "http://127.0.0.1:8080/predictions/model -c 4 -n 100")
    if serve is not None and targets:
        raise UsageError("give either TARGET or --serve, not both")
    with _server(serve, output) as server:
        target = targets[0] if targets else server.target(_api_or_none(api), stream)
        plan = _plan(target, load, server, **options)
        _run(plan, output, plots, progress)


def _run(plan, output: Path, with_plots: bool, show_progress: bool) -> None:
    from ..bench.markdown import metric_table
    from ..bench.plots import require_matplotlib
    from ..bench.report import build_report, write_reports
    from ..bench.runner import run_bench
    from ..bench.targets import check_reachable

    if with_plots:
        require_matplotlib()
    check_reachable(plan.target)
    bar = _RichProgress() if show_progress else None
    results = run_bench(plan, bar)
    report = build_report(plan.describe(), results)
    written = write_reports(report, results, output, with_plots)
    typer.echo("\n".join(metric_table([(f"C={r.log.concurrency}", r.summary) for r in results])))
    typer.echo(f"wrote {', '.join(str(p) for p in written if p.suffix in ('.json', '.md', '.png'))}")
    if not any(r.summary["requests"]["ok"] for r in results):
        errors = [e for r in results for e in r.summary["errors"]]
        raise ToolError(f"no request succeeded; first error: {errors[0] if errors else 'none recorded'}",
                        hint=f"the per-request logs are in {output}")


def _plan(target: str, load, server, *, api, stream, region, tokenizer, prompt, prompt_tokens, price,
          price_source, headers, shape):
    from dataclasses import replace

    from ..bench.local_server import tokenizer_dir
    from ..bench.prompts import TokenCounter, build_prompts
    from ..bench.runner import BenchPlan
    from ..bench.targets import parse_target

    resolved = parse_target(target, api, stream, region)
    if tokenizer is None and server is not None:
        found = tokenizer_dir(server.model_dir)
        tokenizer = str(found) if found else None
    counter = TokenCounter.load(tokenizer) if tokenizer else None
    prompts = build_prompts(prompt_tokens, counter, prompt or None)
    if counter is None and not prompt:
        typer.secho(f"warning: no tokenizer, so --prompt-tokens {prompt_tokens} means {prompt_tokens} words of filler "
                    "text (often twice as many tokens or more); pass --tokenizer MODEL_DIR_OR_HUB_ID to count "
                    "tokens", fg="yellow", err=True)
    return BenchPlan(resolved, replace(shape, stream=resolved.stream), prompts, load, counter, price, price_source,
                     headers)


@contextlib.contextmanager
def _server(model_dir: Optional[Path], output: Path):
    if model_dir is None:
        yield None
        return
    from ..bench.local_server import LocalServer

    server = LocalServer(model_dir, output / "serve.log")
    typer.echo(f"starting lmi serve {model_dir} on {server.base} and waiting for /ping (its log: {server.log_path}; "
               "loading a model can take minutes)", err=True)
    with server:
        yield server


def _levels(concurrency: int, sweep: Optional[str]) -> tuple[int, ...]:
    if sweep is None:
        _check_positive(concurrency=concurrency)
        return (concurrency,)
    levels = []
    for part in sweep.split(","):
        if not part.strip().isdigit() or int(part) < 1:
            raise UsageError(f"--sweep {sweep!r}: {part.strip()!r} is not a positive integer",
                             hint="e.g. --sweep 1,4,16")
        levels.append(int(part))
    return tuple(levels)


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")


def _api_or_none(api: Optional[str]):
    from ..bench.targets import parse_api

    return parse_api(api)


def _price(price_per_hour: Optional[float], instance_type: Optional[str]) -> tuple[Optional[float], Optional[str]]:
    if price_per_hour is not None:
        if price_per_hour <= 0:
            raise UsageError(f"--price-per-hour must be positive, got {price_per_hour}")
        return price_per_hour, "--price-per-hour"
    if instance_type is None:
        return None, None
    from ..instances import lookup

    instance = lookup(instance_type)
    if instance.price_per_hour is None:
        raise UsageError(f"the instance table has no price for {instance.name}", hint="pass --price-per-hour")
    return instance.price_per_hour, f"lmi's instance table for {instance.name} (on-demand; re-check before publishing)"


def _headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def _json(text: Optional[str]) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--extra-body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--extra-body must be a JSON object, got {text!r}")
    return value


def _compare(paths: list[str]) -> None:
    from ..bench.markdown import compare_markdown
    from ..bench.report import load_report

    if len(paths) < 1:
        raise UsageError("--compare needs report.json files", hint="lmi bench --compare a/report.json b/report.json")
    named = [(_short_name(Path(p)), load_report(Path(p))) for p in paths]
    typer.echo(compare_markdown(named), nl=False)


def _short_name(path: Path) -> str:
    return path.parent.name if path.name == "report.json" and path.parent.name else path.stem


def _self_test(levels: tuple[int, ...], duration: float, show_progress: bool) -> None:
    from ..bench.selftest import run_self_test

    result = run_self_test(concurrencies=levels, duration=duration,
                           progress=_RichProgress() if show_progress else None)
    typer.echo("| client | concurrency | requests | errors | requests/s | token events/s | client CPU/request |")
    typer.echo("|---|---:|---:|---:|---:|---:|---:|")
    for level in result["levels"]:
        client = "aiohttp (HTTP)" if level["api"] == "lmi" else "boto3 (SageMaker)"
        typer.echo(f"| {client} | {level['concurrency']} | {level['requests']} | {level['errors']} | "
                   f"{level['requests_per_s'] or 0:,.0f} | {level['token_events_per_s'] or 0:,.0f} | "
                   f"{level['client_cpu_us_per_request'] or 0:,.0f} us |")
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v)
    typer.echo(f"load generator ceiling: {result['ceiling_requests_per_s'] or 0:,.0f} requests/s over HTTP "
               f"(wall clock; {result['ceiling_requests_per_client_cpu_s'] or 0:,.0f} per CPU-second of the client), "
               f"{result['sagemaker_ceiling_requests_per_s'] or 0:,.0f} requests/s through boto3; "
               f"{result['machine']['cpus']} CPUs; {versions}")
    errors = [lv["first_error"] for lv in result["levels"] if lv["first_error"]]
    if errors:
        raise UsageError(f"the self-test saw errors: {errors[0]}")


class _RichProgress:
    """A rich progress bar per phase on stderr: requests done (or seconds with --duration) and errors so far."""

    def phase(self, label: str, total: int | None, duration: float | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.by_time, self.done_count, self.errors = total is None, 0, 0
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                 TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn(),
                                 console=Console(stderr=True), refresh_per_second=4)
        self.task = self.progress.add_task(label, total=duration if self.by_time else total, count="", errors=0)
        self.progress.start()

    def done(self, record) -> None:
        self.done_count += 1
        self.errors += 0 if record.ok else 1
        fields = {"count": f"{self.done_count} requests", "errors": self.errors}
        if self.by_time:
            self.progress.update(self.task, **fields)
        else:
            self.progress.update(self.task, completed=self.done_count, **fields)

    def tick(self, elapsed: float) -> None:
        if self.by_time:
            self.progress.update(self.task, completed=elapsed)

    def end(self) -> None:
        if self.by_time:  # the last tick can fall just short of the duration
            self.progress.update(self.task, completed=self.progress.tasks[0].total)
        self.progress.stop()
