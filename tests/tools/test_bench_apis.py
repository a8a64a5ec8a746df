"""Request bodies per API, and reading each API's real answer shapes into records (sans-IO)."""

import json

import pytest

from lmi_tools.answers.messages import Api
from lmi_tools.answers.reader import AnswerReader
from lmi_tools.bench.apis import RequestShape, build_body
from lmi_tools.bench.records import RequestRecord, complete


def test_lmi_and_sagemaker_bodies():
    for api in (Api.LMI, Api.SAGEMAKER):
        assert build_body(api, "hi", RequestShape(8)) == {
            "inputs": "hi", "parameters": {"max_new_tokens": 8, "details": True, "ignore_eos": True}, "stream": True}
    assert build_body(Api.LMI, "hi", RequestShape(8, stream=False, ignore_eos=False)) == {
        "inputs": "hi", "parameters": {"max_new_tokens": 8, "details": True}}


def test_tgi_has_no_ignore_eos_and_the_path_chooses_streaming():
    assert build_body(Api.TGI, "hi", RequestShape(8)) == {"inputs": "hi",
                                                          "parameters": {"max_new_tokens": 8, "details": True}}


def test_openai_bodies():
    assert build_body(Api.OPENAI_COMPLETIONS, "hi", RequestShape(8, model="m")) == {
        "prompt": "hi", "model": "m", "max_tokens": 8, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}}
    assert build_body(Api.OPENAI_CHAT, "hi", RequestShape(8, stream=False, ignore_eos=False)) == {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": False}


def test_extra_body_merges_nested_objects():
    shape = RequestShape(8, extra={"parameters": {"temperature": 0.5, "details": False}, "x": 1})
    assert build_body(Api.LMI, "hi", shape) == {
        "inputs": "hi", "stream": True, "x": 1,
        "parameters": {"max_new_tokens": 8, "details": False, "ignore_eos": True, "temperature": 0.5}}


def read(api, content_type, chunks, status=200):
    """Feed chunks at t = 1, 2, 3...; finish at the next tick; return the completed record."""
    reader = AnswerReader(api, content_type, status)
    for i, chunk in enumerate(chunks, start=1):
        reader.feed(chunk, float(i))
    end = float(len(chunks) + 1)
    return complete(RequestRecord(index=0, send=0.0, status=status), reader.finish(end), end)


def jsonlines(*objects) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objects)


LMI_LINES = jsonlines({"token": {"id": 5, "text": " a", "log_prob": -1.0}},
                      {"token": {"id": 6, "text": "", "log_prob": -1.0}},
                      {"token": {"id": 7, "text": "\u00e9", "log_prob": -1.0}, "generated_text": " a\u00e9",
                       "details": {"finish_reason": "length", "generated_tokens": 3, "prompt_tokens": 9}})


def test_lmi_jsonlines_split_across_chunks():
    cut = LMI_LINES.index(b'"id": 6') + 2
    rec = read(Api.LMI, "application/jsonlines", [LMI_LINES[:cut], LMI_LINES[cut:]])
    assert rec.ok and rec.token_times == [1.0, 2.0, 2.0]  # a held-back (empty) token is still a token
    assert rec.first_token == 1.0 and rec.end == 3.0
    assert (rec.input_tokens, rec.input_tokens_source, rec.output_tokens, rec.output_tokens_source) == (
        9, "server", 3, "server")
    assert rec.text == " a\u00e9" and rec.finish_reason == "length"


def test_sagemaker_reads_the_same_lines_from_tiny_payload_parts():
    rec = read(Api.SAGEMAKER, "application/jsonlines", [LMI_LINES[i:i + 5] for i in range(0, len(LMI_LINES), 5)])
    assert rec.ok and len(rec.token_times) == 3 and rec.output_tokens == 3


def test_lmi_json_answer_is_one_event_at_the_end():
    body = json.dumps({"generated_text": "xyz", "details": {"generated_tokens": 4, "finish_reason": "length"}})
    rec = read(Api.LMI, "application/json", [body[:10].encode(), body[10:].encode()])
    assert rec.ok and rec.token_times == [] and rec.first_token == rec.end == 3.0
    assert rec.output_tokens == 4 and rec.input_tokens is None and rec.text == "xyz"


def test_without_details_the_token_events_count():
    rec = read(Api.LMI, "application/jsonlines", [jsonlines({"token": {"text": "a"}}, {"token": {"text": "b"}})])
    assert rec.output_tokens == 2 and rec.output_tokens_source == "events" and rec.text == "ab"


@pytest.mark.parametrize("last", [
    # DJLServing LMI: a failure mid-generation still answers 200; the last line says finish_reason=error
    {"token": {"id": -1, "text": "", "log_prob": -1, "special_token": True}, "generated_text": "",
     "details": {"finish_reason": "error", "generated_tokens": 1}},
    # lmi_handlers: an error object in the stream
    {"code": 424, "message": "Failed Dependency", "error": "scripted failure at token 2"},
])
def test_errors_inside_an_lmi_stream(last):
    rec = read(Api.LMI, "application/jsonlines", [jsonlines({"token": {"text": "a"}}, last)])
    assert not rec.ok and rec.first_token is None


