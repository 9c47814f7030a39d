"""The peer's RTP stream (rtp and sip transports) on its own: what it reads of a received
packet is what aiortc's `RtpPacket.parse` reads, the live path and the after-call replay of a
load test count the same packets received, lost and foreign, the same jitter and the same
digits as counting on `RtpPacket.parse` does, and what it sends is aiortc's serialisation of
consecutive packets, paced as its `Pacer` says, key presses included."""

from __future__ import annotations

import asyncio
import socket
import struct

import numpy as np
import pytest
from aiortc.rtp import RtpPacket

from agent.testing.peer.transports.base import PeerCall, PeerOptions, open_call
from agent.testing.peer.transports.narrowband import NARROW_RATE, codec_name
from agent.testing.peer.transports.rtp_stream import (
    MAX_DATAGRAM,
    PACKET_SECONDS,
    RtpStream,
    parse_rtp,
)
from agent.testing.peer.transports.telephone_events import DigitDetector, digit_packets
from agent.testing.testsignal import make_test_signal
from tests.support.agents import wait_until

REMOTE = ("127.0.0.1", 40000)
PCMU, DTMF = 0, 101


def rtp(sequence: int, timestamp: int, payload: bytes, *, payload_type: int = PCMU,
        marker: bool = False, csrcs: tuple[int, ...] = (), extension: bytes | None = None,
        padding: int = 0) -> bytes:
    """An RTP packet built field by field (RFC 3550 5.1, 5.3.1)."""
    first = 0x80 | (0x20 if padding else 0) | (0x10 if extension is not None else 0) | len(csrcs)
    data = struct.pack("!BBHII", first, (0x80 if marker else 0) | payload_type,
                       sequence & 0xFFFF, timestamp & 0xFFFFFFFF, 0x1234)
    data += b"".join(struct.pack("!I", csrc) for csrc in csrcs)
    if extension is not None:
        data += struct.pack("!HH", 0xBEDE, len(extension) // 4) + extension
    data += payload
    if padding:
        data += bytes(padding - 1) + bytes([padding])
    return data


def bad_padding(sequence: int, timestamp: int) -> bytes:
    """Padding said to be longer than the packet after its header."""
    return bytes([0xA0]) + rtp(sequence, timestamp, b"\x00\x00\x00\xC8")[1:]


def audio(index: int) -> bytes:
    return bytes([index % 256]) * 160


class Reference:
    """Counting as the stream did with an `RtpPacket` per packet (RFC 3550 A.3 with the
    wrap cycles kept apart, 6.4.1): what the stream's counts must equal."""

    def __init__(self, remote: tuple[str, int], strict: bool = True) -> None:
        self.remote, self.strict = remote, strict
        self.received = self.foreign = 0
        self.base: int | None = None
        self.max_seq = 0
        self.jitter = 0.0
        self.last_transit: float | None = None
        self.detector = DigitDetector()
        self.digits: list[str] = []
        self.audio: list[tuple[float, bytes]] = []

    def feed(self, data: bytes, source: tuple[str, int], now: float) -> None:
        if len(data) > MAX_DATAGRAM or (
                source != self.remote and (self.strict or source[0] != self.remote[0])):
            self.foreign += 1
            return
        try:
            packet = RtpPacket.parse(data)
        except ValueError:
            self.foreign += 1
            return
        if packet.payload_type not in (PCMU, DTMF):
            self.foreign += 1
            return
        self.received += 1
        seq = packet.sequence_number
        if self.base is None:
            self.base = self.max_seq = seq
        else:
            cycles, low = self.max_seq & ~0xFFFF, self.max_seq & 0xFFFF
            if (seq - low) & 0xFFFF < 0x8000:
                extended = cycles + seq + (0x10000 if seq < low else 0)
                self.max_seq = max(self.max_seq, extended)
        if packet.payload_type == DTMF:
            digit = self.detector.feed(packet.timestamp, packet.payload)
            if digit is not None:
                self.digits.append(digit)
            return
        transit = now - packet.timestamp / NARROW_RATE
        if self.last_transit is not None:
            self.jitter += (abs(transit - self.last_transit) - self.jitter) / 16
        self.last_transit = transit
        self.audio.append((now, packet.payload))

    @property
    def lost(self) -> int:
        expected = 0 if self.base is None else self.max_seq - self.base + 1
        return max(0, expected - self.received)


def traffic() -> list[tuple[bytes, tuple[str, int], float]]:
    """(packet, source, arrival): audio whose sequence numbers and timestamps wrap, two
    packets lost, two reordered, one duplicated, headers of every form, foreign packets of
    every kind, a digit."""
    packets: list[tuple[bytes, tuple[str, int], float]] = []
    at, sequence, timestamp = 100.0, 0xFFFA, 0xFFFFFF00  # both wrap during the call

    def add(data: bytes, source: tuple[str, int] = REMOTE) -> None:
        packets.append((data, source, at))

    for index in (0, 1, 2, 4, 5, 6, 8, 10, 9, 11):  # 3 and 7 lost, 9 after 10
        add(rtp(sequence + index, timestamp + 160 * index, audio(index), marker=index == 0))
        at += 0.02 + (0.003 if index % 3 else -0.002)  # some jitter
    add(rtp(sequence + 5, timestamp + 160 * 5, audio(5)))  # a duplicate
    base = sequence + 12
    add(rtp(base, timestamp + 160 * 12, audio(12), csrcs=(7, 8), extension=b"\x10\xAA\x00\x00"))
    add(rtp(base + 1, timestamp + 160 * 13, audio(13), padding=4))
    add(rtp(base + 2, timestamp + 160 * 14, audio(14), extension=b""))
    add(rtp(base + 3, timestamp + 160 * 15, audio(15), csrcs=(9,)))
    add(rtp(base + 4, timestamp + 160 * 16, audio(16))[:11])  # truncated header
    add(rtp(base + 4, timestamp + 160 * 16, audio(16), csrcs=(1, 2))[:18])  # truncated CSRCs
    add(bad_padding(base + 4, timestamp + 160 * 16))
    add(b"")
    add(bytes([0x40]) + rtp(base + 4, 0, audio(16))[1:])  # version 1
    add(rtp(base + 4, timestamp + 160 * 16, audio(16), payload_type=96))  # foreign type
    add(rtp(base + 4, timestamp + 160 * 16, audio(16)), ("127.0.0.1", 40001))  # another port
    add(rtp(base + 4, timestamp + 160 * 16, audio(16)), ("127.0.0.2", 40000))  # another host
    add(rtp(base + 4, timestamp + 160 * 16, bytes(MAX_DATAGRAM)))  # too large
    event_at = timestamp + 160 * 16
    for offset, (payload, marker) in enumerate(digit_packets("5", 160)):
        add(rtp(base + 4 + offset, event_at, payload, payload_type=DTMF, marker=marker))
        at += 0.02
    after = base + 4 + len(digit_packets("5", 160))
    add(rtp(after, timestamp + 160 * 24, audio(24), marker=True))
    return packets


def stream_for(defer: bool) -> tuple[PeerCall, RtpStream]:
    call = open_call("rtp://127.0.0.1:9", "rtp",
                     PeerOptions(extra={"defer_decoding": defer}))
    stream = RtpStream(call, codec_name("PCMU"), DTMF)
    return call, stream


def counts(call: PeerCall, stream: RtpStream) -> tuple[int | None, int | None, int]:
    """What the call reports received and lost, and what the stream took for foreign."""
    return call.packets_received, call.packets_lost, stream.foreign_packets


def expected() -> Reference:
    reference = Reference(REMOTE)
    for data, source, at in traffic():
        reference.feed(data, source, at)
    # What the traffic holds, by construction: every form of header parsed, the losses.
    assert reference.received == 10 + 1 + 4 + 8 + 1  # the duplicate counts (RFC 3550 A.3)
    assert reference.lost == 1 and reference.foreign == 9 and reference.digits == ["5"]
    return reference


@pytest.mark.parametrize("data", [
    rtp(1, 160, b"ab"), rtp(0xFFFF, 0xFFFFFFFF, b"", marker=True, payload_type=127),
    rtp(2, 320, b"cd", csrcs=(1, 2, 3)), rtp(3, 480, b"ef", extension=b"\x01\x02\x03\x04"),
    rtp(4, 640, b"gh", padding=3), rtp(5, 800, b"ij", csrcs=(4,), extension=b"", padding=1),
    rtp(6, 960, b"kl")[:11], rtp(7, 1120, b"", csrcs=(5, 6))[:15], b"", bytes(12),
    bad_padding(8, 1280), bytes([0xA0]) + rtp(8, 1280, b"mn\x00")[1:],
    bytes([0xC0]) + rtp(9, 0, b"op")[1:],
], ids=["plain", "marker", "csrcs", "extension", "padding", "all", "short", "short-csrcs",
        "empty", "version-0", "long-padding", "zero-padding", "version-3"])
def test_a_packet_reads_as_aiortc_reads_it(data: bytes) -> None:
    try:
        packet = RtpPacket.parse(data)
    except ValueError:
        assert parse_rtp(data) is None
        return
    assert parse_rtp(data) == (packet.payload_type, packet.sequence_number, packet.timestamp,
                               packet.payload)


def test_the_live_path_counts_as_rtp_packet_parse_does() -> None:
    reference = expected()
    call, stream = stream_for(defer=False)
    stream.remote = REMOTE
    for data, source, at in traffic():
        stream.on_datagram(data, source, at)
    assert (stream.packets_received, stream.packets_lost, stream.foreign_packets) == (
        reference.received, reference.lost, reference.foreign)
    assert stream.jitter == reference.jitter and stream.jitter is not None
    assert [event.event["digit"] for event in call.dtmf_received] == reference.digits
    assert call.received.arrivals == [at for at, _ in reference.audio]


def test_a_load_tests_kept_packets_count_and_decode_as_the_live_path() -> None:
    reference = expected()
    call, stream = stream_for(defer=True)
    stream.remote = REMOTE
    stream._kept = [(at, data, source) for data, source, at in traffic()]
    stream.publish()
    assert counts(call, stream) == (None, None, 0)  # counted with the recordings, after it
    call.finish_recordings()
    assert counts(call, stream) == (reference.received, reference.lost, reference.foreign)
    assert call.jitter == reference.jitter
    assert [event.event["digit"] for event in call.dtmf_received] == reference.digits
    assert call.received.arrivals == [at for at, _ in reference.audio]
    decoded = stream_for(defer=True)[1].decoder.decode_many([p for _, p in reference.audio])
    assert np.array_equal(call.received.samples(), np.concatenate(decoded))


def test_a_kept_packet_that_names_the_remote_is_counted_from_any_source() -> None:
    # No remote known (an rtp:// target that has not sent yet): the first packet names it,
    # then a packet from another port of the same host is taken unless the port is strict.
    call, stream = stream_for(defer=True)
    stream.strict_source_port = False
    stream._kept = [(1.0, rtp(1, 160, audio(1)), ("127.0.0.1", 5000, 0, 0)),
                    (1.02, rtp(3, 480, audio(3)), ("127.0.0.1", 5002)),
                    (1.04, rtp(4, 640, audio(4)), ("127.0.0.3", 5000))]
    stream.publish()
    call.finish_recordings()
    assert stream.remote == ("127.0.0.1", 5000)
    assert counts(call, stream) == (2, 1, 1)


async def test_polled_packets_from_a_real_socket_count_as_rtp_packet_parse_does() -> None:
    call, stream = stream_for(defer=True)
    local = await stream.bind("127.0.0.1")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sender.bind(("127.0.0.1", 0))
        stranger.bind(("127.0.0.1", 0))
        stream.remote = sender.getsockname()
        reference = Reference(stream.remote)
        sent = 0

        async def all_kept(count: int) -> None:
            await wait_until(lambda: len(stream._kept) == count, timeout=10)

        for data, source, _ in traffic():
            if len(data) > MAX_DATAGRAM:
                continue  # the loopback takes it; the size rule is the replay test's
            (sender if source == REMOTE else stranger).sendto(data, local)
            reference.feed(data, sender.getsockname() if source == REMOTE
                           else stranger.getsockname(), 0.0)
            sent += 1
            if sent % 8 == 0:  # within what one socket's buffer takes between ticks
                await all_kept(sent)
        await all_kept(sent)
        stream.publish()
        call.finish_recordings()
        assert counts(call, stream) == (reference.received, reference.lost, reference.foreign)
        assert reference.lost == 1 and reference.digits == ["5"]
        assert [event.event["digit"] for event in call.dtmf_received] == ["5"]
        assert len(call.received.arrivals) == len(reference.audio)
    finally:
        sender.close()
        stranger.close()
        await stream.close()


async def test_sent_packets_are_consecutive_aiortc_packets_with_digits_in_place() -> None:
    call, stream = stream_for(defer=True)
    await stream.bind("127.0.0.1")
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(5)
        stream.remote = receiver.getsockname()
        stream._sequence = 0xFFFD  # the sequence number wraps
        signal = make_test_signal(1.0)
        call.play(signal)
        payloads = stream.encoder.encode_packets(signal.astype(np.float32))
        tick = 1000.0

        def send(count: int = 1) -> list[RtpPacket]:
            nonlocal tick
            stream._send_due(tick, tick)
            tick += PACKET_SECONDS
            packets = [RtpPacket.parse(receiver.recv(4096)) for _ in range(count)]
            return packets

        sent = [packet for _ in range(3) for packet in send()]
        # A short stall: the packets missed go out on the next tick; a long one restarts.
        tick += PACKET_SECONDS
        sent += send(2)
        tick += 0.5
        sent += send(1)
        pressing = asyncio.ensure_future(stream.send_dtmf("7"))
        await wait_until(lambda: bool(stream._digit_slots))  # its packets queued
        event = digit_packets("7", 160)
        while stream._digit_slots:
            sent += send()
        await asyncio.wait_for(pressing, 5)
        sent += send() + send()
        assert not stream._digit_slots
        first = sent[0]
        assert all(p.ssrc == stream.ssrc and p.version == 2 and not p.csrc
                   and not p.padding_size for p in sent)
        assert [p.sequence_number for p in sent] == [
            (first.sequence_number + i) & 0xFFFF for i in range(len(sent))]
        assert first.sequence_number == 0xFFFD and sent[3].sequence_number == 0
        assert [p.timestamp for p in sent if p.payload_type == PCMU] == [
            (first.timestamp + 160 * i) & 0xFFFFFFFF for i in range(len(sent))
            if sent[i].payload_type == PCMU]
        audio_sent = [p.payload for p in sent if p.payload_type == PCMU]
        pause = [stream.encoder.silence] * 3
        assert audio_sent == payloads[:6] + pause + payloads[6:8]
        events = [p for p in sent if p.payload_type == DTMF]
        assert [(p.payload, bool(p.marker)) for p in events] == event
        assert len({p.timestamp for p in events}) == 1
        assert not any(p.marker for p in sent if p.payload_type == PCMU)
        assert len(call.sent.arrivals) == len(sent)
    finally:
        receiver.close()
        await stream.close()
