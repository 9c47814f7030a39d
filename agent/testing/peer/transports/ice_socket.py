"""The ICE socket of a connected WebRTC call, read here instead of by aioice's transport, each
datagram with the kernel's arrival time.

Two users: the load-test media path (direct_srtp.py) keeps the agent's SRTP packets itself,
and an ordinary call (`RtpArrivals`) notes when each of the agent's RTP packets arrived and
passes everything on. aiortc hands decoded audio over only after its jitter buffer, which
holds four packets before it releases one (60-80 ms for 20 ms packets): timed at that point,
every arrival, and so the time to first audio, the echo's delay and each response latency,
would include the peer's own buffering rather than only the agent and the path. The RTP
header is not encrypted by SRTP (RFC 3711 section 3.1), so its timestamp names the packet,
and a decoded frame carries that timestamp counted from the stream's first one (aiortc's
receiver rebases it so).

The socket's asyncio transport is paused (its own flow control) and a duplicate of the
descriptor is read on the event loop instead (`recvmsg`, `SO_TIMESTAMPNS`: arrival.py); what
is not SRTP (STUN, DTLS, SRTCP) goes on to aioice's protocol at once, as the transport would
have handed it. `attach` reads aioice's internals (the connection's nominated pair) and returns
None where they are not found; the call then goes on as aiortc has it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from agent.testing.peer.transports.arrival import (
    ANCILLARY_BYTES,
    arrival,
    stamp_arrivals,
    wall_offset,
)

log = logging.getLogger(__name__)

MAX_DATAGRAM = 2048

# (an SRTP packet, its arrival) → True when taken, False to pass it on to aioice as well.
OnRtp = Callable[[bytes, float], bool]


def is_srtp(data: bytes) -> bool:
    """An RTP (not RTCP) packet: version 2 in the first byte, and a second byte outside the
    RTCP packet types 192-223 that RFC 5761 section 4 keeps apart from RTP payload types."""
    return len(data) > 12 and 127 < data[0] < 192 and not 191 < data[1] < 224


def nominated_pair(dtls_transport: Any) -> Any:
    """aioice's nominated candidate pair (component 1) under an aiortc DTLS transport, or None
    (its `protocol` is the ICE socket's, `remote_addr` the agent's address)."""
    connection = getattr(getattr(dtls_transport, "transport", None), "_connection", None)
    pair = getattr(connection, "_nominated", {}).get(1)
    protocol = getattr(pair, "protocol", None)
    if (protocol is None or getattr(protocol, "transport", None) is None
            or not hasattr(protocol, "datagram_received")
            or getattr(pair, "remote_addr", None) is None):
        return None
    return pair


class IceSocketReader:
    """Reads one ICE socket; `on_rtp` (settable: the load-test path takes over from the
    arrival notes once connected) sees each SRTP packet first."""

    def __init__(self, protocol: Any, sock: socket.socket, on_rtp: OnRtp) -> None:
        self._protocol = protocol
        self._socket: socket.socket | None = sock
        self.on_rtp = on_rtp
        self._offset = wall_offset()

    @classmethod
    def attach(cls, protocol: Any, on_rtp: OnRtp) -> IceSocketReader | None:
        """Read the socket under aioice's `protocol` from now on; None where it cannot be."""
        try:
            transport = protocol.transport
            sock = transport.get_extra_info("socket").dup()  # shares the socket, O_NONBLOCK
        except (OSError, AttributeError):
            log.warning("the ICE socket cannot be read directly: aioice reads it")
            return None
        try:
            stamp_arrivals(sock)
            transport.pause_reading()
            reader = cls(protocol, sock, on_rtp)
            asyncio.get_running_loop().add_reader(sock.fileno(), reader._readable)
        except (OSError, AttributeError, RuntimeError, NotImplementedError):
            sock.close()
            log.warning("the ICE socket cannot be read directly: aioice reads it")
            return None
        return reader

    def _readable(self) -> None:
        """One datagram (the loop calls again while more wait)."""
        if self._socket is None:
            return
        try:
            data, ancillary, _, source = self._socket.recvmsg(MAX_DATAGRAM, ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # an ICMP error for an earlier send
            self._protocol.error_received(exc)
            return
        if is_srtp(data) and self.on_rtp(data, arrival(ancillary, self._offset)):
            return
        self._protocol.datagram_received(data, source)

    def close(self) -> None:
        """Give the socket back to its transport (so DTLS and RTCP end as usual)."""
        if self._socket is None:
            return
        asyncio.get_running_loop().remove_reader(self._socket.fileno())
        self._socket.close()
        self._socket = None
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()


class RtpArrivals:
    """When the agent's RTP packets arrived, by RTP timestamp counted from the stream's first
    packet, as aiortc's receiver counts the frames it decodes after its jitter buffer
    (`take(frame.pts)`). Noted from before the first packet (the reader starts when ICE
    completes, before DTLS); where the stream began out of order, no frame finds its packet
    and the frames keep the time they were handed over."""

    LIMIT = 1024  # packets whose frames never come out (lost in the buffer) age out

    def __init__(self, payload_type: int) -> None:
        self.payload_type = payload_type
        self._first: int | None = None
        self._times: dict[int, float] = {}
        self.found = 0  # frames that found their packet

    def note(self, data: bytes, arrived: float) -> bool:
        if data[1] & 0x7F == self.payload_type:
            timestamp = int.from_bytes(data[4:8], "big")
            if self._first is None:
                self._first = timestamp
            relative = (timestamp - self._first) & 0xFFFFFFFF
            if relative not in self._times:  # a duplicate keeps the first arrival
                self._times[relative] = arrived
                if len(self._times) > self.LIMIT:
                    del self._times[next(iter(self._times))]
        return False  # on to aiortc, which decodes it

    def take(self, pts: int | None) -> float | None:
        arrived = None if pts is None else self._times.pop(pts & 0xFFFFFFFF, None)
        self.found += arrived is not None
        return arrived
