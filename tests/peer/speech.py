"""Speech-like test audio for the peer's tests: bursts of the built-in test signal (band-limited
noise, which the voice-activity detector hears as speech) at known times, and silence."""

from __future__ import annotations

import numpy as np

from agent.testing.testsignal import band_limited_noise, make_test_signal

RATE = 48000


def bursts(spans: list[tuple[float, float]], seconds: float, seed: int = 7) -> np.ndarray:
    """Float32 mono at 48 kHz: the test signal on each (start, end), silence elsewhere."""
    out = np.zeros(int(seconds * RATE), dtype=np.float32)
    for number, (start, end) in enumerate(spans):
        piece = make_test_signal(end - start, RATE, seed=seed + number)
        at = int(start * RATE)
        out[at : at + len(piece)] = piece[: len(out) - at]
    return out


def sharp_burst(seconds: float, seed: int = 11, edge: float = 0.005) -> np.ndarray:
    """Float32 mono at 48 kHz: the test signal's noise at the same level with `edge`-second
    raised-cosine edges instead of its 100 ms fades, so its start and end are sharp enough
    for a codec to keep (a codec may drop the quiet first milliseconds of a slow fade-in)."""
    count = int(seconds * RATE)
    noise = band_limited_noise(count, RATE, 300, 3400, seed)
    noise *= 0.25 / np.sqrt(np.mean(noise**2))
    ramp = int(edge * RATE)
    shape = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, ramp))
    noise[:ramp] *= shape
    noise[-ramp:] *= shape[::-1]
    return noise.astype(np.float32)


def padded(samples: np.ndarray, seconds: float = 0.1) -> np.ndarray:
    """`samples` with `seconds` of silence before and after."""
    pad = np.zeros(int(seconds * RATE), dtype=np.float32)
    return np.concatenate([pad, samples, pad])
