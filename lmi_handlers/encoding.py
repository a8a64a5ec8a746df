"""Wire formats: the only code that turns generation events into bytes.

A request's format is chosen once (``choose_format``) from ``option.output_formatter``, the request's
``stream`` flag and its Accept header, then a per-request ``Encoder`` renders its events:

* LMI text: ``json`` (``{"generated_text", "details"}``; in a rolling batch sent in pieces as tokens arrive, as
  DJL's rolling-batch json formatter does), ``jsonlines`` (one ``{"token": ...}`` line
  per token, the last also carrying ``generated_text`` and ``details``), ``sse`` (the same objects as
  ``data: ...`` events); with ``tgi_compat`` the TGI shapes;
* OpenAI chat: ``chat.completion`` objects, and ``chat.completion.chunk`` lines or SSE events
  (``data: [DONE]`` last), the shapes OpenAI clients parse;
* the inf2 example schema: the generated texts (prompt included) as a JSON list.
"""

from __future__ import annotations

import enum
import itertools
import json
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from .events import ErrorEvent, Event, FinishReason, GenerationResult, Token, TokenEvent
from .request import GenerationRequest, Schema
from .structured.reasoning import ReasoningReader
from .structured.tools import CallReader, call_id


class Framing(str, enum.Enum):
    JSON = "application/json"
    JSONLINES = "application/jsonlines"
    SSE = "text/event-stream"


@dataclass(frozen=True)
class Format:
    framing: Framing
    chat: bool = False
    tgi: bool = False
    #: A JSON answer sent in pieces as tokens arrive (rolling batch, LMI schema), as DJL's json formatter does.
    incremental: bool = False

    @property
    def content_type(self) -> str:
        return self.framing.value

    @property
    def streaming(self) -> bool:
        return self.framing is not Framing.JSON


def choose_format(request: GenerationRequest, output_formatter: str = "", accept: str | None = None,
                  tgi_compat: bool = False, rolling: bool = False) -> Format:
    """The request's format; with ``rolling`` (a rolling batch) an LMI request's JSON answer of one choice is
    incremental (several choices answer when all are done, as DJL's best-of formatter does)."""
    fmt = _format(request, output_formatter, accept, tgi_compat)
    if rolling and fmt.framing is Framing.JSON and request.schema is Schema.LMI and request.n == 1:
        return Format(Framing.JSON, tgi=fmt.tgi, incremental=True)
    return fmt


def _format(request: GenerationRequest, output_formatter: str, accept: str | None, tgi_compat: bool) -> Format:
    chat = request.schema is Schema.CHAT
    if request.schema is Schema.LEGACY:
        return Format(Framing.JSON)
    if output_formatter:
        framing = {"json": Framing.JSON, "jsonlines": Framing.JSONLINES, "sse": Framing.SSE}[
            output_formatter.removesuffix("_chat")]
        return Format(framing, chat, tgi_compat and not chat)
    accept = (accept or "").lower()
    wants_sse, wants_lines = "text/event-stream" in accept, "application/jsonlines" in accept
    if not (request.stream or wants_sse or wants_lines):
        return Format(Framing.JSON, chat, tgi_compat and not chat)
    if wants_sse or (not wants_lines and (chat or tgi_compat)):
        # OpenAI clients parse chat streams as server-sent events whatever Accept they send.
        return Format(Framing.SSE, chat, tgi_compat and not chat)
    return Format(Framing.JSONLINES, chat, tgi_compat and not chat)


def reason_phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "error"


