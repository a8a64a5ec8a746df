"""Typed request parameters: what each field means and what it accepts, written once, beside the field.

As vLLM's ``SamplingParams`` does, the types check their own values: every field carries a ``Rule`` (its
JSON type and range) in its metadata, and ``checked`` builds an instance from raw JSON values, raising an
``InvalidRequest`` that names the client's field, the value and what is allowed. The request parsers
(``request.py``) only map each schema's names onto these fields.

``RequestLimits`` are the per-request bounds checked before anything is tokenized.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

from .errors import invalid_field

if TYPE_CHECKING:
    from .structured.constraint import Constraint
    from .structured.reasoning import Reasoning
    from .structured.tools import ToolCalling

MAX_SEED = 2**63 - 1
MAX_STOP_SEQUENCES = 16
MAX_LOGIT_BIAS = 300
MAX_TOP_LOGPROBS = 20
#: The most choices one request may ask for (``n``): OpenAI's own limit (vLLM's default allows 16,384).
MAX_CHOICES = 128
MAX_TEMPERATURE = 2.0
#: A request's scheduling priority is a 32-bit integer, as vLLM stores it.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Rule:
    """What a field accepts: a JSON type (bool, int, float, a string or a list of strings) and a range."""

    kind: type
    low: float | None = None
    high: float | None = None
    #: The lower bound itself is excluded (``> low`` rather than ``>= low``).
    low_open: bool = False

    @property
    def allowed(self) -> str:
        if self.kind is bool:
            return "expected true or false"
        if self.kind is tuple:
            return f"expected a non-empty string or a list of at most {MAX_STOP_SEQUENCES} non-empty strings"
        if self.kind is dict:
            return (f"expected an object of at most {MAX_LOGIT_BIAS} token ids (as strings) to numbers in "
                    f"[{self.low:g}, {self.high:g}]")
        if self.kind is int:
            upper = f" and <= {self.high}" if self.high is not None else ""
            return f"expected an integer >= {self.low}{upper}" if self.low is not None else "expected an integer"
        if self.low is not None and self.high is not None:
            return f"expected a number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"expected a number {'>' if self.low_open else '>='} {self.low:g}"
        return "expected a number"

    def check(self, name: str, value: Any) -> Any:
        """``value`` as this field's type, or an ``InvalidRequest`` naming ``name``."""
        if self.kind is tuple:
            stops = [value] if isinstance(value, str) else value
            if isinstance(stops, list) and len(stops) <= MAX_STOP_SEQUENCES and all(
                    isinstance(s, str) and s for s in stops):
                return tuple(stops)
            raise invalid_field(name, value, self.allowed)
        if self.kind is dict:
            return self._token_map(name, value)
        if isinstance(value, bool) != (self.kind is bool) or not isinstance(value, (bool, int, float)):
            raise invalid_field(name, value, self.allowed)
        if self.kind is int and not isinstance(value, int):
            raise invalid_field(name, value, self.allowed)
        if self.kind is not bool and not self._in_range(value):
            raise invalid_field(name, value, self.allowed)
        return float(value) if self.kind is float else value

    def _token_map(self, name: str, value: Any) -> tuple[tuple[int, float], ...]:
        """``{"token id": number}`` as sorted (id, number) pairs."""
        if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
            raise invalid_field(name, value, self.allowed)
        pairs = []
        for key, bias in value.items():
            if not (isinstance(key, str) and key.isdigit()) or isinstance(bias, bool) or not isinstance(
                    bias, (int, float)) or not self._in_range(bias):
                raise invalid_field(f"{name}.{key}", bias, self.allowed)
            pairs.append((int(key), float(bias)))
        return tuple(sorted(pairs))

    def _in_range(self, value: float) -> bool:
        try:
            if not math.isfinite(value):
                return False
        except OverflowError:  # an integer too large for a float
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high


def ruled(default: Any, rule: Rule) -> Any:
    """A dataclass field with its rule."""
    return field(default=default, metadata={"rule": rule})


T = TypeVar("T")


def rule_of(cls: type, name: str) -> Rule:
    return next(f.metadata["rule"] for f in dataclasses.fields(cls) if f.name == name)


