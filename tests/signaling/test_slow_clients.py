"""Slow clients: connections that trickle a request head or body are closed, in bounded time."""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from signaling import slow_clients
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, RunningAgent
from tests.support.server_process import free_tcp_port, read_until


async def _dribble_until_closed(host: str, port: int, head: bytes, trickle: bytes,
                                limit: float = 20.0) -> tuple[bytes, float]:
    """Send `head`, then one byte of `trickle` every 0.2 s until the server answers or
    closes; (what it answered, seconds until the connection ended)."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(head)
    answer = b""

    async def dribble() -> None:
        for byte in trickle:
            await asyncio.sleep(0.2)
            writer.write(bytes([byte]))
            await writer.drain()

    sender = asyncio.ensure_future(dribble())
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), limit):
            answer += chunk
    except (ConnectionError, asyncio.TimeoutError):
        pass
    finally:
        sender.cancel()
        writer.close()
    return answer, time.monotonic() - started


def _host_port(running: RunningAgent) -> tuple[str, int]:
    return "127.0.0.1", running.server.port  # type: ignore[return-value]


async def test_a_trickled_body_gets_408_and_the_connection_closes(
    start_agent: AgentFactory,
) -> None:
    running = await start_agent(body_timeout=1.0)
    body = b'{"codec": "PCMU"}' + b" " * 200
    head = (b"POST /v1/telephony/rtp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    answer, took = await _dribble_until_closed(*_host_port(running), head, body)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"body_timeout"' in answer
    assert 1.0 <= took < 10.0  # closed, not held for the 40 s the trickle would take
    assert not running.agent.telephony_legs
    # A body that arrives in time is unaffected.
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + "/v1/telephony/rtp", json={}) as response:
            assert response.status == 201
            leg = (await response.json())["call_id"]
        async with http.delete(f"{running.url}/v1/telephony/rtp/{leg}") as response:
            assert response.status == 200


async def test_a_trickled_multipart_offer_gets_408(start_agent: AgentFactory) -> None:
    running = await start_agent(body_timeout=1.0)
    body = (b"--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\nv=0\r\n" + b"a" * 200)
    head = (b"POST /v1/realtime/calls HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(body) + 8))
    answer, took = await _dribble_until_closed(*_host_port(running), head, body)
    assert answer.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in answer
    assert took < 10.0


@pytest.mark.slow
async def test_unauthenticated_slow_body_is_refused_without_waiting(
    start_agent: AgentFactory,
) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("sk-slow",)), body_timeout=30.0)
    head = (b"POST /v1/telephony/rtp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    answer, took = await _dribble_until_closed(*_host_port(running), head, b"{" * 100,
                                               limit=15.0)
    assert answer.startswith(b"HTTP/1.1 401")
    assert took < 15.0  # aiohttp discards the unread body for a bounded lingering time


async def test_header_deadline_closes_only_connections_without_a_request_head() -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        slow_clients.guard_protocol_factory(runner.server, 1.0), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    before = slow_clients.STATS.header_timeouts
    try:
        answer, took = await _dribble_until_closed(
            "127.0.0.1", port, b"GET / HTTP/1.1\r\nHost: x\r\n", b"X-Slow: " + b"a" * 200)
        assert answer == b"" and 1.0 <= took < 10.0
        assert slow_clients.STATS.header_timeouts == before + 1
        # A kept-alive connection that made its request outlives the header deadline.
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(f"http://127.0.0.1:{port}/") as response:
                    assert await response.text() == "hi"
                await asyncio.sleep(1.5)
        assert slow_clients.STATS.header_timeouts == before + 1
    finally:
        server.close()
        await runner.cleanup()


async def test_server_process_closes_a_slow_header_client() -> None:
    port = free_tcp_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--port", str(port), "--header-timeout", "1",
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )
    lines: list[str] = []
    assert process.stderr is not None
    try:
        await asyncio.wait_for(read_until(process.stderr, "serving plugin echo", lines), 60)
        answer, took = await _dribble_until_closed(
            "127.0.0.1", port, b"GET /health HTTP/1.1\r\n", b"Host: " + b"h" * 200)
        assert answer == b"" and 1.0 <= took < 10.0
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/health") as response:
                assert response.status == 200
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
