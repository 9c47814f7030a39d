"""Connections read on the peer's 5 ms poll (real TCP on loopback): each read keeps the
kernel's arrival time, not the poll's; the transport reads nothing meanwhile; a connection
whose reader says stop, or whose other end closes, goes back to its transport, which then
reads on (and sees the end itself)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.testing.peer.transports import receive_poll as receive_poll_module
from agent.testing.peer.transports.receive_poll import ReceivePoll, receive_poll
from agent.testing.peer.transports.send_tick import send_tick
from tests.support.agents import wait_until
from tests.support.tls import self_signed


def keeping(reads: list[tuple[bytes, float]], go_on: bool = True) -> Callable[[bytes, float], bool]:
    """A reader that keeps what it is given; `go_on`: what it says after each read."""

    def deliver(data: bytes, arrived: float) -> bool:
        reads.append((data, arrived))
        return go_on

    return deliver


class Recorder(asyncio.Protocol):
    """What the transport itself reads."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.data: list[bytes] = []
        self.ended = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.ended.set()
        return False


@dataclass
class Link:
    transport: asyncio.Transport
    recorder: Recorder
    remote: asyncio.StreamWriter  # the other end


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, recorder = await asyncio.get_running_loop().create_connection(
        Recorder, "127.0.0.1", port)
    remote = await asyncio.wait_for(accepted.get(), 5)
    try:
        yield Link(transport, recorder, remote)
    finally:
        transport.close()
        remote.close()
        server.close()
        await server.wait_closed()


async def test_a_read_keeps_the_kernels_arrival_time(link: Link) -> None:
    poll = ReceivePoll()
    reads: list[tuple[bytes, float]] = []
    try:
        assert poll.take(link.transport, keeping(reads))
        # The kernel turns its receive timestamps on a moment after the first socket asks
        # (deferred work): a first read settles that before the one measured.
        link.remote.write(b"warm")
        await link.remote.drain()
        await wait_until(lambda: len(reads) == 1, timeout=5)
        reads.clear()
        before = time.monotonic()
        link.remote.write(b"media")
        await link.remote.drain()
        after = time.monotonic()
        await asyncio.sleep(0.1)  # it waits in the socket; the transport does not read it
        assert link.recorder.data == []
        polled_at = time.monotonic()
        poll.poll()
        assert [data for data, _ in reads] == [b"media"]
        arrived = reads[0][1]
        assert before - 0.002 <= arrived <= after + 0.002 and arrived < polled_at - 0.05, (
            before, arrived, after, polled_at)
    finally:
        poll.close()


async def test_the_poll_reads_on_its_own_tick(link: Link) -> None:
    poll = ReceivePoll()
    reads: list[tuple[bytes, float]] = []
    try:
        assert poll.take(link.transport, keeping(reads))
        def joined() -> bytes:
            return b"".join(data for data, _ in reads)

        link.remote.write(b"one")
        await link.remote.drain()
        await wait_until(lambda: joined() == b"one", timeout=5)
        link.remote.write(b"two")
        await link.remote.drain()
        await wait_until(lambda: joined() == b"onetwo", timeout=5)
        assert link.recorder.data == []
    finally:
        poll.close()
    assert len(poll) == 0


async def test_a_burst_has_the_connections_read_every_5_ms_for_a_while(
        link: Link, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receive_poll_module, "HURRY_SECONDS", 0.2)
    clock = send_tick()
    poll = ReceivePoll()
    reads: list[tuple[bytes, float]] = []
    try:
        assert poll.take(link.transport, keeping(reads))
        assert clock.polls() == 0 and clock.senders() == 1  # read on the send tick
        poll.hurry()
        assert clock.polls() == 1 and poll.hurried == 1  # and on every 5 ms step
        link.remote.write(b"burst")
        await link.remote.drain()
        await wait_until(lambda: bool(reads), timeout=5)
        await wait_until(lambda: clock.polls() == 0, timeout=5)  # back after HURRY_SECONDS
        assert clock.senders() == 1
    finally:
        poll.close()
    assert len(clock) == 0


async def test_a_reader_that_says_stop_hands_the_connection_back(link: Link) -> None:
    poll = ReceivePoll()
    reads: list[tuple[bytes, float]] = []
    try:
        polled = poll.take(link.transport, keeping(reads, go_on=False))
        assert polled is not None
        link.remote.write(b"handover")
        await link.remote.drain()
        await wait_until(lambda: bool(reads), timeout=5)
        assert len(poll) == 0  # released: the transport reads again
        link.remote.write(b"after")
        await link.remote.drain()
        await wait_until(lambda: b"".join(link.recorder.data) == b"after", timeout=5)
        assert [data for data, _ in reads] == [b"handover"]
        polled.release()  # once only
    finally:
        poll.close()


async def test_the_end_of_the_stream_goes_back_to_the_transport(link: Link) -> None:
    poll = ReceivePoll()
    try:
        assert poll.take(link.transport, lambda data, at: True)
        link.remote.close()
        await asyncio.wait_for(link.recorder.ended.wait(), 5)
        assert len(poll) == 0
    finally:
        poll.close()


async def test_a_closing_transport_is_not_taken(link: Link) -> None:
    poll = ReceivePoll()
    link.transport.close()
    assert poll.take(link.transport, lambda data, at: True) is None
    assert len(poll) == 0


async def test_a_tls_connection_is_left_to_its_transport(tmp_path: Path) -> None:
    # Its socket carries TLS records, not the bytes the protocol reads.
    cert, key = self_signed(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=str(cert))
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=server_side)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await asyncio.get_running_loop().create_connection(
        Recorder, "127.0.0.1", port, ssl=client_side)
    try:
        assert ReceivePoll().take(transport, lambda data, at: True) is None
    finally:
        transport.close()
        server.close()
        await server.wait_closed()


async def test_each_loop_has_one_poll() -> None:
    assert receive_poll() is receive_poll()
