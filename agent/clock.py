"""Monotonic time, injectable so pacing and ticking can be tested against a fake clock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class FakeClock:
    """Time moves only when someone sleeps, so an hour of pacing simulates in a second."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start

    def now(self) -> float:
        return self.time

    async def sleep_until(self, deadline: float) -> None:
        if deadline > self.time:
            self.time = deadline
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.time += seconds
