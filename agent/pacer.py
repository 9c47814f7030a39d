"""When each outbound 20 ms packet is due, on a monotonic clock, without drift.

Due times are computed as anchor + n * period (never by adding periods up), so an hour of
pacing lands on the same sample as the first minute. After a stall (a busy event loop, a
suspended process) the pacer re-anchors instead of bursting the missed packets out.
"""

from __future__ import annotations

from .clock import Clock

# A packet released this long after the one before leaves a hole in the audio at the
# receiver: the capacity benchmark's timing criterion (60 ms), seen from the sender.
HOLE_SECONDS = 0.06


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

    async def wait_next(self) -> None:
        """Sleep until the next packet is due."""
        now = self.clock.now()
        if self._anchor is None:
            self._anchor = now
            self._index = 0
        due = self._anchor + self._index * self.period
        if now - due > self.max_lateness:
            # We fell behind by more than we may catch up: start a new timeline from now.
            self._anchor = now
            self._index = 0
            self.reanchors += 1
            due = now
        await self.clock.sleep_until(due)
        released = self.clock.now()
        if self._released_at is not None and released - self._released_at > HOLE_SECONDS:
            self.late_sends += 1
        self._released_at = released
        self._index += 1

    @property
    def next_due(self) -> float | None:
        if self._anchor is None:
            return None
        return self._anchor + self._index * self.period
