"""The peer's own load during a run of calls: was the caller what limited the load test?

A load generator that runs out of CPU measures itself: its sends go late, its reads wait,
and the delays and gaps it reports are its own. Load tools warn about it (Locust, when its
CPU passes 90 %); the peer does too, from what it can see of itself:

- the CPU time of the thread that runs the calls (the event loop's: every call's sends,
  reads and signalling run there), over the run and in its busiest whole `INTERVAL`,
  sampled by one small task on the loop;
- the process's CPU time over the run (the event loop, and the analysis threads of
  scripted calls) and afterwards (a load run's measuring and analysis, after its last call);
- how late the shared send tick ran (`PeerTick.late_max`): a wake-up that comes late is a
  late packet on every call.

`OwnLoad.warning` (report.py) says so when the loop's thread was busy `BUSY_SHARE` or more
of a core in its busiest interval: `python -m agent.peer` prints it as a
`warning [peer_busy]` line, and the JSON report of a run carries every figure
(`peer_load`).

The standard library has what this needs (`time.thread_time`, `time.process_time`); psutil
would add a dependency for the same two numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from agent.testing.peer.report import OwnLoad
from agent.testing.peer.transports.send_tick import send_tick

INTERVAL = 1.0  # seconds per sample of the loop thread's CPU


class LoadWatch:
    """Watches the running loop's thread from `start` to `stop` (both on the loop)."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._started = self._thread_started = self._process_started = 0.0
        self._busiest = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread_started = time.thread_time()
        self._process_started = time.process_time()
        send_tick().late_max = 0.0  # this run's lateness only
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        wall, cpu = self._started, self._thread_started
        while True:
            await asyncio.sleep(self.interval)
            now, used = time.monotonic(), time.thread_time()
            if now > wall:
                self._busiest = max(self._busiest, (used - cpu) / (now - wall))
            wall, cpu = now, used

    async def stop(self) -> OwnLoad:
        now, used = time.monotonic(), time.thread_time()
        process = time.process_time()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return OwnLoad(
            seconds=now - self._started,
            loop_cpu_seconds=used - self._thread_started,
            # Whole intervals only: a run of a few milliseconds (a call that failed to
            # connect) is all set-up, busy without holding up any call.
            busiest_share=self._busiest,
            process_cpu_seconds=process - self._process_started,
            tick_late_max_ms=send_tick().late_max * 1000,
        )