def error_object(code: int, message: str) -> dict[str, Any]:
    """The one error body shape: what ``Output.error`` sends, also used inside streams and batches."""
    return {"code": code, "message": reason_phrase(code), "error": message}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _escaped(text: str) -> str:
    """``text`` as it appears inside a JSON string (escaping is per character, so pieces join into the whole)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


_chat_ids = itertools.count(1)
OPENAI_FINISH = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


class Encoder:
    """Renders one request's events in its format; ``encode`` returns the text to send now. A request of ``n``
    choices gets the events of each (its index beside them); its answer is complete when all are."""

    def __init__(self, request: GenerationRequest, fmt: Format, prompt: str, model_name: str = "lmi"):
        self.request, self.format, self.prompt = request, fmt, prompt
        self.model_name = request.model or model_name
        self._chat_id = f"chatcmpl-{next(_chat_ids)}"
        self._created = int(time.time())
        self._sent_role: set[int] = set()  # the choices whose first chunk went out
        self._opened = False
        self._held = ""
        self._results: dict[int, GenerationResult] = {}  # each finished choice's result, by index
        #: Each choice's reader of a forced tool call, while the call streams (``_forced_call_chunks``).
        self._calls = {i: CallReader(request.tools) for i in range(request.n)} if (
            request.tools is not None and request.tools.forced) else None
        #: Each choice's reader of a reasoning model's answer, read apart as it streams (``structured/reasoning.py``).
        self._thinking = {i: ReasoningReader(request.reasoning) for i in range(request.n)} if (
            request.reasoning is not None) else None

    @property
    def content_type(self) -> str:
        return self.format.content_type

    def encode(self, events: list[Event], index: int = 0) -> str:
        """Text for these events of choice ``index`` (one step's worth); "" when nothing is due yet."""
        if self.format.incremental:
            return self._incremental(events)
        out = []
        for i, event in enumerate(events):
            if isinstance(event, TokenEvent):
                nxt = events[i + 1] if i + 1 < len(events) else None
                out.append(self._token(event, nxt if isinstance(nxt, GenerationResult) else None, index))
            elif isinstance(event, ErrorEvent):
                out.append(self._error(event))
            elif isinstance(event, GenerationResult) and not (i and isinstance(events[i - 1], TokenEvent)):
                out.append(self._token(None, event, index))
        return "".join(out)

    def _finished(self, index: int, result: GenerationResult | None) -> list[GenerationResult] | None:
        """Records choice ``index``'s result; every choice's, in order, once the last has finished."""
        if result is None:
            return None
        self._results[index] = result
        return [self._results[i] for i in range(self.request.n)] if len(self._results) == self.request.n else None

    def result_object(self, *results: GenerationResult) -> Any:
        """The JSON value of a finished request (one element of a list answer), from each choice's result. An LMI
        answer of several choices is the first, with the others in ``details.best_of_sequences`` (DJL's and TGI's
        best-of shape)."""
        first = results[0]
        if self.request.schema is Schema.LEGACY:
            return self._text(first)
        if self.format.chat:
            return self._chat_completion(results)
        body: dict[str, Any] = {"generated_text": self._text(first)}
        if self.request.details or len(results) > 1:
            body["details"] = self._details(first, with_tokens=self.request.details)
        if len(results) > 1:
            body["details"]["best_of_sequences"] = [
                {"generated_text": self._text(r), **self._details(r, with_tokens=self.request.details)}
                for r in results[1:]]
        return [body] if self.format.tgi else body

    def _text(self, result: GenerationResult) -> str:
        return self.prompt + result.text if self.request.return_full_text else result.text

    # --- pieces -----------------------------------------------------------------------------

    def _incremental(self, events: list[Event]) -> str:
        """The JSON answer in pieces, as DJL's rolling-batch json formatter sends it: ``{"generated_text": "``, then
        each token's escaped text, then ``"}`` (or ``", "details": {...}}``). The pieces join into the bytes of
        ``json.dumps(result_object(...), ensure_ascii=False)``. The opening goes out alone, the step's text one step
        later, so that a client that drops the piece holding the opening (the SageMaker LMI recipe) loses no text.
        A failure ends the request with its own error (the rolling batch's item), so it is not encoded here."""
        text = "".join(event.token.text for event in events if isinstance(event, TokenEvent))
        result = next((event for event in events if isinstance(event, GenerationResult)), None)
        out = ""
        if not self._opened:
            self._opened = True
            prefix = self.prompt if self.request.return_full_text else ""
            out = ("[" if self.format.tgi else "") + '{"generated_text": "' + _escaped(prefix)
            if result is None:
                self._held = text
                return out
        out += _escaped(self._held + text)
        self._held = ""
        if result is None:
            return out
        out += '"'
        if self.request.details:
            out += ', "details": ' + json.dumps(self._details(result, with_tokens=True), ensure_ascii=False)
        return out + "}" + ("]" if self.format.tgi else "")

    def _frame(self, obj: Any) -> str:
        line = dumps(obj)
        return f"data: {line}\n\n" if self.format.framing is Framing.SSE else line + "\n"

    def _token(self, event: TokenEvent | None, result: GenerationResult | None, index: int) -> str:
        if self.format.framing is Framing.JSON:
            done = self._finished(index, result)
            return dumps(self.result_object(*done)) if done is not None else ""
        if self.format.chat:
            return self._chat_chunk(event, result, index)
        line: dict[str, Any] = {"index": index} if self.request.n > 1 else {}
        if event is not None:
            line["token"] = self._token_dict(event.token)
            if self.format.tgi and event.token.top:
                line["top_tokens"] = self._top_tokens(event.token)
        if result is not None:
            line["generated_text"] = self._text(result)
            if self.request.details:
                line["details"] = self._details(result, with_tokens=False)
        return self._frame(line)

    def _error(self, event: ErrorEvent) -> str:
        body = error_object(event.code, event.message)
        if self.format.framing is Framing.JSON:
            return dumps(body)
        tail = "data: [DONE]\n\n" if self.format.chat and self.format.framing is Framing.SSE else ""
        return self._frame(body) + tail

    def _token_dict(self, token: Token) -> dict[str, Any]:
        if self.format.tgi:
            return {"id": token.id, "text": token.text, "logprob": token.log_prob, "special": token.special}
        out: dict[str, Any] = {"id": token.id, "text": token.text, "log_prob": token.log_prob}
        if token.special:
            out["special_token"] = True
        if token.top:
            out["top_logprobs"] = [{"id": i, "text": text, "log_prob": p} for i, text, p in token.top]
        return out

    def _details(self, result: GenerationResult, with_tokens: bool) -> dict[str, Any]:
        details: dict[str, Any] = {"finish_reason": result.finish_reason.value,
                                   "generated_tokens": result.generated_tokens,
                                   "prompt_tokens": result.prompt_tokens, "inputs": self.prompt}
        if result.seed is not None:
            details["seed"] = result.seed
        if result.speculation is not None:
            details.update(draft_tokens=result.speculation[0], accepted_draft_tokens=result.speculation[1],
                           acceptance_rate=result.acceptance_rate)
        if with_tokens:
            details["tokens"] = [self._token_dict(t) for t in result.tokens]
            if self.format.tgi and self.request.sampling.top_logprobs:
                details["top_tokens"] = [self._top_tokens(t) for t in result.tokens]
        return details

    @staticmethod
    def _top_tokens(token: Token) -> list[dict[str, Any]]:
        """TGI's ``top_tokens`` of one position (``top_n_tokens``)."""
        return [{"id": i, "text": text, "logprob": p, "special": False} for i, text, p in token.top]

    @staticmethod
    def _usage(results: Any) -> dict[str, int]:
        """OpenAI's usage, as vLLM counts it for several choices: the prompt once, every choice's tokens."""
        prompt, completion = results[0].prompt_tokens, sum(r.generated_tokens for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _logprobs(self, tokens: tuple[Token, ...] | list[Token]) -> dict[str, Any] | None:
        if not self.request.details:
            return None
        return {"content": [{"token": t.text, "logprob": t.log_prob, "bytes": list(t.text.encode()),
                             "top_logprobs": [{"token": text, "logprob": p, "bytes": list(text.encode())}
                                              for _, text, p in t.top]} for t in tokens]}

    def _tool_calls(self, result: GenerationResult) -> tuple[str | None, str | None, list[dict[str, Any]], str]:
        """The answer's reasoning (None without ``option.reasoning_parser``), content, tool calls in OpenAI's shape
        (read from the content), and finish reason."""
        reasoning, text = (None, result.text) if self.request.reasoning is None else (
            self.request.reasoning.split(result.text))
        if self.request.tools is None:
            return reasoning, text, [], OPENAI_FINISH[result.finish_reason]
        content, calls = self.request.tools.calls(text or "")
        shaped = [{"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
                  for name, arguments in calls]
        return reasoning, content, shaped, _call_finish(result, bool(shaped))

    def _chat_completion(self, results: Any) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            reasoning, content, calls, reason = self._tool_calls(result)
            message: dict[str, Any] = {"role": "assistant", "content": content, **_thought(reasoning)}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": index, "message": message, "logprobs": self._logprobs(result.tokens),
                            "finish_reason": reason, "stop_reason": result.stop_sequence})
        return {"id": self._chat_id, "object": "chat.completion", "created": self._created,
                "model": self.model_name, "choices": choices, "usage": self._usage(results)}

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        return self._frame({"id": self._chat_id, "object": "chat.completion.chunk", "created": self._created,
                            "model": self.model_name, "choices": [{"index": index, "delta": delta,
                                                                   "logprobs": logprobs, "finish_reason": finish}]})

    def _tool_call_chunks(self, result: GenerationResult, index: int) -> str:
        """An ``auto`` answer, streamed once it is complete (calls are read from the whole text): its content, then
        each call's id and name, then its arguments, as deltas the ``openai`` client reassembles."""
        reasoning, content, calls, reason = self._tool_calls(result)
        out = [self._chunk(index, {"role": "assistant", "content": content, **_thought(reasoning)})]
        for i, call in enumerate(calls):
            out.append(self._call_head(index, i, call["function"]["name"], call["id"]))
            out.append(self._chunk(index, {"tool_calls": [{"index": i, "function": {
                "arguments": call["function"]["arguments"]}}]}))
        out.append(self._chunk(index, {}, reason))
        return "".join(out)

    def _forced_call_chunks(self, event: TokenEvent | None, result: GenerationResult | None, index: int) -> str:
        """A forced call (``required`` or a named function) as it is generated: the role first, each call's id and
        name as soon as the name is known, its arguments in pieces as they grow, and the finish reason last."""
        assert self._calls is not None
        reader, out = self._calls[index], []
        if index not in self._sent_role:
            self._sent_role.add(index)
            out.append(self._chunk(index, {"role": "assistant", "content": None}))
        thought, text = self._think(index, event.token.text if event is not None else "", result is not None)
        if thought:
            out.append(self._chunk(index, _thought(thought)))
        for kind, call, value in reader.feed(text):
            out.append(self._call_head(index, call, value, call_id()) if kind == "call" else
                       self._chunk(index, {"tool_calls": [{"index": call, "function": {"arguments": value}}]}))
        if result is not None:
            out.append(self._chunk(index, {}, _call_finish(result, bool(reader.calls))))
        return "".join(out)

    def _call_head(self, index: int, call: int, name: str, id_: str) -> str:
        return self._chunk(index, {"tool_calls": [{"index": call, "id": id_, "type": "function",
                                                   "function": {"name": name, "arguments": ""}}]})

    def _chat_chunk(self, event: TokenEvent | None, result: GenerationResult | None, index: int) -> str:
        if self._calls is not None:
            return self._forced_call_chunks(event, result, index) + self._chat_end(index, result)
        if self.request.tools is not None and self.request.tools.active:
            out = self._tool_call_chunks(result, index) if result is not None else ""
            return out + self._chat_end(index, result)
        thought, text = self._think(index, event.token.text if event is not None else "", result is not None)
        if not text and not thought and result is None and index in self._sent_role:
            return ""  # a held-back token: nothing for the client yet
        delta: dict[str, Any] = {"content": text} if text or not thought else {}
        delta.update(_thought(thought or None))
        if index not in self._sent_role:
            delta = {"role": "assistant", **delta}
            self._sent_role.add(index)
        chunk = {"id": self._chat_id, "object": "chat.completion.chunk", "created": self._created,
                 "model": self.model_name,
                 "choices": [{"index": index, "delta": delta,
                              "logprobs": self._logprobs([event.token]) if event is not None else None,
                              "finish_reason": OPENAI_FINISH[result.finish_reason] if result else None,
                              **({"stop_reason": result.stop_sequence} if result else {})}]}
        return self._frame(chunk) + self._chat_end(index, result)

    def _think(self, index: int, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of the next piece of choice ``index``'s streamed answer; all of it is content without
        a reasoning parser."""
        if self._thinking is None:
            return "", text
        thought, content = self._thinking[index].feed(text)
        if final:
            more_thought, more_content = self._thinking[index].flush()
            thought, content = thought + more_thought, content + more_content
        return thought, content

    def _chat_end(self, index: int, result: GenerationResult | None) -> str:
        """After a stream's last chunk (that of its last choice to finish): the usage chunk if asked for, and
        ``[DONE]`` over SSE."""
        results = self._finished(index, result)
        out = ""
        if results is not None:
            if self.request.include_usage:
                out += self._frame({"id": self._chat_id, "object": "chat.completion.chunk",
                                    "created": self._created, "model": self.model_name, "choices": [],
                                    "usage": self._usage(results)})
            if self.format.framing is Framing.SSE:
                out += "data: [DONE]\n\n"
        return out


def _thought(reasoning: str | None) -> dict[str, str]:
    """A message's or delta's reasoning: ``reasoning_content`` (DeepSeek's and LMI's name) and ``reasoning`` (vLLM's
    since 0.10), as clients read one or the other."""
    return {} if reasoning is None else {"reasoning_content": reasoning, "reasoning": reasoning}


def _call_finish(result: GenerationResult, called: bool) -> str:
    """``tool_calls`` for an answer with calls, unless ``max_tokens`` cut it short (``length``, as OpenAI says of a
    call whose arguments did not finish)."""
    if called and result.finish_reason is not FinishReason.LENGTH:
        return "tool_calls"
    return OPENAI_FINISH[result.finish_reason]
