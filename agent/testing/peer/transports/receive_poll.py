"""Stream connections read on the peer's 20 ms send tick, with the kernel's arrival times,
instead of a wake-up of the event loop for every message.

The agent paces each call's messages on its own 20 ms timeline, so with tens of calls in one
peer process their messages arrive spread over the 20 ms and each costs the peer a wake-up of
its event loop (a context switch, a pass of the loop, a read): most of what receiving costs
it. Here a connection's transport stops reading (`pause_reading`, asyncio's own flow
control) and its socket (a duplicate of the descriptor) goes into one `epoll` set, drained
on the wake-up the peer's sends take anyway (send_tick.py): every connection that has data
is read, each read handed on with its arrival time (`deliver(data, arrived)`), as the
transport would hand it to its protocol.

Arrival times come from the kernel (`SO_TIMESTAMPNS`, which TCP reports for the last segment
a read takes), so a message read alone keeps its exact arrival, not the read's time. TCP
merges segments that wait together in a socket, so two messages of one connection waiting
for the same read share the later one's time. A paced stream has one message per 20 ms:
with a healthy agent a read almost always finds one (on loopback, 8 and 32 calls of 4 s:
at most 0.5 % of the reads held two). A reader that finds several (`hurry`: a burst after
the agent stalled) has the connections read every 5 ms for the next `HURRY_SECONDS`, so
only the first read of a burst is up to 20 ms off, the rest less than 5 ms. Where `deliver` says to
stop, or the socket ends or fails, the connection goes back to its transport
(`resume_reading`), which then reads it as before (and sees the end itself). Linux and plain
TCP only (epoll, the timestamps, bytes as they come off the socket): for TLS or elsewhere
`take` returns None and the transport reads.

asyncio has no such batched read, hence this module.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import time
from collections.abc import Callable

from agent.testing.peer.transports.arrival import (
    ANCILLARY_BYTES,
    SO_TIMESTAMPNS,
    arrival,
    stamp_arrivals,
    wall_offset,
)
from agent.testing.peer.transports.per_loop import PerLoop
from agent.testing.peer.transports.send_tick import send_tick

log = logging.getLogger(__name__)

HURRY_SECONDS = 1.0
READ_BYTES = 256 * 1024  # what asyncio's socket transport reads at a time

# Bytes read and when they arrived (monotonic); False: stop polling this connection.
Deliver = Callable[[bytes, float], bool]


class PolledConnection:
    """One connection read by the poll; `release` gives it back to its transport."""

    def __init__(self, poll: ReceivePoll, transport: asyncio.Transport, sock: socket.socket,
                 deliver: Deliver) -> None:
        self._poll = poll
        self._transport = transport
        self._socket: socket.socket | None = sock
        self._deliver = deliver
        self.reads = 0

    def drain(self, offset: float) -> None:
        """Every read waiting on the socket (`offset`: wall clock minus monotonic)."""
        sock = self._socket
        while sock is not None:
            try:
                data, ancillary, _, _ = sock.recvmsg(READ_BYTES, ANCILLARY_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # reset: the transport reads it again and sees the end
                self.release()
                return
            if not data:  # the end: left for the transport to see
                self.release()
                return
            arrived = arrival(ancillary, offset)
            self.reads += 1
            if not self._deliver(data, arrived):
                self.release()
                return
            if len(data) < READ_BYTES:  # a stream read takes all there is: empty now
                return
            sock = self._socket

    def release(self) -> None:
        """Back to the transport, which reads from now on (once; safe after a close)."""
        if self._stop() and not self._transport.is_closing():
            self._transport.resume_reading()

    def close(self) -> None:
        """Stop polling without handing reads back (the connection is closing)."""
        self._stop()

    def _stop(self) -> bool:
        sock, self._socket = self._socket, None
        if sock is None:
            return False
        self._poll.forget(sock)
        sock.close()
        return True


class ReceivePoll:
    """The loop's polled connections, read on the peer's send tick (send_tick.py), every
    5 ms for a while after a burst (`hurry`)."""

    def __init__(self) -> None:
        self._epoll: select.epoll | None = None
        self._connections: dict[int, PolledConnection] = {}
        self._leave: Callable[[], None] | None = None  # the send tick
        self._leave_fast: Callable[[], None] | None = None  # the 5 ms reads
        self._fast_until = 0.0
        self.hurried = 0  # bursts seen

    def __len__(self) -> int:
        return len(self._connections)

    def take(self, transport: asyncio.Transport, deliver: Deliver) -> PolledConnection | None:
        """Read `transport`'s socket here from now on; None where it cannot be (not Linux, no
        socket, a transport that cannot pause): the transport reads on."""
        if SO_TIMESTAMPNS is None or not hasattr(select, "epoll") or transport.is_closing():
            return None
        if transport.get_extra_info("ssl_object") is not None:
            return None  # TLS: the socket carries records the transport must decrypt
        shared = transport.get_extra_info("socket")
        if shared is None or not hasattr(shared, "dup"):
            return None
        try:
            sock = shared.dup()
        except OSError:
            return None
        try:
            sock.setblocking(False)
            if not stamp_arrivals(sock):
                raise OSError("no arrival stamps")
            if self._epoll is None:
                self._epoll = select.epoll()
            self._epoll.register(sock.fileno(), select.EPOLLIN)
            transport.pause_reading()
        except (OSError, RuntimeError, AttributeError, NotImplementedError):
            self._unregister(sock)
            sock.close()
            return None
        connection = PolledConnection(self, transport, sock, deliver)
        self._connections[sock.fileno()] = connection
        if self._leave is None:
            self._leave = send_tick().join(self._on_send_tick)
        return connection

    def hurry(self) -> None:
        """Messages of one connection were found waiting together (sharing one arrival
        time): read every 5 ms for the next HURRY_SECONDS."""
        self.hurried += 1
        self._fast_until = time.monotonic() + HURRY_SECONDS
        if self._leave_fast is None and self._connections:
            self._leave_fast = send_tick().join_poll(self._fast_poll)

    def _on_send_tick(self, tick_at: float, now: float) -> None:
        if self._leave_fast is None:  # otherwise read on this step already
            self.poll()

    def _fast_poll(self) -> None:
        self.poll()
        if self._leave_fast is not None and time.monotonic() > self._fast_until:
            self._leave_fast()
            self._leave_fast = None

    def forget(self, sock: socket.socket) -> None:
        self._connections.pop(sock.fileno(), None)
        self._unregister(sock)
        if not self._connections:
            self._stop_polling()

    def _stop_polling(self) -> None:
        for leave in (self._leave, self._leave_fast):
            if leave is not None:
                leave()
        self._leave = self._leave_fast = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None

    def _unregister(self, sock: socket.socket) -> None:
        # Before the duplicate closes: an epoll entry lives as long as the socket does, and
        # the transport's own descriptor keeps it alive.
        if self._epoll is not None:
            try:
                self._epoll.unregister(sock.fileno())
            except (OSError, ValueError):
                pass

    def poll(self) -> None:
        """Drain every connection with data waiting (the tick's work, callable directly)."""
        if self._epoll is None:
            return
        offset = wall_offset()
        for fd, _ in self._epoll.poll(0):
            connection = self._connections.get(fd)
            if connection is None:
                continue
            try:
                connection.drain(offset)
            except Exception:  # one broken reader must not stop the others
                log.exception("a polled connection failed; handing it back to its transport")
                connection.release()

    def close(self) -> None:
        for connection in list(self._connections.values()):
            connection.release()
        self._stop_polling()


receive_poll = PerLoop(ReceivePoll)  # the running loop's one
