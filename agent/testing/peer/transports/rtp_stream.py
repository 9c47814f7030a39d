"""The peer's end of one RTP audio stream (G.711, 20 ms packets, RFC 4733 DTMF), shared by the
rtp and sip transports.

A UDP socket on the event loop (asyncio datagram endpoint). Sending: audio is encoded when
it is queued (`PeerCall.preencode`), and every stream of the event loop is driven by one
`PeerTick` (send_tick.py: one timer for all, each stream's own `Pacer`), so a send is a
slice of bytes and a `sendto`; while digits are being sent their telephone-event
packets take the audio's place. Receiving: packets from the remote (or any source until the
first one, when the remote is not known: symmetric RTP) are decoded into the call's
`received` recording as they come, or, with `extra["defer_decoding"]` (a load test without a
script: nothing reads the audio during the call), kept as bytes and decoded after the call
(`PeerCall.finish_recordings`).
In that load-test mode the socket is not on the event loop at all: each wake-up of the shared
tick first reads what every stream's socket holds (`_Poller`: one epoll for all of
them, asked until nothing is ready, so an empty socket costs no failed `recvmsg`), with each
packet's arrival time from the kernel (`SO_TIMESTAMPNS`), then sends. A datagram then costs
no wake-up and no selector round of its own (those were most of the peer's CPU per RTP
call), and the jitter and gaps still see when each packet really arrived. The packets are
kept as they came (bytes, source, arrival) and parsed, counted and decoded after the call.
Telephone-events become `dtmf` events. Sequence numbers give packets received and lost
(RFC 3550 A.3), RTP timestamps against arrival times the interarrival jitter (RFC 3550
6.4.1). Sent headers are packed directly (see `_send`). Received packets with the
plain 12-byte header (version 2, no padding, extension or CSRCs: what G.711 senders send) are
read with one `struct` unpack (`parse_rtp`), anything else with aiortc's `RtpPacket`: an
object per packet cost twice what parsing and counting it now cost after a load test's call.
The kept packets of a load test are replayed through `on_datagram` after the call, as
packets are taken live otherwise.
"""

from __future__ import annotations

import asyncio
import secrets
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc.rtp import RtpPacket

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.testing.peer.transports.arrival import (
    ANCILLARY_BYTES,
    arrival,
    stamp_arrivals,
    wall_offset,
)
from agent.testing.peer.transports.base import EncodedPlayback, PeerCall
from agent.testing.peer.transports.narrowband import (
    NARROW_RATE,
    SAMPLES_PER_PACKET,
    NarrowbandCodec,
)
from agent.testing.peer.transports.per_loop import PerLoop
from agent.testing.peer.transports.send_tick import send_tick
from agent.testing.peer.transports.telephone_events import (
    PAUSE_PACKETS,
    DigitDetector,
    check_digits,
    digit_packets,
)

Address = tuple[str, int]
MAX_DATAGRAM = 2048
RTP_HEADER = struct.Struct("!BBHII")
RTP_HEADER_SIZE = RTP_HEADER.size
PLAIN_FIRST_BYTE = 0x80  # version 2; no padding, extension or CSRCs
_FIXED_FIELDS = struct.Struct("!xBHI")  # marker and payload type, sequence number, timestamp
PACKET_SECONDS = SAMPLES_PER_PACKET / NARROW_RATE

# A received packet's (payload type, sequence number, timestamp, payload).
Parsed = tuple[int, int, int, bytes]


def parse_rtp(data: bytes) -> Parsed | None:
    """(payload type, sequence number, timestamp, payload) of an RTP packet; None for what is
    not one. The plain 12-byte header is read with one unpack; a header with padding, an
    extension or CSRCs (and whatever is not RTP) goes through aiortc's `RtpPacket.parse`,
    which gives the same fields."""
    if len(data) >= RTP_HEADER_SIZE and data[0] == PLAIN_FIRST_BYTE:
        marker_type, sequence, timestamp = _FIXED_FIELDS.unpack_from(data)
        return marker_type & 0x7F, sequence, timestamp, data[RTP_HEADER_SIZE:]
    try:
        packet = RtpPacket.parse(data)
    except ValueError:
        return None
    return packet.payload_type, packet.sequence_number, packet.timestamp, packet.payload


