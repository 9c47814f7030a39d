"""A clock for tests and benchmarks: time moves only when someone sleeps."""

from __future__ import annotations

import asyncio


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
