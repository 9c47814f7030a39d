"""Client events from a call's data channel: handled one at a time, in arrival order, at a
bounded rate.

Handling an event can queue work on the plugin's worker thread (a restart from the prompt),
which every call's step shares; a caller flooding the channel must not push its restarts
ahead of everyone's frames, nor pile up tasks or memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agent.audio.clock import Clock, MonotonicClock
from agent.realtime.rate_limit import TokenBucket

RawEvent = str | bytes
REPORT_INTERVAL = 1.0  # at most one refusal report a second: refusals must not amplify a flood


class ClientEventInbox:
    def __init__(
        self,
        handle: Callable[[RawEvent], Awaitable[None]],
        report_refusals: Callable[[RawEvent, int], None],
        *,
        rate: float,
        burst: int,
        clock: Clock | None = None,
    ) -> None:
        self._handle = handle
        self._report_refusals = report_refusals
        self._clock = clock or MonotonicClock()
        self._bucket = TokenBucket(rate, burst, self._clock)
        self._queue: asyncio.Queue[RawEvent] = asyncio.Queue(maxsize=burst)
        self._unreported = 0
        self._reported_at: float | None = None
        self.refused = 0

    def offer(self, raw: RawEvent) -> None:
        """Take an event from the channel (never blocks); refuse it over the rate."""
        if self._bucket.take() and not self._queue.full():
            self._queue.put_nowait(raw)
            return
        self.refused += 1
        self._unreported += 1
        now = self._clock.now()
        if self._reported_at is None or now - self._reported_at >= REPORT_INTERVAL:
            self._reported_at = now
            count, self._unreported = self._unreported, 0
            self._report_refusals(raw, count)

    async def serve(self) -> None:
        """Handle admitted events in order until cancelled (by the call's task owner)."""
        while True:
            raw = await self._queue.get()
            await self._handle(raw)
