"""Errors of the user-side tooling. ``cli.main`` is the one place that prints them and picks the exit code."""

from __future__ import annotations


class ToolError(Exception):
    """A failure the user can act on: ``str(error)`` says what went wrong, ``hint`` what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class UsageError(ToolError):
    """The command line or a spec file is wrong."""

    exit_code = 2


class ValidationFailed(ToolError):
    """A configuration does not fit the model or the hardware."""

    exit_code = 3


class AwsError(ToolError):
    """An AWS call failed: credentials, permissions, quotas, conflicts, missing resources, bad requests.

    ``code`` is AWS's error code (``AccessDenied``, ``ResourceLimitExceeded``...) where there is one, and
    ``kind`` our grouping of it (``not-found``, ``access-denied``, ``quota``...), for callers that react.
    """

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None, code: str | None = None, kind: str = "aws"):
        super().__init__(message, hint)
        self.code, self.kind = code, kind


class ModelFailed(ToolError):
    """The deployed model answered with an error (SageMaker ModelError, or a failure in the middle of a stream).

    ``received`` is the text that arrived before the failure (already printed by a streaming command).
    """

    exit_code = 5

    def __init__(self, message: str, hint: str | None = None, received: str = ""):
        super().__init__(message, hint)
        self.received = received
