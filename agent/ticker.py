"""The clocked stepper: one ticker per plugin steps every live session once per frame period.

All live sessions go through the plugin in ONE batched `step` call per tick, on a single
worker thread (so a GPU model does one forward pass per tick for every call, and the event
loop never waits on the model). Each session has a small bounded inbound queue; a caller that
sent nothing this period is fed the plugin's silence so the model keeps time. A standing
backlog (after a network burst, or a caller clock that runs fast) is trimmed oldest-first so
it cannot turn into permanent delay. Joins and leaves happen between ticks and never move the
tick timeline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .clock import Clock, MonotonicClock
from .plugins.base import Plugin, PluginError, PluginSession, RuntimeConfig, StepOutput

log = logging.getLogger(__name__)

T = TypeVar("T")

# Ticks in a row with a frame still queued after the step before one frame is dropped.
BACKLOG_PATIENCE_TICKS = 12


@dataclass
class SessionCounters:
    frames_in: int = 0
    frames_stepped: int = 0
    silence_filled: int = 0
    dropped_overflow: int = 0
    dropped_backlog: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class TickerCounters:
    ticks: int = 0
    late_ticks: int = 0  # ticks that started more than one period late
    reanchors: int = 0
    step_errors: int = 0
    last_step_ms: float = 0.0
    max_step_ms: float = 0.0
    total_step_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        mean = self.total_step_ms / self.ticks if self.ticks else 0.0
        return {**self.__dict__, "mean_step_ms": round(mean, 3)}


OutputHandler = Callable[[StepOutput], None]
ErrorHandler = Callable[[Exception], None]


class TickedSession:
    """One call's seat at the ticker."""

    def __init__(
        self,
        plugin_session: PluginSession,
        inbound_capacity: int,
        on_output: OutputHandler,
        on_error: ErrorHandler | None,
    ) -> None:
        self.plugin_session = plugin_session
        self.inbound: deque[np.ndarray] = deque()
        self.inbound_capacity = inbound_capacity
        self.on_output = on_output
        self.on_error = on_error
        self.counters = SessionCounters()
        self.closed = False
        self._backlog_ticks = 0

    @property
    def config(self) -> RuntimeConfig:
        return self.plugin_session.config

    def push(self, frame: np.ndarray) -> None:
        """Queue one caller frame (event loop)."""
        self.counters.frames_in += 1
        if len(self.inbound) >= self.inbound_capacity:
            self.inbound.popleft()
            self.counters.dropped_overflow += 1
        self.inbound.append(frame)

    def take(self, silence: np.ndarray) -> np.ndarray:
        """The frame for this tick: the oldest queued one, or silence."""
        self.counters.frames_stepped += 1
        if not self.inbound:
            self.counters.silence_filled += 1
            self._backlog_ticks = 0
            return silence
        frame = self.inbound.popleft()
        if self.inbound:
            self._backlog_ticks += 1
            if self._backlog_ticks >= BACKLOG_PATIENCE_TICKS:
                self.inbound.popleft()
                self.counters.dropped_backlog += 1
                self._backlog_ticks = 0
        else:
            self._backlog_ticks = 0
        return frame


class Ticker:
    def __init__(
        self,
        plugin: Plugin,
        clock: Clock | None = None,
        inbound_capacity: int = 3,
        max_lateness_ticks: float = 2.0,
    ) -> None:
        self.plugin = plugin
        self.clock = clock or MonotonicClock()
        capabilities = plugin.capabilities()
        self.period = capabilities.frame_size / capabilities.sample_rate
        self.inbound_capacity = inbound_capacity
        self.max_lateness = max_lateness_ticks * self.period
        self.sessions: list[TickedSession] = []
        self.counters = TickerCounters()
        self._silence = plugin.silence_frame()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ticker-{plugin.id}")
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def _in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ticker")

    async def open_session(
        self,
        config: RuntimeConfig,
        on_output: OutputHandler,
        on_error: ErrorHandler | None = None,
    ) -> TickedSession:
        if self._closed:
            raise PluginError("shutting_down", "the server is shutting down", status=503)
        plugin_session = await self._in_worker(self.plugin.create_session, config)
        ticked = TickedSession(plugin_session, self.inbound_capacity, on_output, on_error)
        self.sessions.append(ticked)
        self.start()
        self._wakeup.set()
        return ticked

    async def close_session(self, ticked: TickedSession) -> None:
        if ticked.closed:
            return
        ticked.closed = True
        if ticked in self.sessions:
            self.sessions.remove(ticked)
        await self._in_worker(self.plugin.close_session, ticked.plugin_session)

    async def restart_session(self, ticked: TickedSession) -> None:
        """New epoch: queued caller audio is dropped and the plugin goes back to its prompt."""
        ticked.inbound.clear()
        await self._in_worker(self.plugin.restart_session, ticked.plugin_session)

    async def update_session(self, ticked: TickedSession, config: RuntimeConfig) -> None:
        ticked.plugin_session.config = config

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for ticked in list(self.sessions):
            await self.close_session(ticked)
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        anchor: float | None = None
        index = 0
        while True:
            if not self.sessions:
                self._wakeup.clear()
                await self._wakeup.wait()
                anchor = None
                continue
            if anchor is None:
                anchor = self.clock.now()
                index = 0
            due = anchor + index * self.period
            await self.clock.sleep_until(due)
            lateness = self.clock.now() - due
            if lateness > self.period:
                self.counters.late_ticks += 1
            await self._tick()
            index += 1
            if self.clock.now() - (anchor + index * self.period) > self.max_lateness:
                # The plugin could not keep up for a while: start a fresh timeline instead of
                # stepping back to back to catch up (which would only add delay).
                anchor = self.clock.now()
                index = 0
                self.counters.reanchors += 1

    async def _tick(self) -> None:
        live = list(self.sessions)
        if not live:
            return
        batch = [(ticked.plugin_session, ticked.take(self._silence)) for ticked in live]
        started = time.perf_counter()
        try:
            outputs = await self._in_worker(self.plugin.step, batch)
        except Exception as exc:  # a plugin fault must not stop the clock for everyone
            self.counters.step_errors += 1
            log.exception("plugin %s step failed", self.plugin.id)
            for ticked in live:
                if ticked.on_error is not None and not ticked.closed:
                    ticked.on_error(exc)
            return
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.counters.ticks += 1
            self.counters.last_step_ms = elapsed_ms
            self.counters.total_step_ms += elapsed_ms
            self.counters.max_step_ms = max(self.counters.max_step_ms, elapsed_ms)
        for ticked, output in zip(live, outputs):
            if ticked.closed:
                continue
            try:
                ticked.on_output(output)
            except Exception:
                log.exception("output handler failed")
