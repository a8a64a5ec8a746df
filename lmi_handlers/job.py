"""One client request from arrival to answer: parsing, tokenizing, and assembling the response.

``prepare_job`` turns one ``Input`` item into a ``Job`` (or raises ``InvalidRequest``): the body is
parsed into typed requests within the configured ``RequestLimits``, each prompt is tokenized and checked
against the model's context, and each gets a ``SequenceState`` and an ``Encoder``; ``compile_grammars`` then
compiles the grammar of each constrained one for the model, within the grammar budgets (slow work, which the
rolling batch runs off its step loop). A request that fails before generation, for whatever reason, is a
``Job.rejected``: it answers with its own error and nothing else is affected. As the engine produces events,
``Job.take`` returns the text due to the client now - every token for a stream, the whole body at the end
otherwise - so the same object serves a plain call, a stream and a rolling-batch request.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from .adapters import Adapters, requested_adapters
from .backends.base import Backend
from .deployment import Deployment
from .encoding import Encoder, choose_format, dumps, error_object
from .errors import HandlerError, InvalidRequest, invalid_field, status_of
from .events import ErrorEvent, Event, GenerationResult
from .request import GenerationRequest, Payload, Schema, decode_body, parse_payload
from .schemas import MAX_SEED
from .sequence import SequenceState
from .structured import tools as tool_calling
from .structured.reasoning import Reasoning


class Job:
    """One request's sequences and encoders: one encoder per prompt, one sequence per choice of each (``n``);
    ``choices`` gives each sequence's (encoder, choice index), by default one sequence per encoder."""

    def __init__(self, payload: Payload, seqs: list[SequenceState], encoders: list[Encoder],
                 choices: list[tuple[int, int]] | None = None):
        self.payload = payload
        self.seqs = seqs
        self.encoders = encoders
        self.choices = choices if choices is not None else [(i, 0) for i in range(len(seqs))]
        self.results: dict[int, GenerationResult] = {}
        self.error: ErrorEvent | None = None

    @classmethod
    def rejected(cls, error: BaseException) -> "Job":
        """A request that failed before generation (bad input, a tokenizer failure): done, with its error."""
        message = str(error) if isinstance(error, HandlerError) else f"{type(error).__name__}: {error}"
        job = cls(Payload(()), [], [])
        job.error = ErrorEvent(status_of(error), message)
        return job

    @property
    def compiles(self) -> bool:
        """Whether it has grammars still to compile (``compile_grammars``)."""
        return self.error is None and any(seq.request.constraint is not None and seq.grammar is None
                                          for seq in self.seqs)

    @property
    def streaming(self) -> bool:
        return bool(self.encoders) and not self.payload.many and self.encoders[0].format.streaming

    @property
    def content_type(self) -> str:
        if self.payload.many or not self.encoders or self.error is not None:
            return "application/json"  # a list of answers is one JSON value, whatever framing each asked for
        return self.encoders[0].content_type

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.results) == len(self.seqs)

    def take(self, events: Mapping[int, list[Event]]) -> str:
        """The text due now for this step's events (those of other jobs are ignored)."""
        out = []
        for seq, (encoder, index) in zip(self.seqs, self.choices):
            mine = events.get(seq.uid)
            if not mine or self.error is not None:
                continue
            for event in mine:
                if isinstance(event, GenerationResult):
                    self.results[seq.uid] = event
                elif isinstance(event, ErrorEvent):
                    self.error = event
            if not self.payload.many:
                out.append(self.encoders[encoder].encode(mine, index))
        if self.payload.many and self.done and self.error is None:
            results = [enc.result_object(*[self.results[seq.uid] for seq, (owner, _) in zip(self.seqs, self.choices)
                                           if owner == i]) for i, enc in enumerate(self.encoders)]
            legacy = self.payload.requests[0].schema is Schema.LEGACY
            out.append(dumps({"outputs": results} if legacy else results))
        return "".join(out)

    def error_body(self) -> str:
        assert self.error is not None
        return dumps(error_object(self.error.code, self.error.message))


