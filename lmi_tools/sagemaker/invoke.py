"""Invoke a SageMaker endpoint (or ``lmi serve``'s SageMaker Runtime paths): a whole answer with
``invoke_endpoint``, or tokens as they arrive with ``invoke_endpoint_with_response_stream``.

A stream is a series of ``PayloadPart`` events whose bytes are arbitrary slices of the container's output:
a line, a JSON object, even a UTF-8 character can be split across parts (reference/sagemaker.md §3.4). The
published LineIterators get this wrong (§5.1: one never reassembles, one loops forever on a last line without
``\\n``). ``iter_lines`` keeps a byte buffer, splits off complete ``\\n``-terminated lines, decodes each line
(never a part), and at the end flushes a last unterminated line only if it is a complete JSON value, else
raises "truncated line". Lines are LMI jsonlines (``token.text``), chat chunks (``choices[0].delta.content``,
as jsonlines or ``data:`` server-sent events) or a whole JSON answer.

Failures: before the stream, ``ModelError`` (the container answered 4xx/5xx); in the middle,
``ModelStreamError`` / ``InternalStreamFailure`` events, or an error line (LMI keeps HTTP 200 and ends with
``{"code", "error"}`` or ``details.finish_reason == "error"``, §5.2). All become ``ModelFailed`` carrying the
text received so far.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from botocore.exceptions import ClientError

from ..errors import ModelFailed
from .aws import aws_errors, from_client_error

JSON = "application/json"
JSONLINES = "application/jsonlines"


def request_body(prompt: str, parameters: Mapping[str, Any] | None = None, stream: bool = False,
                 chat: bool = False) -> dict:
    """An LMI request (``inputs``/``parameters``/``stream``), or with ``chat`` an OpenAI chat request whose
    parameters (``max_tokens``, ``temperature``...) sit at the top level."""
    if chat:
        return {"messages": [{"role": "user", "content": prompt}], **(parameters or {}), "stream": stream}
    body: dict = {"inputs": prompt, "stream": stream}
    if parameters:
        body["parameters"] = dict(parameters)
    return body


def iter_lines(events: Iterable[Mapping]) -> Iterator[str]:
    """The complete lines carried by a stream's ``PayloadPart`` events (other events are ignored)."""
    buffer = bytearray()
    for event in events:
        part = event.get("PayloadPart")
        if not part:
            continue
        buffer += part.get("Bytes", b"")
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield _decode(bytes(buffer[start:end]))
            start = end + 1
        del buffer[:start]
    if buffer:
        tail = bytes(buffer)
        if not _is_complete(tail):
            raise ModelFailed(f"the stream ended in the middle of a line ({len(tail)} bytes with no final newline: "
                              f"truncated line {tail[:60]!r})", hint="the connection or the container stopped "
                              "early: run the request again, and check the container's log")
        yield _decode(tail)


def _decode(line: bytes) -> str:
    try:
        return line.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as exc:
        raise ModelFailed(f"the stream sent a line that is not UTF-8: {exc}") from None


def _is_complete(tail: bytes) -> bool:
    try:
        payload = _sse_payload(tail.decode("utf-8").strip())
        if payload and payload != "[DONE]":
            json.loads(payload)
        return True
    except (UnicodeDecodeError, ValueError):  # cut inside a character or a JSON value
        return False


def _sse_payload(line: str) -> str:
    return line[len("data:"):].strip() if line.startswith("data:") else line


def parse_line(line: str) -> Any | None:
    """The JSON value of a jsonlines or ``data:`` line; None for blank lines, SSE comments/fields, ``[DONE]``."""
    line = line.strip()
    if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
        return None
    payload = _sse_payload(line)
    if payload == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except ValueError:
        raise ModelFailed(f"the stream sent a line that is not JSON: {line[:80]!r}") from None


def answer_text(value: Any) -> str:
    """The generated text in an answer or a stream line (LMI, chat, chat chunk, TGI list, legacy list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(answer_text(item) for item in value)
    if not isinstance(value, dict):
        return ""
    if "token" in value:
        return (value.get("token") or {}).get("text") or ""
    if value.get("choices"):
        choice = value["choices"][0]
        message = choice.get("delta") or choice.get("message") or {}
        return message.get("content") or choice.get("text") or ""
    return value.get("generated_text") or ""


def error_in(value: Any) -> str | None:
    """The error an answer or line reports, if any (LMI error objects, finish_reason "error", OpenAI errors)."""
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error)
    if error is not None and "code" in value:
        return f"{error} (code {value['code']})"
    if (value.get("details") or {}).get("finish_reason") == "error":
        return "the model stopped with finish_reason 'error'"
    return None


@dataclass(frozen=True)
class Answer:
    """A whole answer: the raw body, its content type, and the generated text found in it."""

    body: bytes
    content_type: str
    text: str


def invoke(runtime, endpoint: str, payload: Mapping, accept: str = JSON) -> Answer:
    """``invoke_endpoint`` with a JSON body; ``ModelFailed`` if the model answered with an error."""
    with aws_errors(f"invoking endpoint {endpoint}"):
        response = runtime.invoke_endpoint(EndpointName=endpoint, Body=json.dumps(payload),
                                           ContentType=JSON, Accept=accept)
        body = response["Body"].read()
    content_type = response.get("ContentType", "")
    try:
        value = json.loads(body)
    except ValueError:
        return Answer(body, content_type, body.decode("utf-8", "replace"))
    error = error_in(value)
    if error:
        raise ModelFailed(f"the model answered with an error: {error}")
    return Answer(body, content_type, answer_text(value))


class TokenStream:
    """The text of each token as it arrives, from ``invoke_endpoint_with_response_stream``.

    Iterate once. ``text`` is everything received so far, ``last`` the last JSON line (LMI's carries
    ``generated_text`` and ``details``), ``content_type`` the container's (X-Amzn-SageMaker-Content-Type).
    """

    def __init__(self, response: Mapping):
        self.body = response["Body"]
        self.content_type = response.get("ContentType", "")
        self.text, self.last = "", None

    def __iter__(self) -> Iterator[str]:
        try:
            for line in iter_lines(self._events()):
                value = parse_line(line)
                if value is None:
                    continue
                self.last = value
                error = error_in(value)
                if error:
                    raise ModelFailed(f"the model failed in the middle of the stream: {error}",
                                      hint="the text received before the failure was kept")
                piece = answer_text(value)
                if piece:
                    self.text += piece
                    yield piece
        except ModelFailed as exc:
            exc.received = self.text
            raise
        finally:
            self.body.close()  # also when the caller stops early: frees the connection

    def _events(self) -> Iterator[Mapping]:
        try:
            yield from self.body
        except ClientError as exc:  # EventStreamError: ModelStreamError, InternalStreamFailure
            raise from_client_error(exc, "reading the stream") from None


def invoke_stream(runtime, endpoint: str, payload: Mapping, accept: str = JSONLINES) -> TokenStream:
    """Start ``invoke_endpoint_with_response_stream``; iterate the result for tokens. ``payload`` should ask for
    a stream (``"stream": true``), as LMI otherwise answers in one piece."""
    with aws_errors(f"invoking endpoint {endpoint} with response streaming"):
        response = runtime.invoke_endpoint_with_response_stream(EndpointName=endpoint, Body=json.dumps(payload),
                                                                ContentType=JSON, Accept=accept)
    return TokenStream(response)
