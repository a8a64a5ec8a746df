"""The SageMaker streaming post's client recipes, written here from their description, against ``lmi serve``.

The TGI recipe: a ``LineIterator`` that appends each ``PayloadPart`` to a buffer and yields the complete lines (those
ending in a newline); when the event stream ends with bytes left that do not end a line, it keeps looking for one,
forever. DJLServing's own handlers end a JSON answer without a newline (their json formatter closes with ``"}``);
``lmi serve`` does the same, so that recipe works unchanged only with a streaming format (``"stream": true``, whose
jsonlines all end in a newline). docs/sagemaker.md ("Client recipes") says so.

The LMI recipe (seed 003): a ``LineIterator`` that returns whatever ``readline()`` gives, a newline or not, and a
printer that skips the piece holding ``{"generated_text":``, prints ``\\n`` as a new line and strips the closing
``"}``. It was written for DJL's rolling-batch json formatter, which sends the JSON answer in pieces as tokens arrive;
the request carries no ``"stream"``.
"""

from __future__ import annotations

import contextlib
import io
import json
import time

import httpx
import pytest

from .test_serve_sagemaker import runtime


class PostLineIterator:
    """The recipe's line iterator. ``spin_limit`` replaces its endless loop with an error, so a test can finish."""

    def __init__(self, stream, spin_limit: int = 1000):
        self.events, self.buffer, self.read_pos, self.spins, self.spin_limit = iter(stream), io.BytesIO(), 0, 0, \
            spin_limit

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        while True:
            self.buffer.seek(self.read_pos)
            line = self.buffer.readline()
            if line and line[-1] == ord("\n"):
                self.read_pos += len(line)
                return line[:-1]
            try:
                event = next(self.events)
            except StopIteration:
                if self.read_pos < self.buffer.getbuffer().nbytes:
                    self.spins += 1  # the recipe's `continue`: it never ends
                    if self.spins > self.spin_limit:
                        raise RuntimeError("the recipe would loop forever on an unterminated last line") from None
                    continue
                raise
            self.buffer.seek(0, io.SEEK_END)
            self.buffer.write(event["PayloadPart"]["Bytes"])


@pytest.fixture(scope="module")
def server(serve_module):
    model = serve_module.scripted("tiny", **{"option.rolling_batch": "auto", "option.max_new_tokens": 8})
    return serve_module([model], args=["--sagemaker-part-size", "3"])


def stream(server, body: dict):
    return runtime(server).invoke_endpoint_with_response_stream(
        EndpointName="tiny", Body=json.dumps(body), ContentType="application/json")["Body"]


def test_the_recipe_works_unchanged_on_a_streaming_answer(server):
    lines = [json.loads(line) for line in PostLineIterator(stream(server, {"inputs": "hi", "stream": True}))]
    assert len(lines) == 8 and all("token" in line for line in lines)
    assert "".join(line["token"]["text"] for line in lines) == lines[-1]["generated_text"] == " The qui"


def test_a_json_answer_ends_without_a_newline_as_djl_sends_it(server):
    body = b"".join(event["PayloadPart"]["Bytes"] for event in stream(server, {"inputs": "hi"}))
    assert json.loads(body) == {"generated_text": " The qui"}
    assert not body.endswith(b"\n")
    with pytest.raises(RuntimeError, match="loop forever"):
        list(PostLineIterator(stream(server, {"inputs": "hi"})))


def test_error_bodies_come_in_djlservings_shapes_and_clients_read_them(server):
    from lmi_tools.answers.messages import error_message

    unknown = httpx.post(f"{server.url}/predictions/nope", json={"inputs": "hi"}, timeout=10)
    assert unknown.status_code == 404 and set(unknown.json()) == {"code", "type", "message"}  # the front end's
    bad = httpx.post(f"{server.url}/predictions/tiny", json={"inputs": ""}, timeout=10)
    # with rolling batch, DJLServing's front end turns the item's code and error into {"code", "error"}
    assert bad.status_code == 400 and set(bad.json()) == {"code", "error"} and "inputs" in bad.json()["error"]
    assert "nope" in error_message(unknown.json()) and "inputs" in error_message(bad.json())


