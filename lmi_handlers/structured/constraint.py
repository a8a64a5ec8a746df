"""The one constraint a request puts on its answer, whatever wire shape asked for it.

* OpenAI (chat and completions): ``response_format`` ``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}``;
* TGI: ``parameters.grammar`` ``{"type": "json" | "regex", "value": ...}``;
* LMI (``/invocations``, ``/predictions``) and vLLM's extra chat fields: ``guided_json``, ``guided_regex``,
  ``guided_choice``, with ``guided_whitespace_pattern``.

JSON is compact unless ``guided_whitespace_pattern`` asks for whitespace: a grammar that allows free whitespace
lets a small model spend its whole budget on newlines between a key and its value. Every constraint is compiled
(llguidance, without a tokenizer) when the request is parsed, so a schema the library cannot compile is a 400
naming the field and the library's reason before anything runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidRequest, invalid_field

#: LMI's names, as vLLM's guided decoding spells them (LMI's vLLM engine passes them to vLLM).
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_whitespace_pattern")
INSTALL = "pip install 'lmi-handlers[hf]'"


@dataclass(frozen=True)
class Constraint:
    """What the answer must match: a JSON schema (``kind`` "json"), a regular expression ("regex") or one of a
    few strings ("choice")."""

    kind: str
    #: The JSON schema as compact JSON text, the regex, or the choices as a JSON list.
    spec: str
    #: The client's field, named in errors.
    field: str
    #: Whitespace the JSON may hold between tokens (a regex); None: none at all (compact JSON).
    whitespace: str | None = None
    #: ``json_object`` without a schema: any object, which nothing bounds, so finishing is best effort.
    any_object: bool = False
    #: What the grammar allows before the constraint starts: a reasoning model's reasoning (``reasoning.py``).
    lead: str | None = None

    @property
    def schema(self) -> Any:
        return json.loads(self.spec) if self.kind == "json" else None

    def grammar(self) -> str:
        """The constraint as an llguidance grammar (after ``lead``, where there is one)."""
        if self.lead is not None:
            from .reasoning import after_reasoning

            return after_reasoning(dataclasses.replace(self, lead=None).grammar(), self.lead)
        from llguidance import LLMatcher

        if self.kind == "json":
            options = ({"whitespace_flexible": False} if self.whitespace is None
                       else {"whitespace_flexible": True, "whitespace_pattern": self.whitespace})
            return LLMatcher.grammar_from_json_schema(self.spec, defaults=options)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        return LLMatcher.grammar_from_regex("|".join(re.escape(choice) for choice in json.loads(self.spec)))


def checked(constraint: Constraint) -> Constraint:
    """``constraint`` once the grammar library compiles it; else an ``InvalidRequest`` with the library's reason."""
    try:
        from llguidance import LLMatcher
    except ImportError:
        raise InvalidRequest(f"{constraint.field}: structured output needs the llguidance package on this server "
                             f"({INSTALL})", field=constraint.field) from None
    try:
        error = LLMatcher.validate_grammar(constraint.grammar())
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error:
        reason = " ".join(error.split())[:300]
        raise InvalidRequest(f"{constraint.field}: cannot be compiled into a grammar: {reason}",
                             field=constraint.field)
    return constraint


