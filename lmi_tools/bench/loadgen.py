"""The closed loop: C clients, each sending its next request as soon as its previous one ends.

A phase stops starting requests at its count or its deadline, whichever comes first, then waits for the
requests in flight, but never past its hard stop: whatever is still running then is cancelled and counted
(so a run always ends, even against a server that hangs).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from .records import RequestRecord

#: A run keeps every record in memory: this bounds a run's log whatever its duration.
MAX_REQUESTS = 1_000_000

Send = Callable[[int], Awaitable[RequestRecord]]


@dataclass
class PhaseResult:
    records: list[RequestRecord]
    #: Requests in flight at the hard stop (cancelled; not in ``records``).
    cancelled: int


async def closed_loop(send: Send, concurrency: int, count: int, send_until: float, hard_stop: float,
                      on_done: Callable[[RequestRecord], None] | None = None) -> PhaseResult:
    """Run ``concurrency`` clients until ``count`` requests were started or ``send_until`` (perf_counter) passed."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    records: list[RequestRecord] = []
    state = {"next": 0, "in_flight": 0}
    limit = min(count, MAX_REQUESTS)

    async def client() -> None:
        while state["next"] < limit and time.perf_counter() < send_until:
            index = state["next"]
            state["next"] += 1
            state["in_flight"] += 1
            record = await send(index)
            state["in_flight"] -= 1
            records.append(record)
            if on_done is not None:
                on_done(record)

    tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, hard_stop - time.perf_counter()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # a bug in an executor, not a failed request: do not hide it
    return PhaseResult(records, state["in_flight"] if pending else 0)
