"""The peer's shared HTTP client per event loop: the calls holding it share one session and
its kept-alive connections (a real aiohttp server on loopback counts them), the last to let
go closes it, and other settings get a session of their own."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from agent.testing.peer.transports.http_client import HttpClients, http_clients


async def test_the_holders_share_one_session_and_its_connections(aiohttp_server: Any) -> None:
    peers: set[tuple[str, int]] = set()

    async def handle(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername")[:2])
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/legs", handle)
    app.router.add_delete("/legs/1", handle)
    server = await aiohttp_server(app)
    clients = HttpClients()
    first = clients.hold(True, 5.0)
    second = clients.hold(True, 5.0)
    assert first is second and len(clients) == 1
    for session in (first, second, first):
        async with session.post(server.make_url("/legs")) as response:
            assert (await response.json())["ok"]
        async with session.delete(server.make_url("/legs/1")) as response:
            await response.read()
    assert len(peers) == 1  # six requests, one kept-alive connection
    await clients.release(True, 5.0)
    assert not first.closed  # still held
    await clients.release(True, 5.0)
    assert first.closed and len(clients) == 0
    await clients.release(True, 5.0)  # once too often: nothing to do
    # Held again: a fresh session.
    again = clients.hold(True, 5.0)
    assert again is not first and not again.closed
    await clients.release(True, 5.0)


async def test_other_settings_get_a_session_of_their_own() -> None:
    clients = HttpClients()
    checked, unchecked, slow = (clients.hold(True, 5.0), clients.hold(False, 5.0),
                                clients.hold(True, 30.0))
    try:
        assert len({id(checked), id(unchecked), id(slow)}) == 3
        assert slow.timeout.total == 30.0
    finally:
        for verify, timeout in ((True, 5.0), (False, 5.0), (True, 30.0)):
            await clients.release(verify, timeout)
    assert checked.closed and unchecked.closed and slow.closed


def test_each_loop_has_its_own() -> None:
    async def both() -> tuple[HttpClients, HttpClients]:
        return http_clients(), http_clients()

    first, again = asyncio.run(both())
    other, _ = asyncio.run(both())
    assert first is again and other is not first
