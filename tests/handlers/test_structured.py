"""Structured output: the wire shapes into one constraint (400s naming the field), tool calling, and the
per-row grammar masks of the batched sampler (a tokenizer trained here, no model)."""

import json

import pytest

from lmi_handlers.encoding import Encoder, Format, Framing
from lmi_handlers.errors import ConfigError, InvalidRequest
from lmi_handlers.events import FinishReason, GenerationResult, Token, TokenEvent
from lmi_handlers.request import parse_payload
from lmi_handlers.structured import constraint as structured
from lmi_handlers.structured.tools import CallReader, ToolOptions, parse_tools, resolve

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def chat(**fields):
    return parse_payload({**CHAT, **fields}, 30).requests[0]


def lmi(**parameters):
    return parse_payload({"inputs": "hi", "parameters": parameters}, 30).requests[0]


def test_every_wire_shape_becomes_one_compact_constraint():
    by_openai = chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA,
                                                                             "strict": True}}).constraint
    by_lmi = lmi(guided_json=json.dumps(SCHEMA)).constraint
    by_tgi = structured.from_tgi_grammar({"type": "json", "value": SCHEMA})
    assert by_openai.spec == by_lmi.spec == by_tgi.spec == json.dumps(SCHEMA, separators=(",", ":"))
    assert by_openai.whitespace is None and by_openai.field == "response_format.json_schema.schema"
    assert structured.to_guided(by_tgi) == {"guided_json": SCHEMA}
    assert lmi(guided_regex="[0-9]+").constraint.kind == "regex"
    assert lmi(guided_choice=["a", "b"]).constraint.kind == "choice"
    assert chat(response_format={"type": "json_object"}).constraint.any_object
    assert chat(response_format={"type": "text"}).constraint is None and chat().constraint is None


@pytest.mark.parametrize("build, field, reason", [
    (lambda: lmi(guided_json={"type": "foo"}), "parameters.guided_json", "Invalid type"),
    (lambda: lmi(guided_json="{not json"), "parameters.guided_json", "not JSON"),
    (lambda: lmi(guided_regex="[a-"), "parameters.guided_regex", "unclosed character class"),
    (lambda: lmi(guided_regex="[0-9]", guided_json=SCHEMA), "parameters.guided_regex", "only one of"),
    (lambda: lmi(guided_choice=[]), "parameters.guided_choice", "non-empty list"),
    (lambda: chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 3, "maximum": 1}}}), "response_format.json_schema.schema", "minimum"),
    (lambda: chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
     "response_format.json_schema.name", "non-empty string"),
    (lambda: chat(response_format={"type": "json_object", "x": 1}), "response_format.x", "unknown field"),
    (lambda: structured.from_tgi_grammar({"type": "lark", "value": "x"}), "parameters.grammar.type", "json, regex"),
    (lambda: chat(guided_regex="[0-9]", response_format={"type": "json_object"}), "guided_regex", "only one"),
])
def test_a_constraint_that_cannot_compile_is_a_400_naming_the_field(build, field, reason):
    with pytest.raises(InvalidRequest) as caught:
        build()
    assert caught.value.status == 400 and caught.value.field == field and reason in str(caught.value)


def test_tool_choice_shapes_the_grammar_and_reads_the_calls_back():
    named = parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name":
                                                                                             "get_weather"}}})
    assert named.constraint().schema == WEATHER["function"]["parameters"]
    assert named.calls('{"city":"Paris"}') == (None, [("get_weather", '{"city":"Paris"}')])
    required = parse_tools({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    schema = required.constraint().schema
    assert schema["maxItems"] == 1 and schema["items"]["anyOf"][0]["properties"]["name"] == {"const": "get_weather"}
    assert required.calls('[{"name":"get_weather","arguments":{"city":"Rome"}}]')[1] == [
        ("get_weather", '{"city":"Rome"}')]
    assert required.calls('[{"name":"get_w') == (None, [])  # cut short by max_tokens before the name: no call
    # cut short inside the arguments: the call as far as it got, as its stream sent it
    assert required.calls('[{"name":"get_weather","arguments":{"ci') == (None, [("get_weather", '{"ci')])
    assert parse_tools({"tools": [WEATHER]}).choice == "auto" and parse_tools(CHAT) is None
    assert chat(tools=[WEATHER], tool_choice="required").constraint.field == "tools"
    assert chat(tools=[WEATHER], tool_choice="none").constraint is None


def _trip_tool():
    """What ``openai.pydantic_function_tool`` makes of a nested pydantic model: parameters that refer to their own
    ``$defs`` (and a property named like a keyword, whose schema refers to them too)."""
    openai = pytest.importorskip("openai")
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=20)

    class Trip(BaseModel):
        origin: City
        stops: list[City] = Field(max_length=2)
        default: City | None = None

    return openai.pydantic_function_tool(Trip)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "Trip"}}, "none"])
