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
