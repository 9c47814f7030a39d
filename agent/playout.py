"""The agent audio waiting between the ticker (80 ms in) and the pacer (20 ms out).

When the model's output comes late (a slow step, a GC pause), the pacer sends silence and
everything after it plays that much later: without a remedy the call keeps that extra
delay for good. So the buffer watches how long each new output waits before its first
sample is sent, and every window of pushes drops, in silence, the whole 20 ms chunks that
even the most pressed output of the window did not need. Only silent audio is ever dropped
(the agent's pauses, not its words). After an underrun, up to one model frame of that wait
is kept for a while: that cushion was earned by real lateness of the model's steps.
"""

from __future__ import annotations

import numpy as np

from .pacer import Pacer
from .sample_fifo import SampleFifo

TRIM_WINDOW_PUSHES = 25  # 2 s of 80 ms outputs
TRIM_HOLD_PUSHES = 125  # 10 s with a cushion after an underrun
HOLD_CUSHION_SECONDS = 0.08  # the most kept as a cushion: one 80 ms model frame
SILENCE_PEAK = 10 ** (-50 / 20)  # about -50 dBFS: quieter audio may be dropped unheard


class PlayoutBuffer(SampleFifo):
    """A SampleFifo of agent output; `clear()` on barge-in drops what was not played yet."""

    def __init__(self, capacity_samples: int) -> None:
        super().__init__(capacity_samples)
        self.trimmed_samples = 0
        self._pacer: Pacer | None = None
        self._sample_rate = 0
        self._chunk = 0
        self._primed = False  # an output arrived since the start or the last clear
        self._window_pushes = 0
        self._window_min_slack: int | None = None
        self._hold_pushes = 0
        self._pending_trim = 0

    def follow(self, pacer: Pacer, sample_rate: int) -> None:
        """Trim against this pacer's send times (without one the buffer never trims)."""
        self._pacer = pacer
        self._sample_rate = sample_rate
        self._chunk = round(pacer.period * sample_rate)

    def push(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        self._observe_slack()
        super().push(samples)
        self._primed = True

    def pop(self, count: int) -> np.ndarray | None:
        self._trim_if_silent()
        audio = super().pop(count)
        if audio is None and self._primed:
            # Output came late: keep the delay this cost as a cushion for a while.
            self._hold_pushes = TRIM_HOLD_PUSHES
            self._pending_trim = 0
        return audio

    def clear(self) -> int:
        self._primed = False
        self._pending_trim = 0
        self._window_pushes = 0
        self._window_min_slack = None
        return super().clear()

    def _observe_slack(self) -> None:
        """Before a push: samples of wait ahead of it (queued audio + time to the next send)."""
        pacer = self._pacer
        if pacer is None or not self._primed or pacer.next_due is None:
            return
        lead = max(0.0, pacer.next_due - pacer.clock.now())
        slack = self.buffered_samples + int(lead * self._sample_rate)
        if self._window_min_slack is None or slack < self._window_min_slack:
            self._window_min_slack = slack
        if self._hold_pushes:
            self._hold_pushes -= 1
        self._window_pushes += 1
        if self._window_pushes < TRIM_WINDOW_PUSHES:
            return
        standing = self._window_min_slack
        if self._hold_pushes:
            standing -= int(HOLD_CUSHION_SECONDS * self._sample_rate)
        excess = (max(0, standing) // self._chunk) * self._chunk
        if excess:
            self._pending_trim = excess
        self._window_pushes = 0
        self._window_min_slack = None

    def _trim_if_silent(self) -> None:
        count = self._pending_trim
        if not count or self.buffered_samples < count:
            return
        head = self.peek(count)
        if float(np.max(np.abs(head))) <= SILENCE_PEAK:
            self.discard(count)
            self.trimmed_samples += count
            self._pending_trim = 0
