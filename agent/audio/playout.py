"""The agent audio waiting between the ticker (80 ms in) and the pacer (20 ms out).

When the model's output comes late (a slow step, a GC pause), the pacer sends silence and
everything after it plays that much later: without a remedy the call keeps that extra
delay for good. So the buffer records how long each new output waits before its first
sample is sent, and drops the whole 20 ms chunks of wait that no output in a window needed
(standing_backlog.py), keeping up to one 80 ms model frame as a cushion for a while after an
underrun. Only silent audio is ever dropped: the agent's pauses, not its words.

The wait of less than a packet that is left, from the moment an output lands to the next
send, is given back by moving the sends instead (send_phase.py, `Pacer.advance`), and a
pacer starting or restarting after a stall starts on the landing outputs' phase: every call
sends its answer just after the tick that made it, whatever moment the call started at.
"""

from __future__ import annotations

import numpy as np

from agent.audio.pacer import Pacer
from agent.audio.sample_fifo import SampleFifo
from agent.audio.send_phase import SendPhase
from agent.audio.standing_backlog import StandingBacklog

TRIM_WINDOW_PUSHES = 25  # 2 s of 80 ms outputs
TRIM_HOLD_PUSHES = 125  # 10 s with a cushion after an underrun
HOLD_CUSHION_SECONDS = 0.08  # the most kept as a cushion: one 80 ms model frame
# Kept between an output's landing and the send that carries its first samples: the event
# loop's and the step's jitter from one output to the next, beyond what a window saw.
PHASE_GUARD_SECONDS = 0.004
PHASE_FIRST_PUSHES = 4  # the first alignment, 320 ms of outputs into the call
# A leg that starts sending as its seat is taken (a media stream) holds its first send this
# long at most for the first output to land: the sends then start on the outputs' phase.
FIRST_PHASE_WAIT_SECONDS = 0.1
SILENCE_PEAK = 10 ** (-50 / 20)  # about -50 dBFS: quieter audio may be dropped unheard


class PlayoutBuffer(SampleFifo):
    """A SampleFifo of agent output; `clear()` on barge-in drops what was not played yet."""

    def __init__(self, capacity_samples: int) -> None:
        super().__init__(capacity_samples)
        self.trimmed_samples = 0
        self._pacer: Pacer | None = None
        self._sample_rate = 0
        self._backlog: StandingBacklog | None = None
        self._phase: SendPhase | None = None
        self.phase_moved_samples = 0  # how far the sends were moved earlier, in all
        # The last output's wait for the send of its first sample (queued audio + the time to
        # the next send), in samples; None before the pacer started.
        self.last_wait_samples: int | None = None
        self._sending = False  # the first pop (the call's first send) has happened
        self._primed = False  # an output arrived since the start or the last clear
        self._pending_trim = 0

    def follow(self, pacer: Pacer, sample_rate: int) -> None:
        """Trim against this pacer's send times (without one the buffer never trims)."""
        self._pacer = pacer
        pacer.first_phase_wait = FIRST_PHASE_WAIT_SECONDS
        self._sample_rate = sample_rate
        granule = round(pacer.period * sample_rate)
        self._backlog = StandingBacklog(
            TRIM_WINDOW_PUSHES, TRIM_HOLD_PUSHES, granule=granule,
            cushion=int(HOLD_CUSHION_SECONDS * sample_rate),
        )
        self._phase = SendPhase(granule, round(PHASE_GUARD_SECONDS * sample_rate),
                                PHASE_FIRST_PUSHES, TRIM_WINDOW_PUSHES)

    @property
    def holding_cushion(self) -> bool:
        """A late output was seen recently: up to one frame of wait is being kept."""
        return self._backlog is not None and self._backlog.holding

    def push(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        if self._pacer is not None:
            # Where a pacer that starts (or restarts after a stall) puts its first send.
            self._pacer.phase_hint = self._pacer.clock.now() + PHASE_GUARD_SECONDS
            if self._pacer.next_due is None:
                self._drop_silence_before_the_first_send()
        self._observe_wait()
        super().push(samples)
        self._primed = True

    def pop(self, count: int) -> np.ndarray | None:
        if not self._sending:
            self._sending = True
            if self._drop_silence_before_the_first_send():
                self._primed = False  # as after a clear: the next underrun is not lateness
        self._trim_if_silent()
        audio = super().pop(count)
        if audio is None and self._primed and self._backlog is not None:
            # Output came late: keep the delay this cost as a cushion for a while.
            self._backlog.lateness_seen()
            self._pending_trim = 0
        return audio

    def clear(self) -> int:
        self._primed = False
        self._pending_trim = 0
        if self._backlog is not None:
            self._backlog.restart_window()
        if self._phase is not None:
            self._phase.restart()
        return super().clear()

    def _drop_silence_before_the_first_send(self) -> bool:
        """The ticker answers from the moment the seat is taken, the sends begin when the
        call connects: silence queued in between (up to a frame less what the first sends
        took before the next answer) would delay everything after it, for good while the
        caller talks (only silence is trimmed). Dropped as answers land before the first
        send, and at the first send. Speech stays queued."""
        count = self.buffered_samples
        if not count or float(np.max(np.abs(self.peek(count)))) > SILENCE_PEAK:
            return False
        self.discard(count)
        self.trimmed_samples += count
        return True

    def _observe_wait(self) -> None:
        """Before a push: samples of wait ahead of it (queued audio + time to the next send)."""
        pacer, backlog, phase = self._pacer, self._backlog, self._phase
        if (pacer is None or backlog is None or phase is None or not self._primed
                or pacer.next_due is None):
            return
        lead = max(0.0, pacer.next_due - pacer.clock.now())
        waiting = self.buffered_samples + int(lead * self._sample_rate)
        self.last_wait_samples = waiting
        excess = backlog.observe(waiting)
        if excess:
            self._pending_trim = excess
        # Every output of the window keeps at least the guard after the move: a cushion kept
        # after a late output is whole packets, and stays (so does the wait it gave that one).
        spare = phase.observe(waiting)
        if spare and pacer.advance(spare / self._sample_rate):
            self.phase_moved_samples += spare

    def _trim_if_silent(self) -> None:
        count = self._pending_trim
        if not count or self.buffered_samples < count:
            return
        head = self.peek(count)
        if float(np.max(np.abs(head))) <= SILENCE_PEAK:
            self.discard(count)
            self.trimmed_samples += count
            self._pending_trim = 0
