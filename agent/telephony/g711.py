"""G.711 μ-law and A-law as numpy lookup tables.

Python's `audioop` is gone in 3.13. PyAV's `pcm_mulaw`/`pcm_alaw` codecs work, but need an
`AudioFrame`/`Packet` round trip per 20 ms chunk: measured 4.5 us to encode and 4.1 us to
decode 160 samples, against 1.2 us for an indexed load here, with no objects to build or
keep per call. Decoding is a 256-entry table (identical to FFmpeg's, checked in
tests/telephony/test_g711_tables.py); encoding is a 65536-entry table that maps every int16
sample to the code whose decoded value is nearest (FFmpeg rounds at 14-bit resolution, so
the two differ by one step on about 0.6% of samples, all sitting on a midpoint between two
levels).
"""

from __future__ import annotations

import numpy as np

MULAW_SILENCE = 0xFF  # μ-law "positive zero"
ALAW_SILENCE = 0xD5  # A-law has no zero; this is +8, the quietest positive level


def _mulaw_decode_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF  # μ-law codes are sent inverted
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55  # even bits are sent inverted
    segment = (codes & 0x70) >> 4
    magnitude = ((codes & 0x0F) << 4) + np.where(segment == 0, 8, 0x108)
    magnitude = np.where(segment > 1, magnitude << np.maximum(segment - 1, 0), magnitude)
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


def _nearest_code_table(decode: np.ndarray, zero_code: int) -> np.ndarray:
    """Index by an int16 sample viewed as uint16; holds the code nearest to that sample."""
    levels = decode.astype(np.int32)
    order = np.argsort(levels, kind="stable")
    sorted_levels = levels[order]
    unique_levels, first = np.unique(sorted_levels, return_index=True)
    codes_for_levels = order[first].astype(np.uint8)
    # Two codes share a level only at zero (μ-law ±0); prefer the conventional silence code.
    codes_for_levels[unique_levels == levels[zero_code]] = zero_code
    samples = np.arange(-32768, 32768, dtype=np.int32)
    midpoints = (unique_levels[:-1] + unique_levels[1:]) / 2.0
    # A sample exactly on a midpoint goes to the level with the smaller magnitude.
    index = np.where(
        samples < 0,
        np.searchsorted(midpoints, samples, side="right"),
        np.searchsorted(midpoints, samples, side="left"),
    )
    index = np.clip(index, 0, len(unique_levels) - 1)
    by_sample = codes_for_levels[index]
    table = np.empty(65536, dtype=np.uint8)
    table[samples.astype(np.int16).view(np.uint16)] = by_sample
    table[0] = zero_code  # digital silence encodes as the codec's silence byte
    return table


MULAW_DECODE = _mulaw_decode_table()
ALAW_DECODE = _alaw_decode_table()
MULAW_ENCODE = _nearest_code_table(MULAW_DECODE, MULAW_SILENCE)
ALAW_ENCODE = _nearest_code_table(ALAW_DECODE, ALAW_SILENCE)


def _as_int16(samples: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(samples, dtype=np.int16)


def mulaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples → μ-law bytes."""
    return MULAW_ENCODE[_as_int16(samples).view(np.uint16)].tobytes()


def mulaw_decode(payload: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    return MULAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]


def alaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples → A-law bytes."""
    return ALAW_ENCODE[_as_int16(samples).view(np.uint16)].tobytes()


def alaw_decode(payload: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    return ALAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]
