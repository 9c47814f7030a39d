"""Timers for the SIP transaction layer: RFC 3261's T1/T2/T4, and a clock that can be faked.

Transactions are callback state machines, not tasks: each retransmission or timeout is one
`call_later` handle that the transaction cancels when it ends, so nothing outlives a
transaction and there is no task to own. `LoopTimers` schedules on the running event loop;
`ManualTimers` runs them when a test advances its clock, so Timer H's 32 seconds take none.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class TimerSettings:
    """RFC 3261 §17: T1 (RTT estimate), T2 (largest non-INVITE retransmission interval), T4
    (how long a message may live in the network). Timers B, F, H, J are 64*T1."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0

    @property
    def timeout(self) -> float:
        return 64 * self.t1


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...

    def now(self) -> float: ...


class LoopTimers:
    """Timers on the running event loop."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)

    def now(self) -> float:
        return asyncio.get_running_loop().time()


@dataclass(order=True)
class _Entry:
    due: float
    order: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """A fake clock for tests: timers fire, in order, only inside `advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self.time = start
        self._heap: list[_Entry] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        entry = _Entry(self.time + max(0.0, delay), next(self._order), callback)
        heapq.heappush(self._heap, entry)
        return entry

    def advance(self, seconds: float) -> None:
        """Move the clock forward, firing every timer that falls due on the way."""
        deadline = self.time + seconds
        while self._heap and self._heap[0].due <= deadline:
            entry = heapq.heappop(self._heap)
            if entry.cancelled:
                continue
            self.time = entry.due
            entry.callback()
        self.time = deadline

    @property
    def pending(self) -> int:
        return sum(1 for entry in self._heap if not entry.cancelled)
