"""The front end's side of DJL's async mode (``AsyncChannel``, Java's ``AsyncRequestManager``) against our worker's
async engine in this process: the real handler (scripted backend) behind the real wire codec, an event loop on a
thread of its own, the socket replaced by a pipe of frames. Also where each entry point comes from (``PyModel``)."""

from __future__ import annotations

import asyncio
import io
import json
import queue
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmi_handlers.handler import Handler
from lmi_tools.serving.async_channel import AsyncChannel, answer_item
from lmi_tools.serving.worker.async_engine import invoke
from lmi_tools.serving.worker.client import WorkerDied
from lmi_tools.serving.worker.codec import (OutputHeader, encode_input, iter_output_frames, read_input,
                                            read_output_header)
from lmi_tools.serving.worker.frontend import entry_points, init_input, request_input

JSON = [("Content-Type", "application/json")]


class LoopWorker:
    """``Worker``'s ``send``/``receive`` over our async engine: every Input goes through the codec to ``invoke`` on
    an event loop thread, every answer back through the codec."""

    name = "loop"

    def __init__(self, **options):
        handler = Handler()
        self.module = SimpleNamespace(handle=handler.handle,
                                      register_adapter=lambda i: handler.manage_adapter(i, "register"))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        self.sent: list = []
        init = {"backend": "scripted", "async_mode": "true", "max_new_tokens": "4", **options}
        self._run(init_input(init))
        assert read_output_header(self._next()).code == 204

    def _run(self, inputs):
        decoded = read_input(io.BytesIO(encode_input(inputs)))
        asyncio.run_coroutine_threadsafe(invoke(self.module, decoded, self.answers), self.loop).result(30)

    def _next(self):
        answer = self.answers.get(timeout=30)
        if answer is None:
            raise EOFError
        return io.BytesIO(b"".join(iter_output_frames(answer)))

    def send(self, inputs):
        self.sent.append(inputs)
        asyncio.run_coroutine_threadsafe(invoke(self.module, read_input(io.BytesIO(encode_input(inputs))),
                                                self.answers), self.loop)

    def receive(self) -> OutputHeader:
        try:
            return read_output_header(self._next())
        except EOFError:
            raise WorkerDied("gone") from None

    def die(self):
        self.answers.put(None)


class Client:
    """A request's answers as the channel delivers them."""

    def __init__(self):
        self.items, self.done, self.cancelled = [], threading.Event(), False

    def take(self, item):
        self.items.append(item)
        if item.last:
            self.done.set()

    def fail(self, code, message):
        self.items.append(SimpleNamespace(code=code, error=message, data="", last=True))
        self.done.set()


def channel_over(worker):
    channel = AsyncChannel(worker, lambda key, item: key.take(item))
    channel.start()
    return channel


def body(payload):
    return request_input(JSON, json.dumps(payload).encode())


def test_requests_in_flight_are_answered_each_by_its_tracking_id():
    worker = LoopWorker(scripted_step_delay_ms="5")
    channel = channel_over(worker)
    clients = [Client() for _ in range(12)]
    for i, client in enumerate(clients):
        channel.send(body({"inputs": "x", "stream": bool(i % 2), "parameters": {"max_new_tokens": 1 + i % 4}}),
                     client)
    for i, client in enumerate(clients):
        assert client.done.wait(30)
        text = "".join(item.data for item in client.items)
        if i % 2:
            assert [json.loads(line)["token"]["text"] for line in text.splitlines()] == list(" The"[:1 + i % 4])
        else:
            assert json.loads(text) == {"generated_text": " The"[:1 + i % 4]}
    ids = {inputs.properties["request_tracking_id"] for inputs in worker.sent}
    assert len(ids) == 12 and all(inputs.properties["handler"] == "handle" for inputs in worker.sent)
    assert channel.active == {}


def test_a_client_that_went_away_is_cancelled_once_and_the_call_waits_for_its_answer():
    worker = LoopWorker(scripted_step_delay_ms="10")
    channel = channel_over(worker)
    client = Client()
    channel.send(body({"inputs": "x", "stream": True, "parameters": {"max_new_tokens": 1000}}), client)
    client.cancelled = True
    channel.cancel_gone(lambda key: key.cancelled)
    channel.cancel_gone(lambda key: key.cancelled)
    assert client.done.wait(30)
    assert client.items[-1].code == 499 and len(client.items) < 200
    assert [i.properties.get("lmi_cancel") for i in worker.sent].count(worker.sent[0].properties[
        "request_tracking_id"]) == 1
    code, answer = channel.call(SimpleNamespace(properties={"handler": "register_adapter", "name": "a1", "src": "/x"},
                                                content=body({}).content), 30)
    assert code == 400 and "does not serve adapters" in answer.decode()


def test_a_worker_that_dies_is_seen_and_its_requests_are_handed_back():
    worker = LoopWorker(scripted_step_delay_ms="50")
    channel = channel_over(worker)
    client = Client()
    channel.send(body({"inputs": "x", "parameters": {"max_new_tokens": 1000}}), client)
    worker.die()
    assert channel.dead.wait(10)
    assert channel.fail_all() == [client] and channel.active == {}


@pytest.mark.parametrize("code, content, expected", [
    (200, {"data": "x", "last": "true"}, ("x", True, None, None)),
    (200, {"data": "", "last": "true", "code": "400", "error": "bad"}, ("", True, 400, "bad")),
    (200, {"data": "", "last": "false"}, ("", False, None, None)),
    (424, None, ("", True, 424, "Async Inference Failure nope")),
    (200, {"other": "1"}, ("", True, 500, "the handler's answer is not DJL's {data, last} map")),
])
def test_what_each_answer_means_for_its_request(code, content, expected):
    from lmi_handlers.protocol import Output, PairList

    pairs = PairList()
    if content is not None:
        pairs.add(None, Output.binary_encode(content))
    item = answer_item(OutputHeader(code, "nope", {"request_tracking_id": "t"}, pairs))
    assert (item.data, item.last, item.code, item.error) == expected


def test_entry_points_resolve_as_djlservings_pymodel(tmp_path: Path):
    assert entry_points(tmp_path, {"entryPoint": "my.module"}, "vllm", True, {}) == ("my.module", "")
    assert entry_points(tmp_path, {}, "", False, {"DJL_ENTRY_POINT": "x.py"}) == ("x.py", "")
    assert entry_points(tmp_path, {}, "", False, {}) == ("", "")
    (tmp_path / "model.py").write_text("")
    assert entry_points(tmp_path, {"model_id": "m"}, "", False, {}) == ("model.py", "djl_python.huggingface")
    assert entry_points(tmp_path, {}, "vllm", True, {})[1] == "djl_python.lmi_vllm.vllm_async_service"
    assert entry_points(tmp_path, {}, "vllm", False, {})[1] == "djl_python.huggingface"
    assert entry_points(tmp_path, {}, "trtllm", True, {})[1] == "djl_python.lmi_trtllm.trtllm_async_service"
    (tmp_path / "model.joblib").write_text("")
    assert entry_points(tmp_path, {}, "vllm", True, {}) == ("model.py", "djl_python.sklearn_handler")
