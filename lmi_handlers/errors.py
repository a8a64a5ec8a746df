"""Every error the runtime reports, each with the HTTP status it maps to, and the bounds on its text.

``Handler`` is the only place that turns these into responses; nothing else hard-codes a status. What a client reads
of an error is at most ``MAX_ERROR_CHARS`` characters (``capped``, applied wherever an error becomes a response), and
what the log keeps of a failure at most ``MAX_LOG_CHARS`` (``log_failure``): a hostile request's megabyte grammar
becomes neither a megabyte error line nor a megabyte log line.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

#: The most characters of error text a client receives (docs/serving.md, "Failures"); the rest is cut.
MAX_ERROR_CHARS = 1000
#: The most characters the log keeps of one failure's message, and again of its stack.
MAX_LOG_CHARS = 4000


class HandlerError(Exception):
    """Base class: ``status`` is the HTTP status, ``str(error)`` a sentence for the client."""

    status = 500


class ConfigError(HandlerError):
    """A serving.properties value is invalid; the model refuses to load."""

    status = 400

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"option.{key}={value!r} is invalid: {allowed}")


class InvalidRequest(HandlerError):
    """The request body or one of its fields is invalid."""

    status = 400

    def __init__(self, message: str, field: str | None = None, value: Any = None):
        self.field, self.value = field, value
        super().__init__(message)


def invalid_field(field: str, value: Any, allowed: str) -> InvalidRequest:
    """An ``InvalidRequest`` whose message names the field, the value received and what is allowed."""
    try:
        shown = repr(value)
    except (ValueError, RecursionError):  # an integer too long to print, a structure too deep
        shown = f"a {type(value).__name__} too large to show"
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidRequest(f"{field}: {allowed}, got {shown}", field=field, value=value)


class AdapterNotFound(InvalidRequest):
    """A request names a LoRA adapter that is not registered (the message lists those that are)."""

    status = 404


class Cancelled(HandlerError):
    """The client went away; nginx's 499 "client closed request" (nobody reads it, but every answer says why)."""

    status = 499


class BackendError(HandlerError):
    """The model failed while generating (LMI answers 424 for this)."""

    status = 424


class EngineStopped(HandlerError):
    """An engine we drive (vLLM) stopped for good; the worker process restarts (503, as when a worker dies)."""

    status = 503


class OutOfMemory(HandlerError):
    """The model ran out of device or host memory (DJLServing's 507)."""

    status = 507


class SequenceFailed(HandlerError):
    """One sequence failed inside a shared step (its grammar, its sampling, its adapter's rows, its text) and ends
    alone, with the status of the cause: a request's own fault, such as a grammar that fails mid-generation, is a
    400. The message names that request's own field and cause, never another request's."""

    def __init__(self, stage: str, cause: BaseException):
        self.stage, self.cause = stage, cause
        self.status = status_of(cause)
        detail = str(cause) if isinstance(cause, HandlerError) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"generation failed ({stage}): {detail}")


def step_failure(error: BaseException) -> str:
    """What every sequence of a step that failed as a whole is told: a backend's own sentence (``BackendError``,
    ``OutOfMemory``, ``EngineStopped``: ours, never quoting a request), else only the failure's type, since its text
    may quote any request of the step."""
    if isinstance(error, HandlerError) and not isinstance(error, InvalidRequest):
        return f"generation failed: {error}"
    return f"generation failed: {type(error).__name__} in the model's step (the server log has the details)"


def capped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    tail = f"... (cut: {len(text)} characters in all)"
    return text[:max(0, limit - len(tail))] + tail


def log_failure(log: logging.Logger, what: str, error: BaseException) -> None:
    """``what`` failed with ``error``: logged with its stack, each bounded by ``MAX_LOG_CHARS``."""
    stack = "".join(traceback.format_tb(error.__traceback__))
    log.error("%s: %s\n%s", what, capped(f"{type(error).__name__}: {error}", MAX_LOG_CHARS),
              capped(stack, MAX_LOG_CHARS).rstrip())


def status_of(error: BaseException) -> int:
    if isinstance(error, HandlerError):
        return error.status
    if is_out_of_memory(error):
        return OutOfMemory.status
    return BackendError.status


def is_out_of_memory(error: BaseException) -> bool:
    # torch.cuda.OutOfMemoryError and MemoryError, matched by name as the DJL engine does, so
    # that no torch import is needed here.
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"OutOfMemoryError", "MemoryError"}) or "CUDA error: out of memory" in str(error)
