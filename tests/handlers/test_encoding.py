"""Wire formats: which one a request gets, and the exact shapes LMI, TGI and OpenAI clients parse."""

import json

import pytest

from lmi_handlers.encoding import Encoder, Format, Framing, choose_format
from lmi_handlers.events import ErrorEvent, FinishReason, GenerationResult, Token, TokenEvent
from lmi_handlers.request import parse_payload


def request(data):
    return parse_payload(data, 30).requests[0]


LMI = {"inputs": "Hi"}
LMI_STREAM = {"inputs": "Hi", "stream": True}
CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
CHAT_STREAM = {**CHAT, "stream": True}


@pytest.mark.parametrize("data, formatter, accept, tgi, expected", [
    (LMI, "", None, False, Format(Framing.JSON)),
    (LMI_STREAM, "", None, False, Format(Framing.JSONLINES)),
    (LMI_STREAM, "", "text/event-stream", False, Format(Framing.SSE)),
    (LMI, "", "text/event-stream", False, Format(Framing.SSE)),
    (LMI, "", "application/jsonlines", False, Format(Framing.JSONLINES)),
    (LMI_STREAM, "", None, True, Format(Framing.SSE, tgi=True)),
    (LMI, "", None, True, Format(Framing.JSON, tgi=True)),
    (LMI_STREAM, "json", None, False, Format(Framing.JSON)),  # an explicit formatter wins, as in LMI
    (LMI, "jsonlines", None, False, Format(Framing.JSONLINES)),
    (CHAT, "", None, False, Format(Framing.JSON, chat=True)),
    (CHAT_STREAM, "", "application/json", False, Format(Framing.SSE, chat=True)),
    (CHAT_STREAM, "", "application/jsonlines", False, Format(Framing.JSONLINES, chat=True)),
    (CHAT, "jsonlines_chat", None, False, Format(Framing.JSONLINES, chat=True)),
    ({"text": "Hi", "seq_length": 9}, "jsonlines", None, False, Format(Framing.JSON)),
])
def test_choose_format(data, formatter, accept, tgi, expected):
    assert choose_format(request(data), formatter, accept, tgi) == expected


TOKENS = (Token(5, "Hel", -0.5), Token(6, "lo", -0.25), Token(2, "", -0.1, special=True))
RESULT = GenerationResult("Hello", FinishReason.EOS, 3, 4, TOKENS, seed=7)


def events():
    return [TokenEvent(TOKENS[0], 1)], [TokenEvent(TOKENS[1], 2)], [TokenEvent(TOKENS[2], 3), RESULT]


def render(data, fmt):
    encoder = Encoder(request(data), fmt, prompt="Say:", model_name="tiny")
    return [encoder.encode(step) for step in events()], encoder


def test_json_waits_for_the_end_and_carries_details():
    chunks, _ = render({"inputs": "Say:", "parameters": {"details": True}}, Format(Framing.JSON))
    assert chunks[:2] == ["", ""]
    body = json.loads(chunks[2])
    assert body["generated_text"] == "Hello"
    assert body["details"]["finish_reason"] == "eos_token" and body["details"]["generated_tokens"] == 3
    assert body["details"]["inputs"] == "Say:" and body["details"]["seed"] == 7
    assert body["details"]["tokens"][2] == {"id": 2, "text": "", "log_prob": -0.1, "special_token": True}


def test_return_full_text_prepends_the_prompt():
    chunks, _ = render({"inputs": "Say:", "parameters": {"return_full_text": True}}, Format(Framing.JSON))
    assert json.loads(chunks[2]) == {"generated_text": "Say:Hello"}


def test_jsonlines_one_line_per_token_and_the_last_carries_the_text():
    chunks, _ = render({"inputs": "Say:", "stream": True, "parameters": {"details": True}},
                       Format(Framing.JSONLINES))
    lines = [json.loads(c) for c in chunks]
    assert all(c.endswith("\n") and c.count("\n") == 1 for c in chunks)
    assert lines[0] == {"token": {"id": 5, "text": "Hel", "log_prob": -0.5}}
    assert lines[2]["generated_text"] == "Hello"
    assert lines[2]["details"]["finish_reason"] == "eos_token" and "tokens" not in lines[2]["details"]
    assert "".join(line["token"]["text"] for line in lines) == lines[2]["generated_text"]


def test_sse_frames():
    chunks, _ = render(LMI_STREAM, Format(Framing.SSE))
    assert all(c.startswith("data: {") and c.endswith("}\n\n") for c in chunks)


def test_tgi_shapes():
    chunks, _ = render(LMI_STREAM, Format(Framing.SSE, tgi=True))
    assert json.loads(chunks[0][6:])["token"] == {"id": 5, "text": "Hel", "logprob": -0.5, "special": False}
    (body,) = json.loads(render(LMI, Format(Framing.JSON, tgi=True))[0][2])
    assert body == {"generated_text": "Hello"}


def test_chat_completion_object():
    chunks, _ = render({**CHAT, "logprobs": True}, Format(Framing.JSON, chat=True))
    body = json.loads(chunks[2])
    assert body["object"] == "chat.completion" and body["model"] == "tiny" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello"}
    assert choice["finish_reason"] == "stop"
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == [-0.5, -0.25, -0.1]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_chat_stream_chunks_role_first_and_done_last():
    chunks, _ = render({**CHAT_STREAM, "stream_options": {"include_usage": True}}, Format(Framing.SSE, chat=True))
    events_ = [c for chunk in chunks for c in chunk.split("\n\n") if c]
    assert events_[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events_[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert payloads[1]["choices"][0]["delta"] == {"content": "lo"}
    assert payloads[2]["choices"][0]["finish_reason"] == "stop"
    assert payloads[3]["choices"] == [] and payloads[3]["usage"]["total_tokens"] == 7
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}


def test_chat_stream_skips_held_back_tokens():
    encoder = Encoder(request(CHAT_STREAM), Format(Framing.JSONLINES, chat=True), prompt="")
    assert encoder.encode([TokenEvent(Token(1, "a", 0.0), 1)]) != ""
    assert encoder.encode([TokenEvent(Token(2, "", 0.0), 2)]) == ""


def test_errors_inside_streams():
    encoder = Encoder(request(LMI_STREAM), Format(Framing.JSONLINES), prompt="")
    line = json.loads(encoder.encode([ErrorEvent(424, "generation failed: boom")]))
    assert line == {"code": 424, "message": "Failed Dependency", "error": "generation failed: boom"}
    chat = Encoder(request(CHAT_STREAM), Format(Framing.SSE, chat=True), prompt="")
    assert chat.encode([ErrorEvent(507, "oom")]).endswith("data: [DONE]\n\n")


def test_legacy_answer_is_the_full_text():
    encoder = Encoder(request({"text": "Say:", "seq_length": 9}), Format(Framing.JSON), prompt="Say:")
    assert encoder.result_object(RESULT) == "Say:Hello"
