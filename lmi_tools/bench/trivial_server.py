"""A trivial LMI endpoint for ``lmi bench --self-test``: canned answers, as cheap per request as possible.

Plain asyncio over one socket (HTTP/1.1, keep-alive, Content-Length request bodies), so the server is never
what limits the measurement. It answers:

* ``POST /predictions/<model>`` and ``/invocations``: JSON lines of ``--tokens`` tokens when the body asks to
  stream, else one JSON answer; both with ``details`` (``generated_tokens``, ``prompt_tokens``);
* ``POST /endpoints/<name>/invocations-response-stream``: the same lines, one event-stream PayloadPart each;
  ``/endpoints/<name>/invocations``: the JSON answer;
* ``GET /ping``: 200.

Run: ``python -m lmi_tools.bench.trivial_server --port 0 [--tokens 4]``; it prints ``port=<n>`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from lmi_tools.serving.eventstream import payload_part

MAX_HEAD = 64 * 1024


def answers(tokens: int) -> dict[str, bytes]:
    lines = [{"token": {"id": 10 + i, "text": " tok", "log_prob": -0.5}} for i in range(tokens)]
    details = {"finish_reason": "length", "generated_tokens": tokens, "prompt_tokens": 8}
    lines[-1].update(generated_text=" tok" * tokens, details=details)
    encoded = [json.dumps(line).encode() + b"\n" for line in lines]
    whole = json.dumps({"generated_text": " tok" * tokens, "details": details}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(line), line) for line in encoded) + b"0\r\n\r\n"
    frames = b"".join(payload_part(line) for line in encoded)
    return {
        "stream": b"HTTP/1.1 200 OK\r\nContent-Type: application/jsonlines\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + chunked,
        "json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(whole), whole),
        "eventstream": b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.amazon.eventstream\r\n"
                       b"X-Amzn-SageMaker-Content-Type: application/jsonlines\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(frames), frames),
        "ping": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        "missing": b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        "bad": b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
    }


class TrivialProtocol(asyncio.Protocol):
    def __init__(self, replies: dict[str, bytes]):
        self.replies, self.buffer = replies, bytearray()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._close_bad()
                return
            head = bytes(self.buffer[:head_end]).decode("latin-1")
            length = _content_length(head)
            if length is None:
                self._close_bad()
                return
            if len(self.buffer) < head_end + 4 + length:
                return
            body = bytes(self.buffer[head_end + 4:head_end + 4 + length])
            del self.buffer[:head_end + 4 + length]
            self.transport.write(self.replies[_route(head.split(" ", 2), body)])

    def _close_bad(self) -> None:
        self.transport.write(self.replies["bad"])
        self.transport.close()


def _content_length(head: str) -> int | None:
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            return int(value.strip()) if value.strip().isdigit() else None
        if name == "transfer-encoding":
            return None  # chunked request bodies: not needed by the bench's clients
    return 0


def _route(request_line: list[str], body: bytes) -> str:
    method, path = (request_line + ["", ""])[:2]
    path = path.split("?", 1)[0]
    if method == "GET" and path == "/ping":
        return "ping"
    if method != "POST":
        return "missing"
    if path.startswith("/endpoints/"):
        return "eventstream" if path.endswith("/invocations-response-stream") else "json"
    if path.startswith("/predictions/") or path == "/invocations":
        return "stream" if b'"stream": true' in body or b'"stream":true' in body else "json"
    return "missing"


async def serve(port: int, tokens: int) -> None:
    loop = asyncio.get_running_loop()
    replies = answers(tokens)
    server = await loop.create_server(lambda: TrivialProtocol(replies), "127.0.0.1", port)
    print(f"port={server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=4)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.tokens))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
