"""Line reassembly and token extraction for SageMaker response streams (no network: fake event streams)."""

import io
import json

import pytest
from botocore.exceptions import EventStreamError

from lmi_tools.answers.messages import Api
from lmi_tools.errors import ModelFailed
from lmi_tools.sagemaker.invoke import TokenStream, invoke, request_body

TOKENS = [" The", " qu\u00efck", " \u2014", " f\u00f6x \u2713", "!"]  # 2- and 3-byte characters
JSONLINES = "".join(json.dumps({"token": {"id": i, "text": t, "log_prob": -0.5}}, ensure_ascii=False) + "\n"
                    for i, t in enumerate(TOKENS)).encode()


class FakeBody:
    """Stands in for botocore's EventStream: PayloadPart events, then optionally an error event."""

    def __init__(self, data: bytes, size: int, error: str | None = None, extra_events=()):
        self.events = [{"PayloadPart": {"Bytes": data[i:i + size]}} for i in range(0, len(data), size)]
        self.events[1:1] = list(extra_events)
        self.error, self.closed = error, False

    def __iter__(self):
        yield from self.events
        if self.error:
            raise EventStreamError({"Error": {"Code": self.error, "Message": "Your model failed mid-stream"}},
                                   "InvokeEndpointWithResponseStream")

    def close(self):
        self.closed = True


def stream(data: bytes, size: int, content_type: str = "application/jsonlines", api: Api = Api.SAGEMAKER,
           **kwargs) -> TokenStream:
    return TokenStream({"Body": FakeBody(data, size, **kwargs), "ContentType": content_type}, api)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, len(JSONLINES)])
def test_lines_split_anywhere_across_parts_come_back_whole(size):
    tokens = stream(JSONLINES, size)
    assert list(tokens) == TOKENS
    assert tokens.text == "".join(TOKENS) and tokens.body.closed
    assert tokens.answer.pieces[-1] == "!"


def test_events_other_than_payload_parts_are_skipped():
    assert list(stream(JSONLINES, 4, extra_events=[{}, {"SomethingNew": {}}])) == TOKENS


def test_a_last_line_without_newline_is_flushed_when_complete():
    data = JSONLINES + b'{"token": {"text": " end"}, "generated_text": "x"}'
    assert list(stream(data, 6))[-1] == " end"


@pytest.mark.parametrize("tail", [b'{"token": {"text": " e', "{\"token\": {\"text\": \"\u2713\"}}".encode()[:-4]])
def test_a_stream_that_stops_inside_a_line_is_a_truncated_line(tail):
    tokens = stream(JSONLINES + tail, 5)
    received = []
    with pytest.raises(ModelFailed, match="truncated line") as info:
        received.extend(tokens)
    assert received == TOKENS and info.value.received == "".join(TOKENS)


def test_a_model_stream_error_keeps_what_arrived_and_closes_the_stream():
    tokens = stream(JSONLINES, 9, error="ModelStreamError")
    received = []
    with pytest.raises(ModelFailed, match="Your model failed mid-stream") as info:
        received.extend(tokens)
    assert received == TOKENS and info.value.received == "".join(TOKENS)
    assert "ModelStreamError" in str(info.value) and tokens.body.closed


def test_internal_stream_failure_says_to_retry():
    with pytest.raises(ModelFailed) as info:
        list(stream(JSONLINES, 9, error="InternalStreamFailure"))
    assert "run the request again" in info.value.hint


@pytest.mark.parametrize("line", [
    {"code": 424, "message": "Failed Dependency", "error": "scripted failure at token 3"},
    {"token": {"id": -1, "text": "", "special_token": True}, "generated_text": "",
     "details": {"finish_reason": "error"}},
])
def test_an_error_line_mid_stream_fails_with_the_text_so_far(line):
    data = JSONLINES + json.dumps(line).encode() + b"\n"
    with pytest.raises(ModelFailed, match="middle of the stream") as info:
        list(stream(data, 11))
    assert info.value.received == "".join(TOKENS)


def test_chat_chunks_as_server_sent_events():
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
              {"choices": [{"index": 0, "delta": {"content": "lo \u2713"}}]},
              {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}]
    data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
    assert list(stream(data, 3, "text/event-stream", Api.OPENAI_CHAT)) == ["Hel", "lo \u2713"]


def test_chat_chunks_as_jsonlines():
    data = b"".join(json.dumps({"choices": [{"delta": {"content": t}}]}).encode() + b"\n" for t in TOKENS)
    assert "".join(stream(data, 4, api=Api.OPENAI_CHAT)) == "".join(TOKENS)


def test_a_whole_json_answer_to_a_stream_call_comes_at_once():
    body = json.dumps({"generated_text": "all of it"}, indent=2).encode()  # DJL pretty-prints JSON answers
    assert list(stream(body, 5, "application/json")) == ["all of it"]


class FakeRuntime:
    def __init__(self, body: bytes, content_type: str = "application/json"):
        self.response = {"Body": io.BytesIO(body), "ContentType": content_type}

    def invoke_endpoint(self, **kwargs):
        return self.response


@pytest.mark.parametrize("value, text", [
    ({"generated_text": "abc"}, "abc"),
    ([{"generated_text": "abc"}], "abc"),  # tgi_compat answers with a list
    ({"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}, "hi"),
])
def test_whole_answers(value, text):
    chat = "choices" in value if isinstance(value, dict) else False
    reply = invoke(FakeRuntime(json.dumps(value).encode()), "e", request_body("p", chat=chat))
    assert reply.text == text


@pytest.mark.parametrize("value, found", [
    ({"code": 400, "message": "Bad Request", "error": "inputs: expected a non-empty string"}, "inputs"),
    ({"error": {"message": "context too long"}}, "context too long"),
    ({"generated_text": "", "details": {"finish_reason": "error"}}, "finish_reason=error"),
    ({"code": 503, "type": "ServiceUnavailableException", "message": "busy"}, "ServiceUnavailableException: busy"),
])
def test_errors_in_whole_answers(value, found):
    with pytest.raises(ModelFailed, match="answered with an error") as info:
        invoke(FakeRuntime(json.dumps(value).encode()), "e", request_body("p"))
    assert found in str(info.value)


def test_raw_returns_any_body_unread():
    assert invoke(FakeRuntime(b"<html>", "text/html"), "e", request_body("p"), raw=True).text == "<html>"
    with pytest.raises(ModelFailed, match="not JSON"):
        invoke(FakeRuntime(b"<html>", "text/html"), "e", request_body("p"))


def test_request_bodies():
    assert request_body("hi", {"max_new_tokens": 4}, stream=True) == {
        "inputs": "hi", "stream": True, "parameters": {"max_new_tokens": 4}}
    assert request_body("hi", {"max_tokens": 4}, chat=True) == {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": False}