def json_schema(field: str, value: Any, whitespace: str | None = None) -> Constraint:
    """A JSON-schema constraint from an object, or a string holding one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid_field(field, value, f"expected a JSON schema (an object); this string is not JSON: {exc}")
    if not isinstance(value, Mapping):
        raise invalid_field(field, value, "expected a JSON schema (an object)")
    spec = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return checked(Constraint("json", spec, field, whitespace))


def regex(field: str, value: Any) -> Constraint:
    if not isinstance(value, str) or not value:
        raise invalid_field(field, value, "expected a regular expression (a non-empty string)")
    return checked(Constraint("regex", value, field))


def _choice(field: str, value: Any) -> Constraint:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise invalid_field(field, value, "expected a non-empty list of non-empty strings")
    return checked(Constraint("choice", json.dumps(value, ensure_ascii=False), field))


def from_response_format(value: Any, field: str = "response_format") -> Constraint | None:
    """OpenAI's ``response_format``: None for ``text``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid_field(field, value, 'expected an object such as {"type": "json_object"}')
    kind = value.get("type")
    allowed = {"text": ("type",), "json_object": ("type",), "json_schema": ("type", "json_schema")}
    if kind not in allowed:
        raise invalid_field(f"{field}.type", kind, "allowed types are text, json_object, json_schema")
    _known(value, allowed[kind], field)
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json", '{"type":"object"}', field, any_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise invalid_field(f"{field}.json_schema", spec, 'expected an object {"name", "schema", "strict"}')
    _known(spec, ("name", "description", "schema", "strict"), f"{field}.json_schema")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise invalid_field(f"{field}.json_schema.name", spec.get("name"), "expected a non-empty string")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise invalid_field(f"{field}.json_schema.strict", spec["strict"], "expected true or false")
    # strict or not, the schema is enforced: a grammar costs little and a non-strict answer may not parse.
    return json_schema(f"{field}.json_schema.schema", spec.get("schema", {"type": "object"}))


def from_tgi_grammar(value: Any, field: str = "parameters.grammar") -> Constraint | None:
    """TGI's ``grammar``: ``{"type": "json", "value": schema}`` or ``{"type": "regex", "value": "..."}``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid_field(field, value, 'expected {"type": "json" or "regex", "value": ...}')
    _known(value, ("type", "value"), field)
    kind = value.get("type")
    if kind == "json":
        return json_schema(f"{field}.value", value.get("value"))
    if kind == "regex":
        return regex(f"{field}.value", value.get("value"))
    raise invalid_field(f"{field}.type", kind, "allowed types are json, regex")


def from_guided(values: Mapping[str, Any], prefix: str = "") -> Constraint | None:
    """LMI's ``guided_json`` / ``guided_regex`` / ``guided_choice`` (at most one), in ``values``."""
    sent = [name for name in GUIDED_FIELDS[:3] if values.get(name) is not None]
    whitespace = values.get("guided_whitespace_pattern")
    if whitespace is not None:  # compiled on its own first, so that a bad pattern is blamed on its own field
        regex(prefix + "guided_whitespace_pattern", whitespace)
    if len(sent) > 1:
        raise InvalidRequest(f"{prefix}{sent[1]}: only one of {', '.join(prefix + n for n in GUIDED_FIELDS[:3])} "
                             f"may be sent, got {', '.join(prefix + n for n in sent)}", field=prefix + sent[1])
    if not sent:
        return None
    name = sent[0]
    if name == "guided_json":
        return json_schema(prefix + name, values[name], whitespace)
    if name == "guided_regex":
        return regex(prefix + name, values[name])
    return _choice(prefix + name, values[name])


def to_guided(constraint: Constraint) -> dict[str, Any]:
    """``constraint`` as LMI's parameters (what the OpenAI completions and TGI routes send the handler)."""
    if constraint.kind == "json":
        out: dict[str, Any] = {"guided_json": json.loads(constraint.spec)}
        if constraint.whitespace is not None:
            out["guided_whitespace_pattern"] = constraint.whitespace
        return out
    if constraint.kind == "regex":
        return {"guided_regex": constraint.spec}
    return {"guided_choice": json.loads(constraint.spec)}


def one_of(*constraints: Constraint | None) -> Constraint | None:
    """The constraint sent, refusing two from different fields."""
    sent = [c for c in constraints if c is not None]
    if len(sent) > 1:
        raise InvalidRequest(f"{sent[1].field}: only one constraint may be sent, got {sent[0].field} too",
                             field=sent[1].field)
    return sent[0] if sent else None


def _known(value: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise InvalidRequest(f"unknown field {where}.{unknown[0]}: allowed fields are {', '.join(allowed)}",
                             field=f"{where}.{unknown[0]}")
