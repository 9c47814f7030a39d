"""How much of a queue waited a whole window for nothing: the delay a call can give back.

Both queues on a call's path use it: caller audio waiting for the next tick (ticker.py) and
agent audio waiting for the next send (playout.py). Each time the queue is served it reports
how much was waiting; at the end of a window the smallest of those waits, in whole granules,
is delay that nothing needed. After real lateness (a late caller packet, a late model step)
a cushion of at most `cushion` is kept for `hold` events, so one late arrival does not turn
into a glitch every window.
"""

from __future__ import annotations


class StandingBacklog:
    def __init__(self, window: int, hold: int, granule: int, cushion: int) -> None:
        self.window = window
        self.hold = hold
        self.granule = max(1, granule)
        self.cushion = cushion
        self._seen = 0
        self._smallest: int | None = None
        self._hold_left = 0

    @property
    def holding(self) -> bool:
        return self._hold_left > 0

    def lateness_seen(self) -> None:
        """Something arrived late: keep up to `cushion` of the wait for a while."""
        self._hold_left = self.hold

    def restart_window(self) -> None:
        self._seen = 0
        self._smallest = None

    def observe(self, waiting: int) -> int:
        """Record one wait (in samples). At a window's end, returns the excess to drop."""
        if self._smallest is None or waiting < self._smallest:
            self._smallest = waiting
        if self._hold_left:
            self._hold_left -= 1
        self._seen += 1
        if self._seen < self.window:
            return 0
        standing = self._smallest - (self.cushion if self._hold_left else 0)
        self.restart_window()
        return (max(0, standing) // self.granule) * self.granule
