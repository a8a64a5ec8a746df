"""One boto3 call as data: what ``--dry-run`` prints is exactly what is later sent.

Deploys and teardowns are planned as lists of ``ApiCall`` (service, method, keyword arguments) before any
request goes out; ``run`` makes them on the client of each call's service.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import UsageError
from .aws import aws_errors

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY", re.IGNORECASE)


@dataclass(frozen=True)
class ApiCall:
    """One boto3 client call: method name and keyword arguments, on the ``service`` client."""

    method: str
    params: dict
    service: str = "sagemaker"

    @property
    def subject(self) -> str:
        """What the call is about, for messages: the first name-like parameter."""
        for key in ("PolicyName", "InferenceComponentName", "ResourceId", "EndpointName", "EndpointConfigName",
                    "ModelName"):
            if key in self.params:
                return str(self.params[key])
        return ""

    def as_json(self) -> dict:
        """The call for printing: values of secret-looking environment variables are masked."""
        return {"service": self.service, "method": self.method,
                "operation": "".join(part.title() for part in self.method.split("_")), "params": _masked(self.params)}


def run(clients: Mapping[str, object], calls, on_step: Callable[[str], None] | None = None) -> list[dict]:
    """Make ``calls`` in order on ``clients[call.service]``; returns the answers."""
    answers = []
    for call in calls:
        client = clients.get(call.service)
        if client is None:
            raise UsageError(f"{call.method} {call.subject} needs a {call.service} client",
                             hint=f"pass boto3.client({call.service!r}) to the library function")
        with aws_errors(f"{call.method.replace('_', ' ')} {call.subject}"):
            answers.append(getattr(client, call.method)(**call.params))
        if on_step:
            on_step(f"{call.method}: {call.subject}")
    return answers


def _masked(value):
    if isinstance(value, dict):
        return {k: _mask_env(v) if k == "Environment" else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _mask_env(environment: dict) -> dict:
    return {k: "****" if SECRET_NAME.search(k) else v for k, v in environment.items()}