class LmiLineIterator:
    """The LMI recipe's iterator: any bytes ``readline()`` returns, a whole line or not."""

    def __init__(self, stream):
        self.events, self.buffer, self.read_pos = iter(stream), io.BytesIO(), 0

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        while True:
            self.buffer.seek(self.read_pos)
            line = self.buffer.readline()
            if line:
                self.read_pos += len(line)
                return line
            try:
                event = next(self.events)
            except StopIteration:
                if self.read_pos < self.buffer.getbuffer().nbytes:
                    continue
                raise
            if "PayloadPart" not in event:
                print("Unknown event type:" + str(event))
                continue
            self.buffer.seek(0, io.SEEK_END)
            self.buffer.write(event["PayloadPart"]["Bytes"])


def print_response_stream(response_stream) -> None:
    """The LMI recipe's printer."""
    start_sequence, stop_sequence, new_line = b'{"generated_text":', b'"}', b"\\n"
    for line in LmiLineIterator(response_stream.get("Body")):
        if start_sequence in line:
            continue
        if line == new_line:
            print()
            continue
        elif line.endswith(stop_sequence):
            line = line.rstrip(stop_sequence)
        print(line.decode("utf-8"), end="")


class Printed(io.StringIO):
    """stdout that remembers when each piece was printed."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def write(self, text: str) -> int:
        if text:
            self.times.append(time.monotonic())
        return super().write(text)


@pytest.fixture(scope="module")
def djl_like(serve_module):
    """SageMaker's framing without splitting: one PayloadPart per chunk the model sends."""
    slow = {"option.rolling_batch": "auto", "option.scripted_step_delay_ms": 100, "option.max_new_tokens": 12}
    return serve_module([serve_module.scripted("rolling", **slow), serve_module.scripted("plain")])


def test_the_lmi_recipe_prints_the_answer_as_it_is_generated(djl_like):
    payload = {"inputs": "Tell me about foxes", "parameters": {"do_sample": True, "top_p": 0.6, "temperature": 0.9,
                                                               "top_k": 50, "max_new_tokens": 12,
                                                               "return_full_text": False}}
    began = time.monotonic()
    response = runtime(djl_like).invoke_endpoint_with_response_stream(
        EndpointName="rolling", Body=json.dumps(payload), ContentType="application/json")
    printed = Printed()
    with contextlib.redirect_stdout(printed):
        print_response_stream(response)
    assert printed.getvalue() == " The quick b"
    # one piece per generation step (100 ms each), the first long before the last
    assert len(printed.times) >= 10 and printed.times[-1] - printed.times[0] > 0.5
    assert printed.times[0] - began < printed.times[-1] - began - 0.5


def test_the_pieces_form_one_json_document_byte_for_byte_as_djl_sends_it(djl_like):
    parts = [event["PayloadPart"]["Bytes"] for event in runtime(djl_like).invoke_endpoint_with_response_stream(
        EndpointName="rolling", Body=json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 4}}),
        ContentType="application/json")["Body"]]
    assert parts == [b'{"generated_text": "', b" T", b"h", b'e"}']
    body = httpx.post(f"{djl_like.url}/predictions/rolling", json={"inputs": "hi", "parameters": {"max_new_tokens": 4}})
    assert body.content == b'{"generated_text": " The"}' and body.headers["content-type"] == "application/json"


def test_djls_integration_client_gets_a_json_list_without_rolling_batch_and_a_400_with_it(djl_like):
    # tests/integration/llm/client.py, the huggingface case: a list of one prompt with "stream": true
    request = {"inputs": ["hi"], "stream": True, "parameters": {"max_new_tokens": 4}}
    plain = httpx.post(f"{djl_like.url}/predictions/plain", json=request)
    assert plain.status_code == 200 and plain.json() == [{"generated_text": " The"}]
    assert plain.headers["content-type"] == "application/json"
    rolling = httpx.post(f"{djl_like.url}/predictions/rolling", json=request)
    assert rolling.status_code == 400 and "'inputs' must be one string" in rolling.json()["error"]
