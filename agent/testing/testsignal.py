"""A built-in test signal and the measurements made on its echo.

The signal is band-limited noise (300-3400 Hz, so it survives G.711 as well as Opus) that
never repeats, so cross-correlating what came back with what was sent finds one unambiguous
delay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ANALYSIS_RATE = 8000


def band_limited_noise(count: int, sample_rate: int, low_hz: float, high_hz: float,
                       seed: int) -> np.ndarray:
    """Seeded white noise with everything outside [low_hz, high_hz] removed (float64)."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(count))
    freqs = np.fft.rfftfreq(count, 1 / sample_rate)
    spectrum[(freqs < low_hz) | (freqs > high_hz)] = 0
    return np.fft.irfft(spectrum, count)


def make_test_signal(seconds: float, sample_rate: int = 48000, seed: int = 7,
                level: float = 0.25) -> np.ndarray:
    """Float32 mono band-limited noise with a 100 ms fade in/out."""
    count = int(seconds * sample_rate)
    signal = band_limited_noise(count, sample_rate, 300, 3400, seed)
    signal *= level / (np.sqrt(np.mean(signal**2)) + 1e-12)
    fade = min(count // 2, int(0.1 * sample_rate))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade)
        signal[:fade] *= ramp
        signal[-fade:] *= ramp[::-1]
    return np.clip(signal, -1, 1).astype(np.float32)


def decimate(samples: np.ndarray, sample_rate: int, target: int = ANALYSIS_RATE) -> np.ndarray:
    """Band-limit by FFT and keep every n-th sample (rates here are integer multiples)."""
    factor = sample_rate // target
    if factor <= 1:
        return samples.astype(np.float64)
    spectrum = np.fft.rfft(samples.astype(np.float64))
    freqs = np.fft.rfftfreq(len(samples), 1 / sample_rate)
    spectrum[freqs > target / 2] = 0
    return np.fft.irfft(spectrum, len(samples))[::factor]


@dataclass
class EchoMeasurement:
    lag_seconds: float  # where `received` best matches `sent` overall (received lags by this)
    correlation: float  # mean normalized correlation of the windows after `skip` seconds
    windows: int = 0  # analysis windows that carried signal
    holes: int = 0  # windows that did not come back recognisably (score < 0.5)
    lag_spread_seconds: float = 0.0  # max - min of the per-window lags (drops/inserts)


WINDOW_SECONDS = 0.25
TRACK_SECONDS = 0.25  # how far a window's lag may wander from the overall lag


def _normalized(a: np.ndarray, b: np.ndarray) -> float:
    denom = np.sqrt(np.sum(a * a) * np.sum(b * b))
    return float(np.sum(a * b) / denom) if denom > 0 else 0.0


def coarse_lag(s: np.ndarray, r: np.ndarray, max_lag: int) -> int:
    """The lag (0..max_lag samples) at which `r` best matches `s`: FFT cross-correlation."""
    size = 1 << int(np.ceil(np.log2(len(s) + len(r))))
    xcorr = np.fft.irfft(np.fft.rfft(r, size) * np.conj(np.fft.rfft(s, size)), size)
    return int(np.argmax(xcorr[: max_lag + 1]))


def measure_echo(sent: np.ndarray, received: np.ndarray, sample_rate: int,
                 max_lag_seconds: float = 2.0, skip_seconds: float = 1.0) -> EchoMeasurement:
    """Find the echo's delay, then score how faithfully each 250 ms of it came back.

    Each window gets its own best lag near the overall one, so a real-time path that drops
    or inserts a frame after a stall is scored on what it played, not failed outright; the
    spread of the window lags reports such shifts.
    """
    if len(sent) == 0 or len(received) == 0:
        return EchoMeasurement(0.0, 0.0)
    rate = ANALYSIS_RATE
    factor = max(1, sample_rate // rate)
    s = decimate(sent, sample_rate)
    r = decimate(received, sample_rate)
    coarse = coarse_lag(s, r, min(int(max_lag_seconds * rate), len(r) - 1)) * factor
    # Refine to a full-rate sample, then shift `received` so the lag is a whole number of
    # analysis samples: a fractional-sample misalignment at 8 kHz would cost correlation at
    # the top of the band that the path did not lose.
    span = min(len(sent), len(received) - coarse - factor) if len(received) > coarse + factor else 0
    fine = coarse
    if span > 0:
        candidates = range(max(0, coarse - factor), coarse + factor + 1)
        fine = max(candidates, key=lambda k: float(np.dot(received[k : k + span], sent[:span])))
    r = decimate(received[fine % factor :], sample_rate)
    lag = fine // factor
    window = int(WINDOW_SECONDS * rate)
    track = int(TRACK_SECONDS * rate)
    scores: list[float] = []
    lags: list[int] = []
    for start in range(lag + int(skip_seconds * rate), len(r) - window + 1, window):
        piece = r[start : start + window]
        lo = max(0, start - lag - track)
        hi = min(len(s), start - lag + track + window)
        reference = s[lo:hi]
        if len(reference) < window or np.sum(reference**2) == 0:
            continue
        local = np.correlate(reference, piece, mode="valid")
        offset = int(np.argmax(local))
        scores.append(_normalized(piece, reference[offset : offset + window]))
        lags.append(start - (lo + offset))
    if not scores:
        return EchoMeasurement(fine / sample_rate, 0.0)
    spread = (max(lags) - min(lags)) / rate
    holes = sum(1 for score in scores if score < 0.5)
    return EchoMeasurement(fine / sample_rate, float(np.mean(scores)), len(scores), holes, spread)
