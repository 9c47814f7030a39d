"""G.722 (ITU-T, 64 kbit/s sub-band ADPCM) for telephony legs, through FFmpeg's codec in PyAV.

G.722 carries 16 kHz audio (50-7000 Hz): a wideband call for the model at the bit rate of
G.711. Its encoder and decoder are adaptive (ADPCM predictors), so each leg needs its own
pair: `G722.for_leg()` (agent/telephony/codec.py) makes one per leg. RFC 3551 §4.5.2 keeps
its RTP clock at 8000 Hz although it samples at 16000 (a mistake in RFC 1890 kept for
compatibility): 20 ms is 320 samples, 160 bytes, and a timestamp step of 160.

PyAV (FFmpeg's `g722` encoder and decoder) is already a dependency of aiortc; no G.722 of
our own is written here.
"""

from __future__ import annotations

from typing import Literal

import av
import numpy as np
from av.audio.frame import AudioFrame

SAMPLE_RATE = 16000
RTP_CLOCK_RATE = 8000  # RFC 3551: G.722's RTP clock, whatever it samples at
STATIC_PAYLOAD_TYPE = 9


def _open_context(mode: Literal["r", "w"]) -> av.AudioCodecContext:
    """FFmpeg's G.722 codec, mono at 16 kHz: "w" encodes int16 samples, "r" decodes."""
    context = av.CodecContext.create("g722", mode)
    assert isinstance(context, av.AudioCodecContext)
    context.sample_rate = SAMPLE_RATE
    if mode == "w":
        context.format = "s16"
    context.layout = "mono"
    context.open()
    return context


class G722Encoder:
    """int16 mono at 16 kHz → G.722 bytes (4 bits a sample pair: 320 samples, 160 bytes)."""

    def __init__(self) -> None:
        self._context = _open_context("w")

    def encode(self, samples: np.ndarray) -> bytes:
        """Whole 20 ms chunks come out at once; other sizes are buffered to 320 samples."""
        if len(samples) == 0:
            return b""
        frame = AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1),
            format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        return b"".join(bytes(packet) for packet in self._context.encode(frame))


class G722Decoder:
    """G.722 bytes → int16 mono at 16 kHz (two samples a byte)."""

    def __init__(self) -> None:
        self._context = _open_context("r")

    def decode(self, payload: bytes) -> np.ndarray:
        if not payload:
            return np.zeros(0, dtype=np.int16)
        try:
            frames = self._context.decode(av.packet.Packet(payload))
        except av.FFmpegError:  # every byte string is G.722; kept as a guard all the same
            return np.zeros(0, dtype=np.int16)
        if not frames:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames]).astype(
            np.int16, copy=False)
