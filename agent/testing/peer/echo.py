"""The round-trip delay of an echo and how faithfully it came back, cheaply enough for a
load test's callers.

The measurement is the one `agent.testing.testsignal.measure_echo` makes (its
`EchoMeasurement`, plus the mean score of the windows that came back): the overall lag by
FFT cross-correlation (`coarse_lag`, shared with it), refined to the full-rate sample, then
every 250 ms window of what came back scored at its own best lag near the overall one (a path
that drops or inserts a frame is scored on what it played, and the spread of the window lags
shows the shift). The rest is written again here, rather than called,
because the peer pays for it after every call of a load test and two parts of it dominated
the peer's own CPU per call:

- the 48 → 8 kHz decimation was an FFT over the whole call, whose length (any number of
  20 ms pieces) often has a large prime factor; here it is a zero-phase FIR evaluated at the
  kept samples only (`downsample.py`), and each channel is decimated once: the overall lag
  is found on a 6-sample mean of what came back (its aliasing only adds a little noise to a
  correlation peak that the full-rate refinement then pins to the sample), so what came back
  is decimated once, already shifted by the refined lag's remainder, rather than once for the
  lag and again shifted. The overall lag's FFT cross-correlation runs at 2 kHz (a quarter
  of the work), then the 8 kHz lag is picked among the few that allow. The two decimated
  channels are handed back (`measure_keeping`) for the speech detection, which works at the
  same 8 kHz;
- each window searched ±250 ms around the overall lag (a 6000 × 2000 correlation, 16 of them
  for 4 s); here a window is first scored at the lag the previous window had (and one sample
  either side), and only a window that does not match there (score below `TRACKED`: a
  dropped or inserted frame, a hole) gets the full search.

One difference: the lag spread is over the windows that came back; a hole has no lag (its
best match is anywhere), and counted it made one hole look like a 250 ms shift.

Its figures agree with `measure_echo`'s to a sample and 0.01 of correlation on the same
audio (tests/peer/test_echo.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from agent.testing.peer.downsample import downsample
from agent.testing.testsignal import (
    ANALYSIS_RATE,
    TRACK_SECONDS,
    WINDOW_SECONDS,
    EchoMeasurement,
    coarse_lag,
)

TRACKED = 0.9  # a window scoring this at the tracked lag needs no search
HOLE = 0.5  # a window scoring below this did not come back recognisably
COARSE_STEP = 4  # the overall lag is first found at ANALYSIS_RATE / this


@dataclass
class Echo(EchoMeasurement):
    matched: float = 0.0  # mean score of the windows that came back (the holes left out)


@dataclass(frozen=True)
class Decimated:
    """What `measure_keeping` decimated to ANALYSIS_RATE: `sent` from sample 0, `received`
    from sample `received_from`."""

    sent: np.ndarray
    received: np.ndarray
    received_from: int
    factor: int


def to_analysis_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """Float32 at ANALYSIS_RATE (`rate` an integer multiple of it), band-limited."""
    return downsample(samples, max(1, rate // ANALYSIS_RATE))


def _block_means(samples: np.ndarray, factor: int) -> np.ndarray:
    """The mean of each `factor` samples centred on every factor-th one (a crude low-pass,
    enough to find a correlation peak)."""
    count = -(-len(samples) // factor)
    half = factor // 2
    padded = np.zeros((count + 1) * factor, dtype=np.float32)
    padded[half : half + len(samples)] = samples
    total = padded[0 : count * factor : factor].copy()
    for phase in range(1, factor):
        total += padded[phase : count * factor : factor]
    return cast(np.ndarray, total * np.float32(1 / factor))


def _overall_lag(s: np.ndarray, rough: np.ndarray, max_lag: int) -> int:
    """`coarse_lag(s, rough, max_lag)`, cheaper: the FFT cross-correlation at a quarter of the
    rate (a quarter of the FFT's work), then the 8 kHz lag among those it allows."""
    step = COARSE_STEP
    # (numpy's double-precision FFT is the faster one here)
    quarter = coarse_lag(downsample(s, step).astype(np.float64),
                         _block_means(rough, step).astype(np.float64), max_lag // step)
    lo, hi = max(0, quarter * step - step), min(max_lag, quarter * step + step)

    def at(lag: int) -> float:
        span = min(len(s), len(rough) - lag)
        return float(np.dot(rough[lag : lag + span], s[:span])) if span > 0 else 0.0

    return max(range(lo, hi + 1), key=at)


def _score(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b)) / denom if denom > 0 else 0.0


def _tracked(s: np.ndarray, piece: np.ndarray, start: int, guess: int, overall: int,
             track: int) -> tuple[float, int] | None:
    """(score, lag) of one window at the guessed lag or a sample either side (no further than
    `track` from the overall lag), when it matches there; None when it needs the search."""
    window = len(piece)
    best: tuple[float, int] | None = None
    for lag in (guess, guess - 1, guess + 1):
        at = start - lag
        if abs(lag - overall) > track or at < 0 or at + window > len(s):
            continue
        score = _score(piece, s[at : at + window])
        if best is None or score > best[0]:
            best = (score, lag)
    if best is not None and best[0] >= TRACKED:
        return best
    return None


def measure(sent: np.ndarray, received: np.ndarray, sample_rate: int,
            max_lag_seconds: float = 2.0, skip_seconds: float = 1.0) -> Echo:
    """`received` (the echo) against `sent`, both mono at `sample_rate` from the same t0."""
    return measure_keeping(sent, received, sample_rate, max_lag_seconds, skip_seconds)[0]


def measure_keeping(sent: np.ndarray, received: np.ndarray, sample_rate: int,
                    max_lag_seconds: float = 2.0, skip_seconds: float = 1.0
                    ) -> tuple[Echo, Decimated | None]:
    """`measure`, and the two channels as it decimated them (None without audio)."""
    if len(sent) == 0 or len(received) == 0:
        return Echo(0.0, 0.0), None
    rate = ANALYSIS_RATE
    factor = max(1, sample_rate // rate)
    sent = np.asarray(sent, dtype=np.float32)
    received = np.asarray(received, dtype=np.float32)
    s = to_analysis_rate(sent, sample_rate)
    rough = _block_means(received, factor)
    coarse = _overall_lag(s, rough, min(int(max_lag_seconds * rate), len(rough) - 1)) * factor
    # Refine to a full-rate sample, then shift `received` so the lag is a whole number of
    # analysis samples (a fractional-sample misalignment at 8 kHz would cost correlation at
    # the top of the band that the path did not lose).
    fine = coarse
    if len(received) > coarse + factor:
        span = min(len(sent), len(received) - coarse - factor)
        candidates = range(max(0, coarse - factor), coarse + factor + 1)
        fine = max(candidates,
                   key=lambda k: float(np.dot(received[k : k + span], sent[:span])))
    r = to_analysis_rate(received[fine % factor :], sample_rate)
    kept = Decimated(s, r, fine % factor, factor)
    lag = fine // factor
    window = int(WINDOW_SECONDS * rate)
    track = int(TRACK_SECONDS * rate)
    scores: list[float] = []
    lags: list[int] = []
    guess = lag
    for start in range(lag + int(skip_seconds * rate), len(r) - window + 1, window):
        piece = r[start : start + window]
        lo = max(0, start - lag - track)
        hi = min(len(s), start - lag + track + window)
        reference = s[lo:hi]
        if len(reference) < window or not np.any(reference):
            continue
        found = _tracked(s, piece, start, guess, lag, track)
        if found is None:
            local = np.correlate(reference, piece, mode="valid")
            offset = int(np.argmax(local))
            found = (_score(piece, reference[offset : offset + window]), start - (lo + offset))
        scores.append(found[0])
        lags.append(found[1])
        if found[0] >= HOLE:
            guess = found[1]
    if not scores:
        return Echo(fine / sample_rate, 0.0), kept
    # The spread of the lags of the windows that came back: a hole (a silent window) has no
    # lag, its best match is anywhere.
    heard = [(lag, score) for lag, score in zip(lags, scores, strict=True) if score >= HOLE]
    spread = (max(h[0] for h in heard) - min(h[0] for h in heard)) / rate if heard else 0.0
    matched = float(np.mean([h[1] for h in heard])) if heard else 0.0
    return Echo(fine / sample_rate, float(np.mean(scores)), len(scores), len(scores) - len(heard),
                spread, matched), kept
