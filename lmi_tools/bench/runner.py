"""A benchmark end to end: for each concurrency, warm up, run the measured phase, count tokens, summarise."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from ..answers.messages import Api
from .apis import IGNORE_EOS, RequestShape, build_body
from .clients import HttpClient, SageMakerClient
from .loadgen import MAX_REQUESTS, closed_loop
from .metrics import summarize
from .prompts import PromptSet, TokenCounter
from .records import RequestRecord, RunLog
from .targets import BenchTarget


@dataclass(frozen=True)
class LoadSettings:
    """The load shape: closed-loop concurrency levels, how many requests or how long, and the hard limits."""

    concurrencies: tuple[int, ...] = (1,)
    #: Measured requests per concurrency level (None: as many as ``duration`` allows).
    requests: int | None = None
    #: Seconds of sending per concurrency level (None: until ``requests`` were sent).
    duration: float | None = None
    #: Requests sent (and not recorded) before each measured phase; None: one per client.
    warmup: int | None = None
    #: A request with no complete answer after this many seconds is an error.
    request_timeout: float = 120.0
    #: Hard cap on a phase's sending time; in-flight requests get ``request_timeout`` more, then are cancelled.
    max_duration: float = 1800.0

    def warmup_for(self, concurrency: int) -> int:
        return concurrency if self.warmup is None else self.warmup


@dataclass
class BenchPlan:
    target: BenchTarget
    shape: RequestShape
    prompts: PromptSet
    load: LoadSettings
    counter: TokenCounter | None = None
    price_per_hour: float | None = None
    price_source: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "target": self.target.describe(),
            "request": {"max_new_tokens": self.shape.max_new_tokens, "stream": self.shape.stream,
                        "ignore_eos": self.shape.ignore_eos and self.target.api in IGNORE_EOS,
                        "ignore_eos_supported": self.target.api in IGNORE_EOS, "model": self.shape.model,
                        "extra_body": dict(self.shape.extra)},
            "prompt": {"description": self.prompts.description, "variants": len(self.prompts.prompts),
                       "tokens": sorted({c for c in self.prompts.token_counts if c is not None}) or None},
            "load": {"concurrencies": list(self.load.concurrencies), "requests": self.load.requests,
                     "duration_s": self.load.duration, "warmup": self.load.warmup,
                     "warmup_default": "one request per client", "request_timeout_s": self.load.request_timeout,
                     "max_duration_s": self.load.max_duration},
            "tokenizer": self.counter.name if self.counter else None,
            "price": {"per_hour": self.price_per_hour, "source": self.price_source},
        }


@dataclass
class RunResult:
    log: RunLog
    summary: dict[str, Any]


class Progress(Protocol):
    def phase(self, label: str, total: int | None, duration: float | None) -> None: ...
    def done(self, record: RequestRecord) -> None: ...
    def tick(self, elapsed: float) -> None: ...
    def end(self) -> None: ...


class NoProgress:
    def phase(self, label: str, total: int | None, duration: float | None) -> None:
        pass

    def done(self, record: RequestRecord) -> None:
        pass

    def tick(self, elapsed: float) -> None:
        pass

    def end(self) -> None:
        pass


def run_bench(plan: BenchPlan, progress: Progress | None = None) -> list[RunResult]:
    """Every concurrency level of the plan, one after the other."""
    progress = progress or NoProgress()
    return asyncio.run(_run_all(plan, progress))


async def _run_all(plan: BenchPlan, progress: Progress) -> list[RunResult]:
    results = []
    for concurrency in plan.load.concurrencies:
        log = await run_level(plan, concurrency, progress)
        count_tokens(log.records, plan.prompts, plan.counter)
        results.append(RunResult(log, summarize(log, plan.price_per_hour)))
    return results


def make_client(target: BenchTarget, concurrency: int, request_timeout: float, headers: dict[str, str]):
    if target.api is Api.SAGEMAKER:
        return SageMakerClient(target, concurrency, request_timeout)
    return HttpClient(target, concurrency, request_timeout, headers)


async def run_level(plan: BenchPlan, concurrency: int, progress: Progress,
                    client_factory: Callable[..., Any] = make_client) -> RunLog:
    """Warm-up (not recorded), then the measured phase, at one concurrency."""
    load = plan.load
    bodies = [json.dumps(build_body(plan.target.api, p, plan.shape)).encode("utf-8") for p in plan.prompts.prompts]
    async with client_factory(plan.target, concurrency, load.request_timeout, plan.headers) as client:
        def send(index: int):
            return client.send(index, bodies[index % len(bodies)])

        warmup = load.warmup_for(concurrency)
        if warmup:
            progress.phase(f"warm-up  C={concurrency}", warmup, None)
            client.origin = start = time.perf_counter()
            await closed_loop(send, concurrency, warmup, start + load.max_duration,
                              start + load.max_duration + load.request_timeout, progress.done)
            progress.end()
        progress.phase(f"measured C={concurrency}", load.requests, load.duration)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        client.origin = origin = time.perf_counter()
        send_until = origin + min(load.duration or math.inf, load.max_duration)
        ticker = asyncio.create_task(_tick(progress, origin)) if load.duration else None
        try:
            phase = await closed_loop(send, concurrency, load.requests or MAX_REQUESTS, send_until,
                                      send_until + load.request_timeout, progress.done)
        finally:
            if ticker is not None:
                ticker.cancel()
            progress.end()
    return RunLog(concurrency, phase.records, streaming=plan.target.stream, cancelled=phase.cancelled,
                  started_at=started_at)


async def _tick(progress: Progress, origin: float) -> None:
    while True:
        await asyncio.sleep(0.25)
        progress.tick(time.perf_counter() - origin)


def count_tokens(records: list[RequestRecord], prompts: PromptSet, counter: TokenCounter | None) -> None:
    """Fill the counts the server did not report: input from the prompt's count, output with the tokenizer.

    Runs after the measured phase, so tokenizing never competes with the load generator for the CPU.
    """
    for record in records:
        known = prompts.token_counts[record.index % len(prompts.token_counts)]
        if record.input_tokens is None and known is not None:
            record.input_tokens, record.input_tokens_source = known, "tokenizer"
    if counter is not None:
        todo = [r for r in records if r.ok and r.output_tokens_source != "server" and r.text is not None]
        for record, count in zip(todo, counter.output_tokens([r.text for r in todo])):
            record.output_tokens, record.output_tokens_source = count, "tokenizer"
    for record in records:
        record.text = None
