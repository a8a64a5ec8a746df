"""``lmi bench --self-test``: the load generator's own ceiling, against a trivial endpoint in another process.

The trivial endpoint (``trivial_server``) runs as a subprocess; where the machine has two or more CPUs it is
pinned to the last one and this process to the others, so client and server never share a core. The client
side is the real one: the same executors, reader, closed loop and records as a benchmark.
"""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Iterator

from ..errors import ToolError
from .apis import RequestShape
from .prompts import PromptSet
from .runner import BenchPlan, LoadSettings, NoProgress, Progress, count_tokens, run_level
from .targets import parse_target


@contextmanager
def trivial_endpoint(tokens: int, pin: bool = True) -> Iterator[int]:
    """Start the trivial endpoint; yields its port. Pins server and client to different CPUs where possible."""
    process = subprocess.Popen([sys.executable, "-m", "lmi_tools.bench.trivial_server", "--port", "0",
                                "--tokens", str(tokens)], stdout=subprocess.PIPE, text=True)
    own = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("port="):
            raise ToolError(f"the self-test endpoint did not start (said {line!r})")
        if pin and own is not None and len(own) >= 2:
            server_cpu = max(own)
            os.sched_setaffinity(process.pid, {server_cpu})
            os.sched_setaffinity(0, own - {server_cpu})
        yield int(line.strip().split("=", 1)[1])
    finally:
        if own is not None:
            os.sched_setaffinity(0, own)
        process.terminate()
        process.wait(timeout=10)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("aiohttp", "boto3"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _level(plan: BenchPlan, concurrency: int, progress: Progress | None) -> dict[str, Any]:
    cpu = time.process_time()
    log = asyncio.run(run_level(plan, concurrency, progress or NoProgress()))
    # CPU seconds this process spent (all threads, warm-up included): robust on a busy machine, unlike wall time
    cpu = time.process_time() - cpu
    sent = len(log.records) + plan.load.warmup_for(concurrency)
    count_tokens(log.records, plan.prompts, None)
    ok = [r for r in log.records if r.ok]
    wall = max(r.end for r in log.records) - min(r.send for r in log.records) if log.records else 0.0
    events = sum(len(r.token_times) for r in ok)
    return {"api": plan.target.api.value, "concurrency": concurrency, "requests": len(log.records),
            "errors": len(log.records) - len(ok), "wall_s": wall,
            "requests_per_s": len(ok) / wall if wall else None,
            "token_events_per_s": events / wall if wall else None,
            "client_cpu_us_per_request": cpu / sent * 1e6 if sent else None,
            "requests_per_client_cpu_s": sent / cpu if cpu > 0 else None,
            "first_error": next((r.error for r in log.records if r.error), None)}


def run_self_test(concurrencies: tuple[int, ...] = (1, 16, 64), sagemaker_concurrencies: tuple[int, ...] = (16,),
                  duration: float = 3.0, tokens: int = 4, progress: Progress | None = None) -> dict[str, Any]:
    """Measure requests/s through the HTTP client (and boto3 for SageMaker) against the trivial endpoint."""
    shape = RequestShape(max_new_tokens=tokens)
    prompts = PromptSet(("self-test prompt",), (8,), "a fixed short prompt")
    levels = []
    started = time.time()
    with trivial_endpoint(tokens) as port:
        for url, levels_for in ((f"http://127.0.0.1:{port}/predictions/trivial", concurrencies),
                                (f"http://127.0.0.1:{port}/endpoints/trivial/invocations-response-stream",
                                 sagemaker_concurrencies)):
            target = parse_target(url)
            load = LoadSettings(tuple(levels_for), duration=duration, warmup=None, request_timeout=30)
            plan = BenchPlan(target, shape, prompts, load)
            levels += [_level(plan, c, progress) for c in levels_for]
    http = [lv["requests_per_s"] or 0 for lv in levels if lv["api"] == "lmi"]
    http_cpu = [lv["requests_per_client_cpu_s"] or 0 for lv in levels if lv["api"] == "lmi"]
    boto = [lv["requests_per_s"] or 0 for lv in levels if lv["api"] == "sagemaker"]
    return {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "versions": _versions(),
            "tokens_per_answer": tokens, "duration_s_per_level": duration, "levels": levels,
            "ceiling_requests_per_s": max(http, default=None), "sagemaker_ceiling_requests_per_s": max(boto, default=None),
            "ceiling_requests_per_client_cpu_s": max(http_cpu, default=None),
            "elapsed_s": time.time() - started}
