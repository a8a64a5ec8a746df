"""OpenAI tool calling on chat: the request's tools, the grammar that forces a call, and reading calls back.

* ``tool_choice`` ``"required"`` or a named function is enforced by a grammar built from the functions'
  ``parameters``: a named call's answer is its arguments object; a required call's is a JSON list of
  ``{"name", "arguments"}`` (one element unless ``parallel_tool_calls``). Arguments therefore always parse and
  validate against the function's parameters.
* ``"auto"`` generates freely and reads calls from the text with the parser ``option.tool_call_parser`` names,
  only when ``option.enable_auto_tool_choice`` is true, as LMI's vLLM engine asks: vLLM's names, ``hermes``
  (``<tool_call>{...}</tool_call>``) and ``llama3_json`` (``{"name", "parameters"}`` objects separated by ``;``).
  A backend with parsers of its own reads the answer with them (its ``tool_call_parser``: the vllm backend, vLLM's
  parsers of those names); the others with the ones here.
* ``"none"`` (and no tools) generates plain text.

A forced call is read as it is generated (``CallReader``), so a stream sends its name first and then its arguments
as they grow; the finished answer is read by the same reader, so both give the same calls.

Earlier calls in the conversation (an assistant message's ``tool_calls``) are written in the hermes format,
and tool results are ``tool`` messages; the tools themselves go to the chat template (``tokenizer.render_chat``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError, InvalidRequest, invalid_field
from ..values import parse_bool, parse_choice
from .constraint import Constraint, checked

PARSERS = ("hermes", "llama3_json")
#: The options this module reads (``option.<key>``).
KEYS = ("enable_auto_tool_choice", "tool_call_parser")
CHOICES = ("none", "auto", "required")
#: Reads an ``auto`` answer: its calls as (name, arguments as JSON text) and the text that is not a call.
Parser = Callable[[str], tuple[list[tuple[str, str]], str]]


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
    #: What reads an ``auto`` answer (``option.tool_call_parser``'s parser), set when the job is prepared.
    parser: Parser | None = None

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
            return checked(Constraint("json", compact_json(_parameters(self.functions[index])),
                                      f"tools[{index}].function.parameters"))
        # Each function's parameters move to the root's $defs, under its name, with their local references
        # ("#/$defs/City", "#") rebased there: pydantic's schemas refer to their own $defs.
        calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                   "arguments": {"$ref": f"#/$defs/{f['name']}"}},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in self.functions]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1,
                  "$defs": {f["name"]: rebased(_parameters(f), f"#/$defs/{f['name']}") for f in self.functions}}
        if not self.parallel:
            schema["maxItems"] = 1
        return checked(Constraint("json", compact_json(schema), "tools"))

    def calls(self, text: str) -> tuple[str | None, list[tuple[str, str]]]:
        """The answer's text content (None when it holds only calls) and its calls, (name, arguments as JSON).
        A forced answer cut short (by ``max_tokens``) gives the calls as far as they were generated, as a stream
        of it did."""
        if self.choice == "none":
            return text, []
        if self.forced:
            reader = CallReader(self)
            reader.feed(text)
            return None, reader.calls
        found, content = (self.parser or _hermes)(text)
        calls = [(name, arguments) for name, arguments in found if name in self.names]
        if not calls:
            return text, []
        return (content or None), calls if self.parallel else calls[:1]


class CallReader:
    """Reads a forced call's answer as it is generated. ``feed`` takes the next piece of text and returns what is
    new: ``("call", index, name)`` once a call's name is known (at once for a named function), then
    ``("arguments", index, text)`` as its arguments grow. ``calls`` holds every named call so far.

    A ``required`` answer is the JSON list the grammar allows, ``[{"name": ..., "arguments": {...}}, ...]`` (name
    first, as the schema lists it): a small JSON scanner follows strings and nesting to find each element's name
    and the text of its arguments value. A named function's answer is the arguments object itself."""

    def __init__(self, calling: ToolCalling):
        self._named = calling.choice != "required"
        self._started = False
        self._found: list[list[Any]] = [[calling.choice, ""]] if self._named else []  # [name or None, arguments]
        self._depth, self._string, self._escape = 0, False, False
        self._key: str | None = None  # the element's key whose value comes next (after its colon)
        self._colon, self._capturing, self._word = False, False, ""

    @property
    def calls(self) -> list[tuple[str, str]]:
        return [(name, arguments) for name, arguments in self._found if name is not None]

    def feed(self, text: str) -> list[tuple[str, int, str]]:
        out: list[tuple[str, int, str]] = []
        if self._named:
            if not self._started:
                self._started = True
                out.append(("call", 0, self._found[0][0]))
            self._found[0][1] += text
            pieces = [("arguments", 0, text)] if text else []
        else:
            pieces = [event for ch in text for event in self._char(ch)]
        for kind, index, value in pieces:  # one piece of arguments per call and step, not one per character
            if kind == "arguments" and out and out[-1][0] == "arguments" and out[-1][1] == index:
                out[-1] = (kind, index, out[-1][2] + value)
            else:
                out.append((kind, index, value))
        return out

    def _char(self, ch: str) -> list[tuple[str, int, str]]:
        was_string = self._string
        in_element = self._depth == 2 and not was_string  # between an element's keys and values
        if self._capturing and in_element and ch in ",}":
            self._capturing = False  # the arguments value ended
        elif in_element and self._colon and self._key == "arguments" and not ch.isspace():
            self._capturing = True
        self._lex(ch)
        if self._capturing:
            self._found[-1][1] += ch
            return [("arguments", len(self._found) - 1, ch)] if self._found[-1][0] is not None else []
        if self._depth == 2 and (was_string or self._string):  # a key or a string value of the element
            self._word += ch
            if was_string and not self._string:
                return self._word_done(json.loads(self._word))
        elif in_element and ch in ":,":
            self._colon, self._key = ch == ":", self._key if ch == ":" else None
        elif ch == "{" and self._depth == 2:  # the next element
            self._found.append([None, ""])
            self._key, self._colon = None, False
        return []

    def _word_done(self, word: str) -> list[tuple[str, int, str]]:
        self._word = ""
        if not self._colon:
            self._key = word
            return []
        if self._key == "name" and self._found[-1][0] is None:
            self._found[-1][0] = word
            index, arguments = len(self._found) - 1, self._found[-1][1]
            # arguments written before the name (a grammar that does not keep the schema's order) follow it
            return [("call", index, word)] + ([("arguments", index, arguments)] if arguments else [])
        return []

    def _lex(self, ch: str) -> None:
        """Strings, escapes and nesting depth, character by character."""
        if self._string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._string = False
        elif ch == '"':
            self._string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1


