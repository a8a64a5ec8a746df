"""What ``lmi bench TARGET [--api API]`` points at.

TARGET is a URL; its path names the API unless ``--api`` does:

=====================================================  ======================  =====================
URL path                                               API                     streams?
=====================================================  ======================  =====================
``/predictions/<model>``, ``/invocations``             ``lmi`` (DJLServing)    yes (``"stream": true``)
``/endpoints/<name>/invocations-response-stream``      ``sagemaker`` (boto3)   yes
``/endpoints/<name>/invocations``                      ``sagemaker`` (boto3)   no
``/generate_stream`` / ``/generate``                   ``tgi``                 yes / no
``/v1/completions``                                    ``openai-completions``  yes
``/v1/chat/completions``                               ``openai-chat``         yes
=====================================================  ======================  =====================

``sagemaker:<endpoint name>`` is a real SageMaker endpoint in ``--region`` (or the AWS configuration's).
For SageMaker URLs the scheme and host become boto3's ``endpoint_url`` (``lmi serve`` answers those paths
locally). With ``--api`` a bare ``http://host:port`` gets the API's default path. ``--no-stream`` turns
streaming off where the path does not decide it.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..answers.messages import Api
from ..errors import ToolError, UsageError

DEFAULT_PATHS = {Api.LMI: "/invocations", Api.OPENAI_COMPLETIONS: "/v1/completions",
                 Api.OPENAI_CHAT: "/v1/chat/completions", Api.OPENAI_EMBEDDINGS: "/v1/embeddings"}
SAGEMAKER_PATH = re.compile(r"^/endpoints/([^/]+)(/invocations(-response-stream)?)?/?$")
AWS_RUNTIME_HOST = re.compile(r"^runtime\.sagemaker\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
API_NAMES = ", ".join(a.value for a in Api)


@dataclass(frozen=True)
class BenchTarget:
    """A resolved target: the API, where to send, and whether answers stream."""

    api: Api
    stream: bool
    #: The URL requests are posted to (HTTP APIs).
    url: str | None = None
    #: SageMaker: the endpoint's name, boto3's endpoint_url (None: AWS itself) and region.
    endpoint_name: str | None = None
    endpoint_url: str | None = None
    region: str | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"api": self.api.value, "stream": self.stream}
        if self.api is Api.SAGEMAKER:
            out.update(endpoint_name=self.endpoint_name, endpoint_url=self.endpoint_url, region=self.region)
        else:
            out["url"] = self.url
        return out


def detect_api(path: str) -> Api | None:
    if SAGEMAKER_PATH.match(path):
        return Api.SAGEMAKER
    if path.startswith("/predictions/") or path.rstrip("/") == "/invocations" or (
            path.startswith("/models/") and path.rstrip("/").endswith("/invoke")):
        return Api.LMI
    if path.rstrip("/") in ("/generate", "/generate_stream"):
        return Api.TGI
    if path.rstrip("/").endswith("/embeddings"):
        return Api.OPENAI_EMBEDDINGS
    if path.rstrip("/").endswith("/chat/completions"):
        return Api.OPENAI_CHAT
    if path.rstrip("/").endswith("/completions"):
        return Api.OPENAI_COMPLETIONS
    return None


def _stream(path_says: bool | None, asked: bool | None, target: str) -> bool:
    if path_says is None:
        return True if asked is None else asked
    if asked is not None and asked != path_says:
        raise UsageError(f"--{'no-' if not asked else ''}stream contradicts TARGET {target}, whose path "
                         f"{'streams' if path_says else 'does not stream'}",
                         hint="change the path (e.g. /generate vs /generate_stream) or drop the flag")
    return path_says


def _sagemaker(target: str, parts, stream: bool | None, region: str | None) -> BenchTarget:
    match = SAGEMAKER_PATH.match(parts.path)
    if match is None:
        raise UsageError(f"TARGET {target} does not name a SageMaker endpoint",
                         hint="use sagemaker:NAME or http(s)://HOST/endpoints/NAME/invocations-response-stream")
    path_says = None if match.group(2) is None else match.group(3) is not None
    aws = AWS_RUNTIME_HOST.match(parts.hostname or "")
    region = region or (aws.group(1) if aws else "us-east-1")
    return BenchTarget(Api.SAGEMAKER, _stream(path_says, stream, target), endpoint_name=match.group(1),
                  endpoint_url=f"{parts.scheme}://{parts.netloc}", region=region)


def parse_target(target: str, api: str | None = None, stream: bool | None = None,
                 region: str | None = None) -> BenchTarget:
    """Resolve TARGET (and ``--api``, ``--stream/--no-stream``, ``--region``) into a ``BenchTarget``."""
    chosen = parse_api(api)
    if target.startswith("sagemaker:") and not target.startswith("sagemaker://"):
        name = target.split(":", 1)[1]
        if not name or chosen not in (None, Api.SAGEMAKER):
            raise UsageError(f"TARGET {target!r}: sagemaker:NAME needs an endpoint name and --api sagemaker (or none)")
        return BenchTarget(Api.SAGEMAKER, True if stream is None else stream, endpoint_name=name, region=region)
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"TARGET {target!r} is not an http(s) URL or sagemaker:NAME",
                         hint="e.g. http://127.0.0.1:8080/predictions/model (see docs/benchmarking.md)")
    found = detect_api(parts.path)
    chosen = chosen or found
    if chosen is None:
        raise UsageError(f"cannot tell the API of TARGET {target} from its path {parts.path or '/'!r}",
                         hint=f"add --api ({API_NAMES}) or use a path such as /predictions/<model>")
    if chosen is Api.SAGEMAKER:
        return _sagemaker(target, parts, stream, region)
    path = parts.path if parts.path not in ("", "/") else None
    if chosen is Api.TGI:
        path_says = None if path is None else path.rstrip("/").endswith("/generate_stream")
        streaming = _stream(path_says, stream, target)
        path = path or ("/generate_stream" if streaming else "/generate")
    else:
        streaming = _stream(False if chosen is Api.OPENAI_EMBEDDINGS else None, stream, target)
        path = path or DEFAULT_PATHS[chosen]
    query = f"?{parts.query}" if parts.query else ""
    return BenchTarget(chosen, streaming, url=f"{parts.scheme}://{parts.netloc}{path}{query}")


def parse_api(api: str | None) -> Api | None:
    if api is None:
        return None
    try:
        return Api(api)
    except ValueError:
        raise UsageError(f"--api {api!r} is not one of {API_NAMES}") from None


def check_reachable(target: BenchTarget, timeout: float = 5.0) -> None:
    """Connect once before sending anything, so that a dead port is one clear error, not N failed requests.
    Only for explicit URLs: SageMaker itself (no endpoint URL) is reached through boto3's own checks."""
    url = target.url or target.endpoint_url
    if not url:
        return
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise ToolError(f"cannot connect to {parts.hostname}:{port} ({exc.strerror or exc}); nothing was sent",
                        hint="start the server first and check the URL, or let lmi bench start one with "
                             "--serve MODEL_DIR") from None