class _Poller:
    """The load-test streams' sockets, read on the shared tick (one epoll for all): it joins
    the shared tick before any of its streams, so each tick reads before it sends."""

    ROUNDS = 8  # a socket holding more than this many datagrams is read on later ticks too

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._readers: dict[int, Callable[[float], None]] = {}  # by file descriptor
        self._leave: Callable[[], None] | None = None

    def add(self, stream: RtpStream, sock: socket.socket) -> None:
        self._epoll.register(sock.fileno(), select.EPOLLIN)
        self._readers[sock.fileno()] = stream._read_one
        if self._leave is None:
            self._leave = send_tick().join(self._tick)

    def remove(self, sock: socket.socket) -> None:
        if self._readers.pop(sock.fileno(), None) is not None:
            self._epoll.unregister(sock.fileno())
        if not self._readers and self._leave is not None:
            self._leave()
            self._leave = None

    def _tick(self, tick_at: float, now: float) -> None:
        offset = wall_offset()
        poll, readers = self._epoll.poll, self._readers
        for _ in range(self.ROUNDS):
            ready = poll(0)
            if not ready:
                return
            for fd, _ in ready:
                read = readers.get(fd)
                if read is not None:
                    read(offset)


shared_poller = PerLoop(_Poller)  # the running loop's one


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, stream: RtpStream) -> None:
        self.stream = stream

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.stream.on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        self.stream.send_errors += 1


# One 20 ms slot of a digit: (telephone-event payload or None for silence, marker, the
# future to resolve once the slot is sent).
DigitSlot = tuple[bytes | None, bool, "asyncio.Future[None] | None"]


