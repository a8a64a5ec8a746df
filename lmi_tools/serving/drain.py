"""A graceful stop for ``lmi serve``: what SageMaker and Kubernetes expect of a replica they stop with SIGTERM.

The first SIGTERM (or SIGINT) starts a drain: at once ``/ping``, ``/health`` and every new request answer 503 with
``Retry-After`` and ``Connection: close`` (``DrainGate``; ``/metrics`` still answers), so that load balancers take the
replica out and clients retry elsewhere; the listeners stay open to say so. Every request accepted before it runs
to its end, streams included, for up to ``--drain-timeout`` seconds (25 by default, under SageMaker's 30). Those
still running then end with an error event in their own protocol's framing (the dispatcher's mid-answer error, as
when a model is unloaded), the workers stop and the server exits 0. A second signal stops at once: the workers are
killed and the listeners close without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Awaitable, Callable

logger = logging.getLogger("lmi.serve")
DEFAULT_TIMEOUT = 25.0
#: Seconds a client is told to wait before it retries (on another replica, behind a load balancer).
RETRY_AFTER = "1"
#: The paths that answer during a drain: the metrics show the drain's progress.
OPEN_PATHS = ("/metrics",)
POLL = 0.05


class Drain:
    """The server's state of stopping: the requests it is answering, and whether it still accepts new ones."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self.in_flight = 0
        self.draining = False
        self.forced = False

    @property
    def reason(self) -> str:
        return f"the server is shutting down: this request did not finish within the drain timeout of " \
               f"{self.timeout:g} s (lmi serve --drain-timeout)"

    async def run(self, cut: Callable[[str], Awaitable[None]], stop: Callable[[], None]) -> None:
        """Wait for the accepted requests; those left at the timeout are ``cut`` with ``reason``; then ``stop``."""
        deadline = time.monotonic() + self.timeout
        logger.info("draining: %d requests in flight, at most %g s; new requests get 503", self.in_flight,
                    self.timeout)
        while self.in_flight and time.monotonic() < deadline and not self.forced:
            await asyncio.sleep(POLL)
        if self.in_flight and not self.forced:
            logger.warning("drain timeout: %d requests still running end with an error", self.in_flight)
            await cut(self.reason)
            grace = time.monotonic() + 2.0  # their error events reach the clients
            while self.in_flight and time.monotonic() < grace:
                await asyncio.sleep(POLL)
        logger.info("drained: stopping the workers")
        stop()


class DrainGate:
    """ASGI middleware: counts the requests in flight; while draining, answers new ones 503 (``error`` gives each
    API's own error shape)."""

    def __init__(self, app: Any, drain: Drain, error: Callable[[Any, int, str], Awaitable[Any]]):
        self.app, self.drain, self.error = app, drain, error

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope["path"] not in OPEN_PATHS:
            response = await self.error(scope, 503, "the server is shutting down (draining): retry on another "
                                                    "replica")
            response.headers["Retry-After"] = RETRY_AFTER
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


def on_signals(loop: asyncio.AbstractEventLoop, first: Callable[[], None], second: Callable[[], None]) -> None:
    """``first`` on the first SIGTERM or SIGINT, ``second`` on any later one."""
    seen: list[int] = []

    def handle(sig: int) -> None:
        logger.info("received %s%s", signal.Signals(sig).name, " again: stopping now" if seen else "")
        (second if seen else first)()
        seen.append(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handle, sig)