@pytest.mark.parametrize("status, body, message", [
    (400, {"code": 400, "type": "BadRequestException", "message": "Parameter model_name is required."},
     "HTTP 400: BadRequestException: Parameter model_name is required."),
    (424, {"code": 424, "message": "Failed Dependency", "error": "inputs: expected a non-empty string"},
     "HTTP 424: inputs: expected a non-empty string"),
    (422, {"error": "Input validation error", "error_type": "validation"}, "HTTP 422: Input validation error"),
    (401, {"error": {"message": "bad key", "type": "auth"}}, "HTTP 401: bad key"),
])
def test_error_statuses_name_the_server_message(status, body, message):
    rec = read(Api.LMI, "application/json", [json.dumps(body).encode()], status=status)
    assert rec.error == message and rec.status == status


def test_non_json_error_body():
    assert read(Api.TGI, "text/plain", [b"upstream gone"], status=502).error == "HTTP 502: upstream gone"


def sse(*objects, done=False, space=True) -> bytes:
    prefix = b"data: " if space else b"data:"
    out = b"".join(prefix + json.dumps(o).encode() + b"\n\n" for o in objects)
    return out + (b"data: [DONE]\n\n" if done else b"")


def test_tgi_generate_stream():
    events = [{"index": i + 1, "token": {"id": i, "text": t, "logprob": -0.1, "special": False},
               "generated_text": None, "details": None} for i, t in enumerate(["a", "b"])]
    events.append({"index": 3, "token": {"id": 2, "text": "</s>", "logprob": -0.1, "special": True},
                   "generated_text": "ab", "details": {"finish_reason": "eos_token", "generated_tokens": 3,
                                                       "seed": None}})
    data = sse(*events, space=False)  # TGI writes "data:" without a space
    rec = read(Api.TGI, "text/event-stream", [data[:30], data[30:]])
    assert rec.ok and len(rec.token_times) == 3 and rec.output_tokens == 3 and rec.input_tokens is None
    assert rec.text == "ab" and rec.finish_reason == "eos_token"


def test_tgi_generate_and_its_error_event():
    body = {"generated_text": "abc", "details": {"finish_reason": "length", "generated_tokens": 3, "seed": None,
                                                 "prefill": [], "tokens": []}}
    assert read(Api.TGI, "application/json", [json.dumps(body).encode()]).output_tokens == 3
    rec = read(Api.TGI, "text/event-stream", [sse({"error": "Request failed during generation: boom",
                                                    "error_type": "generation"})])
    assert rec.error == "Request failed during generation: boom"


def test_openai_completions_stream_with_usage():
    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    data = sse({**chunk, "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]},
               {**chunk, "choices": [{"index": 0, "text": "bc", "logprobs": None, "finish_reason": "length"}]},
               {**chunk, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}},
               done=True)
    rec = read(Api.OPENAI_COMPLETIONS, "text/event-stream; charset=utf-8", [data])
    assert rec.ok and rec.token_times == [1.0, 1.0] and rec.text == "abc" and rec.finish_reason == "length"
    assert (rec.input_tokens, rec.output_tokens, rec.output_tokens_source) == (7, 3, "server")


def test_openai_chat_role_only_chunk_is_not_a_token():
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    data = [sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            sse({**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}),
            sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, done=True)]
    rec = read(Api.OPENAI_CHAT, "text/event-stream", data)
    assert rec.token_times == [2.0] and rec.first_token == 2.0 and rec.text == "Hi"
    assert rec.output_tokens == 1 and rec.output_tokens_source == "events"


def test_openai_non_streamed_answers_and_errors():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    rec = read(Api.OPENAI_CHAT, "application/json", [json.dumps(body).encode()])
    assert rec.ok and rec.text == "yo" and rec.output_tokens == 2 and rec.input_tokens == 4
    bad = read(Api.OPENAI_CHAT, "text/event-stream", [sse({"error": {"message": "overloaded"}}, done=True)])
    assert bad.error == "overloaded"


def test_garbage_in_a_stream_is_an_error_not_a_crash():
    assert "not JSON" in read(Api.LMI, "application/jsonlines", [b"{oops\n"]).error
    assert "not UTF-8" in read(Api.LMI, "application/jsonlines", [b"\xff\xfe\n"]).error
    assert "not JSON" in read(Api.LMI, "application/json", [b"<html>"]).error


def test_a_transport_error_already_on_the_record_wins():
    record = RequestRecord(index=0, send=0.0, status=200, error="ClientPayloadError: connection reset")
    reader = AnswerReader(Api.LMI, "application/jsonlines")
    reader.feed(jsonlines({"token": {"text": "a"}}), 1.0)
    complete(record, reader.finish(2.0), 2.0)
    assert record.error.startswith("ClientPayloadError") and record.first_token is None


def test_zero_generated_tokens_is_a_count_not_a_missing_one():
    rec = read(Api.LMI, "application/json", [json.dumps(
        {"generated_text": "", "details": {"generated_tokens": 0, "finish_reason": "eos_token"}}).encode()])
    assert (rec.output_tokens, rec.output_tokens_source) == (0, "server")
