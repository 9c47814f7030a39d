"""The part of a packet that agent audio waits for its send: given back by moving the sends.

The ticker's answers land every 80 ms, on the ticker's grid; a leg sends every 20 ms, on a
grid of its own that started wherever the call happened to start. The first send after an
answer lands is then anywhere up to a packet later, a delay fixed for the whole call.
`SendPhase` watches the wait of each landing answer (queued audio plus the time to the next
send) and, at the end of a window, tells by how much the sends may move earlier: the
smallest wait of the window, less its whole packets (those are the standing backlog's, see
standing_backlog.py) and less a small guard. The windows of a call's first `window` answers
are short, so a call reaches its best phase within a few frames even when its first answers
came unevenly; the later ones keep it there when the step time or the ticker's timeline
changes (after a stall both grids restart somewhere new).
"""

from __future__ import annotations


class SendPhase:
    def __init__(self, granule: int, guard: int, first_window: int, window: int) -> None:
        self.granule = max(1, granule)
        self.guard = guard
        self.window = window
        self._first_window = first_window
        self._seen = 0
        self._observed = 0  # answers seen since the start or the last restart
        self._smallest: int | None = None

    def restart(self) -> None:
        """Forget what was seen (a barge-in): the next window is a short one again."""
        self._observed = 0
        self._seen = 0
        self._smallest = None

    def observe(self, waiting: int) -> int:
        """Record one answer's wait (in samples). At a window's end, how many samples earlier
        the sends may move (0: already at the best phase, within the guard)."""
        if self._smallest is None or waiting < self._smallest:
            self._smallest = waiting
        self._seen += 1
        self._observed += 1
        length = self._first_window if self._observed <= self.window else self.window
        if self._seen < length:
            return 0
        spare = self._smallest % self.granule - self.guard
        self._seen = 0
        self._smallest = None
        return max(0, spare)
