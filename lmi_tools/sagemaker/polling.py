"""Waiting for a SageMaker resource to reach a state: one poller for endpoints, inference components and
optimization jobs, which differ only in how they are described, which field holds the status, and what to tell
the user when it fails or takes too long."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection

from ..errors import AwsError

StatusCallback = Callable[[str, float], None]


@dataclass(frozen=True)
class Waitable:
    """What to poll: ``describe()`` answers a description whose ``status_key`` is ``done`` when finished, one of
    ``failed`` when it never will be. ``what`` names it in messages ("endpoint NAME")."""

    what: str
    describe: Callable[[], dict]
    status_key: str
    done: str
    failed: Collection[str]
    failed_hint: str
    timeout_hint: str


def wait_for(target: Waitable, timeout_s: float, poll_s: float, on_status: StatusCallback | None = None,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll until ``target.done`` (returns the description); ``AwsError`` on a failed state (with SageMaker's
    FailureReason) or when ``timeout_s`` would pass before the next poll. ``on_status(status, elapsed_s)`` each
    poll."""
    began = clock()
    while True:
        description = target.describe()
        status, elapsed = description[target.status_key], clock() - began
        if on_status:
            on_status(status, elapsed)
        if status == target.done:
            return description
        if status in target.failed:
            reason = description.get("FailureReason") or "SageMaker gave no reason"
            raise AwsError(f"{target.what} is {status}: {reason}", code=status, kind="failed",
                           hint=target.failed_hint)
        if elapsed + poll_s > timeout_s:
            raise AwsError(f"{target.what} is still {status} after {elapsed:.0f} s", code="WaitTimeout",
                           kind="timeout", hint=target.timeout_hint)
        sleep(poll_s)
