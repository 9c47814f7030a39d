"""A streaming polyphase resampler for the small rational ratios of telephony audio.

8 or 16 kHz G.711/L16 in and out of a 24 kHz model are ratios of 3/1, 1/3, 3/2 and 2/3. For
those, one windowed-sinc low-pass filter, split by phase, turns each 20 ms chunk into a
couple of matrix products: the chunk is laid out in rows (after a row or so of the filter's
history), and each row's block of output samples is its own row times a small matrix of
taps, plus each earlier row its taps reach back into times another. That costs a few
microseconds a chunk, against about 15 for libswresample through PyAV (a frame object, a
filter graph, a copy out), and a phone leg resamples twice every 20 ms.

Output stays in step with input: a chunk of n input samples gives exactly n * up / down
output samples (n must be a multiple of `down`), delayed by the filter's fixed group delay.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from math import gcd

import numpy as np

TAPS_PER_PHASE = 32  # filter length, in input samples of the slower side
KAISER_BETA = 8.0  # about 80 dB of stopband
CUTOFF = 0.92  # of the lower Nyquist: a little below it, so the transition band stays under
MAX_FACTOR = 6  # ratios with a larger numerator or denominator go to libswresample


def supported(source_rate: int, target_rate: int) -> bool:
    """Whether this resampler takes the pair (a small ratio; equal rates need none)."""
    if source_rate == target_rate or source_rate <= 0 or target_rate <= 0:
        return False
    ratio = Fraction(target_rate, source_rate)
    return max(ratio.numerator, ratio.denominator) <= MAX_FACTOR


def lowpass(up: int, down: int) -> np.ndarray:
    """The prototype filter, at `up` times the input rate, with a gain of `up` (zero-stuffing
    leaves 1/up of the energy). Its length is odd with a centre `down` divides, so the
    stream comes out late by a whole number of output samples."""
    factor = max(up, down)
    half = -(-(TAPS_PER_PHASE * factor - 1) // (2 * down)) * down
    n = np.arange(-half, half + 1)
    cutoff = CUTOFF / factor  # of the upsampled rate's Nyquist
    taps = cutoff * np.sinc(cutoff * n) * np.kaiser(len(n), KAISER_BETA)
    return taps * up / taps.sum()


@dataclass(frozen=True)
class _Layout:
    """What every resampler of one (source rate, target rate, chunk) shares."""

    row: int
    history_rows: int
    matrices: np.ndarray  # read-only
    delay_samples: int


@functools.lru_cache(maxsize=64)
def _layout(source_rate: int, target_rate: int, chunk_samples: int) -> _Layout:
    """Built once per rate pair (about a millisecond of Python): a burst of new calls must not
    pay it call by call on the event loop."""
    divisor = gcd(source_rate, target_rate)
    up, down = target_rate // divisor, source_rate // divisor
    taps = lowpass(up, down)
    span = -(-len(taps) // up)  # input samples one output reaches over
    row = _row_length(chunk_samples, down, span)
    # The input is laid out in rows of `row` samples (the chunk's rows after a few rows of
    # history). Output i of a row sits at upsampled time i * down: on input sample
    # floor(i * down / up) of that row, filter phase (i * down) mod up. Its taps reach back
    # over `span` samples, into earlier rows: so each row's output is a sum of matrix
    # products, one per row it reaches (`matrices[k]`: k rows back), each over plain
    # contiguous rows, which BLAS takes as they are.
    outputs_per_row = row * up // down
    history_rows = -(-(span - 1) // row)
    matrices = np.zeros((history_rows + 1, row, outputs_per_row))
    for i in range(outputs_per_row):
        offset, phase = divmod(i * down, up)
        for j in range(span):  # tap phase + j*up weighs input sample offset - j
            tap = phase + j * up
            if tap < len(taps):
                rows_back, position = divmod(offset - j, row)
                matrices[-rows_back, position, i] = taps[tap]
    matrices = matrices.astype(np.float32)
    matrices.flags.writeable = False
    return _Layout(row, history_rows, matrices, (len(taps) - 1) // 2 // down)


class PolyphaseResampler:
    """float32 mono chunks at `source_rate` → float32 at `target_rate`, state carried over."""

    def __init__(self, source_rate: int, target_rate: int, chunk_samples: int) -> None:
        self.source_rate = source_rate
        layout = _layout(source_rate, target_rate, chunk_samples)
        self.row = layout.row
        self.history_rows = layout.history_rows
        self._matrices = layout.matrices
        # The filter's group delay: the stream comes out this many samples late (about 2 ms).
        self.delay_samples = layout.delay_samples
        self.chunk_samples = chunk_samples
        self._rows = chunk_samples // self.row
        self._buffer = np.zeros((self.history_rows + self._rows, self.row), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)  # the start of an unfinished row

    def convert(self, samples: np.ndarray) -> np.ndarray:
        """Input samples (any real dtype, scaled to ±1) → the output they complete. A chunk of
        `chunk_samples` (or any whole number of rows) comes out whole; the samples of a last
        partial row wait for the next call (a few ms, only with odd chunk sizes)."""
        if self._pending.size:
            samples = np.concatenate((self._pending, samples))
        whole = len(samples) - len(samples) % self.row
        self._pending = np.asarray(samples[whole:], dtype=np.float32)
        history = self.history_rows
        if whole == self.chunk_samples:
            buffer = self._buffer
            buffer[:history] = buffer[self._rows:]
            buffer[history:] = np.reshape(samples[:whole], (self._rows, self.row))
        else:  # an odd size: a buffer of its own; the history always ends self._buffer
            buffer = np.concatenate((self._buffer[len(self._buffer) - history:],
                                     np.reshape(samples[:whole], (-1, self.row))))
            buffer = buffer.astype(np.float32, copy=False)
            self._buffer[len(self._buffer) - history:] = buffer[len(buffer) - history:]
        rows = len(buffer) - history
        out = buffer[history:] @ self._matrices[0]
        for back in range(1, history + 1):
            out += buffer[history - back: history - back + rows] @ self._matrices[back]
        return out.reshape(-1)


def _row_length(chunk_samples: int, down: int, span: int) -> int:
    """The shortest row that divides the chunk, holds whole `down` groups and reaches back
    at most into the row before it (fewest products), else the longest that divides; with
    none (a chunk that does not divide by `down`), a row of its own: a chunk then leaves a
    partial row waiting."""
    rows = [n for n in range(down, chunk_samples + 1, down) if chunk_samples % n == 0]
    if not rows:
        return down * -(-(span - 1) // down)
    return next((n for n in rows if n >= span - 1), rows[-1])
