"""Our worker's async mode: the stand-in for DJL's ``PythonAsyncEngine`` (``--async-mode``).

As DJL's engine does: a thread reads each ``Input`` from the socket and starts ``await module.<handler>(inputs)`` on
the event loop at once, so many requests are in flight; each answer (an ``Output``, or every ``Output`` of an async
generator) gets the request's ``request_tracking_id`` property and goes to a second thread, which writes it to the
socket, so answers of different requests interleave. Results map as DJL's: ``None`` -> 204 "No content", an
out-of-memory error -> 507, another exception -> 424 (message ``service.invoke_handler_async() failure``), a result
that is neither an ``Output`` nor an async generator -> 424 naming its type. One difference: an async generator that
raises mid-stream ends its request with a 424 chunk saying why, where DJL's engine logs it and leaves the request
unanswered. The worker ends when the front end closes the connection.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import queue
import socket
import threading
import types
from typing import Any, BinaryIO

from lmi_handlers.djl import async_output
from lmi_handlers.errors import is_out_of_memory
from lmi_handlers.protocol import Output

from .codec import iter_output_frames, read_input

TRACKING_ID = "request_tracking_id"
logger = logging.getLogger(__name__)


def serve_async(module: types.ModuleType, connection: socket.socket, reader: BinaryIO,
                args: argparse.Namespace) -> None:
    answers: queue.SimpleQueue[Output | None] = queue.SimpleQueue()
    sender = threading.Thread(target=_send, args=(connection, answers), name="lmi-send", daemon=True)
    sender.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        threading.Thread(target=_receive, args=(reader, loop, closed, module, answers, args), name="lmi-receive",
                         daemon=True).start()
        await closed

    asyncio.run(main())
    answers.put(None)
    sender.join(timeout=5)


def _receive(reader: BinaryIO, loop: asyncio.AbstractEventLoop, closed: asyncio.Future, module: types.ModuleType,
             answers: queue.SimpleQueue, args: argparse.Namespace) -> None:
    while True:
        try:
            inputs = read_input(reader)
        except (EOFError, OSError):
            loop.call_soon_threadsafe(closed.set_result, None)  # the front end closed the connection: shut down
            return
        inputs.properties["device_id"] = str(args.device_id)
        inputs.properties["model_dir"] = args.model_dir
        asyncio.run_coroutine_threadsafe(invoke(module, inputs, answers), loop)


def _send(connection: socket.socket, answers: queue.SimpleQueue) -> None:
    """Writes the answers in order; those already waiting go out in one write (a step answers many requests).
    ``None`` ends it."""
    last = False
    while not last:
        waiting = [answers.get()]
        while not answers.empty():
            waiting.append(answers.get_nowait())
        last = None in waiting
        frames = [frame for output in waiting[:waiting.index(None) if last else None]
                  for frame in iter_output_frames(output)]
        try:
            connection.sendall(b"".join(frames))
        except OSError:
            return


async def invoke(module: types.ModuleType, inputs: Any, answers: queue.SimpleQueue) -> None:
    """Await the handler for one Input and queue its answer(s), each tagged with the Input's tracking id."""
    tracking_id = inputs.get_property(TRACKING_ID)
    name = inputs.get_function_name() or "handle"
    try:
        result = await getattr(module, name)(inputs)
    except Exception as exc:  # noqa: BLE001 - mapped to status codes like DJL's async engine
        logger.exception("handler %s raised", name)
        result = Output(code=507, message=str(exc)) if is_out_of_memory(exc) else \
            Output().error(str(exc), message="service.invoke_handler_async() failure")
    if result is None:
        result = Output(code=204, message="No content")
    elif isinstance(result, types.AsyncGeneratorType):
        await _stream(result, tracking_id, answers)
        return
    elif not hasattr(result, "content") or not hasattr(result, "code"):
        result = Output().error(f"Invalid type returned from {name}: {type(result).__name__}, does not match "
                                "djl_python.outputs.Output or an async generator")
    answers.put(result.add_property(TRACKING_ID, tracking_id))


async def _stream(outputs: Any, tracking_id: Any, answers: queue.SimpleQueue) -> None:
    try:
        async for output in outputs:
            answers.put(output.add_property(TRACKING_ID, tracking_id))
    except Exception as exc:  # noqa: BLE001 - the stream's own failure ends it with its own error
        logger.exception("an async answer failed mid-stream")
        answers.put(async_output("", True, "application/json", str(exc), 424).add_property(TRACKING_ID, tracking_id))
