"""Speech-like test audio for the peer's tests: bursts of the built-in test signal (band-limited
noise, which the voice-activity detector hears as speech) at known times, and silence."""

from __future__ import annotations

import numpy as np

from agent.testing.testsignal import make_test_signal

RATE = 48000


def bursts(spans: list[tuple[float, float]], seconds: float, seed: int = 7) -> np.ndarray:
    """Float32 mono at 48 kHz: the test signal on each (start, end), silence elsewhere."""
    out = np.zeros(int(seconds * RATE), dtype=np.float32)
    for number, (start, end) in enumerate(spans):
        piece = make_test_signal(end - start, RATE, seed=seed + number)
        at = int(start * RATE)
        out[at : at + len(piece)] = piece[: len(out) - at]
    return out
