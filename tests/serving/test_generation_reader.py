"""How the TGI and OpenAI-completions routes read a model's answer, in every framing a model may be configured
to answer in (jsonlines, ``option.output_formatter=sse``, one JSON value, TGI's shapes with ``tgi_compat``)."""

import json

from lmi_tools.serving.routes.generation import Failure, Result, Token, line_items


def read(*lines):
    seen, counted = set(), []
    items = [item for line in lines for item in line_items(line.encode(), seen, counted.append)]
    return items, counted


def test_lmi_jsonlines_and_sse_lines():
    for prefix in ("", "data: "):
        items, counted = read(prefix + '{"token": {"id": 5, "text": "a", "log_prob": -0.5}}',
                              prefix + '{"token": {"id": 6, "text": "b", "log_prob": -0.1}, "generated_text": "ab", '
                                       '"details": {"finish_reason": "length", "generated_tokens": 2, '
                                       '"prompt_tokens": 3}}')
        assert items == [Token(5, "a", -0.5, False),
                         Result("ab", "length", 2, 3, None, 0, Token(6, "b", -0.1, False))]
        assert counted == [items[-1]]


def test_one_json_answer_with_details_tokens_and_tgi_shapes():
    answer = [{"generated_text": "hi", "details": {"finish_reason": "eos_token", "generated_tokens": 2, "seed": 7,
                                                    "tokens": [{"id": 1, "text": "h", "logprob": -1.0, "special": False},
                                                               {"id": 2, "text": "i", "logprob": -2.0,
                                                                "special": True}]}}]
    items, _ = read(json.dumps(answer))
    assert items == [Token(1, "h", -1.0, False), Token(2, "i", -2.0, True), Result("hi", "eos_token", 2, 0, 7)]


def test_several_prompts_keep_their_index():
    items, _ = read(json.dumps([{"generated_text": "x"}, {"generated_text": "y"}]))
    assert [(r.text, r.index) for r in items] == [("x", 0), ("y", 1)]


def test_errors_and_unreadable_answers_are_failures():
    assert read('{"code": 400, "message": "Bad Request", "error": "max_new_tokens=0 is invalid"}')[0] == [
        Failure(400, "max_new_tokens=0 is invalid")]
    assert read("data: [DONE]", "") == ([], [])
    [failure], _ = read("not json")
    assert isinstance(failure, Failure) and failure.code == 502 and "cannot read" in failure.message
