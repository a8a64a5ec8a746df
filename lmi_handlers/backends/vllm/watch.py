"""vLLM's engine watched, for the step loop (``engine.py``) and the async driver (``async_engine.py``) alike.

vLLM's engine core cannot recover from a failed step: it stops, and every later call raises. Its drivers then fail
every request with a 503 that says so and end this worker process a moment later, as vLLM's own server exits, so
that the server (``lmi serve``, DJLServing) starts a fresh one instead of answering errors forever. An engine core
process that ends without a word (killed by a signal, or by the kernel's OOM killer) leaves the engine waiting
forever; a watcher thread ends this process then too. A request vLLM refuses fails alone, with the status its
error means (``request_error``).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from typing import Any

from ...errors import EngineStopped, InvalidRequest, status_of

logger = logging.getLogger(__name__)

#: Seconds between answering the requests of a stopped engine and this process's exit: the answers reach the
#: socket first.
EXIT_DELAY = 1.0
CORE_ENDED = "vLLM's engine process ended; the model's worker restarts"


class EngineWatch:
    """What the step loop and the async driver share: why vLLM's engine stopped, once it has (every request is then
    refused with it), and ending this process then (the server starts a fresh worker)."""

    def __init__(self) -> None:
        self.stopped: str | None = None
        self.exit_soon = exit_soon
        watch_cores(self._core_ended)

    def _core_ended(self, which: str) -> None:
        """From ``watch_cores``' thread: an engine core process ended without vLLM saying so."""
        if self.stopped is None:
            logger.error("vllm: %s and vLLM's engine did not say so; this worker exits so that the server starts a "
                         "fresh one", which)
            self.stopped = CORE_ENDED
            self.exit_soon()


def watch_cores(on_end: Any) -> None:
    """Calls ``on_end(which)`` from a thread once one of vLLM's engine core processes (this process's children once
    the engine is built; none when vLLM runs its core in this process) ends, a moment later: a core that fails tells
    the engine first, so ``on_end`` acts only where the engine did not say so."""
    cores = multiprocessing.active_children()
    if cores:
        threading.Thread(target=_watch, args=(cores, on_end), name="vllm-engine-watch", daemon=True).start()


def _watch(cores: list[multiprocessing.Process], on_end: Any) -> None:
    multiprocessing.connection.wait([core.sentinel for core in cores])
    time.sleep(EXIT_DELAY)
    ended = next(core for core in cores if not core.is_alive())
    on_end(f"the engine process {ended.name} (pid {ended.pid}) ended with code {ended.exitcode}")


def request_error(exc: Exception, stopped: str | None) -> tuple[int, str]:
    """(status, message) for a request vLLM refused: its validation errors are the client's (400); on an engine
    that stopped, ``stopped`` says why."""
    if isinstance(exc, (InvalidRequest, EngineStopped)):
        return exc.status, str(exc)
    if stopped is not None:
        return EngineStopped.status, stopped
    parameter = getattr(exc, "parameter", None)
    if parameter is not None or isinstance(exc, (ValueError, TypeError)):
        error = InvalidRequest(f"{exc}", field=parameter)
        return error.status, str(error)
    return status_of(exc), f"{type(exc).__name__}: {exc}"


def engine_dead(exc: Exception) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(exc, EngineDeadError)


def exit_soon() -> None:
    """End this process in ``EXIT_DELAY`` seconds, from a thread: the step that says why is answered first."""
    timer = threading.Timer(EXIT_DELAY, os._exit, (1,))
    timer.daemon = True
    timer.start()