def _parameters(function: Mapping[str, Any]) -> Any:
    return function.get("parameters") or {"type": "object", "properties": {}}


#: Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = ("const", "enum", "default", "examples")
#: Keywords whose values map names (which may be any word, "default" too) to schemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def rebased(schema: Any, base: str) -> Any:
    """``schema`` moved to the JSON pointer ``base`` of a larger document: its local references ("#", "#/...")
    point into ``base``. Object keys are pointer-safe (function names hold no "/" or "~"); only object paths are
    used, which every grammar library resolves (xgrammar does not index arrays)."""
    if isinstance(schema, list):
        return [rebased(item, base) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: rebased(sub, base) for name, sub in value.items()}
        else:
            out[key] = value if key in _DATA_KEYWORDS else rebased(value, base)
    return out


def compact_json(value: Any) -> str:
    """``value`` as JSON without free whitespace, as every engine writes arguments and schemas."""
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
        checked(Constraint("json", compact_json(parameters), f"{field}.function.parameters"))
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


def parser(name: str, calling: ToolCalling) -> Parser:
    """Our parser ``name`` (one of ``PARSERS``), for backends without parsers of their own."""
    return _PARSE[name]


def resolve(calling: ToolCalling | None, options: ToolOptions,
            parsers: Callable[[str, ToolCalling], Parser] = parser) -> ToolCalling | None:
    """``calling`` with the server's parser (made by ``parsers``: the backend's ``tool_call_parser`` where it has
    one), or a 400 for ``auto`` on a server that does not read calls."""
    if calling is None or calling.choice != "auto":
        return calling
    if not options.auto:
        raise invalid_field("tool_choice", "auto", 'this server reads tool calls from free text only with '
                            'option.enable_auto_tool_choice=true and option.tool_call_parser; send tool_choice '
                            '"required" or a named function (enforced by a grammar), or "none"')
    assert options.parser is not None  # ToolOptions requires it with enable_auto_tool_choice
    return dataclasses.replace(calling, parser=parsers(options.parser, calling))


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
        parts.append(f"<tool_call>\n{compact_json({'name': function['name'], 'arguments': arguments})}\n</tool_call>")
    return "\n".join(parts)


def system_prompt(calling: ToolCalling) -> str:
    """The tools as a system message in the hermes format, for chat templates that do not render tools."""
    listed = "\n".join(compact_json(tool) for tool in calling.templated())
    return ("You may call one or more functions to assist with the user query. The functions are:\n"
            f"<tools>\n{listed}\n</tools>\nFor each call, write a JSON object with the function name and its "
            'arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, '
            '"arguments": <args-json-object>}\n</tool_call>')


# --- parsers of free text -------------------------------------------------------------------

def _objects(texts: list[str], arguments_key: str) -> list[tuple[str, str]]:
    found = []
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(
                value.get(arguments_key, value.get("arguments")), dict):
            found.append((value["name"], compact_json(value.get(arguments_key, value.get("arguments")))))
    return found


def _hermes(text: str) -> tuple[list[tuple[str, str]], str]:
    """Calls in ``<tool_call>...</tool_call>`` (the last one may be unclosed), and the text before the first."""
    bodies = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S)
    return _objects(bodies, "arguments"), text.split("<tool_call>", 1)[0].strip()


def _llama3_json(text: str) -> tuple[list[tuple[str, str]], str]:
    """A text that is only ``{"name", "parameters"}`` objects separated by ``;`` (after ``<|python_tag|>``)."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return [], text
    parts = re.split(r";\s*(?=\{)", body)
    found = _objects(parts, "parameters")
    return (found, "") if len(found) == len(parts) else ([], text)


_PARSE: dict[str, Parser] = {"hermes": _hermes, "llama3_json": _llama3_json}


def with_tool_prompt(turns: list[dict[str, Any]], calling: ToolCalling) -> list[dict[str, Any]]:
    """Chat turns with the tools described in the system message (added first when there is none)."""
    prompt = system_prompt(calling)
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{prompt}"}, *turns[1:]]
    return [{"role": "system", "content": prompt}, *turns]
