"""The socket ``lmi serve`` listens on (``app.listen``), served as uvicorn serves it (``loop.create_server``)."""

import asyncio
import socket

from lmi_tools.serving.app import listen


def test_connections_send_small_writes_at_once():
    """Nagle's algorithm is off on every accepted connection: with it on, a stream's first token waited for the
    client's delayed ACK of the answer's head on a kept-alive connection."""

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        made: asyncio.Future = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                made.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = listen("127.0.0.1", 0)
        server = await loop.create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            try:
                return await asyncio.wait_for(made, 10)
            finally:
                writer.close()

    assert asyncio.run(accepted_nodelay()) == 1
