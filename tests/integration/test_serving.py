"""The listening socket the CLI and the tests serve on."""

from __future__ import annotations

import asyncio
import socket

from router.cli.serving import bind


async def test_accepted_connections_have_nagle_turned_off():
    # with Nagle on, a stream's first event waited ~40 ms for the client's delayed ACK
    sock = bind("127.0.0.1", 0)
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(lambda r, w: accepted.set_result(w), sock=sock)
    _, client = await asyncio.open_connection(*sock.getsockname())
    try:
        peer = await asyncio.wait_for(accepted, 5)
        assert peer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        peer.close()
    finally:
        client.close()
        server.close()
        await server.wait_closed()
