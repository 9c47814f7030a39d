"""The cheaper per-packet path of a telephony leg gives the same bytes and samples as the
general code it stands in for: the chunk filter against polyphase.py and float_to_s16, the
RTP header read and written directly against aiortc's parse and serialize, the jitter tick's
one-packet case against packets of other durations."""

from __future__ import annotations

import numpy as np
import pytest
from aiortc.rtp import RtpPacket

from agent.audio.pcm import float_to_s16
from agent.audio.polyphase import PolyphaseResampler
from agent.telephony.g711 import mulaw_decode, mulaw_encode
from agent.telephony.resample import ChunkFilter, ChunkResampler
from agent.telephony.rtp_jitter import Concealer, InboundTicks, JitterBuffer
from agent.telephony.rtp_leg import parse_rtp


@pytest.mark.parametrize("source, target", [(24000, 8000), (24000, 16000), (8000, 24000),
                                            (16000, 24000)])
def test_chunk_filter_is_the_polyphase_filter_bit_for_bit(source: int, target: int) -> None:
    chunk = source // 50
    general, fast = PolyphaseResampler(source, target, chunk), ChunkFilter(source, target, chunk)
    rng = np.random.default_rng(7)
    for index in range(200):
        # loud chunks clip, silence (None) still rings out the filter's history
        samples = None if index % 9 == 4 else (
            rng.standard_normal(chunk) * (2.0 if index % 5 == 0 else 0.3)).astype(np.float32)
        expected = float_to_s16(general.convert(
            np.zeros(chunk, dtype=np.float32) if samples is None else samples))
        assert np.array_equal(fast.convert(samples), expected), index


def test_a_leg_resampler_takes_the_chunk_filter_and_keeps_its_output() -> None:
    resampler = ChunkResampler(24000, 8000)
    general = PolyphaseResampler(24000, 8000, 480)
    chunk = (np.sin(np.arange(480) / 7) * 0.5).astype(np.float32)
    for _ in range(5):
        assert np.array_equal(resampler.convert(chunk), float_to_s16(general.convert(chunk)))
    first = resampler.convert(chunk)
    assert not np.shares_memory(first, resampler.convert(chunk))  # a chunk is the caller's


@pytest.mark.parametrize("data", [
    RtpPacket(payload_type=0, marker=1, sequence_number=65535, timestamp=0xFFFFFFFF,
              ssrc=0xDEADBEEF, payload=bytes(range(160))).serialize(),
    RtpPacket(payload_type=101, sequence_number=7, timestamp=8, ssrc=9,
              payload=b"\x01\x8a\x03\x20").serialize(),
    RtpPacket(payload_type=8, sequence_number=1, timestamp=2, ssrc=3, payload=b"").serialize(),
    # not the plain header (two CSRCs; padding): aiortc's parse
    b"\x82\x00\x00\x01" + bytes(8) + bytes(range(8)) + b"x" * 160,
    b"\xa0\x00\x00\x01" + bytes(8) + b"x" * 160 + b"\x00\x02",
])
def test_parse_rtp_reads_what_aiortc_reads(data: bytes) -> None:
    ours, theirs = parse_rtp(data), RtpPacket.parse(data)
    for name in ("version", "marker", "payload_type", "sequence_number", "timestamp", "ssrc",
                 "payload", "csrc"):
        assert getattr(ours, name) == getattr(theirs, name), name


@pytest.mark.parametrize("data", [b"", b"\x80" * 11, b"\x40" + bytes(20), b"\x8f" + bytes(12)])
def test_parse_rtp_refuses_what_aiortc_refuses(data: bytes) -> None:
    with pytest.raises(ValueError):
        RtpPacket.parse(data)
    with pytest.raises(ValueError):
        parse_rtp(data)


@pytest.mark.parametrize("packet_samples", [160, 80, 240, 185])
def test_jitter_ticks_play_the_same_samples_whatever_the_packet_duration(
        packet_samples: int) -> None:
    pcm = (np.sin(np.arange(160 * 60) / 5) * 9000).astype(np.int16)
    ticks = InboundTicks(JitterBuffer(3), Concealer(160), 160, 480)
    starts = list(range(0, len(pcm) - packet_samples + 1, packet_samples))
    played, sent = [], 0
    for tick in range(len(pcm) // 160 + 4):  # a packet is pushed once its audio is over
        while sent < len(starts) and starts[sent] + packet_samples <= (tick + 1) * 160:
            ticks.note_packet_samples(packet_samples)
            ticks.buffer.push(sent, mulaw_encode(pcm[starts[sent]:starts[sent] + packet_samples]))
            sent += 1
        chunk = ticks.tick(mulaw_decode)
        if chunk is not None:
            played.append(chunk)
    out = np.concatenate(played)
    expected = mulaw_decode(mulaw_encode(pcm[:len(out)]))
    assert len(out) >= len(pcm) - 2 * packet_samples - 160
    assert np.array_equal(out, expected)
    assert all(len(chunk) == 160 for chunk in played[:-2])
    assert ticks.packet_samples == packet_samples
