"""Grammars are compiled for the model before their request joins a batch (issue 43): what cannot be satisfied, is
empty, too large or too slow to compile is a 400 naming the client's field at admission, beside good requests that
answer as alone; the compilation runs beside the step loop, never in it."""

import json
import re
import threading

import pytest

from lmi_handlers.errors import InvalidRequest
from lmi_handlers.config import HANDLER_KEYS
from lmi_handlers.structured.admission import KEYS, GrammarBudget, GrammarCompiler, endless_ref, expanded_length
from lmi_handlers.structured.constraint import Constraint

from .test_handler_contract import JavaLoop
from .test_step_isolation import answer, answers_alone

pytest.importorskip("torch")
pytest.importorskip("llguidance")

LOOP = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                  "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
        "$ref": "#/$defs/a"}
TREE = {"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {
    "$ref": "#/$defs/node"}}}, "required": ["children"]}}, "$ref": "#/$defs/node"}


@pytest.mark.parametrize("schema, loop", [
    (LOOP, "#/$defs/a"),
    ({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}, "#"),
    ({"type": "array", "minItems": 1, "items": {"$ref": "#"}}, "#"),
    ({"allOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {"type": "object", "required": ["y"], "properties": {
        "y": {"anyOf": [{"$ref": "#/$defs/x"}, {"$ref": "#/$defs/x"}]}}}}}, "#/$defs/x"),
    (TREE, None),  # a tree: its children may be an empty list
    ({"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"}, None),
    ({"$defs": {"a": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                                                    "required": ["a"]}]}}, "$ref": "#/$defs/a"}, None),
    ({"$defs": {"a": {"properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}}, "$ref": "#/$defs/a"}, None),
    ({"type": "object", "properties": {"x": {"$ref": "#/missing"}}, "required": ["x"]}, None),  # the library's call
])
def test_a_loop_of_required_refs_is_found_and_a_way_out_is_not_a_loop(schema, loop):
    assert endless_ref(schema) == loop


@pytest.fixture(scope="module")
def handler(tiny_rolling_handler):
    return tiny_rolling_handler


GOOD = {"a": {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 6}},
        "b": {"inputs": "My number is", "stream": True,
              "parameters": {"max_new_tokens": 6, "guided_regex": "[0-9]{4}"}}}
CHOICES = [f"SECRET-TOKEN-12345-{i:06d}" for i in range(4_000)]  # 108,000 characters (the issue's: 1 MB)


@pytest.fixture(scope="module")
def alone(handler):
    return answers_alone(handler, GOOD)


def chat(**fields):
    return {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, **fields}


@pytest.mark.parametrize("payload, field, reason", [
    ({"inputs": "x", "parameters": {"guided_json": LOOP}}, "parameters.guided_json",
     re.escape("no JSON value satisfies this schema: every value of #/$defs/a requires another")),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "l", "schema": LOOP}}),
     "response_format.json_schema.schema", "no JSON value satisfies"),
    ({"inputs": "x", "parameters": {"guided_regex": "[^\\x00-\\x{10FFFF}]"}}, "parameters.guided_regex",
     "no text satisfies this constraint"),
    ({"inputs": "x", "parameters": {"guided_regex": "()"}}, "parameters.guided_regex", "allows only an empty answer"),
    ({"inputs": "x", "parameters": {"guided_choice": CHOICES}}, "parameters.guided_choice",
     re.escape("accepts at most 65,536 (option.max_grammar_chars)")),
    ({"inputs": "x", "parameters": {"guided_regex": "(a{1000}){1000}"}}, "parameters.guided_regex",
     re.escape("the regex's repetitions multiply out to 1,000,000 characters; this server accepts at most 65,536")),
])
def test_a_grammar_that_cannot_be_served_is_a_400_at_admission_beside_good_requests(handler, alone, payload, field,
                                                                                   reason):
    loop = JavaLoop(handler)
    for name, good in GOOD.items():
        loop.submit(name, good)
    loop.step()
    loop.submit("bad", payload)
    while loop.active:
        loop.step()
    assert loop.codes == {"bad": 400}, loop.bodies["bad"][:500]
    assert loop.bodies["bad"].startswith(f"{field}: ") and re.search(reason, loop.bodies["bad"]), loop.bodies["bad"]
    assert len(loop.bodies["bad"]) < 1000 and "SECRET" not in loop.bodies["bad"]
    assert {name: answer(loop.bodies[name]) for name in GOOD} == alone


@pytest.mark.parametrize("regex, length", [
    ("[0-9]{3}-[0-9]{4}", 8), ("((a{10}){10}){10}", 1000), ("x{2,}|y{2,5}", 8), (r"\d{1,100}", 100),
    (r"[\]a[:alpha:]]{4}", 4), (r"\x{10FFFF}{3}", 3), ("(ab)*c", 4)])
def test_a_regex_is_measured_with_its_repetitions_multiplied_out(regex, length):
    assert expanded_length(regex) == length


def test_grammars_compile_beside_the_step_loop(handler, monkeypatch):
    release = threading.Event()
    compile_grammar = handler.backend.compile_grammar

    def slowly(constraint):
        assert release.wait(30), "the step loop never finished the free request"
        return compile_grammar(constraint)

    monkeypatch.setattr(handler.backend, "compile_grammar", slowly)
    loop = JavaLoop(handler)
    loop.submit("constrained", {"inputs": "x", "parameters": {"max_new_tokens": 4, "guided_regex": "[0-9]{4}"}})
    loop.submit("free", GOOD["a"])
    while "free" in {r.key for r in loop.active}:
        loop.step()  # would block here, inside the compilation, if it ran in the step
    assert loop.bodies["constrained"] == ""
    release.set()
    while loop.active:
        loop.step()
    assert json.loads(loop.bodies["constrained"])["generated_text"].isdigit()


def test_the_budgets_are_options_and_a_compilation_over_its_time_is_refused(tiny_model_dir):
    from transformers import AutoTokenizer

    assert GrammarBudget.from_properties({"max_grammar_chars": "100", "max_grammar_compile_ms": "50",
                                          "max_grammar_step_fuel": "5000"}) == GrammarBudget(100, 50, 5000)
    assert set(KEYS) <= HANDLER_KEYS  # known options: no unknown-key warning
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    hurried = GrammarCompiler(tokenizer, len(tokenizer), tokenizer.eos_token_id, GrammarBudget(compile_ms=0))
    with pytest.raises(InvalidRequest, match=r"f: the constraint is too slow to compile: it took .* ms of CPU, more "
                                             r"than 0 ms \(option.max_grammar_compile_ms\)"):
        hurried.compile(Constraint("regex", "[0-9]{4}", "f"))