class RtpStream:
    def __init__(self, call: PeerCall, codec: str, dtmf_payload_type: int | None = 101) -> None:
        self.call = call
        self.encoder = NarrowbandCodec(codec, call.rate)
        self.decoder = NarrowbandCodec(codec, call.rate)
        self.payload_type = self.encoder.payload_type
        self.dtmf_payload_type = dtmf_payload_type
        self.defer_decoding = bool(call.options.extra.get("defer_decoding", False))
        self.remote: Address | None = None
        self.local: Address | None = None
        # False: take the remote host's packets from any port (senders like ffmpeg send from
        # a port other than the one they listen on).
        self.strict_source_port = True
        self.ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._digit_timestamp = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._socket: socket.socket | None = None  # load-test mode: drained on each tick
        self._pacer = Pacer(MonotonicClock(), PACKET_SECONDS)
        self._leave_clock: Callable[[], None] | None = None
        self._digit_slots: deque[DigitSlot] = deque()
        self._silence_payload = self.encoder.silence
        self._silent_samples = np.zeros(call.rate // 50, dtype=np.float32)
        self._detector = DigitDetector()
        self._deferred: list[tuple[float, bytes]] = []
        # Load-test mode: (arrival, packet, source as the socket gives it), as they came.
        self._kept: list[tuple[float, bytes, tuple[Any, ...]]] = []
        call.preencode(EncodedPlayback(self.encoder.encode_packets, call.rate // 50,
                                       self._silence_payload, f"{codec}/{call.rate}"))
        # Receive statistics.
        self.packets_received = 0
        self.foreign_packets = 0
        self.send_errors = 0
        self._base_seq: int | None = None
        self._max_seq = 0  # extended (with wrap cycles)
        self._jitter = 0.0
        self._last_transit: float | None = None

    async def bind(self, host: str, port: int = 0) -> Address:
        if self.defer_decoding:
            address = self._bind_polled(host, port)
            assert self._socket is not None
            shared_poller().add(self, self._socket)
            return address
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self),
                                                           local_addr=(host, port))
        self._transport = transport
        sockname = transport.get_extra_info("sockname")
        self.local = (sockname[0], sockname[1])
        return self.local

    def _bind_polled(self, host: str, port: int) -> Address:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            stamp_arrivals(sock)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        sockname = sock.getsockname()
        self.local = (sockname[0], sockname[1])
        return self.local

    def _read_one(self, offset: float) -> None:
        """One datagram from the polled socket (its poller saw it readable), with its kernel
        arrival time (`offset`: wall clock minus monotonic), kept for after the call."""
        sock = self._socket
        if sock is None:
            return
        try:
            data, ancillary, _, source = sock.recvmsg(MAX_DATAGRAM + 1, ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # an ICMP error for an earlier send
            self.send_errors += 1
            return
        if self.remote is None:  # symmetric RTP: the first packet names the remote
            self.on_datagram(data, (source[0], source[1]), arrival(ancillary, offset))
        else:
            self._kept.append((arrival(ancillary, offset), data, source))

    def start(self, remote: Address | None) -> None:
        """Send to `remote` (None: to whoever sends first) from now on."""
        if remote is not None:
            self.remote = remote
        self._leave_clock = send_tick().join(self._send_due)

    # -- sending ---------------------------------------------------------------------------

    def _send(self, payload_type: int, payload: bytes, marker: bool, timestamp: int) -> None:
        if (self._transport is None and self._socket is None) or self.remote is None:
            return
        # The 12-byte header packed directly (RFC 3550 5.1: version 2, no padding, extension
        # or CSRCs): the same bytes as aiortc's RtpPacket.serialize, without an object per
        # packet.
        header = RTP_HEADER.pack(PLAIN_FIRST_BYTE, (0x80 if marker else 0) | payload_type,
                                 self._sequence, timestamp, self.ssrc)
        self._sequence = (self._sequence + 1) & 0xFFFF
        if self._socket is not None:
            try:
                self._socket.sendto(header + payload, self.remote)
            except OSError:  # a full buffer or an ICMP error: the packet is lost
                self.send_errors += 1
        elif self._transport is not None:
            self._transport.sendto(header + payload, self.remote)

    def _send_due(self, tick_at: float, now: float) -> None:
        """On the shared tick's send step (after the poller read what arrived, in load-test
        mode): the packets now due (normally one)."""
        for _ in range(self._pacer.take_due(tick_at, now)):
            self._send_one(now)

    def _send_one(self, now: float) -> None:
        if self._digit_slots:
            payload, marker, done = self._digit_slots.popleft()
            self.call.sent.add_samples(self._silent_samples, now)
            if payload is None or self.dtmf_payload_type is None:
                self._send(self.payload_type, self._silence_payload, False, self._timestamp)
            else:
                if marker:  # an event's packets all carry its start's timestamp
                    self._digit_timestamp = self._timestamp
                self._send(self.dtmf_payload_type, payload, marker, self._digit_timestamp)
            if done is not None and not done.done():
                done.set_result(None)
        else:
            self._send(self.payload_type, self.call.next_payload(now), False, self._timestamp)
        self._timestamp = (self._timestamp + SAMPLES_PER_PACKET) & 0xFFFFFFFF

    async def send_dtmf(self, digits: str) -> None:
        """RFC 4733 digits in place of audio (each its tone and end packets, then a pause of
        silence); returns once they have all been sent. ValueError for a bad digit."""
        if self.dtmf_payload_type is None:
            raise ValueError("no telephone-event payload type was negotiated")
        loop = asyncio.get_running_loop()
        waits = []
        for digit in check_digits(digits):
            for payload, marker in digit_packets(digit, SAMPLES_PER_PACKET):
                self._digit_slots.append((payload, marker, None))
            done: asyncio.Future[None] = loop.create_future()
            self._digit_slots.extend([(None, False, None)] * (PAUSE_PACKETS - 1))
            self._digit_slots.append((None, False, done))
            waits.append(done)
        await asyncio.gather(*waits)

    # -- receiving -------------------------------------------------------------------------

    def on_datagram(self, data: bytes, source: Address, arrived: float | None = None) -> None:
        now = time.monotonic() if arrived is None else arrived
        if not self._admits(data, source):
            return
        parsed = parse_rtp(data)
        if parsed is None:
            self.foreign_packets += 1
            return
        payload_type, sequence, timestamp, payload = parsed
        self._take(payload_type, sequence, timestamp, payload, now)

    def _admits(self, data: bytes, source: Address) -> bool:
        """Whether a datagram may be the remote's (its size and source); the first one names
        the remote when it is not known (symmetric RTP). What is not is counted foreign."""
        if len(data) > MAX_DATAGRAM:
            self.foreign_packets += 1
            return False
        remote = self.remote
        if remote is None:
            self.remote = source  # symmetric RTP: answer whoever sent first
        elif source != remote and (self.strict_source_port or source[0] != remote[0]):
            self.foreign_packets += 1
            return False
        return True

    def _take(self, payload_type: int, sequence: int, timestamp: int, payload: bytes,
              now: float) -> None:
        """A packet from the remote, parsed: counted (RFC 3550 A.3 sequence numbers, 6.4.1
        jitter of the audio), a telephone-event fed to the digit detector, audio decoded or
        kept; another payload type is foreign."""
        audio = payload_type == self.payload_type
        event = payload_type == self.dtmf_payload_type
        if not (audio or event):
            self.foreign_packets += 1
            return
        self.packets_received += 1
        if self._base_seq is None:
            self._base_seq = self._max_seq = sequence
        else:
            # Ahead of the highest by less than half the sequence space (a wrap included):
            # the new highest, extended with wrap cycles; otherwise late or a duplicate.
            ahead = (sequence - self._max_seq) & 0xFFFF
            if ahead < 0x8000:
                self._max_seq += ahead
        if audio:
            transit = now - timestamp / NARROW_RATE
            last = self._last_transit
            if last is not None:
                self._jitter += (abs(transit - last) - self._jitter) / 16
            self._last_transit = transit
        if event:
            digit = self._detector.feed(timestamp, payload)
            if digit is not None:
                pressed = {"type": "dtmf", "digit": digit, "transport": self.call.transport}
                self.call.dtmf_received.append(self.call.add_event(pressed, now))
        elif self.defer_decoding:
            self._deferred.append((now, payload))
        else:
            self.call.received.add_samples(self.decoder.decode(payload), now)

    @property
    def packets_expected(self) -> int:
        return 0 if self._base_seq is None else self._max_seq - self._base_seq + 1

    @property
    def packets_lost(self) -> int:
        return max(0, self.packets_expected - self.packets_received)

    @property
    def jitter(self) -> float | None:
        return self._jitter if self._last_transit is not None else None

    def publish(self) -> None:
        """Copy the statistics onto the call; packets kept as they came (load-test mode) are
        parsed and counted, and audio kept as bytes decoded, when the call's recordings are
        finished (after the call: `PeerCall.finish_recordings`)."""
        if self._kept:
            self.call.defer_until_finished(self._finish_kept)
            return
        self._publish_statistics()
        if self._deferred:
            self.call.defer_until_finished(self._decode_deferred)

    def _publish_statistics(self) -> None:
        self.call.packets_received = self.packets_received
        self.call.packets_lost = self.packets_lost
        self.call.jitter = self.jitter

    def _finish_kept(self) -> None:
        kept, self._kept = self._kept, []
        for arrived, data, source in kept:
            self.on_datagram(data, (source[0], source[1]), arrived)
        self._publish_statistics()
        if self._deferred:
            self._decode_deferred()

    def _decode_deferred(self) -> None:
        decoded = self.decoder.decode_many([payload for _, payload in self._deferred])
        # Float32 mono at the call's rate, one dimension: nothing for `add_samples` to convert.
        add = self.call.received.add_piece
        for (arrived, _), samples in zip(self._deferred, decoded, strict=True):
            add(samples, arrived)
        self._deferred = []

    async def close(self) -> None:
        if self._leave_clock is not None:
            self._leave_clock()
            self._leave_clock = None
        for _, _, done in self._digit_slots:
            if done is not None:
                done.cancel()
        self._digit_slots.clear()
        if self._transport is not None:
            self._transport.close()
        if self._socket is not None:
            shared_poller().remove(self._socket)
            self._socket.close()
            self._socket = None
        self.publish()
