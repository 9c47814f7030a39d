"""The ICE socket read by the peer (ice_socket.py): which datagrams count as the agent's RTP,
and when each packet arrived, for the frames aiortc hands over after its jitter buffer, on
synthetic packets and on a real call to this agent (the echo plugin, on loopback)."""

from __future__ import annotations

import asyncio
import struct

from agent.testing.peer.call import test_signal as signal_of
from agent.testing.peer.transports.base import PeerOptions, open_call
from agent.testing.peer.transports.ice_socket import RtpArrivals, is_srtp
from agent.testing.peer.transports.webrtc import WebRtcCall
from tests.support.agents import RunningAgent


def packet(payload_type: int, timestamp: int, sequence: int = 1) -> bytes:
    return struct.pack("!BBHII", 0x80, payload_type, sequence, timestamp, 7) + b"srtp"


def test_only_rtp_is_taken_rtcp_stun_and_dtls_go_on_to_aioice() -> None:
    header = bytes([0x80, 111]) + bytes(10)
    assert is_srtp(header + b"opus")
    assert is_srtp(bytes([0x80, 0x80 | 111]) + bytes(14))  # the marker bit set
    for rtcp_type in (200, 201, 205, 206):  # SR, RR, RTPFB, PSFB (RFC 5761 section 4)
        assert not is_srtp(bytes([0x80, rtcp_type]) + bytes(14))
    assert not is_srtp(bytes([0x00, 0x01]) + bytes(18))  # a STUN binding request
    assert not is_srtp(bytes([22, 0xFE, 0xFD]) + bytes(13))  # a DTLS record
    assert not is_srtp(header[:12])  # a header and no payload


def test_frames_find_their_packets_by_timestamp_from_the_first() -> None:
    arrivals = RtpArrivals(111)
    first = 0xFFFFFC40  # wraps after two 960-tick packets
    for index in range(4):
        taken = arrivals.note(packet(111, (first + 960 * index) & 0xFFFFFFFF), 10.0 + index)
        assert taken is False  # passed on to aiortc as well
    assert arrivals.note(packet(111, first), 99.0) is False  # a duplicate: the first counts
    assert not arrivals.note(packet(0, (first + 480) & 0xFFFFFFFF), 5.0)  # not audio
    # aiortc counts the frames' timestamps from the first one, unwrapped.
    assert [arrivals.take(pts) for pts in (0, 960, 1920, 2880)] == [10.0, 11.0, 12.0, 13.0]
    assert arrivals.take(0) is None and arrivals.take(None) is None
    assert arrivals.found == 4


def test_packets_whose_frames_never_come_age_out() -> None:
    arrivals = RtpArrivals(111)
    for index in range(RtpArrivals.LIMIT + 10):
        arrivals.note(packet(111, 960 * index), float(index))
    assert arrivals.take(0) is None  # the oldest went
    assert arrivals.take(960 * (RtpArrivals.LIMIT + 9)) == RtpArrivals.LIMIT + 9


async def test_a_calls_audio_is_timed_when_it_reached_the_socket(
        echo_agent: RunningAgent) -> None:
    # An ordinary call (aiortc decodes, through its jitter buffer): each frame takes the
    # arrival of its packet, noted as the packet came off the socket.
    call = open_call(echo_agent.url, "webrtc", PeerOptions(timeout=20.0))
    assert isinstance(call, WebRtcCall)
    try:
        await call.connect()
        assert call._arrivals is not None
        call.play(signal_of(2.0))
        await asyncio.sleep(2.0)
        await call.hangup()
    finally:
        await call.close()
    # Every frame handed over found its packet (the reader started before the first).
    frames = len(call.received.arrivals)
    assert frames > 80 and call._arrivals.found == frames
