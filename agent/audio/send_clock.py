"""One timer for the 20 ms sends of every RTP leg in a process (the media agent owns it).

A leg with a task of its own wakes 50 times a second through asyncio's sleep (a future, a
timer handle, a task step: a tenth of what a PCMU echo leg costs the server). Here one task
ticks every 5 ms on a drift-free grid; the legs are spread over the four 5 ms phases of each
20 ms (each joins the emptiest), and a tick runs every leg of its phase in turn. Each leg
keeps its own `Pacer`, told when a tick comes (`Pacer.take_due`), so its send times, catch-up
after a short stall and restart after a long one are the same as with a task of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from itertools import count

from agent.audio.clock import Clock, MonotonicClock
from agent.audio.pcm import PTIME
from agent.task_owner import TaskOwner

log = logging.getLogger(__name__)

PHASES = 4
# Fallen this far behind, the clock jumps to the present tick instead of running the missed
# ones (the legs' pacers then restart their timelines: see Pacer.take_due).
MAX_LATENESS = 0.1

# Called on each tick of the sender's phase: (the tick's grid time, the time now).
SendDue = Callable[[float, float], None]


class SendClock:
    def __init__(self, clock: Clock | None = None, period: float = PTIME,
                 phases: int = PHASES) -> None:
        self.clock = clock or MonotonicClock()
        self.phase_seconds = period / phases
        self._phases: list[dict[int, SendDue]] = [{} for _ in range(phases)]
        self._keys = count()
        self._tasks = TaskOwner("send-clock")
        self._running: asyncio.Task[None] | None = None
        self.failures = 0  # senders dropped for raising

    def __len__(self) -> int:
        return sum(len(phase) for phase in self._phases)

    def join(self, send_due: SendDue) -> Callable[[], None]:
        """Call `send_due` on every tick of the emptiest phase from now on; returns the call
        that stops it (safe to call more than once)."""
        phase = min(self._phases, key=len)
        key = next(self._keys)
        phase[key] = send_due
        if self._running is None or self._running.done():
            self._running = self._tasks.spawn(self._run(), "ticks")

        def leave() -> None:
            phase.pop(key, None)

        return leave

    def close(self) -> None:
        for phase in self._phases:
            phase.clear()
        self._tasks.cancel_all()

    async def _run(self) -> None:
        anchor = self.clock.now()
        tick = 0
        while len(self):
            tick_at = anchor + tick * self.phase_seconds
            await self.clock.sleep_until(tick_at)
            now = self.clock.now()
            if now - tick_at > MAX_LATENESS:
                tick = int((now - anchor) / self.phase_seconds)
                tick_at = anchor + tick * self.phase_seconds
            self._run_phase(self._phases[tick % len(self._phases)], tick_at, now)
            tick += 1

    def _run_phase(self, phase: dict[int, SendDue], tick_at: float, now: float) -> None:
        for key, send_due in list(phase.items()):
            try:
                send_due(tick_at, now)
            except Exception:  # one broken sender must not silence the others
                log.exception("a sender failed on the send clock; dropping it")
                self.failures += 1
                phase.pop(key, None)
