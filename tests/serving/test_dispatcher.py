"""The dispatcher (``ServedModel``) without a worker process: dynamic batching, queue limits, cancellation,
the rolling step loop, worker failures. Two fakes stand in for the worker's client:

* ``ScriptedWorker`` records every Input and answers with a function of it, optionally held at a gate;
* ``InProcessWorker`` runs the real handler (scripted backend) behind the real wire codec in this process:
  the worker process minus its socket.

The subprocess path is covered by integration_tests/test_serve_*.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from lmi_handlers.backends.scripted import DEFAULT_TEXT
from lmi_handlers.errors import MAX_ERROR_CHARS
from lmi_handlers.handler import Handler
from lmi_handlers.protocol import Input, Output, PairList
from lmi_tools.serving.dispatcher import (Chunk, End, ModelSettings, PendingRequest, QueueFull, ServedModel, Start,
                                          Status)
from lmi_tools.serving.worker import process
from lmi_tools.serving.worker.client import WorkerDied, WorkerSettings
from lmi_tools.serving.worker.codec import (OutputHeader, encode_input, iter_output_frames, read_input,
                                            read_output_header, read_stream_chunks)
from lmi_tools.serving.worker.frontend import batch_prefix, init_input, request_input

TIMEOUT = 20.0


class ScriptedWorker:
    """Stands in for ``worker.client.Worker``: records Inputs, answers with ``answer(inputs)``."""

    pid = 4242
    exit_code = None  # the process runs

    def __init__(self, answer: Callable[[Input], OutputHeader], gate: threading.Event | None = None):
        self.answer, self.gate = answer, gate
        self.inputs: list[Input] = []
        self.entered = threading.Event()  # set once a call is inside predict
        self.chunks: list[bytes] = []
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.exit_code = None

    def predict(self, inputs: Input) -> OutputHeader:
        self.inputs.append(inputs)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT)
        return self.answer(inputs)

    def stream(self):
        yield from self.chunks

    def stop(self) -> None:
        pass

    def kill(self) -> None:
        pass


class InProcessWorker(ScriptedWorker):
    """The real handler behind the real codec: what ``worker/process.py`` does, without the socket."""

    def __init__(self, model_dir: Path, **options: object):
        super().__init__(self._call)
        self.handler = Handler()
        self.init = {"backend": "scripted", "model_dir": str(model_dir), **{k: str(v) for k, v in options.items()}}

    def start(self) -> None:
        super().start()
        assert self.handler.handle(init_input(self.init)) is None

    def _call(self, inputs: Input) -> OutputHeader:
        received = read_input(io.BytesIO(encode_input(inputs)))
        output = process.invoke(SimpleNamespace(handle=self.handler.handle), received, Output)
        wire = io.BytesIO(b"".join(iter_output_frames(output)))
        header = read_output_header(wire)
        self.chunks = list(read_stream_chunks(wire)) if header.is_stream else []
        return header


def header(items: list[tuple[str, bytes]], code: int = 200) -> OutputHeader:
    return OutputHeader(code, "OK", {"content-type": "application/json"}, PairList(pair_list=items))


def served(worker: ScriptedWorker, tmp_path: Path, **settings: object) -> ServedModel:
    model = ServedModel("m", str(tmp_path), ModelSettings(WorkerSettings(tmp_path, {}), **settings), worker=worker)
    return model


def request(loop: asyncio.AbstractEventLoop, **payload: object) -> PendingRequest:
    return PendingRequest(request_input([("Content-Type", "application/json")], json.dumps(payload).encode()), loop)


async def answer_of(pending: PendingRequest) -> tuple[int, bytes, End | None]:
    """Status, body, and the End event (None when the body ended with a final chunk)."""
    start = await asyncio.wait_for(pending.events.get(), TIMEOUT)
    assert isinstance(start, Start)
    return (start.code, *await rest_of(pending))


async def rest_of(pending: PendingRequest) -> tuple[bytes, End | None]:
    body = bytearray()
    while True:
        event = await asyncio.wait_for(pending.events.get(), TIMEOUT)
        if isinstance(event, End):
            return bytes(body), event
        body += event.data
        if event.final:
            return bytes(body), None


def run(scenario) -> None:
    asyncio.run(scenario())


# --- dynamic batching ------------------------------------------------------------------------------

def test_queued_requests_go_out_as_one_batch_and_each_gets_its_own_answer(tmp_path):
    worker = InProcessWorker(tmp_path, batch_size=3)
    model = served(worker, tmp_path, batch_size=3, max_batch_delay_ms=5000)

    async def scenario():
        loop = asyncio.get_running_loop()
        pending = [request(loop, inputs="x", parameters={"max_new_tokens": n}) for n in (1, 2, 3)]
        for p in pending:
            model.submit(p)  # queued before the dispatcher starts: the first take drains the others
        model.start()
        answers = [await answer_of(p) for p in pending]
        assert [json.loads(body)["generated_text"] for _, body, _ in answers] == [" ", " T", " Th"]
        assert all(code == 200 for code, _, _ in answers)

    try:
        run(scenario)
    finally:
        model.stop()
    [batch] = worker.inputs
    assert batch.properties["batch_size"] == "3"
    assert [batch.content.key_at(i) for i in range(3)] == [batch_prefix(i) + "data" for i in range(3)]


def test_a_lone_request_is_sent_unwrapped_once_the_delay_is_spent(tmp_path):
    worker = InProcessWorker(tmp_path, batch_size=4)
    model = served(worker, tmp_path, batch_size=4, max_batch_delay_ms=50)

    async def scenario():
        model.start()
        pending = request(asyncio.get_running_loop(), inputs="x", parameters={"max_new_tokens": 2})
        model.submit(pending)
        code, body, _ = await answer_of(pending)
        assert code == 200 and json.loads(body) == {"generated_text": " T"}

    try:
        run(scenario)
    finally:
        model.stop()
    [single] = worker.inputs
    assert "batch_size" not in single.properties and single.get_as_json()["inputs"] == "x"


def test_a_bad_request_inside_a_batch_gets_200_and_its_error_body_but_alone_its_400(tmp_path):
    """Java's PyPredictor.batchPredict has no per-item status: every request of a batch of two or more
    gets the batch Output's code; a batch of one is sent unwrapped and keeps the handler's code."""
    worker = InProcessWorker(tmp_path, batch_size=2)
    model = served(worker, tmp_path, batch_size=2, max_batch_delay_ms=5000)

    async def scenario():
        loop = asyncio.get_running_loop()
        good, bad = request(loop, inputs="x", parameters={"max_new_tokens": 2}), request(loop, inputs="")
        for p in (good, bad):
            model.submit(p)
        model.start()
        assert (await answer_of(good))[:2] == (200, b'{"generated_text":" T"}')
        code, body, _ = await answer_of(bad)
        assert code == 200 and json.loads(body)["code"] == 400 and "inputs" in json.loads(body)["error"]
        alone = request(loop, inputs="")
        model.submit(alone)
        code, body, _ = await answer_of(alone)
        assert code == 400 and json.loads(body)["code"] == 400

    try:
        run(scenario)
    finally:
        model.stop()
    assert [i.properties.get("batch_size") for i in worker.inputs] == ["2", None]


def test_a_batch_answer_with_the_wrong_item_count_fails_every_request_in_it(tmp_path):
    worker = ScriptedWorker(lambda inputs: header([(batch_prefix(0) + "data", b"{}")]))
    model = served(worker, tmp_path, batch_size=2, max_batch_delay_ms=5000)

    async def scenario():
        loop = asyncio.get_running_loop()
        pending = [request(loop, inputs="a"), request(loop, inputs="b")]
        for p in pending:
            model.submit(p)
        model.start()
        for p in pending:
            code, body, _ = await answer_of(p)
            assert code == 400 and json.loads(body)["type"] == "TranslateException"

    try:
        run(scenario)
    finally:
        model.stop()


# --- queue limits and cancellation ---------------------------------------------------------------

def test_a_full_queue_refuses_at_once_and_the_queued_requests_are_still_answered(tmp_path):
    gate = threading.Event()
    worker = ScriptedWorker(lambda inputs: header([("data", b'"ok"')]), gate)
    model = served(worker, tmp_path, job_queue_size=2, max_batch_delay_ms=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        first = request(loop, inputs="1")
        model.submit(first)
        assert await asyncio.to_thread(worker.entered.wait, TIMEOUT)  # taken off the queue, held in predict
        queued = [request(loop, inputs="2"), request(loop, inputs="3")]
        for p in queued:
            model.submit(p)
        with pytest.raises(QueueFull, match="job queue is full"):
            model.submit(request(loop, inputs="4"))
        gate.set()
        for p in [first, *queued]:
            assert await answer_of(p) == (200, b'"ok"', None)

    try:
        run(scenario)
    finally:
        gate.set()
        model.stop()
    assert [i.get_as_json()["inputs"] for i in worker.inputs] == ["1", "2", "3"]


def test_a_request_whose_client_left_while_queued_is_never_sent(tmp_path):
    gate = threading.Event()
    worker = ScriptedWorker(lambda inputs: header([("data", b'"ok"')]), gate)
    model = served(worker, tmp_path, max_batch_delay_ms=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        first, gone = request(loop, inputs="1"), request(loop, inputs="2")
        model.submit(first)
        assert await asyncio.to_thread(worker.entered.wait, TIMEOUT)
        model.submit(gone)
        gone.cancelled = True
        gate.set()
        assert (await answer_of(first))[0] == 200
        assert (await answer_of(gone))[:2] == (499, b"")

    try:
        run(scenario)
    finally:
        gate.set()
        model.stop()
    assert len(worker.inputs) == 1


# --- rolling batch ---------------------------------------------------------------------------------

def rolling_model(tmp_path: Path, **options: object) -> tuple[InProcessWorker, ServedModel]:
    worker = InProcessWorker(tmp_path, rolling_batch="scheduler", scripted_step_delay_ms=20, **options)
    return worker, served(worker, tmp_path, rolling=True, max_rolling_batch_size=4)


def tokens(body: bytes) -> list[str]:
    return [json.loads(line)["token"]["text"] for line in body.splitlines()]


def test_rolling_steps_deliver_tokens_in_order_and_a_new_request_joins_a_running_batch(tmp_path):
    worker, model = rolling_model(tmp_path)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        first = request(loop, inputs="a", stream=True, parameters={"max_new_tokens": 30})
        model.submit(first)
        start = await asyncio.wait_for(first.events.get(), TIMEOUT)
        assert isinstance(start, Start) and start.code == 200
        second = request(loop, inputs="b", stream=True, parameters={"max_new_tokens": 3})
        model.submit(second)
        body, _ = await rest_of(first)
        _, joined, _ = await answer_of(second)
        assert "".join(tokens(body)) == DEFAULT_TEXT[:30] and "".join(tokens(joined)) == DEFAULT_TEXT[:3]

    try:
        run(scenario)
    finally:
        model.stop()
    steps = [i for i in worker.inputs if not i.is_empty()]
    both = next(s for s in steps if s.properties["batch_size"] == "2")
    # The running request is carried with an empty body; the new one arrives with its headers, body and seed.
    assert both.content.get(batch_prefix(0) + "data") == b"" and batch_prefix(1) + "seed" in both.properties
    assert json.loads(both.content.get(batch_prefix(1) + "data"))["inputs"] == "b"


def test_a_client_that_leaves_mid_stream_is_cancelled_in_the_next_step(tmp_path):
    worker, model = rolling_model(tmp_path)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        pending = request(loop, inputs="a", stream=True, parameters={"max_new_tokens": 200})
        model.submit(pending)
        assert isinstance(await asyncio.wait_for(pending.events.get(), TIMEOUT), Start)
        assert isinstance(await asyncio.wait_for(pending.events.get(), TIMEOUT), Chunk)
        pending.cancelled = True
        await rest_of(pending)

    try:
        run(scenario)
    finally:
        model.stop()
    assert any(i.properties.get(batch_prefix(0) + "lmi_cancel") == "true" for i in worker.inputs)
    assert len(worker.inputs) < 100  # it stopped long before its 200 tokens


def test_a_failed_step_fails_every_active_request_and_the_next_step_resets(tmp_path):
    calls = []

    def answer(inputs: Input) -> OutputHeader:
        calls.append(inputs)
        if len(calls) == 1:
            return header([], code=500)
        return header([(batch_prefix(0) + "data", Output.binary_encode({"data": '"ok"', "last": True}))])

    worker = ScriptedWorker(answer)
    model = served(worker, tmp_path, rolling=True, max_rolling_batch_size=4)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        failed = request(loop, inputs="a")
        model.submit(failed)
        code, body, _ = await answer_of(failed)
        assert code == 500 and json.loads(body)["error"] == "Batch inference failed"
        later = request(loop, inputs="b")
        model.submit(later)
        assert await answer_of(later) == (200, b'"ok"', None)

    try:
        run(scenario)
    finally:
        model.stop()
    assert "reset_rollingbatch" not in calls[0].properties and calls[1].properties["reset_rollingbatch"] == "true"


def test_an_error_from_the_handler_reaches_the_client_capped(tmp_path):
    """A handler's error text (a model.py of one's own need not cap it) is cut to ``MAX_ERROR_CHARS`` on its way to
    the client, before the answer starts and in the middle of a stream."""
    huge = "x" * 1_000_000
    steps = []

    def answer(inputs: Input) -> OutputHeader:
        steps.append(inputs)
        item = {"data": "tok", "last": False} if len(steps) == 1 else {"data": "", "last": True, "code": 424,
                                                                       "error": huge}
        items = [(batch_prefix(i) + "data", Output.binary_encode(
            item if i == 0 else {"data": "", "last": True, "code": 400, "error": huge})) for i in range(
            len(inputs.get_batches()))]
        return header(items)

    model = served(ScriptedWorker(answer), tmp_path, rolling=True, max_rolling_batch_size=4)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        streamed, refused = request(loop, inputs="a"), request(loop, inputs="b")
        model.submit(streamed)
        model.submit(refused)
        code, body, _ = await answer_of(refused)
        assert code == 400 and len(json.loads(body)["error"]) == MAX_ERROR_CHARS
        code, body, end = await answer_of(streamed)
        assert code == 200 and body.startswith(b"tok") and len(end.error) == MAX_ERROR_CHARS

    try:
        run(scenario)
    finally:
        model.stop()


# --- worker failures -------------------------------------------------------------------------------

def test_a_worker_that_dies_fails_its_requests_and_is_restarted(tmp_path):
    def answer(inputs: Input) -> OutputHeader:
        if len(worker.inputs) == 1:
            raise WorkerDied("the worker process died (EOF)")
        return header([("data", b'"ok"')])

    worker = ScriptedWorker(answer)
    model = served(worker, tmp_path, max_batch_delay_ms=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        lost = request(loop, inputs="a")
        model.submit(lost)
        code, body, _ = await answer_of(lost)
        assert code == 503 and "the worker process died" in json.loads(body)["message"]
        after = request(loop, inputs="b")
        model.submit(after)
        assert await answer_of(after) == (200, b'"ok"', None)

    try:
        run(scenario)
    finally:
        model.stop()
    assert (worker.starts, model.restarts, model.status) == (2, 1, Status.READY)


def test_a_worker_that_exits_between_requests_is_restarted_before_the_next_one(tmp_path):
    def answer(inputs: Input) -> OutputHeader:
        if len(worker.inputs) == 1:
            worker.exit_code = 1  # it answers, then ends (as the vllm backend's worker does when vLLM's engine stopped)
        return header([("data", b'"ok"')])

    worker = ScriptedWorker(answer)
    model = served(worker, tmp_path, max_batch_delay_ms=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        model.start()
        for text in "ab":
            pending = request(loop, inputs=text)
            model.submit(pending)
            assert await answer_of(pending) == (200, b'"ok"', None)

    try:
        run(scenario)
    finally:
        model.stop()
    assert (worker.starts, model.restarts, model.status) == (2, 1, Status.READY)
