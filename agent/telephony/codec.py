"""The narrowband codecs telephony legs speak, with their RTP payload types."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.audio.pcm import PTIME
from agent.telephony import g711, g722


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
    samples_per_byte: int = 1  # G.722: 2
    rtp_clock_rate: int | None = None  # when not the sample rate (G.722: 8000, RFC 3551)
    # A stateful codec (G.722's ADPCM): makes one leg's own encode and decode.
    new_state: Callable[[], tuple[Callable[[np.ndarray], bytes],
                                  Callable[[bytes], np.ndarray]]] | None = None

    def samples_in(self, payload: bytes) -> int:
        """How many samples a payload carries (its duration, whatever the sender's ptime)."""
        return len(payload) * self.samples_per_byte // self.bytes_per_sample

    @property
    def encoding(self) -> str:
        """The encoding name in SDP's rtpmap: "PCMU", "G722", "L16"."""
        return self.name.split("/", 1)[0]

    @property
    def rtp_clock(self) -> int:
        return self.rtp_clock_rate or self.sample_rate

    @property
    def rtp_samples_per_chunk(self) -> int:
        """The RTP timestamp step of one 20 ms chunk."""
        return int(self.rtp_clock * PTIME)

    def for_leg(self) -> NarrowbandCodec:
        """The codec one leg uses: this one, or a copy with its own state when stateful."""
        if self.new_state is None:
            return self
        encode, decode = self.new_state()
        return dataclasses.replace(self, encode=encode, decode=decode, new_state=None)

    @property
    def samples_per_chunk(self) -> int:
        return int(self.sample_rate * PTIME)


PCMU = NarrowbandCodec("PCMU", 8000, 0, g711.mulaw_encode, g711.mulaw_decode)
PCMA = NarrowbandCodec("PCMA", 8000, 8, g711.alaw_encode, g711.alaw_decode)
L16_16K = NarrowbandCodec("L16/16000", 16000, None, _l16_encode, _l16_decode, bytes_per_sample=2)


def _g722_state() -> tuple[Callable[[np.ndarray], bytes], Callable[[bytes], np.ndarray]]:
    return g722.G722Encoder().encode, g722.G722Decoder().decode


def _template_encode(samples: np.ndarray) -> bytes:
    raise RuntimeError("G.722 is stateful: encode through codec.for_leg()")


def _template_decode(payload: bytes) -> np.ndarray:
    raise RuntimeError("G.722 is stateful: decode through codec.for_leg()")


# The template: every leg takes its own encoder/decoder pair from for_leg().
G722 = NarrowbandCodec("G722", g722.SAMPLE_RATE, g722.STATIC_PAYLOAD_TYPE, _template_encode,
                       _template_decode, samples_per_byte=2, rtp_clock_rate=g722.RTP_CLOCK_RATE,
                       new_state=_g722_state)

CODECS = {codec.name.lower(): codec for codec in (PCMU, PCMA, L16_16K)}


def codec_by_name(name: str) -> NarrowbandCodec | None:
    return CODECS.get(name.strip().lower())
