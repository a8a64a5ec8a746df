"""What each API's messages say: token events, text, token counts, finish reason and errors (sans-IO).

* ``lmi``: DJLServing / LMI (``/predictions/<model>``, ``/invocations``): answers ``{"generated_text",
  "details"}`` or JSON lines of ``{"token": {...}}``, the last one also carrying ``generated_text`` and
  ``details`` (``generated_tokens``; ``prompt_tokens`` from lmi_handlers).
* ``sagemaker``: the same through SageMaker Runtime; the lines arrive in event-stream PayloadParts.
* ``tgi``: ``/generate`` (one JSON) and ``/generate_stream`` (SSE of ``{"token", "generated_text", "details"}``).
* ``openai-completions`` / ``openai-chat``: ``/v1/completions`` and ``/v1/chat/completions``; streamed as SSE
  chunks ending in ``data: [DONE]``, with a ``usage`` chunk when ``stream_options.include_usage`` is honoured.

A token event is one generated token where the API streams one per message (LMI, TGI), and an OpenAI chunk
whose text is not empty (a chunk may carry several tokens, and the first chat chunk often only the role).
The error rule is ``error_message``'s.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class Api(str, enum.Enum):
    LMI = "lmi"
    SAGEMAKER = "sagemaker"
    TGI = "tgi"
    OPENAI_COMPLETIONS = "openai-completions"
    OPENAI_CHAT = "openai-chat"
    #: ``/v1/embeddings``: one vector per request, no tokens generated (``lmi bench`` counts embeddings per second).
    OPENAI_EMBEDDINGS = "openai-embeddings"


@dataclass
class Answer:
    """What one response said, as it was read."""

    token_times: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    text: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    def token(self, now: float, text: str) -> None:
        self.token_times.append(now)
        self.pieces.append(text)

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message[:300]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_message(obj: Any) -> str | None:
    """The error an object reports, in any of the shapes these servers use; None if it is not an error.

    The one rule for ``lmi invoke``, ``lmi bench`` and ``lmi serve``'s routes (``error_parts``), with DJLServing's
    exception type in front of its message.
    """
    parts = error_parts(obj)
    if parts is None:
        return None
    kind, message = parts
    return f"{kind}: {message}" if kind else message


def error_parts(obj: Any) -> tuple[str, str] | None:
    """(exception type or "", message) of the error an object reports; None if it is not an error.

    An ``error`` field (an object's ``message``, else its value), DJLServing's own ``{"code", "type", "message"}``,
    or LMI's ``details.finish_reason == "error"`` (its mid-stream failure line: the status stayed 200).
    """
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):  # OpenAI / vLLM: {"error": {"message", "type", "code"}}
        return "", str(err.get("message") or err)
    if err:  # lmi_handlers {"code", "message", "error"}; TGI {"error", "error_type"}
        return "", str(err)
    if "code" in obj and "message" in obj and "generated_text" not in obj:  # DJLServing {"code", "type", "message"}
        return str(obj.get("type") or obj["code"]), str(obj["message"])
    details = obj.get("details")
    if isinstance(details, dict) and details.get("finish_reason") == "error":
        return "", "the server reported finish_reason=error"
    return None


def _lmi_details(answer: Answer, details: Any) -> None:
    if not isinstance(details, dict):
        return
    answer.finish_reason = details.get("finish_reason", answer.finish_reason)
    generated = _int(details.get("generated_tokens"))
    answer.output_tokens = generated if generated is not None else answer.output_tokens
    prompt = _int(details.get("prompt_tokens"))
    prompt = prompt if prompt is not None else _int(details.get("input_length"))
    answer.input_tokens = prompt if prompt is not None else answer.input_tokens


def read_lmi_object(answer: Answer, obj: Any, now: float) -> None:
    """An LMI (or TGI) JSON line / SSE event: ``token``, then on the last one ``generated_text`` and ``details``."""
    message = error_message(obj)
    if message is not None or not isinstance(obj, dict):
        answer.fail(message or f"unexpected message {obj!r}")
        return
    details = obj.get("details")
    token = obj.get("token")
    if isinstance(token, dict):
        answer.token(now, str(token.get("text") or ""))
    if isinstance(obj.get("generated_text"), str):
        answer.text = obj["generated_text"]
    _lmi_details(answer, details)


def _is_vector(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)


def read_lmi_body(answer: Answer, obj: Any, now: float) -> None:
    if _is_vector(obj) or (isinstance(obj, list) and obj and all(_is_vector(v) for v in obj)):
        answer.text, answer.output_tokens = json.dumps(obj), 0  # an embedding model's answer: its vectors
        return
    if isinstance(obj, list) and len(obj) == 1:  # TGI's `/` route and LMI's tgi_compat answer with a list
        obj = obj[0]
    message = error_message(obj)
    if message is not None or not isinstance(obj, dict) or not isinstance(obj.get("generated_text"), str):
        answer.fail(message or f"unexpected answer {json.dumps(obj)[:200]}")
        return
    answer.text = obj["generated_text"]
    _lmi_details(answer, obj.get("details"))


def _openai_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return str(choice.get("text") or "")
    part = choice.get("delta") or choice.get("message") or {}
    return str(part.get("content") or "") if isinstance(part, dict) else ""


def _openai_usage(answer: Answer, obj: dict[str, Any]) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        answer.input_tokens = _int(usage.get("prompt_tokens"))
        answer.output_tokens = _int(usage.get("completion_tokens"))


def read_openai_object(answer: Answer, obj: Any, now: float) -> None:
    message = error_message(obj)
    if message is not None or not isinstance(obj, dict):
        answer.fail(message or f"unexpected chunk {obj!r}")
        return
    for choice in obj.get("choices") or ():
        text = _openai_text(choice)
        if text:
            answer.token(now, text)
        answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
    _openai_usage(answer, obj)


def read_openai_body(answer: Answer, obj: Any, now: float) -> None:
    message = error_message(obj)
    if message is not None or not isinstance(obj, dict) or not obj.get("choices"):
        answer.fail(message or f"unexpected answer {json.dumps(obj)[:200]}")
        return
    choice = obj["choices"][0]
    answer.text = _openai_text(choice)
    answer.finish_reason = choice.get("finish_reason")
    _openai_usage(answer, obj)


def read_embeddings_body(answer: Answer, obj: Any, now: float) -> None:
    """An embeddings answer: its vectors are the answer; the input's tokens come from ``usage``."""
    message = error_message(obj)
    if message is not None or not isinstance(obj, dict) or not isinstance(obj.get("data"), list) or not obj["data"]:
        answer.fail(message or f"unexpected answer {json.dumps(obj)[:200]}")
        return
    answer.text, answer.output_tokens = "", 0
    usage = obj.get("usage")
    answer.input_tokens = _int(usage.get("prompt_tokens")) if isinstance(usage, dict) else None


def _not_streamed(answer: Answer, obj: Any, now: float) -> None:
    answer.fail("embeddings are answered whole, not streamed: send --no-stream")


READERS = {Api.LMI: (read_lmi_object, read_lmi_body), Api.SAGEMAKER: (read_lmi_object, read_lmi_body),
           Api.TGI: (read_lmi_object, read_lmi_body),
           Api.OPENAI_COMPLETIONS: (read_openai_object, read_openai_body),
           Api.OPENAI_CHAT: (read_openai_object, read_openai_body),
           Api.OPENAI_EMBEDDINGS: (_not_streamed, read_embeddings_body)}
