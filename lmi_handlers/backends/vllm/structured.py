"""Structured output and tool calling on the vLLM engine: a request's constraint as vLLM's structured-output
parameters, and an ``auto`` answer read by vLLM's own tool parsers.

``structured_outputs`` is pure (keyword arguments of ``vllm.sampling_params.StructuredOutputsParams``, no vLLM
import); ``structured_outputs_params`` builds the object. A forced tool call's grammar is the request's
constraint too, so both reach vLLM through these. JSON stays compact unless the request asked for whitespace,
as on the hf engine.

``tool_call_parser`` is vLLM's parser of ``option.tool_call_parser``'s name (``ToolParserManager``), given the
tokenizer and a ``ChatCompletionRequest`` with the request's tools, as vLLM's OpenAI server gives them: what
counts as a call in free text is vLLM's decision on this engine. What is done with the calls (only the request's
functions, one unless ``parallel_tool_calls``) is ``ToolCalling.calls``'s, as on every engine.
"""

from __future__ import annotations

import json
from typing import Any

from ...config import ConfigError
from ...structured.constraint import Constraint
from ...structured.tools import Parser, ToolCalling, compact_json


def structured_outputs(constraint: Constraint | None) -> dict[str, Any] | None:
    """Keyword arguments of ``StructuredOutputsParams`` for ``constraint``; None when there is none."""
    if constraint is None:
        return None
    if constraint.kind == "regex":
        return {"regex": constraint.spec}
    if constraint.kind == "choice":
        return {"choice": json.loads(constraint.spec)}
    spacing: dict[str, Any] = ({"disable_any_whitespace": True} if constraint.whitespace is None
                               else {"whitespace_pattern": constraint.whitespace})
    if constraint.any_object:
        return {"json_object": True, **spacing}
    return {"json": json.loads(constraint.spec), **spacing}


def structured_outputs_params(constraint: Constraint | None) -> Any:
    """``vllm.sampling_params.StructuredOutputsParams`` for ``constraint`` (None when there is none)."""
    kwargs = structured_outputs(constraint)
    if kwargs is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**kwargs)


def tool_call_parser(tokenizer: Any, name: str, calling: ToolCalling) -> Parser:
    """vLLM's parser ``name`` reading a finished ``auto`` answer to ``calling``: (name, arguments) of each call it
    finds, with the text before them; the whole text and no call when it finds none."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(messages=[], tools=calling.templated(), tool_choice="auto")
    parser = _parser_class(name)(tokenizer, request.tools)

    def parse(text: str) -> tuple[list[tuple[str, str]], str]:
        found = parser.extract_tool_calls(text, request=request)
        if not found.tools_called:
            return [], text
        return [(call.function.name, _compact_arguments(call.function.arguments)) for call in found.tool_calls], \
            found.content or ""

    return parse


def check_tool_parser(tokenizer: Any, name: str) -> None:
    """A ``ConfigError`` when vLLM's parser ``name`` refuses this model's tokenizer (``llama3_json`` needs the
    ``<|python_tag|>`` token in the vocabulary), at load rather than at the first ``auto`` request."""
    try:
        _parser_class(name)(tokenizer, None)
    except Exception as exc:  # noqa: BLE001 - whatever vLLM's parser refuses is the option's fault: name it
        raise ConfigError("tool_call_parser", name, f"vLLM's {name} parser refuses this model's tokenizer: "
                          f"{exc}; choose the parser of the model's tool-call format") from exc


def _parser_class(name: str) -> Any:
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser(name)


def _compact_arguments(arguments: str) -> str:
    """vLLM's arguments text as compact JSON, as the other engines write it (as it came if it is not JSON)."""
    try:
        return compact_json(json.loads(arguments))
    except ValueError:
        return arguments