def prepare_job(item: Any, deployment: Deployment, backend: Backend, server_seed: Any = None,
                adapters: Adapters | None = None, reasoning: Reasoning | None = None) -> Job:
    """Parse, validate and tokenize one request item with the deployment's settings; raises ``InvalidRequest`` for
    bad input (``AdapterNotFound`` for an adapter ``adapters`` does not hold; a ``priority`` other than 0 unless the
    deployment schedules by priority). ``reasoning``: the model's reasoning convention, read apart in chat answers."""
    config = deployment.config
    data = decode_body(item.get_as_bytes(), item.get_property("Content-Type"), config.limits)
    data, named = requested_adapters(item, data)
    payload = parse_payload(data, config.max_new_tokens, config.limits)
    if payload.many and config.rolling and any(request.stream for request in payload.requests):
        # DJL's rolling-batch handlers refuse a list ("The 'inputs' field must be a string"); its non-rolling
        # handler ignores "stream" for a list and answers a JSON list, as Job.take does.
        count = len(payload.requests)
        raise invalid_field("inputs", f"a list of {count} prompt{'s' * (count != 1)}",
                            "with \"stream\": true and rolling batch, 'inputs' must be one string, one streamed "
                            "answer per request (DJL's rolling-batch handlers refuse a list too); send each prompt "
                            "as its own request, or \"stream\": false for a JSON list of answers")
    chosen = adapters.for_inputs(named, len(payload.requests)) if adapters is not None else [None] * len(
        payload.requests)
    accept = item.get_property("Accept")
    seqs, encoders, choices = [], [], []
    for request, adapter in zip(payload.requests, chosen):
        request = _structured(request, deployment.tools, backend)
        _check_supported(request, backend)
        _check_priority(request, deployment.by_priority)
        prompt_text, prompt_ids = _tokenize(request, backend)
        if reasoning is not None and request.schema is Schema.CHAT:
            request = _reasoning(request, reasoning.for_prompt(prompt_text), backend)
        max_new = _token_budget(request, len(prompt_ids), backend.max_sequence_length)
        seed = request.sampling.seed
        if seed is None and request.sampling.do_sample:
            seed = _seed(server_seed)
        first = None
        for index in range(request.n):
            # Choice i samples with seed + i, as vLLM seeds a request's n children: each its own answer, and a
            # seeded request's choices the same every time.
            seq = SequenceState(request, prompt_ids, decode=backend.tokenizer.decode,
                                eos_ids=backend.tokenizer.eos_ids, special_ids=backend.tokenizer.special_ids,
                                max_new_tokens=max_new, seed=None if seed is None else (seed + index) & MAX_SEED)
            seq.adapter, seq.fork_of = adapter, first  # the others share the first choice's prompt blocks
            if first is None:
                first = seq
            seqs.append(seq)
            choices.append((len(encoders), index))
        fmt = choose_format(request, config.output_formatter, accept, config.tgi_compat,
                            rolling=config.rolling and not payload.many)
        encoders.append(Encoder(request, fmt, prompt_text, model_name=os.path.basename(config.model_id.rstrip("/"))))
    return Job(payload, seqs, encoders, choices)


def compile_grammars(job: Job, backend: Backend) -> Job:
    """``job`` once each constrained sequence's grammar is compiled for the model within the grammar budgets
    (``backend.compile_grammar``, ``structured/admission.py``); raises ``InvalidRequest`` naming the field for one
    that is too large, unsatisfiable, empty or too slow. Prompts of one request share one compilation."""
    compile_grammar = getattr(backend, "compile_grammar", None)
    compiled: dict[int, Any] = {}
    for seq in job.seqs if compile_grammar is not None and job.compiles else ():
        constraint = seq.request.constraint
        if constraint is None or seq.grammar is not None:
            continue
        if id(constraint) in compiled:  # copied before any token: in its first state
            seq.grammar = compiled[id(constraint)].deep_copy()
        else:
            seq.grammar = compiled[id(constraint)] = compile_grammar(constraint)
    return job


def _structured(request: GenerationRequest, options: tool_calling.ToolOptions, backend: Backend) -> GenerationRequest:
    """``request`` with the server's tool-call parser; a 400 for a constraint this backend cannot enforce."""
    if request.constraint is not None and not getattr(backend, "structured_output", False):
        field = request.constraint.field
        raise InvalidRequest(f"{field}: the {backend.name} backend does not enforce structured output; "
                             "serve the model with option.backend=hf", field=field)
    if request.tools is None:
        return request
    # A backend with tool-call parsers of its own (vllm: vLLM's) reads an ``auto`` answer with them.
    tools = tool_calling.resolve(request.tools, options, getattr(backend, "tool_call_parser", tool_calling.parser))
    return dataclasses.replace(request, tools=tools)


