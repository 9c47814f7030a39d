"""The tap on an aiohttp client websocket (a real aiohttp server on loopback): the text
messages it keeps are taken as they are parsed, with their arrival times and without the
receive loop; the first other message hands over to the receive loop, which then gets every
message from that one on, and the close as usual."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent.testing.peer.transports.websocket_tap import WebsocketTap, _frame_at, _whole_frames
from tests.support.agents import wait_until

MEDIA = [json.dumps({"event": "media", "media": {"payload": f"p{i}"}}) for i in range(6)]
MARK = json.dumps({"event": "mark", "mark": {"name": "m"}})

Script = Callable[[web.WebSocketResponse, web.Request], Awaitable[None]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[str]]]:
    """A websocket server on 127.0.0.1 that waits for the client's "go", then runs a
    script (never, for a client that feeds the tap bytes itself); returns its URL."""
    servers: list[TestServer] = []

    async def start(script: Script) -> str:
        async def handler(request: web.Request) -> web.WebSocketResponse:
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            message = await socket.receive()
            if message.type is aiohttp.WSMsgType.TEXT and message.data == "go":
                await script(socket, request)
            async for _ in socket:
                pass
            return socket

        app = web.Application()
        app.router.add_get("/", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("/"))

    yield start
    for server in servers:
        await server.close()


KEEP = ('{"event": "media"',)


async def test_kept_messages_are_taken_then_the_receive_loop_gets_the_rest(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(socket: web.WebSocketResponse, _: web.Request) -> None:
        for text in [*MEDIA[:4], MARK, *MEDIA[4:]]:
            await socket.send_str(text)
        await socket.close()

    url = await serve(script)
    taken: list[tuple[float, str]] = []
    received: list[str] = []
    loop_done = asyncio.Event()
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:

        async def receive() -> None:
            async for message in socket:
                received.append(message.data)
            loop_done.set()

        tasks: list[asyncio.Task[None]] = []
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: taken.append((at, data)),
                                   lambda: tasks.append(asyncio.ensure_future(receive())))
        assert tap is not None and tap.active
        before = time.monotonic()
        await socket.send_str("go")
        await asyncio.wait_for(loop_done.wait(), 5)
        assert [data for _, data in taken] == MEDIA[:4] and tap.taken == 4
        assert all(before <= at <= time.monotonic() for at, _ in taken)
        assert received == [MARK, *MEDIA[4:]]  # from the first other message on, in order
        assert not tap.active and len(tasks) == 1
        assert socket.closed  # the close handshake went as without a tap


async def test_delivered_bytes_keep_the_arrival_given(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(socket: web.WebSocketResponse, _: web.Request) -> None:
        await socket.send_str(MEDIA[0])

    url = await serve(script)
    taken: list[tuple[float, str]] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: taken.append((at, data)),
                                   lambda: None)
        assert tap is not None and tap.transport is not None
        # An unmasked text frame as a server sends it, read elsewhere (the receive poll).
        payload = MEDIA[1].encode()
        assert tap.deliver(bytes([0x81, len(payload)]) + payload, 123.25)
        await socket.send_str("go")
        await wait_until(lambda: len(taken) == 2, timeout=5)
        assert taken[0] == (123.25, MEDIA[1]) and taken[1][1] == MEDIA[0]
        tap.detach()
        assert not tap.active


async def test_the_end_of_the_connection_hands_over(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(socket: web.WebSocketResponse, request: web.Request) -> None:
        await socket.send_str(MEDIA[0])
        assert request.transport is not None
        request.transport.abort()  # no close frame: the TCP connection just ends

    url = await serve(script)
    handed_over = asyncio.Event()
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: None, handed_over.set)
        assert tap is not None
        await socket.send_str("go")
        await asyncio.wait_for(handed_over.wait(), 5)
        message = await socket.receive()
        assert message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
        assert tap.taken == 1


def test_a_socket_without_aiohttps_internals_is_not_tapped() -> None:
    socket = cast(aiohttp.ClientWebSocketResponse, SimpleNamespace(_reader=SimpleNamespace()))
    assert WebsocketTap.install(socket, KEEP, lambda at, data: None, lambda: None) is None


async def no_script(socket: web.WebSocketResponse, request: web.Request) -> None:
    """The client feeds the tap the server's bytes itself."""


def frame(text: str) -> bytes:
    """A server's (unmasked) final text frame."""
    payload = text.encode()
    if len(payload) < 126:
        return bytes([0x81, len(payload)]) + payload
    return bytes([0x81, 126]) + len(payload).to_bytes(2, "big") + payload


