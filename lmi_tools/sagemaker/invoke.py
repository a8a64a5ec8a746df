"""Invoke a SageMaker endpoint (or ``lmi serve``'s SageMaker Runtime paths): a whole answer with
``invoke_endpoint``, or tokens as they arrive with ``invoke_endpoint_with_response_stream``.

A stream is a series of ``PayloadPart`` events whose bytes are arbitrary slices of the container's output:
a line, a JSON object, even a UTF-8 character can be split across parts (reference/sagemaker.md §3.4). The
published LineIterators get this wrong (§5.1: one never reassembles, one loops forever on a last line without
``\\n``). The answer is read by ``lmi bench``'s reader (``lmi_tools.answers``): lines are reassembled from the
bytes, decoded whole, framed by the container's content type (JSON, JSON lines, server-sent events), and read
as LMI answers (``token.text``, ``generated_text``) or, with ``chat``, OpenAI chat chunks.

Failures: before the stream, ``ModelError`` (the container answered 4xx/5xx); in the middle,
``ModelStreamError`` / ``InternalStreamFailure`` events, an error message (the rule of ``lmi_tools.answers``:
an ``error`` field, DJLServing's error shape, or LMI's ``details.finish_reason == "error"``), a line that is
not JSON, or a stream cut inside a line. All become ``ModelFailed`` carrying the text received so far.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from botocore.exceptions import ClientError

from ..answers.messages import Answer, Api
from ..answers.reader import AnswerReader, payload_parts
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


def _api(payload: Mapping) -> Api:
    return Api.OPENAI_CHAT if "messages" in payload else Api.SAGEMAKER


@dataclass(frozen=True)
class Reply:
    """A whole answer: the raw body, its content type, and the generated text found in it."""

    body: bytes
    content_type: str
    text: str


def _target(endpoint: str, component: str | None) -> dict:
    """The endpoint, and the inference component when one is named (header X-Amzn-SageMaker-Inference-Component)."""
    return {"EndpointName": endpoint, **({"InferenceComponentName": component} if component else {})}


def invoke(runtime, endpoint: str, payload: Mapping, accept: str = JSON, raw: bool = False,
           component: str | None = None) -> Reply:
    """``invoke_endpoint`` with a JSON body (to ``component`` on the endpoint when given); ``ModelFailed`` if the
    answer reports an error (never with ``raw``, which returns the body unread)."""
    with aws_errors(f"invoking endpoint {endpoint}" + (f" component {component}" if component else "")):
        response = runtime.invoke_endpoint(**_target(endpoint, component), Body=json.dumps(payload),
                                           ContentType=JSON, Accept=accept)
        body = response["Body"].read()
    content_type = response.get("ContentType", "")
    if raw:
        return Reply(body, content_type, body.decode("utf-8", "replace"))
    reader = AnswerReader(_api(payload), content_type)
    reader.feed(body, time.perf_counter())
    answer = reader.finish(time.perf_counter())
    if answer.error:
        raise ModelFailed(f"the model answered with an error: {answer.error}",
                          hint="--raw prints the answer's body as it is")
    return Reply(body, content_type, _text(answer))


def _text(answer: Answer) -> str:
    return answer.text if answer.text is not None else "".join(answer.pieces)


class TokenStream:
    """The text of each token as it arrives, from ``invoke_endpoint_with_response_stream``.

    Iterate once. ``text`` is everything received so far; ``answer`` what the reader found (LMI's last line
    carries ``generated_text`` and ``details``); ``content_type`` the container's (X-Amzn-SageMaker-Content-Type).
    """

    def __init__(self, response: Mapping, api: Api = Api.SAGEMAKER):
        self.body = response["Body"]
        self.content_type = response.get("ContentType", "")
        self.reader = AnswerReader(api, self.content_type)
        self.answer = self.reader.answer
        self.text = ""

    def __iter__(self) -> Iterator[str]:
        sent = 0
        try:
            for part in payload_parts(self._events()):
                self.reader.feed(part, time.perf_counter())
                yield from self._new(sent)
                sent = len(self.answer.pieces)
            self.reader.finish(time.perf_counter())
            yield from self._new(sent)
            if not self.answer.pieces and self.answer.text:  # a whole JSON answer: its text at once
                self.text = self.answer.text
                yield self.answer.text
        except ModelFailed as exc:
            exc.received = self.text
            raise
        finally:
            self.body.close()  # also when the caller stops early: frees the connection

    def _new(self, sent: int) -> Iterator[str]:
        for piece in self.answer.pieces[sent:]:
            if piece:
                self.text += piece
                yield piece
        if self.answer.error:
            truncated = "truncated line" in self.answer.error
            raise ModelFailed(f"the model failed in the middle of the stream: {self.answer.error}",
                              hint="the connection or the container stopped early: run the request again, and "
                                   "check the container's log" if truncated else
                                   "the text received before the failure was kept")

    def _events(self) -> Iterator[Mapping]:
        try:
            yield from self.body
        except ClientError as exc:  # EventStreamError: ModelStreamError, InternalStreamFailure
            raise from_client_error(exc, "reading the stream") from None


def invoke_stream(runtime, endpoint: str, payload: Mapping, accept: str = JSONLINES,
                  component: str | None = None) -> TokenStream:
    """Start ``invoke_endpoint_with_response_stream`` (to ``component`` when given); iterate the result for tokens.
    ``payload`` should ask for a stream (``"stream": true``), as LMI otherwise answers in one piece."""
    with aws_errors(f"invoking endpoint {endpoint}" + (f" component {component}" if component else "")
                    + " with response streaming"):
        response = runtime.invoke_endpoint_with_response_stream(**_target(endpoint, component),
                                                                Body=json.dumps(payload), ContentType=JSON,
                                                                Accept=accept)
    return TokenStream(response, _api(payload))
