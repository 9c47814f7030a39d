"""SIP over UDP and TCP on one address, and TLS beside them (tls.py) (RFC 3261 §18): bytes
in, bytes out, nothing more.

The UDP socket hands each datagram to the user agent as one message. TCP connections cut
their byte stream into messages by Content-Length (`message.frame_stream`), answer RFC 5626
keep-alives (CRLF CRLF → CRLF), and close on a framing error (after the 400/413 the user
agent writes), after `TCP_IDLE_SECONDS` without a byte, at once when the peer's address
is not allowed to talk SIP or already holds `tcp_per_address` connections
(`--sip-tcp-per-address`), and when a connection accepted here has not delivered a whole
message (or keep-alive) within `header_timeout` (`--sip-header-timeout`) of its accept or
of the first byte of a message: a slow or silent peer cannot hold sockets open for long.
Every message comes with its `Flow`: where it came from and how to answer on the same path.
Outbound requests over TCP reuse a connection to the same peer or open one (bounded in time).

Why our own: no SIP library on PyPI is fit (docs/sip.md).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.logs.log_safe import LogThrottle, held_back_note
from signaling.sip.message import MAX_MESSAGE_BYTES, Frame, ParseFailure, frame_stream

log = logging.getLogger(__name__)

Address = tuple[str, int]
TCP_IDLE_SECONDS = 300.0
TCP_CONNECT_SECONDS = 5.0
MAX_TCP_CONNECTIONS = 1024
TCP_PER_ADDRESS = 64  # connections from one IP address at once
HEADER_TIMEOUT = 10.0  # seconds for an accepted connection's message to arrive whole
MAX_DATAGRAM = 65535


@dataclass
class Flow:
    """The path a message came by, and the way back along it."""

    transport: str  # "UDP", "TCP" or "TLS"
    remote: Address
    local: Address
    send: Callable[[bytes], None]  # raises ConnectionError when a TCP flow is gone

    @property
    def reliable(self) -> bool:
        return self.transport != "UDP"


MessageHandler = Callable[[bytes, Flow], None]
FailureHandler = Callable[[ParseFailure, Flow], None]
AddressCheck = Callable[[str], bool]


def _address(sockaddr: Any) -> Address:
    host = str(sockaddr[0]).split("%", 1)[0]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return host, int(sockaddr[1])


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, owner: SipTransports) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.owner.on_datagram(data, _address(addr))

    def error_received(self, exc: Exception) -> None:
        log.debug("sip udp: %r", exc)


class TcpConnection(asyncio.Protocol):
    """One stream connection: plain TCP, or TLS (`kind`), the same framing either way."""

    def __init__(self, owner: SipTransports, kind: str = "TCP", inbound: bool = False) -> None:
        self.owner = owner
        self.kind = kind
        self.inbound = inbound  # accepted here (the header deadline applies), not opened
        self.transport: asyncio.Transport | None = None
        self.remote: Address = ("", 0)
        self.local: Address = ("", 0)
        self.flow: Flow | None = None
        self._buffer = bytearray()
        self._idle: asyncio.TimerHandle | None = None
        self._header: asyncio.TimerHandle | None = None  # a message due whole by then
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.remote = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.flow = Flow(self.kind, self.remote, self.local, self.write)
        if not self.owner.admit_connection(self):
            transport.abort()
            self.closed = True
            return
        self._touch()
        if self.inbound:
            self._expect_message()

    def _expect_message(self) -> None:
        """Arm the header deadline, unless it already runs (a slow sender does not push it
        back by trickling bytes)."""
        timeout = self.owner.header_timeout
        if self._header is None and timeout > 0:
            self._header = asyncio.get_running_loop().call_later(timeout, self._header_late)

    def _header_late(self) -> None:
        self._header = None
        if self.closed:
            return
        self.owner.header_timeouts += 1
        log.info("sip: closed a %s connection from %s: no whole message within %g s "
                 "(--sip-header-timeout)", self.kind, self.remote[0], self.owner.header_timeout)
        self.close()

    def _touch(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(TCP_IDLE_SECONDS, self.close)

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionError(f"the {self.kind} connection is closed")
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._touch()
        self._buffer.extend(data)
        while self._buffer and not self.closed:
            frame = frame_stream(self._buffer, self.owner.max_message_bytes)
            if frame is None:
                break  # the rest of a message is still to come
            if isinstance(frame, ParseFailure):
                assert self.flow is not None
                self.owner.on_failure(frame, self.flow)
                self.close()  # the stream cannot be resynchronised
                return
            self._take(frame)
            if self._header is not None:  # a whole message came: the deadline is met
                self._header.cancel()
                self._header = None
        if self._buffer and not self.closed and self.inbound:
            self._expect_message()  # part of the next message: it is due whole in time

    def _take(self, frame: Frame) -> None:
        del self._buffer[: frame.consumed]
        if not frame.data:
            if frame.consumed >= 4:
                self.write(b"\r\n")  # RFC 5626 pong to a CRLF CRLF ping
            return
        assert self.flow is not None
        self.owner.on_stream_message(frame.data, self.flow)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()  # flushes what was written first
        self.closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for handle in (self._idle, self._header):
            if handle is not None:
                handle.cancel()
        self._idle = self._header = None
        self._buffer.clear()
        self.owner.forget_connection(self)


class SipTransports:
    """The UDP socket and TCP listener on one host:port, and the TCP connections."""

    def __init__(self, on_message: MessageHandler, on_failure: FailureHandler,
                 allowed: AddressCheck, max_message_bytes: int = MAX_MESSAGE_BYTES, *,
                 tcp_per_address: int = TCP_PER_ADDRESS,
                 header_timeout: float = HEADER_TIMEOUT) -> None:
        self.on_message = on_message
        self.tcp_per_address = tcp_per_address
        self.header_timeout = header_timeout  # 0: none
        self._per_host: Counter[str] = Counter()  # connections held, by remote IP
        self.header_timeouts = 0
        self.on_failure = on_failure
        self.allowed = allowed
        self.max_message_bytes = max_message_bytes
        self.host = ""
        self.port = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tls: asyncio.Server | None = None
        self.tls_port = 0
        self.client_tls: ssl.SSLContext | None = None  # for connections the agent opens
        self.connections: dict[Address, TcpConnection] = {}
        self.refused_connections = 0
        self.refused_per_address = 0
        self._refusals = LogThrottle(5.0)

    async def start(self, host: str, port: int) -> int:
        """Bind UDP and TCP on the same port (0: a free one); returns the port."""
        attempts = 20 if port == 0 else 1
        for attempt in range(attempts):
            try:
                return await self._bind(host, port)
            except OSError as exc:
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def _bind(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        udp, _ = await loop.create_datagram_endpoint(lambda: _UdpProtocol(self),
                                                     local_addr=(host, port))
        bound = int(udp.get_extra_info("sockname")[1])
        try:
            self._tcp = await loop.create_server(lambda: TcpConnection(self, inbound=True),
                                                 host, bound, reuse_address=True)
        except OSError:
            udp.close()
            raise
        self._udp = udp
        self.host, self.port = host, bound
        return bound

    async def start_tls(self, host: str, port: int, context: ssl.SSLContext,
                        client_context: ssl.SSLContext) -> int:
        """Also listen for SIP over TLS (tls.py); returns the port."""
        loop = asyncio.get_running_loop()
        self._tls = await loop.create_server(lambda: TcpConnection(self, "TLS", True), host,
                                             port, ssl=context, reuse_address=True,
                                             ssl_handshake_timeout=TCP_CONNECT_SECONDS)
        self.tls_port = int(self._tls.sockets[0].getsockname()[1])
        self.client_tls = client_context
        return self.tls_port

    # -- inbound ----------------------------------------------------------------------------

    def on_datagram(self, data: bytes, remote: Address) -> None:
        if len(data) > MAX_DATAGRAM or self._udp is None:
            return
        udp = self._udp

        def send(reply: bytes, to: Address = remote) -> None:
            udp.sendto(reply, to)

        self.on_message(data, Flow("UDP", remote, (self.host, self.port), send))

    def on_stream_message(self, data: bytes, flow: Flow) -> None:
        self.on_message(data, flow)

    def admit_connection(self, connection: TcpConnection) -> bool:
        host = connection.remote[0]
        crowded = self._per_host[host] >= self.tcp_per_address
        if crowded or not self.allowed(host) or len(self.connections) >= MAX_TCP_CONNECTIONS:
            self.refused_connections += 1
            self.refused_per_address += crowded
            held = self._refusals.admit()
            if held is not None:
                log.info("sip: refused a TCP connection from %s%s", connection.remote[0],
                         held_back_note(held, "refusals"))
            return False
        self.connections[connection.remote] = connection
        self._per_host[host] += 1
        return True

    def forget_connection(self, connection: TcpConnection) -> None:
        if self.connections.get(connection.remote) is connection:
            del self.connections[connection.remote]
            host = connection.remote[0]
            self._per_host[host] -= 1
            if self._per_host[host] <= 0:
                del self._per_host[host]

    # -- outbound ---------------------------------------------------------------------------

    def udp_sender(self, to: Address) -> Callable[[bytes], None]:
        udp = self._udp

        def send(data: bytes) -> None:
            if udp is None or udp.is_closing():
                raise ConnectionError("the SIP UDP socket is closed")
            udp.sendto(data, to)

        return send

    async def flow_to(self, transport: str, to: Address) -> Flow:
        """A way to send to `to`: the UDP socket, or a TCP or TLS connection (reused or
        opened; a TLS one verifies the far end's certificate)."""
        if transport == "UDP":
            return Flow("UDP", to, (self.host, self.port), self.udp_sender(to))
        if transport not in ("TCP", "TLS"):
            raise ConnectionError(f"SIP over {transport} is not served")
        existing = self.connections.get(to)
        if (existing is not None and not existing.closed and existing.flow is not None
                and existing.kind == transport):
            return existing.flow
        loop = asyncio.get_running_loop()
        if transport == "TLS":
            if self.client_tls is None:
                raise ConnectionError("SIP over TLS needs --sip-tls-cert/--sip-tls-key")
            opening = loop.create_connection(lambda: TcpConnection(self, "TLS"), to[0], to[1],
                                             ssl=self.client_tls, server_hostname=to[0],
                                             ssl_handshake_timeout=TCP_CONNECT_SECONDS)
        else:
            opening = loop.create_connection(lambda: TcpConnection(self), to[0], to[1])
        _, connection = await asyncio.wait_for(opening, TCP_CONNECT_SECONDS)
        if connection.flow is None or connection.closed:
            raise ConnectionError(f"the {transport} connection to {to[0]}:{to[1]} was refused")
        return connection.flow

    # -- teardown ---------------------------------------------------------------------------

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        for connection in list(self.connections.values()):
            connection.close()
        self.connections.clear()
        self._per_host.clear()
        for server in (self._tcp, self._tls):
            if server is not None:
                server.close()
                await server.wait_closed()
        self._tcp = self._tls = None

    def stats(self) -> dict[str, int]:
        kinds = [connection.kind for connection in self.connections.values()]
        return {"tcp_connections": kinds.count("TCP"), "tls_connections": kinds.count("TLS"),
                "tcp_refused": self.refused_connections,
                "tcp_refused_per_address": self.refused_per_address,
                "tcp_header_timeouts": self.header_timeouts}