async def test_read_frames_are_taken_whole_in_order_with_the_arrival_of_their_last_byte(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    url = await serve(no_script)
    long_media = json.dumps({"event": "media", "media": {"payload": "x" * 300}})
    taken: list[tuple[float, str]] = []
    received: list[str] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:

        async def receive() -> None:
            async for message in socket:
                received.append(message.data)
                if len(received) == 2:
                    return

        tasks: list[asyncio.Task[None]] = []
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: taken.append((at, data)),
                                   lambda: tasks.append(asyncio.ensure_future(receive())))
        assert tap is not None
        a, b, c, d = (frame(text) for text in (MEDIA[0], long_media, MEDIA[1], MEDIA[2]))
        # The parser may hold part of a frame from before the tap: until a read it was given
        # is seen to end on a frame's end, every read goes through it.
        assert tap.deliver(a[:5], 1.0) and tap.deliver(a[5:] + b[:3], 2.0)
        assert [text for _, text in taken] == [MEDIA[0]]
        assert tap.deliver(b[3:], 3.0) and tap.deliver(c, 4.0)
        # Aligned now: frames are read from the bytes, one split over two reads held whole.
        assert tap.deliver(d + a + b[:200], 5.0) and tap.deliver(b[200:] + c, 6.0)
        assert taken == [(2.0, MEDIA[0]), (3.0, long_media), (4.0, MEDIA[1]), (5.0, MEDIA[2]),
                         (5.0, MEDIA[0]), (6.0, long_media), (6.0, MEDIA[1])]
        # A frame it does not keep, and what follows, go to the receive loop in order.
        assert not tap.deliver(a + frame(MARK) + d, 7.0)
        assert taken[-1] == (7.0, MEDIA[0]) and tap.taken == 8
        await asyncio.wait_for(tasks[0], 5)
        assert received == [MARK, MEDIA[2]]


async def test_a_read_holding_several_kept_messages_is_reported_as_a_burst(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    url = await serve(no_script)
    bursts: list[int] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: None, lambda: None)
        assert tap is not None
        tap.on_burst = lambda: bursts.append(tap.taken)
        a, b, c = (frame(text) for text in MEDIA[:3])
        assert tap.deliver(a, 1.0) and tap.deliver(b, 2.0)  # one a read: no burst
        assert bursts == []
        assert tap.deliver(c + a[:4], 3.0)  # one whole, the next held: no burst
        assert tap.deliver(a[4:] + b + c, 4.0)  # three in one read: they share its time
        assert bursts == [6]
        tap.detach()


async def test_a_frame_the_tap_leaves_goes_to_aiohttps_parser_from_its_start(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    url = await serve(no_script)
    taken: list[str] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:
        handed: list[bool] = []
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: taken.append(data),
                                   lambda: handed.append(True))
        assert tap is not None
        assert tap.deliver(frame(MEDIA[0]), 1.0)  # aligned from here
        ping = bytes([0x89, 0])  # a control frame: aiohttp's to answer
        assert not tap.deliver(frame(MEDIA[1]) + ping, 2.0)
        assert taken == [MEDIA[0], MEDIA[1]] and handed == [True]
        assert not tap.deliver(frame(MARK), 3.0)  # handed over: straight to the parser
        # The receive loop answers the ping itself and gets the next message.
        message = await asyncio.wait_for(socket.receive(), 5)
        assert message.data == MARK and taken == [MEDIA[0], MEDIA[1]]


async def test_detaching_hands_a_held_frame_start_to_the_parser(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    url = await serve(no_script)
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as socket:
        tap = WebsocketTap.install(socket, KEEP, lambda at, data: None, lambda: None)
        assert tap is not None
        assert tap.deliver(frame(MEDIA[0]), 1.0)
        whole = frame(MARK)
        assert tap.deliver(whole[:4], 2.0)  # held: a frame's start
        tap.detach()
        # The parser got the held start; the rest completes the message as usual.
        tap.deliver(whole[4:], 3.0)
        message = await asyncio.wait_for(socket.receive(), 5)
        assert message.data == MARK


def test_frames_are_counted_whole_whatever_their_kind() -> None:
    masked = bytes([0x81, 0x80 | 3]) + b"\x01\x02\x03\x04" + b"abc"
    huge = bytes([0x82, 127]) + (70000).to_bytes(8, "big") + bytes(70000)
    both = frame(MEDIA[0]) + masked + huge
    assert _whole_frames(both) == (3, len(both))
    assert _whole_frames(both[:-1]) == (2, len(both) - len(huge))
    assert _whole_frames(b"\x81") == (0, 0)
    # Only final unmasked text frames of up to 64 KiB are read by the tap itself.
    assert _frame_at(frame(MEDIA[0]), 0) == (2, len(frame(MEDIA[0])))
    assert _frame_at(masked, 0) == (-1, 0) and _frame_at(huge, 0) == (-1, 0)
    assert _frame_at(frame("x" * 300)[:3], 0) is None  # the 16-bit length not here yet
