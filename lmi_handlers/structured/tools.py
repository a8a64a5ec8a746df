"""OpenAI tool calling on chat: the request's tools, the grammar that forces a call, and reading calls back.

* ``tool_choice`` ``"required"`` or a named function is enforced by a grammar built from the functions'
  ``parameters``: a named call's answer is its arguments object; a required call's is a JSON list of
  ``{"name", "arguments"}`` (one element unless ``parallel_tool_calls``). Arguments therefore always parse and
  validate against the function's parameters.
* ``"auto"`` generates freely and reads calls from the text with the parser ``option.tool_call_parser`` names
  (vLLM's names: ``hermes``, ``<tool_call>{...}</tool_call>``; ``llama3_json``, ``{"name", "parameters"}``
  objects separated by ``;``), only when ``option.enable_auto_tool_choice`` is true, as LMI's vLLM engine asks.
* ``"none"`` (and no tools) generates plain text.

Earlier calls in the conversation (an assistant message's ``tool_calls``) are written in the hermes format,
and tool results are ``tool`` messages; the tools themselves go to the chat template (``tokenizer.render_chat``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..config import ConfigError, parse_bool, parse_choice
from ..errors import InvalidRequest, invalid_field
from .constraint import Constraint, checked

PARSERS = ("hermes", "llama3_json")
#: The options this module reads (``option.<key>``).
KEYS = ("enable_auto_tool_choice", "tool_call_parser")
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolOptions:
    """``option.enable_auto_tool_choice`` and ``option.tool_call_parser``."""

    auto: bool = False
    parser: str | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "ToolOptions":
        auto = parse_bool(props, "enable_auto_tool_choice", False)
        parser = parse_choice(props, "tool_call_parser", "", PARSERS) or None
        if auto and parser is None:
            raise ConfigError("enable_auto_tool_choice", props["enable_auto_tool_choice"],
                              f"needs option.tool_call_parser ({', '.join(PARSERS)}) to read the model's calls")
        return cls(auto, parser)


@dataclass(frozen=True)
class ToolCalling:
    """A chat request's tools: ``functions`` as the client sent them (``{"name", "description", "parameters"}``),
    ``choice`` ("none", "auto", "required" or a function's name), and whether several calls may come at once."""

    functions: tuple[Mapping[str, Any], ...]
    choice: str = "auto"
    parallel: bool = True
    #: The parser that reads an ``auto`` answer (``option.tool_call_parser``), set when the job is prepared.
    parser: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    @property
    def forced(self) -> bool:
        return self.choice not in ("none", "auto")

    @property
    def active(self) -> bool:
        return self.choice != "none"

    def templated(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's shape, as chat templates take them."""
        return [{"type": "function", "function": dict(f)} for f in self.functions]

    def constraint(self) -> Constraint | None:
        """The grammar of a forced call; None when the model may answer in text."""
        if self.choice in ("none", "auto"):
            return None
        if self.choice != "required":
            index = self.names.index(self.choice)
            return checked(Constraint("json", _compact(_parameters(self.functions[index])),
                                      f"tools[{index}].function.parameters"))
        calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": _parameters(f)},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in self.functions]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return checked(Constraint("json", _compact(schema), "tools"))

    def calls(self, text: str) -> tuple[str | None, list[tuple[str, str]]]:
        """The answer's text content (None when it holds only calls) and its calls, (name, arguments as JSON)."""
        if self.choice == "none":
            return text, []
        if self.forced:
            try:
                value = json.loads(text)
            except ValueError:  # cut short by max_tokens or a stop sequence: no call to report
                return text, []
            if self.choice != "required":
                return None, [(self.choice, _compact(value))]
            return None, [(c["name"], _compact(c["arguments"])) for c in value]
        found, content = _PARSE[self.parser or "hermes"](text)
        calls = [(c["name"], _compact(c["arguments"])) for c in found if c["name"] in self.names]
        if not calls:
            return text, []
        return (content or None), calls if self.parallel else calls[:1]


def _parameters(function: Mapping[str, Any]) -> Any:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def call_id() -> str:
    return "call_" + os.urandom(12).hex()


# --- the request ----------------------------------------------------------------------------

def parse_tools(data: Mapping[str, Any]) -> ToolCalling | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat body; None without tools."""
    tools, choice, parallel = data.get("tools"), data.get("tool_choice"), data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_field("parallel_tool_calls", parallel, "expected true or false")
    if tools is None:
        if choice not in (None, "none"):
            raise invalid_field("tool_choice", choice, 'needs "tools"; send the functions the model may call')
        return None
    if not isinstance(tools, list) or not tools:
        raise invalid_field("tools", tools, 'expected a non-empty list of {"type": "function", "function": {...}}')
    functions = tuple(_function(f"tools[{i}]", tool) for i, tool in enumerate(tools))
    names = [f["name"] for f in functions]
    if len(set(names)) < len(names):
        raise invalid_field("tools", names, "expected functions with different names")
    return ToolCalling(functions, _choice(choice, names), parallel is not False)


def _function(field: str, tool: Any) -> Mapping[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("function"),
                                                                                       Mapping):
        raise invalid_field(field, tool, 'expected {"type": "function", "function": {"name", "parameters"}}')
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise invalid_field(f"{field}.function.name", name, "expected 1-64 letters, digits, _ . or -")
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise InvalidRequest(f"unknown field {field}.function.{unknown[0]}: allowed fields are name, description, "
                             "parameters, strict", field=f"{field}.function.{unknown[0]}")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise invalid_field(f"{field}.function.parameters", parameters, "expected a JSON schema (an object)")
        checked(Constraint("json", _compact(parameters), f"{field}.function.parameters"))
    return {k: function[k] for k in ("name", "description", "parameters") if function.get(k) is not None}


def _choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise invalid_field("tool_choice", choice, f"allowed values are {', '.join(CHOICES)} or "
                                                       '{"type": "function", "function": {"name": ...}}')
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, Mapping) and isinstance(
        choice.get("function"), Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or name not in names:
        raise invalid_field("tool_choice", choice, f"expected none, auto, required or "
                                                   f'{{"type": "function", "function": {{"name": one of {names}}}}}')
    return name


def resolve(calling: ToolCalling | None, options: ToolOptions) -> ToolCalling | None:
    """``calling`` with the server's parser, or a 400 for ``auto`` on a server that does not read calls."""
    if calling is None or calling.choice != "auto":
        return calling
    if not options.auto:
        raise invalid_field("tool_choice", "auto", 'this server reads tool calls from free text only with '
                            'option.enable_auto_tool_choice=true and option.tool_call_parser; send tool_choice '
                            '"required" or a named function (enforced by a grammar), or "none"')
    return ToolCalling(calling.functions, calling.choice, calling.parallel, options.parser)


def message_text(field: str, message: Mapping[str, Any]) -> str:
    """The text of an assistant message's ``tool_calls`` (hermes format), after its content if any."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise invalid_field(f"{field}.tool_calls", calls, "expected a non-empty list of calls")
    parts = [message["content"]] if isinstance(message.get("content"), str) and message["content"].strip() else []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not isinstance(
                function.get("arguments"), str):
            raise invalid_field(f"{field}.tool_calls[{j}]", call,
                                'expected {"id", "type": "function", "function": {"name", "arguments"}}')
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            raise invalid_field(f"{field}.tool_calls[{j}].function.arguments", function["arguments"],
                                "expected a JSON object in a string") from None
        parts.append(f"<tool_call>\n{_compact({'name': function['name'], 'arguments': arguments})}\n</tool_call>")
    return "\n".join(parts)


def system_prompt(calling: ToolCalling) -> str:
    """The tools as a system message in the hermes format, for chat templates that do not render tools."""
    listed = "\n".join(_compact(tool) for tool in calling.templated())
    return ("You may call one or more functions to assist with the user query. The functions are:\n"
            f"<tools>\n{listed}\n</tools>\nFor each call, write a JSON object with the function name and its "
            'arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, '
            '"arguments": <args-json-object>}\n</tool_call>')


# --- parsers of free text -------------------------------------------------------------------

def _objects(texts: list[str], arguments_key: str) -> list[dict[str, Any]]:
    found = []
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(
                value.get(arguments_key, value.get("arguments")), dict):
            found.append({"name": value["name"], "arguments": value.get(arguments_key, value.get("arguments"))})
    return found


def _hermes(text: str) -> tuple[list[dict[str, Any]], str]:
    """Calls in ``<tool_call>...</tool_call>`` (the last one may be unclosed), and the text before the first."""
    bodies = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S)
    return _objects(bodies, "arguments"), text.split("<tool_call>", 1)[0].strip()


def _llama3_json(text: str) -> tuple[list[dict[str, Any]], str]:
    """A text that is only ``{"name", "parameters"}`` objects separated by ``;`` (after ``<|python_tag|>``)."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return [], text
    parts = re.split(r";\s*(?=\{)", body)
    found = _objects(parts, "parameters")
    return (found, "") if len(found) == len(parts) else ([], text)


_PARSE = {"hermes": _hermes, "llama3_json": _llama3_json}


def with_tool_prompt(turns: list[dict[str, Any]], calling: ToolCalling) -> list[dict[str, Any]]:
    """Chat turns with the tools described in the system message (added first when there is none)."""
    prompt = system_prompt(calling)
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{prompt}"}, *turns[1:]]
    return [{"role": "system", "content": prompt}, *turns]
