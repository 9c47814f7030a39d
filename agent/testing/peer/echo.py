"""The round-trip delay of an echo and how faithfully it came back, cheaply enough for a
load test's callers.

The measurement is the one `agent.testing.testsignal.measure_echo` makes (its
`EchoMeasurement`, plus the mean score of the windows that came back): the overall lag by
FFT cross-correlation at 8 kHz (`coarse_lag`, shared with it), refined to the full-rate
sample, then every 250 ms window of what came back scored at its own best lag near the
overall one (a path that drops or inserts a frame is scored on what it played, and the spread
of the window lags shows the shift). The rest is written again here, rather than called,
because the peer pays for it after every call of a load test and two parts of it dominated
the peer's own CPU per call:

- the 48 → 8 kHz decimation was an FFT over the whole call, whose length (any number of
  20 ms pieces) often has a large prime factor; here it is a zero-phase FIR evaluated at the
  kept samples only (`downsample.py`), ~20x cheaper;
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


@dataclass
class Echo(EchoMeasurement):
    matched: float = 0.0  # mean score of the windows that came back (the holes left out)


def to_analysis_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """Float64 at ANALYSIS_RATE (`rate` an integer multiple of it), band-limited."""
    return downsample(samples, max(1, rate // ANALYSIS_RATE))


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
    if len(sent) == 0 or len(received) == 0:
        return Echo(0.0, 0.0)
    rate = ANALYSIS_RATE
    factor = max(1, sample_rate // rate)
    s = to_analysis_rate(sent, sample_rate)
    r = to_analysis_rate(received, sample_rate)
    coarse = coarse_lag(s, r, min(int(max_lag_seconds * rate), len(r) - 1)) * factor
    # Refine to a full-rate sample, then shift `received` so the lag is a whole number of
    # analysis samples (a fractional-sample misalignment at 8 kHz would cost correlation at
    # the top of the band that the path did not lose).
    fine = coarse
    if len(received) > coarse + factor:
        span = min(len(sent), len(received) - coarse - factor)
        sent32, received32 = np.asarray(sent, np.float32), np.asarray(received, np.float32)
        candidates = range(max(0, coarse - factor), coarse + factor + 1)
        fine = max(candidates,
                   key=lambda k: float(np.dot(received32[k : k + span], sent32[:span])))
    if fine % factor:
        r = to_analysis_rate(np.asarray(received)[fine % factor :], sample_rate)
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
        return Echo(fine / sample_rate, 0.0)
    # The spread of the lags of the windows that came back: a hole (a silent window) has no
    # lag, its best match is anywhere.
    heard = [(lag, score) for lag, score in zip(lags, scores, strict=True) if score >= HOLE]
    spread = (max(h[0] for h in heard) - min(h[0] for h in heard)) / rate if heard else 0.0
    matched = float(np.mean([h[1] for h in heard])) if heard else 0.0
    return Echo(fine / sample_rate, float(np.mean(scores)), len(scores), len(scores) - len(heard),
                spread, matched)
