"""The narrowband codecs telephony legs speak, with their RTP payload types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.audio.pcm import PTIME
from agent.telephony import g711


def _l16_encode(samples: np.ndarray) -> bytes:
    # RFC 3551 L16 is big-endian ("network byte order").
    return np.ascontiguousarray(samples, dtype=">i2").tobytes()


def _l16_decode(payload: bytes) -> np.ndarray:
    usable = len(payload) - len(payload) % 2
    return np.frombuffer(payload[:usable], dtype=">i2").astype(np.int16)


@dataclass(frozen=True)
class NarrowbandCodec:
    name: str  # as a client names it: "PCMU", "PCMA", "L16/16000"
    sample_rate: int
    payload_type: int | None  # static RTP payload type; None: dynamic (96-127)
    encode: Callable[[np.ndarray], bytes]  # int16 mono → payload
    decode: Callable[[bytes], np.ndarray]  # payload → int16 mono
    bytes_per_sample: int = 1

    def samples_in(self, payload: bytes) -> int:
        """How many samples a payload carries (its duration, whatever the sender's ptime)."""
        return len(payload) // self.bytes_per_sample

    @property
    def samples_per_chunk(self) -> int:
        return int(self.sample_rate * PTIME)


PCMU = NarrowbandCodec("PCMU", 8000, 0, g711.mulaw_encode, g711.mulaw_decode)
PCMA = NarrowbandCodec("PCMA", 8000, 8, g711.alaw_encode, g711.alaw_decode)
L16_16K = NarrowbandCodec("L16/16000", 16000, None, _l16_encode, _l16_decode, bytes_per_sample=2)

CODECS = {codec.name.lower(): codec for codec in (PCMU, PCMA, L16_16K)}


def codec_by_name(name: str) -> NarrowbandCodec | None:
    return CODECS.get(name.strip().lower())
