"""Marks: named points in the agent's outbound audio, answered once the audio before them left.

A mark's position is how many agent samples had been queued when it arrived; it is due once
that many samples have left the playout buffer (sent, or dropped by a `clear`). Positions
only grow, so marks come due in the order they arrived.
"""

from __future__ import annotations

from collections import deque


class MarkQueue:
    def __init__(self, max_pending: int = 1024) -> None:
        self.max_pending = max_pending
        self._pending: deque[tuple[int, str]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, name: str, position: int) -> bool:
        """Queue a mark; False when too many are already pending."""
        if len(self._pending) >= self.max_pending:
            return False
        self._pending.append((position, name))
        return True

    def due(self, consumed: int) -> list[str]:
        """Names of marks whose audio has all been consumed, oldest first."""
        names = []
        while self._pending and self._pending[0][0] <= consumed:
            names.append(self._pending.popleft()[1])
        return names
