"""When each outbound 20 ms packet is due, on a monotonic clock, without drift.

Due times are computed as anchor + n * period (never by adding periods up), so an hour of
pacing lands on the same sample as the first minute. After a stall (a busy event loop, a
suspended process) the pacer re-anchors instead of bursting the missed packets out.

A pacer that times itself (`wait_next`) takes its phase from the audio it sends: it starts,
and restarts after a stall, on the grid of `phase_hint` (just after the ticker's answers
land, set by playout.py; the first send waits up to `first_phase_wait` for it), and
`advance` moves it earlier when the answers land earlier than that. One driven by a shared
clock (`take_due`) keeps that clock's phase.
"""

from __future__ import annotations

import math

from agent.audio.clock import Clock

# A packet released this long after the one before leaves a hole in the audio at the
# receiver: the capacity benchmark's timing criterion (60 ms), seen from the sender.
HOLE_SECONDS = 0.06
_PHASE_POLL = 0.005  # how often a pacer waiting for its first phase looks again
_SAME_TICK = 1e-6  # due times and a shared clock's ticks, computed apart, may differ by this


class Pacer:
    def __init__(self, clock: Clock, period: float, max_lateness: float = 0.1) -> None:
        self.clock = clock
        self.period = period
        self.max_lateness = max_lateness
        self._anchor: float | None = None
        self._index = 0  # packets emitted since the anchor
        self.reanchors = 0
        self.late_sends = 0  # packets released more than HOLE_SECONDS after the one before
        self._released_at: float | None = None
        # A time on the grid the sends should keep (where audio lands); None: no preference.
        self.phase_hint: float | None = None
        self.advanced_seconds = 0.0  # how far `advance` moved the timeline, in all
        self._driven = False  # paced by a shared clock's ticks (take_due): its phase is fixed
        # How long a self-timed pacer's first send may wait for a `phase_hint` (the first
        # audio to land) rather than start on a phase of its own; 0: it does not wait.
        self.first_phase_wait = 0.0

    def take_due(self, tick_at: float, now: float) -> int:
        """Pacing driven from outside (a shared clock calling on the sender's phase every
        period, see send_clock.py): how many packets are due at the clock's tick
        `tick_at` (normally 1; 0 before the first is due), read at `now`. The timeline starts
        at the first tick; when it has fallen behind by more than `max_lateness` it restarts
        at this tick rather than bursting the missed packets out."""
        self._driven = True
        due = self._next_due_at(now, restart_at=tick_at)
        if due > tick_at + _SAME_TICK:
            return 0
        count = int((tick_at + _SAME_TICK - due) // self.period) + 1
        self._note_release(now)
        self._index += count
        return count

    async def wait_next(self) -> None:
        """Sleep until the next packet is due."""
        now = self.clock.now()
        if self._anchor is None and self.phase_hint is None and self.first_phase_wait > 0:
            deadline = now + self.first_phase_wait
            while self.phase_hint is None and now < deadline:
                await self.clock.sleep_until(min(deadline, now + _PHASE_POLL))
                now = self.clock.now()
        await self.clock.sleep_until(self._next_due_at(now, restart_at=self._on_phase(now)))
        self._note_release(self.clock.now())
        self._index += 1

    def advance(self, seconds: float) -> bool:
        """Move the timeline `seconds` earlier (sends closer to when their audio lands); False
        where it does not move: not started yet, or paced by a shared clock."""
        if self._anchor is None or self._driven or seconds <= 0:
            return False
        self._anchor -= seconds
        self.advanced_seconds += seconds
        return True

    def _on_phase(self, now: float) -> float:
        """The first time from `now` on `phase_hint`'s grid (`now` without a hint)."""
        hint = self.phase_hint
        if hint is None:
            return now
        return hint + math.ceil((now - hint) / self.period - _SAME_TICK) * self.period

    def _next_due_at(self, now: float, restart_at: float) -> float:
        """When the next packet is due; the timeline starts (or, fallen behind by more than
        may be caught up, starts again) at `restart_at`."""
        if self._anchor is None:
            self._anchor = restart_at
            self._index = 0
        due = self._anchor + self._index * self.period
        if now - due > self.max_lateness:
            self._anchor = restart_at
            self._index = 0
            self.reanchors += 1
            due = restart_at
        return due

    def _note_release(self, released: float) -> None:
        if self._released_at is not None and released - self._released_at > HOLE_SECONDS:
            self.late_sends += 1
        self._released_at = released

    @property
    def next_due(self) -> float | None:
        if self._anchor is None:
            return None
        return self._anchor + self._index * self.period
