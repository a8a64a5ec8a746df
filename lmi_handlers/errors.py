"""Every error the runtime reports, each with the HTTP status it maps to.

``Handler`` is the only place that turns these into responses; nothing else hard-codes a status.
"""

from __future__ import annotations

from typing import Any


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