def test_tools_whose_parameters_refer_to_their_own_defs_work_with_every_tool_choice(choice):
    jsonschema = pytest.importorskip("jsonschema")
    tool = _trip_tool()
    assert "$defs" in tool["function"]["parameters"]
    request = chat(tools=[tool, WEATHER], tool_choice=choice)  # compiled by llguidance, or a 400
    arguments = {"origin": {"name": "Paris"}, "stops": [{"name": "Rome"}], "default": {"name": "Oslo"}}
    if choice == "none":
        assert request.constraint is None
        return
    schema = request.constraint.schema
    answer = [{"name": "Trip", "arguments": arguments}] if choice == "required" else arguments
    jsonschema.validate(answer, schema)  # the references resolve where the grammar moved the parameters
    bad = {**arguments, "origin": {"name": "x" * 21}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "Trip", "arguments": bad}] if choice == "required" else bad, schema)
    if choice == "required":  # a "$ref" inside data (a const) is data: left as it is
        assert structured.json_schema("x", schema).schema == schema
        moved = parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"k": {"const": {"$ref": "#/x"}}}}}}], "tool_choice": "required"})
        assert moved.constraint().schema["$defs"]["f"]["properties"]["k"] == {"const": {"$ref": "#/x"}}


@pytest.mark.parametrize("parser, text, content, calls", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Sure.", [("get_weather", '{"city":"Paris"}')]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call><tool_call>{"name": '
               '"get_weather", "arguments": {"city": "B"}}', None,
     [("get_weather", '{"city":"A"}'), ("get_weather", '{"city":"B"}')]),
    ("hermes", '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>', "same", []),
    ("hermes", "Just text.", "same", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
                    '{"name": "get_weather", "parameters": {"city": "Rome"}}', None,
     [("get_weather", '{"city":"Oslo"}'), ("get_weather", '{"city":"Rome"}')]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}} and more', "same", []),
])
def test_auto_answers_are_read_by_the_named_parser(parser, text, content, calls):
    tools = resolve(parse_tools({"tools": [WEATHER]}), ToolOptions(True, parser))
    assert tools.calls(text) == (text if content == "same" else content, calls)


def test_auto_needs_the_servers_options_as_lmi_spells_them():
    tools = parse_tools({"tools": [WEATHER]})
    with pytest.raises(InvalidRequest, match="option.enable_auto_tool_choice"):
        resolve(tools, ToolOptions())
    options = ToolOptions.from_properties({"enable_auto_tool_choice": "true", "tool_call_parser": "llama3_json"})
    assert resolve(tools, options).calls('{"name": "get_weather", "parameters": {}}')[1] == [("get_weather", "{}")]
    # a backend's own parsers (the vllm backend's) read the answer instead, and the request's rules still apply
    seen = []
    own = resolve(tools, options, lambda name, calling: seen.append((name, calling)) or (
        lambda text: ([("get_weather", "{}"), ("other", "{}")], "before")))
    assert own.calls("anything") == ("before", [("get_weather", "{}")]) and seen == [("llama3_json", tools)]
    with pytest.raises(ConfigError, match="tool_call_parser"):
        ToolOptions.from_properties({"enable_auto_tool_choice": "true"})
    with pytest.raises(ConfigError, match="hermes, llama3_json"):
        ToolOptions.from_properties({"tool_call_parser": "mistral"})


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("choice, text", [
    ("required", '[{"name":"get_weather","arguments":{"city":"Pa\\"ris, {[it]}"}},{"name":"get_time","arguments":{}}]'),
    ({"type": "function", "function": {"name": "get_weather"}}, '{"city":"Lyon \\u00e9"}'),
    ("required", '[{"arguments":{"city":"Pa\\"ris, {[it]}"},"name":"get_weather"}]'),  # name last
])
def test_a_forced_call_is_read_as_it_grows_into_the_calls_of_the_whole_answer(choice, text):
    tools = parse_tools({"tools": [WEATHER, TIME], "tool_choice": choice})
    for size in (1, 3, 7):
        reader, heads, arguments = CallReader(tools), {}, {}
        for start in range(0, len(text), size):
            for kind, index, value in reader.feed(text[start:start + size]):
                if kind == "call":
                    assert index not in heads and index == len(heads)  # each call's name once, in order
                    heads[index], arguments[index] = value, ""
                else:
                    arguments[index] += value  # arguments only after their call's name
        assert [(heads[i], arguments[i]) for i in sorted(heads)] == tools.calls(text)[1]
    assert [json.loads(arguments) for _, arguments in tools.calls(text)[1]][0]["city"] in ('Pa"ris, {[it]}',
                                                                                        "Lyon \u00e9")


