"""A request's grammar, compiled for the model's tokenizer and checked before the request joins a batch.

Parsing (``constraint.py``) checks that the grammar library can compile a constraint at all. Admission compiles it
for the model's tokenizer, within ``GrammarBudget`` (options, docs/serving.md), on the preparation pool rather than
in the shared step (``rolling.py``), and refuses with a 400 naming the client's field a constraint that is:

* too large: more than ``option.max_grammar_chars`` characters (the schema as compact JSON, the regex, the
  choices as the one alternation they are compiled as), or a regex whose counted repetitions multiply out to more
  (``(a{1000}){1000}`` is a million: its lexer would spend seconds, then give up);
* unsatisfiable: no JSON value satisfies the schema (its required ``$ref``s loop without end: a -> b -> a), or no
  text satisfies the grammar at all (the empty class ``[^\\x00-\\x{10FFFF}]``);
* empty: the only answer it allows is the empty string;
* too slow to compile: building its matcher and its first token mask ran out of the library's fuel, or took more
  than ``option.max_grammar_compile_ms`` of CPU time (the compiling thread's own: a loaded host, where that thread
  waits its turn, refuses no more than an idle one).

The matcher it builds is the one the hf engine then masks with; each of its later masks is bounded by
``option.max_grammar_step_fuel`` (llguidance's lexer fuel for one mask), so one valid but expensive grammar cannot
stall the rows beside it: a row that runs out fails alone (``backends/rows.py``). The vllm engine checks the same
way, with vLLM's tokenizer and llguidance's default limits (those vLLM's own matcher gets), and discards the matcher.

Errors quote the library's reason without its parser dump (``verbose_errors`` off): a client learns what is wrong
with its own grammar, and nobody reads anyone's grammar back.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidRequest
from ..values import parse_int
from .constraint import INSTALL, Constraint

#: The options ``GrammarBudget`` reads.
KEYS = ("max_grammar_chars", "max_grammar_compile_ms", "max_grammar_step_fuel")
#: How many rounds the ``$ref`` check takes at most before it gives a schema the benefit of the doubt.
REF_ROUNDS = 32


@dataclass(frozen=True)
class GrammarBudget:
    """What one request's grammar may cost (``option.max_grammar_chars``, ``option.max_grammar_compile_ms``,
    ``option.max_grammar_step_fuel``)."""

    #: Characters of the constraint's text: a 1 MB choice list or regex alternation is refused.
    max_chars: int = 65_536
    #: Milliseconds of CPU time to build the matcher and its first token mask, at admission.
    compile_ms: int = 1_000
    #: llguidance's lexer fuel for one token mask (its ``step_lexer_fuel``; its own default).
    step_fuel: int = 200_000

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "GrammarBudget":
        return cls(parse_int(props, "max_grammar_chars", cls.max_chars) or cls.max_chars,
                   parse_int(props, "max_grammar_compile_ms", cls.compile_ms) or cls.compile_ms,
                   parse_int(props, "max_grammar_step_fuel", cls.step_fuel, minimum=1000) or cls.step_fuel)


class GrammarCompiler:
    """Compiles constraints for one model's tokenizer (converted for llguidance once, at the first constraint)."""

    def __init__(self, hf_tokenizer: Any, vocab: int, eos: int | None, budget: GrammarBudget = GrammarBudget(),
                 library_limits: bool = False):
        self._hf, self.vocab, self.eos, self.budget = hf_tokenizer, vocab, eos, budget
        #: Check with llguidance's default limits (what vLLM's matcher gets) rather than the step fuel.
        self._library_limits = library_limits
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError:
                    raise InvalidRequest(f"structured output needs the llguidance package on this server ({INSTALL})")
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab, eos_token=self.eos)
            return self._tokenizer

    def compile(self, constraint: Constraint) -> Any:
        """``constraint``'s matcher, its first mask computed; an ``InvalidRequest`` naming its field otherwise."""
        self.check_text(constraint)
        field = constraint.field
        tokenizer = self.tokenizer()
        import llguidance

        began = time.thread_time()
        limits = llguidance.LLParserLimits(verbose_errors=False, **(
            {} if self._library_limits else {"step_lexer_fuel": self.budget.step_fuel}))
        matcher = llguidance.LLMatcher(tokenizer, constraint.grammar(), log_level=0, limits=limits)
        allowed = None if matcher.is_error() else self.first_mask(matcher)
        if matcher.is_error():
            raise InvalidRequest(f"{field}: {refusal(matcher.get_error())}", field=field)
        if not allowed:
            raise InvalidRequest(f"{field}: the constraint allows only an empty answer", field=field)
        took = (time.thread_time() - began) * 1000
        if took > self.budget.compile_ms:
            raise InvalidRequest(f"{field}: the constraint is too slow to compile: it took {took:,.0f} ms of CPU, more "
                                 f"than {self.budget.compile_ms:,} ms (option.max_grammar_compile_ms)", field=field)
        return matcher

    def check_text(self, constraint: Constraint) -> None:
        """What the constraint's text alone shows: too large, or (a schema) a loop of required ``$ref``s."""
        field = constraint.field
        size = len(constraint.spec if constraint.kind == "json" else constraint.regex)
        if size > self.budget.max_chars:
            raise InvalidRequest(f"{field}: the constraint is {size:,} characters; this server accepts at most "
                                 f"{self.budget.max_chars:,} (option.max_grammar_chars)", field=field)
        if constraint.kind != "json":
            expanded = expanded_length(constraint.regex)
            if expanded > self.budget.max_chars:
                raise InvalidRequest(f"{field}: the regex's repetitions multiply out to {expanded:,} characters; this "
                                     f"server accepts at most {self.budget.max_chars:,} (option.max_grammar_chars)",
                                     field=field)
            return
        loop = endless_ref(constraint.schema)
        if loop is not None:
            raise InvalidRequest(f"{field}: no JSON value satisfies this schema: every value of {loop} requires "
                                 "another inside it, without end (a loop of required $refs)", field=field)

    def first_mask(self, matcher: Any) -> bool:
        """Computes the matcher's first mask; whether it allows any token but end-of-sequence."""
        import numpy as np

        words = (self.vocab + 31) // 32
        bits = np.zeros(words, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, words * 4)
        if self.eos is not None and self.eos < self.vocab:
            bits.view(np.uint32)[self.eos >> 5] &= np.uint32(0xFFFFFFFF ^ (1 << (self.eos & 31)))
        return bool(bits.any())


