"""The SageMaker streaming post's client recipe, written here from its description, against ``lmi serve``.

The recipe: a ``LineIterator`` that appends each ``PayloadPart`` to a buffer and yields the complete lines (those
ending in a newline); when the event stream ends with bytes left that do not end a line, it keeps looking for one,
forever. DJLServing's own handlers end a JSON answer without a newline (their json formatter closes with ``"}``);
``lmi serve`` does the same, so the recipe works unchanged only with a streaming format (``"stream": true``, whose
jsonlines all end in a newline). docs/sagemaker.md ("Client recipes") says so.
"""

from __future__ import annotations

import io
import json

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
    import httpx

    from lmi_tools.answers.messages import error_message

    unknown = httpx.post(f"{server.url}/predictions/nope", json={"inputs": "hi"}, timeout=10)
    assert unknown.status_code == 404 and set(unknown.json()) == {"code", "type", "message"}  # the front end's
    bad = httpx.post(f"{server.url}/predictions/tiny", json={"inputs": ""}, timeout=10)
    # with rolling batch, DJLServing's front end turns the item's code and error into {"code", "error"}
    assert bad.status_code == 400 and set(bad.json()) == {"code", "error"} and "inputs" in bad.json()["error"]
    assert "nope" in error_message(unknown.json()) and "inputs" in error_message(bad.json())