def test_a_streamed_forced_call_sends_its_arguments_as_they_are_generated_and_reassembles_to_the_answer():
    request = chat(tools=[WEATHER, TIME], tool_choice="required", stream=True)
    pieces = ['[{"name":"get', '_weather","arg', 'uments":{"ci', 'ty":"Ro', 'me"}}]']
    streamed = Encoder(request, Format(Framing.SSE, chat=True), "prompt")
    tokens = [TokenEvent(Token(i, piece, 0.0), i + 1) for i, piece in enumerate(pieces)]
    result = GenerationResult("".join(pieces), FinishReason.EOS, len(pieces), 3, tuple(t.token for t in tokens))
    frames = [streamed.encode([token, *([result] if i == len(tokens) - 1 else [])]) for i, token in enumerate(tokens)]
    chunks = [[json.loads(line[6:]) for line in frame.split("\n\n") if line.startswith("data: {")] for frame in frames]
    deltas = [[c["choices"][0]["delta"] for c in step] for step in chunks]
    assert deltas[0] == [{"role": "assistant", "content": None}]  # no name yet
    assert deltas[1][0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert [d["tool_calls"][0]["function"]["arguments"] for d in deltas[2] + deltas[3]] == ['{"ci', 'ty":"Ro']
    assert chunks[-1][-1]["choices"][0]["finish_reason"] == "tool_calls" and frames[-1].endswith("data: [DONE]\n\n")
    whole = Encoder(request, Format(Framing.JSON, chat=True), "prompt").result_object(result)["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    assert [c["function"] for c in whole["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city":"Rome"}'}]


def test_tool_messages_and_earlier_calls_reach_the_prompt():
    request = chat(messages=[{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                                "arguments": '{"city": "Paris"}'}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "21C"}])
    assert request.messages[1] == ("assistant", '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}'
                                                "\n</tool_call>")
    assert request.messages[2] == ("tool", "21C")
    with pytest.raises(InvalidRequest, match=r"messages\[0\]\.tool_calls\[0\]\.function\.arguments"):
        chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}])


# --- the sampler's masks --------------------------------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_constrained_and_free_rows_share_a_step_and_free_greedy_rows_are_unchanged(tokenizer):
    from lmi_handlers.backends.sampler import select_tokens
    from lmi_handlers.sequence import SequenceState
    from lmi_handlers.structured.masks import GrammarMasks

    eos = {tokenizer.eos_token_id}
    grammars = GrammarMasks(tokenizer, eos)
    free, digits, word = lmi(), lmi(guided_regex="[0-9]{3}"), lmi(guided_choice=["hello"])
    sampled = parse_payload({"inputs": "hi", "parameters": {"guided_regex": "[0-9]{3}", "do_sample": True}},
                            30).requests[0]
    requests = [free, digits, word, free, sampled]
    seqs = [SequenceState(r, [1, 2], decode=tokenizer.decode, eos_ids=eos, seed=7) for r in requests]
    torch.manual_seed(0)
    vocab = len(tokenizer)
    texts = ["" for _ in seqs]
    for _ in range(8):
        logits = torch.randn(len(seqs), vocab)
        plain = select_tokens(torch, logits[[0, 3]].clone(), seqs[::3])  # the free rows alone, without grammars
        picks = select_tokens(torch, logits, seqs, grammars)
        assert [picks[0], picks[3]] == plain  # bit for bit, token and log probability
        for i, pick in enumerate(picks):
            for token, _ in pick if isinstance(pick, list) else [pick]:
                if token not in eos and not seqs[i].finished:
                    texts[i] += tokenizer.decode([token])
                if token in eos and seqs[i].grammar is not None:
                    seqs[i].finished = True
    assert texts[1].isdigit() and len(texts[1]) == 3 and texts[4].isdigit() and len(texts[4]) == 3
    assert texts[2] == "hello"
    assert all(seq.finished for seq in (seqs[1], seqs[2], seqs[4]))  # each ended with its grammar



def test_constrained_rows_do_not_speculate_beside_rows_that_do(tiny_model_dir, tmp_path):
    from .test_hf_backend import ask, loaded
    from .test_speculative import always_speculate

    handler = loaded(tiny_model_dir, tmp_path, rolling_batch="disable", speculative_draft_model=str(tiny_model_dir))
    always_speculate(handler)
    code, body = ask(handler, {"inputs": "the the the the the the", "parameters": {
        "max_new_tokens": 12, "details": True, "guided_regex": "[0-9]{4}"}})
    answer = json.loads(body)
    assert code == 200 and answer["generated_text"].isdigit() and len(answer["generated_text"]) == 4
    assert "draft_tokens" not in answer["details"] or answer["details"]["draft_tokens"] == 0
    assert answer["details"]["finish_reason"] == "eos_token"  # ended with its grammar, before the budget
    code, body = ask(handler, {"inputs": "the the the the the the", "parameters": {"max_new_tokens": 12,
                                                                                   "details": True}})
    assert code == 200 and json.loads(body)["details"]["draft_tokens"] > 0  # the free row still guesses
