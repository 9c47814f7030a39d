"""G.711 (PCMU, PCMA) for the peer's phone transports, at the peer's 48 kHz.

The companding tables come from FFmpeg's own `pcm_mulaw`/`pcm_alaw` codecs (through PyAV),
built once: every 16-bit value encoded and every byte decoded. Per packet the work is then a
numpy table look-up plus libswresample between 48 kHz and 8 kHz, which keeps a peer placing
many calls far cheaper than the agent it tests. Audio kept as bytes for after the call
(`decode_many`) is upsampled in one go by `downsample.upsample` (a zero-phase FIR as matrix
products, ~14x cheaper than libswresample over a whole call, within -55 dB of its output and
on the same sample grid). The agent's own G.711 is not imported: the
peer is a client of the public interfaces, and the layering keeps agent.testing off
agent.telephony.
"""

from __future__ import annotations

import functools
from typing import cast

import av
import numpy as np

from agent.audio.pcm import float_to_s16
from agent.testing.peer.downsample import upsample

NARROW_RATE = 8000
SAMPLES_PER_PACKET = 160  # 20 ms at 8 kHz
PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}
_FFMPEG_CODECS = {"PCMU": "pcm_mulaw", "PCMA": "pcm_alaw"}


@functools.lru_cache(maxsize=4)
def _tables(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(encode: 65536 bytes indexed by s16 + 32768, decode: 256 s16 values)."""
    codec = _FFMPEG_CODECS[name]
    encoder = cast(av.AudioCodecContext, av.CodecContext.create(codec, "w"))
    encoder.sample_rate, encoder.format, encoder.layout = NARROW_RATE, "s16", "mono"
    every = np.arange(-32768, 32768, dtype=np.int16).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(every, format="s16", layout="mono")
    frame.sample_rate = NARROW_RATE
    encoded = b"".join(bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)])
    decoder = cast(av.AudioCodecContext, av.CodecContext.create(codec, "r"))
    decoder.sample_rate, decoder.layout = NARROW_RATE, "mono"
    decoded = np.concatenate([f.to_ndarray().reshape(-1)
                              for f in decoder.decode(av.Packet(bytes(range(256))))])
    return np.frombuffer(encoded, dtype=np.uint8).copy(), decoded.astype(np.int16)


def codec_name(name: str | None) -> str:
    """PCMU or PCMA (case-insensitive); ValueError otherwise."""
    upper = (name or "PCMU").upper()
    if upper not in PAYLOAD_TYPES:
        raise ValueError(f"codec {name!r}: the phone transports speak PCMU or PCMA")
    return upper


class NarrowbandCodec:
    """One direction's G.711 with its resampler (it keeps filter state between packets)."""

    def __init__(self, name: str, rate: int) -> None:
        self.name = codec_name(name)
        self.payload_type = PAYLOAD_TYPES[self.name]
        self.rate = rate
        self._encode_table, self._decode_table = _tables(self.name)
        self._down = av.AudioResampler(format="s16", layout="mono", rate=NARROW_RATE)
        self._up = av.AudioResampler(format="flt", layout="mono", rate=rate)

    def encode(self, samples: np.ndarray) -> bytes:
        """Float32 at `rate` → G.711 bytes (one byte per 8 kHz sample)."""
        frame = av.AudioFrame.from_ndarray(float_to_s16(samples).reshape(1, -1), format="s16",
                                           layout="mono")
        frame.sample_rate = self.rate
        parts = [f.to_ndarray().reshape(-1) for f in self._down.resample(frame)]
        if not parts:
            return b""
        pcm = np.concatenate(parts).astype(np.int32) + 32768
        return bytes(self._encode_table[pcm])

    def encode_packets(self, samples: np.ndarray) -> list[bytes]:
        """A whole piece of audio (a multiple of 20 ms at `rate`) → one payload per 20 ms,
        resampled in one go (a resampler of its own, flushed: the piece ends in itself)."""
        resampler = av.AudioResampler(format="s16", layout="mono", rate=NARROW_RATE)
        frame = av.AudioFrame.from_ndarray(float_to_s16(samples).reshape(1, -1), format="s16",
                                           layout="mono")
        frame.sample_rate = self.rate
        parts = [f.to_ndarray().reshape(-1)
                 for f in [*resampler.resample(frame), *resampler.resample(None)]]
        packets = len(samples) * NARROW_RATE // self.rate // SAMPLES_PER_PACKET
        pcm = np.zeros(packets * SAMPLES_PER_PACKET, dtype=np.int32)
        if parts:
            narrow = np.concatenate(parts)[: len(pcm)]
            pcm[: len(narrow)] = narrow
        encoded = self._encode_table[pcm + 32768].tobytes()
        return [encoded[i : i + SAMPLES_PER_PACKET]
                for i in range(0, len(encoded), SAMPLES_PER_PACKET)]

    @property
    def silence(self) -> bytes:
        """20 ms of digital silence."""
        return bytes(self._encode_table[np.full(SAMPLES_PER_PACKET, 32768)])

    def decode_many(self, payloads: list[bytes]) -> list[np.ndarray]:
        """Many payloads decoded in one resampling pass (a call's audio kept for after it):
        one array per payload, the length and timing `decode` would give them one by one."""
        if not payloads:
            return []
        pcm = self._decode_table[np.frombuffer(b"".join(payloads), dtype=np.uint8)]
        if self.rate % NARROW_RATE:
            whole = np.concatenate([self.decode(b"".join(payloads)), self.flush()])
        else:
            whole = upsample(pcm.astype(np.float32) * np.float32(1 / 32768),
                             self.rate // NARROW_RATE)
        pieces, start = [], 0
        for payload in payloads:
            end = start + len(payload) * self.rate // NARROW_RATE
            pieces.append(whole[start:end])
            start = end
        return pieces

    def flush(self) -> np.ndarray:
        """What the upsampler still holds (the end of the last payload)."""
        parts = [f.to_ndarray().reshape(-1) for f in self._up.resample(None)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def decode(self, payload: bytes) -> np.ndarray:
        """G.711 bytes → float32 at `rate`."""
        pcm = self._decode_table[np.frombuffer(payload, dtype=np.uint8)]
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = NARROW_RATE
        parts = [f.to_ndarray().reshape(-1) for f in self._up.resample(frame)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