def checked(cls: type[T], values: Mapping[str, Any], names: Mapping[str, str], **fixed: Any) -> T:
    """``cls`` built from raw JSON ``values`` (by field name; None means "not sent"), each checked by its
    rule; errors name the field as the client wrote it (``names``). ``fixed`` values are taken as they are."""
    rules = {f.name: f.metadata["rule"] for f in dataclasses.fields(cls) if "rule" in f.metadata}
    kwargs = {key: rules[key].check(names.get(key, key), value) for key, value in values.items() if value is not None}
    return cls(**kwargs, **fixed)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen."""

    #: Sample from the distribution (true) or take the most likely token (false: greedy decoding).
    do_sample: bool = ruled(False, Rule(bool))
    #: Divides the logits before sampling; 0 means greedy decoding whatever ``do_sample`` says. At most 2 on every
    #: schema and engine: OpenAI's range, and what vLLM's ``SamplingParams`` accepts.
    temperature: float = ruled(1.0, Rule(float, low=0, high=MAX_TEMPERATURE))
    #: Sample only among the k most likely tokens; 0 turns the filter off.
    top_k: int = ruled(0, Rule(int, low=0))
    #: Sample only among the most likely tokens whose probabilities add up to p; 1 turns the filter off.
    top_p: float = ruled(1.0, Rule(float, low=0, high=1, low_open=True))
    #: Above 1 discourages tokens already in the text, below 1 encourages them; 1 turns it off.
    repetition_penalty: float = ruled(1.0, Rule(float, low=0, low_open=True))
    #: Seeds the request's own random generator, so that the same seed samples the same tokens.
    seed: int | None = ruled(None, Rule(int, low=0, high=MAX_SEED))
    # The fields below are honoured by the backends that list them in ``request_fields`` (hf, neuronx, vllm); the
    # others refuse a request that sets one (``job.py``). None, or the value that means "off", is "not set".
    #: Drop tokens whose probability is below min_p times the most likely token's.
    min_p: float | None = ruled(None, Rule(float, low=0, high=1))
    #: Subtracted from the logit of every token already generated (OpenAI's meaning), in [-2, 2].
    presence_penalty: float | None = ruled(None, Rule(float, low=-2, high=2))
    #: Subtracted once per earlier occurrence of a token in the generated text, in [-2, 2].
    frequency_penalty: float | None = ruled(None, Rule(float, low=-2, high=2))
    #: Added to the logits of the given token ids before sampling ({"token id": bias in [-100, 100]}).
    logit_bias: tuple[tuple[int, float], ...] | None = ruled(None, Rule(dict, low=-100, high=100))
    #: How many most likely alternatives to report beside each generated token (with ``details``/``logprobs``).
    top_logprobs: int | None = ruled(None, Rule(int, low=0, high=MAX_TOP_LOGPROBS))

    def __post_init__(self) -> None:
        if self.temperature == 0:  # greedy, as OpenAI and vLLM read it
            object.__setattr__(self, "do_sample", False)
            object.__setattr__(self, "temperature", 1.0)
        for name, off in OFF_VALUES.items():
            if getattr(self, name) == off:
                object.__setattr__(self, name, None)

    def extras(self) -> dict[str, Any]:
        """The fields only some backends honour, those this request sets."""
        return {name: getattr(self, name) for name in OFF_VALUES if getattr(self, name) is not None}

    @property
    def greedy(self) -> bool:
        return not self.do_sample


#: The backend-specific sampling fields and the value of each that means "off" (the same as not sent).
OFF_VALUES: dict[str, Any] = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": (),
                              "top_logprobs": 0}


@dataclass(frozen=True)
class StoppingParams:
    """When generation ends: a token budget, stop sequences, and whether EOS ends it."""

    #: The most tokens to generate (the prompt not counted).
    max_new_tokens: int = ruled(30, Rule(int, low=1))
    #: Generation stops when the text ends with one of these; it is left out of the answer.
    stop: tuple[str, ...] = ruled((), Rule(tuple))
    #: Keep generating past the end-of-sequence token (for benchmarks with a fixed output length).
    ignore_eos: bool = ruled(False, Rule(bool))


class Schema(str, enum.Enum):
    LMI = "lmi"
    CHAT = "chat"
    LEGACY = "legacy"


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete, with everything that shapes the answer."""

    schema: Schema
    prompt: str
    sampling: SamplingParams
    stopping: StoppingParams
    #: How many answers (choices) to generate for the prompt, each its own sampled sequence.
    n: int = ruled(1, Rule(int, low=1, high=MAX_CHOICES))
    #: Send tokens as they are generated.
    stream: bool = ruled(False, Rule(bool))
    #: Per-token ids, texts and log probabilities (``logprobs`` in the chat schema).
    details: bool = ruled(False, Rule(bool))
    #: Put the prompt in front of the generated text.
    return_full_text: bool = ruled(False, Rule(bool))
    #: Chat messages as (role, text) pairs; the prompt is rendered from them by the backend.
    messages: tuple[tuple[str, str], ...] = ()
    #: The legacy schema's total length (prompt + generated); max_new_tokens is derived from it.
    seq_length: int | None = ruled(None, Rule(int, low=2))
    #: The chat schema's model name, echoed in the answer.
    model: str | None = None
    #: A final chat chunk with token counts (``stream_options.include_usage``).
    include_usage: bool = ruled(False, Rule(bool))
    #: What the answer must match (a JSON schema, a regex), enforced while sampling (``structured/``).
    constraint: Constraint | None = None
    #: Chat tool calling: the tools, ``tool_choice`` and how calls are read back (``structured/tools.py``).
    tools: ToolCalling | None = None
    #: The token budget's name as the client wrote it (``max_tokens`` or ``max_completion_tokens`` on chat), for
    #: errors found once the prompt is tokenized.
    budget_field: str = "parameters.max_new_tokens"
    #: A reasoning model's convention (``option.reasoning_parser``): chat answers carry the reasoning apart.
    reasoning: Reasoning | None = None
    #: Scheduling priority, vLLM's field: lower values are admitted first (then by arrival); 0 by default. Any other
    #: value needs ``option.scheduling_policy=priority`` (``scheduler.py``).
    priority: int = ruled(0, Rule(int, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1]))


@dataclass(frozen=True)
class Payload:
    """One HTTP request: one or more prompts, and whether the answer is a JSON list."""

    requests: tuple[GenerationRequest, ...]
    many: bool = False


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one request, checked before its prompt is tokenized (``option.<name>`` sets the first two)."""

    #: Characters in one prompt (or all of a chat's messages): longer ones are refused without tokenizing.
    max_prompt_chars: int = 1_000_000
    #: Prompts in one request (``inputs`` or ``text`` as a list).
    max_prompts_per_request: int = 64
    #: Nesting of JSON objects and lists in a body; deeper bodies are refused.
    max_json_depth: int = 32