def _reasoning(request: GenerationRequest, reasoning: Reasoning, backend: Backend) -> GenerationRequest:
    """``request`` reading its answer's reasoning apart; its constraint (a schema, a forced tool call) starts after
    the reasoning, unless the backend's own structured output waits for it (vllm: ``reasoning_parser``)."""
    constraint = request.constraint
    if constraint is not None and not getattr(backend, "reasoning_aware", False):
        constraint = dataclasses.replace(constraint, lead=reasoning.lead())
    return dataclasses.replace(request, reasoning=reasoning, constraint=constraint)


def _check_supported(request: GenerationRequest, backend: Backend) -> None:
    """Refuse the sampling fields this backend does not honour (``Backend.request_fields``), naming the field as the
    client wrote it, rather than answer as if it had been applied; and a logit bias on an id outside the model's
    vocabulary (``Backend.vocab_size``), which would otherwise fail the whole batch's step."""
    prefix = "" if request.schema is Schema.CHAT else "parameters."
    honoured = getattr(backend, "request_fields", frozenset())
    for name, value in request.sampling.extras().items():
        if name not in honoured:
            raise invalid_field(prefix + name, value, f"not supported by the {backend.name} backend (the hf and "
                                "vllm backends support it); omit it")
    vocab = getattr(backend, "vocab_size", None)
    outside = [token for token, _ in request.sampling.logit_bias or () if vocab is not None and token >= vocab]
    if outside:
        raise InvalidRequest(f"{prefix}logit_bias: token id {outside[0]} is not in this model's vocabulary (ids 0 "
                             f"to {vocab - 1})", field=f"{prefix}logit_bias", value=outside[0])


def _check_priority(request: GenerationRequest, by_priority: bool) -> None:
    """A priority is honoured only where the server schedules by it, as vLLM's API documents; elsewhere it would be
    silently ignored."""
    if request.priority and not by_priority:
        field = "priority" if request.schema is Schema.CHAT else "parameters.priority"
        raise invalid_field(field, request.priority, "this model serves requests in arrival order "
                            "(option.scheduling_policy=fcfs); send 0 or none, or serve it with "
                            "option.scheduling_policy=priority")


def _tokenize(request: GenerationRequest, backend: Backend) -> tuple[str, list[int]]:
    if request.schema is Schema.CHAT:
        text = backend.tokenizer.render_chat(request.messages, request.tools)
        return text, backend.tokenizer.encode_chat(request.messages, request.tools)
    return request.prompt, backend.tokenizer.encode(request.prompt)


def _token_budget(request: GenerationRequest, prompt_tokens: int, limit: int) -> int:
    field = "text" if request.schema is Schema.LEGACY else "messages" if request.schema is Schema.CHAT else "inputs"
    if prompt_tokens >= limit:
        raise InvalidRequest(f"{field}: the prompt is {prompt_tokens} tokens; this model accepts at most "
                             f"{limit - 1} prompt tokens (prompt plus generated tokens <= {limit}). "
                             "Shorten the prompt; it is never truncated.", field=field, value=prompt_tokens)
    if request.schema is Schema.LEGACY:
        assert request.seq_length is not None
        if request.seq_length <= prompt_tokens:
            raise invalid_field("seq_length", request.seq_length,
                                f"must exceed the prompt's {prompt_tokens} tokens (it counts prompt and "
                                "generated tokens)")
        max_new = request.seq_length - prompt_tokens
    else:
        max_new = request.stopping.max_new_tokens
    if prompt_tokens + max_new > limit:
        budget = "seq_length" if request.schema is Schema.LEGACY else request.budget_field
        raise InvalidRequest(f"{budget}: the prompt is {prompt_tokens} tokens and {max_new} new tokens were asked "
                             f"for, {prompt_tokens + max_new} in all; this model holds at most {limit}. "
                             f"Ask for at most {limit - prompt_tokens} new tokens.", field=budget, value=max_new)
    return max_new


def _seed(server_seed: Any) -> int:
    """The server's per-request seed (rolling batch sends one), else a random one."""
    if server_seed is not None:
        try:
            return int(server_seed) & MAX_SEED
        except (TypeError, ValueError):
            pass
    return int.from_bytes(os.urandom(7), "big")