def refusal(error: str) -> str:
    """Why the library refused a grammar, in a sentence: its first line, without the parser dump."""
    reason = " ".join(error.replace("<non-verbose/>", "").split())[:300]
    if reason == "NoExtensionBias" or not reason:
        return "no text satisfies this constraint"
    if any(word in reason for word in ("fuel", "too many", "too big", "limit")):
        return f"the constraint is too complex to compile within the grammar library's limits ({reason})"
    return f"cannot be compiled into a grammar: {reason}"


_COUNTED = re.compile(r"\{(\d+)(,(\d*))?\}")


def expanded_length(regex: str) -> int:
    """How long ``regex`` is with its counted repetitions multiplied out: an escape or a class counts one, a group
    what is inside it, ``x{m,n}`` ``n`` times ``x`` (``m`` times when open-ended). The size a regex engine compiles
    it to grows with this; llguidance's lexer builds it lazily, but explores it as it masks."""
    frames = [[0, 0]]  # per open group: [its length so far, the length of its last item]
    at = 0
    while at < len(regex):
        char, item = regex[at], 1
        counted = _COUNTED.match(regex, at) if char == "{" else None
        if counted is not None:
            low, comma, high = counted.groups()
            times = int(high) if high else int(low)
            frame = frames[-1]
            frame[0] += frame[1] * (times - 1)
            frame[1] *= times
            at = counted.end()
            continue
        if char == "\\":
            brace = regex[at + 2:at + 3] == "{" and regex[at + 1:at + 2] in "xupP"
            at = (regex.find("}", at) + 1 or len(regex)) if brace else at + 2
        elif char == "[":
            at = _class_end(regex, at)
        elif char == "(":
            frames.append([0, 0])
            at += 1
            continue
        elif char == ")" and len(frames) > 1:
            item = frames.pop()[0]
            at += 1
        else:
            at += 1
        frames[-1][0] += item
        frames[-1][1] = item
    return sum(frame[0] for frame in frames)


def _class_end(regex: str, at: int) -> int:
    """Just past the character class opening at ``at`` (nested classes and escapes included)."""
    depth = 0
    while at < len(regex):
        char = regex[at]
        if char == "\\":
            at += 2
            continue
        if char == "[":
            depth += 1
        elif char == "]" and depth > 0:
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return at


def endless_ref(schema: Any) -> str | None:
    """A local ``$ref`` of ``schema`` that no finite JSON value satisfies (its required properties or items lead back
    to it, a -> b -> a, with no way out), or None. A least fixed point over the refs: a ref is satisfiable once its
    target is without counting on unproven refs; what is not known after ``REF_ROUNDS`` rounds is given the benefit
    of the doubt, as is whatever the grammar library judges itself (types, bounds, missing pointers)."""
    refs: list[str] = []
    _collect_refs(schema, refs, set())
    if not refs:
        return None
    proven: dict[str, bool] = {ref: False for ref in refs}
    for _ in range(REF_ROUNDS):
        grew = False
        for ref in refs:
            if not proven[ref]:
                target = _pointer(schema, ref)
                if target is _MISSING or _finite(target, proven):
                    proven[ref] = grew = True
        if not grew:
            break
    else:
        return None
    return None if _finite(schema, proven) else next(ref for ref in refs if not proven[ref])


_MISSING = object()


def _collect_refs(node: Any, refs: list[str], seen: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
            seen.add(ref)
            refs.append(ref)
        for value in node.values():
            _collect_refs(value, refs, seen)
    elif isinstance(node, list):
        for value in node:
            _collect_refs(value, refs, seen)


def _pointer(schema: Any, ref: str) -> Any:
    node = schema
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _finite(node: Any, proven: Mapping[str, bool]) -> bool:
    """Whether some finite value satisfies ``node``, counting a ref as satisfiable only when ``proven``."""
    if not isinstance(node, dict):
        return node is not False
    ref = node.get("$ref")
    if isinstance(ref, str) and not proven.get(ref, True):
        return False
    if any(not _finite(part, proven) for part in _list(node.get("allOf"))):
        return False
    for key in ("anyOf", "oneOf"):
        if key in node and not any(_finite(part, proven) for part in _list(node[key])):
            return False
    kinds = node.get("type")
    if kinds is None:
        return True  # any type: a number satisfies it (llguidance allows one too)
    return any(_finite_as(kind, node, proven) for kind in (kinds if isinstance(kinds, list) else [kinds]))


def _finite_as(kind: Any, node: Mapping[str, Any], proven: Mapping[str, bool]) -> bool:
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        extra = node.get("additionalProperties", True)
        return all(_finite(properties.get(name, extra), proven) for name in _list(node.get("required")))
    if kind == "array":
        least = node.get("minItems", 0)
        prefix = _list(node.get("prefixItems"))
        if not isinstance(least, int) or least <= 0:
            return True
        needed = prefix[:least] + ([node.get("items", True)] if least > len(prefix) else [])
        return all(_finite(item, proven) for item in needed)
    return True


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
