"""The numpy G.711 tables against FFmpeg's pcm_mulaw/pcm_alaw (through PyAV) and the L16 codec."""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np
import pytest

from agent.telephony import g711
from agent.telephony.codec import L16_16K, PCMA, PCMU, codec_by_name

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)


def _ffmpeg(codec_name: str, mode: str) -> av.CodecContext:
    context = av.CodecContext.create(codec_name, mode)
    context.sample_rate = 8000
    context.format = "s16"
    context.layout = "mono"
    return context


def _ffmpeg_decode(codec_name: str, payload: bytes) -> np.ndarray:
    frames = _ffmpeg(codec_name, "r").decode(av.Packet(payload))
    return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames])


def _ffmpeg_encode(codec_name: str, samples: np.ndarray) -> bytes:
    encoder = _ffmpeg(codec_name, "w")
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 8000
    packets = list(encoder.encode(frame)) + list(encoder.encode(None))
    return b"".join(bytes(packet) for packet in packets)


CASES = [
    ("pcm_mulaw", g711.mulaw_encode, g711.mulaw_decode),
    ("pcm_alaw", g711.alaw_encode, g711.alaw_decode),
]


@pytest.mark.parametrize(("ffmpeg_name", "encode", "decode"), CASES)
def test_decode_matches_ffmpeg_for_every_code(
    ffmpeg_name: str, encode: Callable[[np.ndarray], bytes], decode: Callable[[bytes], np.ndarray],
) -> None:
    every_code = bytes(range(256))
    assert np.array_equal(decode(every_code), _ffmpeg_decode(ffmpeg_name, every_code))


@pytest.mark.parametrize(("ffmpeg_name", "encode", "decode"), CASES)
def test_encode_picks_the_nearest_level(
    ffmpeg_name: str, encode: Callable[[np.ndarray], bytes], decode: Callable[[bytes], np.ndarray],
) -> None:
    ours = decode(encode(ALL_SAMPLES)).astype(np.int32)
    theirs = decode(_ffmpeg_encode(ffmpeg_name, ALL_SAMPLES)).astype(np.int32)
    error_ours = np.abs(ours - ALL_SAMPLES)
    error_theirs = np.abs(theirs - ALL_SAMPLES)
    # Never worse than FFmpeg's encoder, sample by sample, and the same code almost always
    # (FFmpeg rounds at 14-bit resolution, so midpoints can go either way).
    assert np.all(error_ours <= error_theirs)
    same = np.frombuffer(encode(ALL_SAMPLES), np.uint8) == np.frombuffer(
        _ffmpeg_encode(ffmpeg_name, ALL_SAMPLES), np.uint8)
    assert same.mean() > 0.99


def test_silence_bytes_and_round_trip_error() -> None:
    assert g711.mulaw_encode(np.zeros(4, np.int16)) == b"\xff" * 4
    assert g711.alaw_encode(np.zeros(4, np.int16)) == b"\xd5" * 4
    speech_range = ALL_SAMPLES[np.abs(ALL_SAMPLES.astype(np.int32)) < 30000]
    for encode, decode, worst in ((g711.mulaw_encode, g711.mulaw_decode, 512),
                                  (g711.alaw_encode, g711.alaw_decode, 512)):
        error = np.abs(decode(encode(speech_range)).astype(np.int32) - speech_range)
        assert error.max() <= worst
        # Companding: small samples keep small errors.
        quiet = np.abs(speech_range.astype(np.int32)) < 256
        assert error[quiet].max() <= 8


def test_codec_table() -> None:
    assert codec_by_name("pcmu") is PCMU and codec_by_name(" PCMA ") is PCMA
    assert codec_by_name("l16/16000") is L16_16K and codec_by_name("G722") is None
    assert (PCMU.payload_type, PCMA.payload_type, L16_16K.payload_type) == (0, 8, None)
    assert (PCMU.samples_per_chunk, L16_16K.samples_per_chunk) == (160, 320)
    samples = np.array([0, 1, -1, 32767, -32768, 258], dtype=np.int16)
    payload = L16_16K.encode(samples)
    assert payload[:6] == b"\x00\x00\x00\x01\xff\xff"  # network byte order
    assert np.array_equal(L16_16K.decode(payload), samples)
    assert len(L16_16K.decode(payload + b"\x01")) == len(samples)  # a stray odd byte is ignored
