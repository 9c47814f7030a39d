"""Encode outbound audio on the event loop, one RTP payload per 20 ms frame.

aiortc's sender hands every raw frame to a thread to encode and computes an RFC 6465 audio
level with a per-sample Python loop; both cost more than the encode itself for 20 ms of voice.
When a track returns an already-encoded `av.Packet`, the sender only packs it. So the agent's
outbound track encodes inline with a codec opened at the agent's own rate (libopus takes
24 kHz mono natively; G.711 gets one resample to 8 kHz).
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction
from typing import Literal

import av
import numpy as np

from agent.audio.pcm import PTIME

OPUS_BITRATE = 48_000
# libopus's complexity knob, 0-10: CPU per encoded frame against quality at the same bitrate.
# 10 is libopus's own default (and aiortc's). Measured here (benchmarks/opus_complexity_bench.py,
# 24 kHz mono speech at 48 kbit/s): 10 costs about twice 0 per frame.
OPUS_COMPLEXITY = 10
OPUS_COMPLEXITY_RANGE = range(0, 11)

# Opus's RTP clock runs at 48 kHz whatever rate it encodes (RFC 7587).
OPUS_RTP_CLOCK = 48000

# mime subtype (lowercase) → (ffmpeg encoder, encoder sample rate)
# (FFmpeg encoder names as literals: PyAV's CodecContext.create then types an audio context)
_CODECS: dict[str, tuple[Literal["libopus", "pcm_mulaw", "pcm_alaw"], int | None]] = {
    "opus": ("libopus", None),  # None: encode at the track's own rate
    "pcmu": ("pcm_mulaw", 8000),
    "pcma": ("pcm_alaw", 8000),
}


def supports_inline(mime_type: str) -> bool:
    return mime_type.lower().split("/")[-1] in _CODECS


class InlineAudioEncoder:
    """s16 mono frames of `ptime` at `sample_rate` in, one `av.Packet` each out."""

    def __init__(self, mime_type: str, sample_rate: int,
                 opus_complexity: int = OPUS_COMPLEXITY) -> None:
        if opus_complexity not in OPUS_COMPLEXITY_RANGE:
            raise ValueError(f"Opus complexity must be 0-10, not {opus_complexity}")
        encoder_name, encoder_rate = _CODECS[mime_type.lower().split("/")[-1]]
        if encoder_name == "libopus" and sample_rate not in (8000, 12000, 16000, 24000, 48000):
            encoder_rate = 48000
        self.rate = encoder_rate or sample_rate
        self.samples_per_packet = int(self.rate * PTIME)
        self._codec = av.CodecContext.create(encoder_name, "w")
        self._codec.sample_rate = self.rate
        self._codec.format = "s16"
        self._codec.layout = "mono"
        self._codec.time_base = Fraction(1, self.rate)
        if encoder_name == "libopus":
            self._codec.bit_rate = OPUS_BITRATE
            # FFmpeg's libopus wrapper takes complexity as its compression_level.
            self._codec.options = {"application": "lowdelay",
                                   "compression_level": str(opus_complexity)}
        self._resampler = (
            av.AudioResampler(
                format="s16", layout="mono", rate=self.rate, frame_size=self.samples_per_packet
            )
            if self.rate != sample_rate
            else None
        )
        self._source_rate = sample_rate
        self._pending: deque[bytes] = deque()
        # Packets are stamped in the RTP clock's own units, so aiortc's packer takes the pts
        # as it is instead of converting it through Fractions for every packet.
        clock_rate = OPUS_RTP_CLOCK if encoder_name == "libopus" else self.rate
        self._time_base = Fraction(1, clock_rate)
        self._ticks_per_packet = self.samples_per_packet * clock_rate // self.rate
        self._timestamp = 0
        if self._resampler is not None:
            # The resampler's filter delay makes the first frame yield nothing; prime it so
            # every later frame yields exactly one packet.
            self._encode_raw(np.zeros(int(sample_rate * PTIME), dtype=np.int16))
            self._pending.clear()

    def encode(self, samples: np.ndarray) -> av.Packet:
        """One packet for 20 ms of s16 mono samples at the source rate."""
        self._encode_raw(samples)
        payload = self._pending.popleft() if self._pending else self._silence_payload()
        packet = av.Packet(payload)
        packet.pts = self._timestamp
        packet.time_base = self._time_base
        self._timestamp += self._ticks_per_packet
        return packet

    def _encode_raw(self, samples: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self._source_rate
        frames = self._resampler.resample(frame) if self._resampler is not None else [frame]
        for chunk in frames:
            for packet in self._codec.encode(chunk):
                self._pending.append(bytes(packet))

    def _silence_payload(self) -> bytes:
        # Only reached if the codec buffered a frame; keeps the RTP clock continuous.
        self._encode_raw(np.zeros(int(self._source_rate * PTIME), dtype=np.int16))
        return self._pending.popleft() if self._pending else b""
