"""Integer-factor downsampling of a finished recording (48 kHz → the VAD's 16 kHz, the echo
measurement's 8 kHz): a windowed-sinc low-pass FIR evaluated only at the kept samples.

Written here rather than taken from a library because of what the peer pays per call and per
process: `agent.testing.testsignal.decimate` is an FFT over the whole call, slow for the
lengths with a large prime factor that a call's pieces add up to, and scipy's
`resample_poly` (the same polyphase idea) costs ~0.6 s of CPU just to import
`scipy.signal`, in every peer process. The filter is zero-phase (centred), so output sample
k lies exactly at input sample k × factor: the VAD's edges and the echo's lag keep their
times.
"""

from __future__ import annotations

import functools

import numpy as np

TAPS_PER_FACTOR = 32  # filter length = this × factor + 1
PASSBAND = 0.9  # the cut-off as a share of the new Nyquist frequency
KAISER_BETA = 8.0  # ~80 dB stop-band


@functools.lru_cache(maxsize=8)
def lowpass(factor: int) -> np.ndarray:
    """The FIR for `factor`: odd length, symmetric, unit gain at DC."""
    length = TAPS_PER_FACTOR * factor + 1
    n = np.arange(length) - length // 2
    cutoff = PASSBAND / factor / 2  # cycles per input sample
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(length, KAISER_BETA)
    taps /= taps.sum()
    taps.flags.writeable = False
    return taps


def downsample(samples: np.ndarray, factor: int) -> np.ndarray:
    """Float64 `samples` band-limited and kept every `factor`-th (ceil(len / factor) out)."""
    audio = np.asarray(samples, dtype=np.float64).reshape(-1)
    if factor <= 1 or len(audio) == 0:
        return audio.copy()
    taps = lowpass(factor)
    half = len(taps) // 2
    count = -(-len(audio) // factor)
    # Output k is taps · padded[k*factor : k*factor + len(taps)] (the taps are symmetric).
    # Split by phase p = j mod factor, that is one short correlation per phase over every
    # factor-th input sample: len(taps) / factor multiplications per output sample.
    padded = np.zeros(count * factor + len(taps), dtype=np.float64)
    padded[half : half + len(audio)] = audio
    out = np.zeros(count, dtype=np.float64)
    for phase in range(factor):
        out += np.correlate(padded[phase::factor], taps[phase::factor], mode="valid")[:count]
    return out
