"""SageMaker Runtime in front of a local container, for an unmodified boto3 ``sagemaker-runtime`` client.

On SageMaker, boto3 calls SageMaker Runtime (``POST /endpoints/{name}/invocations`` and
``.../invocations-response-stream``), which calls the container's ``POST /invocations``. vLLM's server has only the
container's route, so a botocore ``before-send`` hook plays SageMaker's part here: it sends the request's body, with
the headers SageMaker passes on (content type, accept, custom attributes, session id), to the container's
``/invocations``, and answers boto3 as SageMaker Runtime does: the body with a 200, a container's error status as
SageMaker's 424 ``ModelError``, and a streamed body as event-stream ``PayloadPart`` frames, one per chunk as it
arrives (``lmi_tools/serving/eventstream.py``, the framing ``lmi serve``'s SageMaker routes send). The callers'
code (``invoke_endpoint``, ``invoke_endpoint_with_response_stream``, their ``LineIterator``) is unchanged.
"""

from __future__ import annotations

import json

import boto3
import urllib3
from botocore.awsrequest import AWSResponse, HeadersDict
from botocore.config import Config

from lmi_tools.serving import eventstream

#: The headers SageMaker Runtime passes to the container (the streaming call's accept arrives as Accept).
FORWARDED = {"content-type": "Content-Type", "accept": "Accept", "x-amzn-sagemaker-accept": "Accept",
             "x-amzn-sagemaker-custom-attributes": "X-Amzn-SageMaker-Custom-Attributes",
             "x-amzn-sagemaker-session-id": "X-Amzn-SageMaker-Session-Id"}
_pool = urllib3.PoolManager()


def runtime_for(url: str):
    """A ``sagemaker-runtime`` client whose calls reach the container at ``url`` as SageMaker delivers them."""
    client = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing",
                          config=Config(retries={"max_attempts": 1}, read_timeout=300))
    for operation, framed in (("InvokeEndpoint", False), ("InvokeEndpointWithResponseStream", True)):
        client.meta.events.register(f"before-send.sagemaker-runtime.{operation}",
                                    lambda request, framed=framed, **_: _forward(url, request, framed))
    return client


def _forward(url: str, request, framed: bool) -> AWSResponse:
    headers = {FORWARDED[k.lower()]: v for k, v in request.headers.items() if k.lower() in FORWARDED}
    headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in headers.items()}
    answer = _pool.request("POST", url + "/invocations", body=request.body, headers=headers, preload_content=False,
                           timeout=urllib3.Timeout(connect=10, read=300))
    kind = answer.headers.get("content-type", "application/json")
    if answer.status >= 400:
        text = answer.read().decode("utf-8", "replace")
        body = {"message": f'Received client error ({answer.status}) from primary with message "{text}"',
                "ErrorCode": "CLIENT_ERROR_FROM_MODEL", "OriginalStatusCode": answer.status, "OriginalMessage": text}
        return AWSResponse(request.url, 424, HeadersDict({"x-amzn-ErrorType": "ModelError:",
                                                          "content-type": "application/json"}),
                           _Body([json.dumps(body).encode()]))
    if framed:
        headers = {"content-type": "application/vnd.amazon.eventstream", "X-Amzn-SageMaker-Content-Type": kind}
        return AWSResponse(request.url, 200, HeadersDict(headers), _Body(_parts(answer)))
    headers = {"content-type": kind, "X-Amzn-Invoked-Production-Variant": "AllTraffic"}
    return AWSResponse(request.url, 200, HeadersDict(headers), _Body([answer.read()]))


def _parts(answer):
    chunks = answer.read_chunked() if answer.chunked else iter([answer.read()])
    for chunk in chunks:
        if chunk:
            yield eventstream.payload_part(chunk)


class _Body:
    """What botocore reads a response from: ``stream()`` (event streams and whole bodies alike)."""

    def __init__(self, chunks):
        self.chunks = chunks

    def stream(self, **_):
        yield from self.chunks

    def read(self, *_):
        return b"".join(self.chunks)

    def close(self):
        pass
