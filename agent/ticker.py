"""The clocked stepper: one ticker per plugin steps every plugin slot once per frame period.

A plugin slot is one leg's seat at the ticker: its plugin session (the plugin's per-call
state) and a small bounded queue of caller audio. All live slots go through the plugin in ONE
batched `step` call per tick, on a single worker thread (so a GPU model does one forward pass
per tick for every call, and the event loop never waits on the model); a caller that
sent nothing this period is fed the plugin's silence so the model keeps time. A standing
backlog (after a network burst, or a caller clock that runs fast) is trimmed oldest-first so
it cannot turn into permanent delay. Joins and leaves happen between ticks and never move the
tick timeline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from agent.audio.clock import Clock, MonotonicClock
from agent.audio.sample_fifo import SampleFifo
from agent.audio.standing_backlog import StandingBacklog
from agent.plugins.base import Plugin, PluginError, PluginSession, RuntimeConfig, StepOutput

log = logging.getLogger(__name__)

T = TypeVar("T")

# Caller audio that waited a whole window of ticks for nothing is dropped (20 ms granules,
# see standing_backlog.py). A late frame of a flowing stream earns a cushion of up to one
# frame; a stream's first frame after silence is usually partial and says nothing about
# jitter, and a stall of our own leaves a backlog but pads nothing.
TRIM_WINDOW_TICKS = 25
TRIM_HOLD_TICKS = 125


@dataclass
class SlotCounters:
    chunks_in: int = 0
    frames_stepped: int = 0
    silence_filled: int = 0  # ticks fed pure silence (caller sent nothing)
    padded: int = 0  # ticks whose frame was completed with silence (late audio)
    dropped_overflow_samples: int = 0
    dropped_backlog_samples: int = 0
    # How long the last whole frame was complete before the tick that took it (ms; -1: the
    # last frame was not whole): the framing's part of the round trip beyond the 80 ms.
    last_tick_wait_ms: float = -1.0

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
# Sees each tick's caller frame and the agent audio answering it (a recorder).
TickTap = Callable[[np.ndarray, np.ndarray], None]


class PluginSlot:
    """One call's seat at the ticker: a bounded FIFO of caller samples and the output hooks."""

    def __init__(
        self,
        plugin_session: PluginSession,
        frame_size: int,
        inbound_capacity_frames: int,
        on_output: OutputHandler,
        on_error: ErrorHandler | None,
        clock: Clock | None = None,
    ) -> None:
        self.plugin_session = plugin_session
        self.clock = clock or MonotonicClock()
        self._completed_at: float | None = None  # when the queue last reached a whole frame
        self.frame_size = frame_size
        self.inbound = SampleFifo(frame_size * inbound_capacity_frames)
        self.backlog = StandingBacklog(
            TRIM_WINDOW_TICKS, TRIM_HOLD_TICKS, granule=frame_size // 4, cushion=frame_size
        )
        self.on_output = on_output
        self.on_error = on_error
        self.counters = SlotCounters()
        self.tap: TickTap | None = None
        self.closed = False
        self._flowing = False  # the last tick's frame was all caller audio

    @property
    def config(self) -> RuntimeConfig:
        return self.plugin_session.config

    def push(self, samples: np.ndarray) -> None:
        """Queue caller audio at the plugin's rate, any length (event loop)."""
        self.counters.chunks_in += 1
        short = self.inbound.buffered_samples < self.frame_size
        self.inbound.push(samples)
        if short and self.inbound.buffered_samples >= self.frame_size:
            self._completed_at = self.clock.now()
        self.counters.dropped_overflow_samples = self.inbound.dropped_samples

    def take(self, silence: np.ndarray) -> np.ndarray:
        """The frame for this tick: the oldest queued audio, padded or replaced by silence."""
        self.counters.frames_stepped += 1
        audio = self.inbound.pop_available(self.frame_size)
        if audio is None:
            self.counters.silence_filled += 1
            frame = silence
        elif len(audio) < self.frame_size:
            self.counters.padded += 1
            if self._flowing:
                self.backlog.lateness_seen()
            frame = silence.copy()
            frame[: len(audio)] = audio
        else:
            frame = audio
        self._flowing = audio is not None and len(audio) == self.frame_size
        completed, self._completed_at = self._completed_at, None
        now = self.clock.now()
        self.counters.last_tick_wait_ms = (
            round((now - completed) * 1000, 2) if self._flowing and completed is not None
            else -1.0)
        excess = self.backlog.observe(self.inbound.buffered_samples)
        if excess:
            self.inbound.discard(excess)
            self.counters.dropped_backlog_samples += excess
        if self.inbound.buffered_samples >= self.frame_size:  # the next one is whole already
            self._completed_at = now
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
        self.frame_size = capabilities.frame_size
        self.inbound_capacity = inbound_capacity
        self.max_lateness = max_lateness_ticks * self.period
        self.slots: list[PluginSlot] = []
        self.counters = TickerCounters()
        self._silence = plugin.silence_frame()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ticker-{plugin.id}")
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Called after each tick with (step seconds, lateness seconds); the agent's metrics.
        self.on_tick: Callable[[float, float], None] | None = None

    async def _in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ticker")

    async def open_slot(
        self,
        config: RuntimeConfig,
        on_output: OutputHandler,
        on_error: ErrorHandler | None = None,
    ) -> PluginSlot:
        if self._closed:
            raise PluginError("shutting_down", "the server is shutting down", status=503)
        plugin_session = await self._in_worker(self.plugin.create_session, config)
        slot = PluginSlot(
            plugin_session, self.frame_size, self.inbound_capacity, on_output, on_error,
            self.clock,
        )
        self.slots.append(slot)
        self.start()
        self._wakeup.set()
        return slot

    async def close_slot(self, slot: PluginSlot) -> None:
        if slot.closed:
            return
        slot.closed = True
        if slot in self.slots:
            self.slots.remove(slot)
        await self._in_worker(self.plugin.close_session, slot.plugin_session)

    async def restart_slot(self, slot: PluginSlot) -> None:
        """New epoch: queued caller audio is dropped and the plugin goes back to its prompt."""
        slot.inbound.clear()
        await self._in_worker(self.plugin.restart_session, slot.plugin_session)

    async def update_slot(self, slot: PluginSlot, config: RuntimeConfig) -> None:
        """Swap a session's config between steps, on the worker thread (as base.py's thread
        rule says), so a step never sees it change half-way."""
        await self._in_worker(setattr, slot.plugin_session, "config", config)

    async def send_dtmf(self, slot: PluginSlot, digit: str) -> None:
        """Hand a keypad digit to the plugin on its worker thread (between steps)."""
        if not slot.closed:
            await self._in_worker(self.plugin.handle_dtmf, slot.plugin_session, digit)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for slot in list(self.slots):
            await self.close_slot(slot)
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        anchor: float | None = None
        index = 0
        while True:
            if not self.slots:
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
            step_ms = await self._tick()
            if self.on_tick is not None and step_ms is not None:
                self.on_tick(step_ms / 1000, lateness)
            index += 1
            if self.clock.now() - (anchor + index * self.period) > self.max_lateness:
                # The plugin could not keep up for a while: start a fresh timeline instead of
                # stepping back to back to catch up (which would only add delay).
                anchor = self.clock.now()
                index = 0
                self.counters.reanchors += 1

    async def _tick(self) -> float | None:
        """Step every live session once; the step's milliseconds (None when nothing ran)."""
        live = list(self.slots)
        if not live:
            return None
        batch = [(slot.plugin_session, slot.take(self._silence)) for slot in live]
        started = time.perf_counter()
        try:
            outputs = await self._in_worker(self.plugin.step, batch)
        except Exception as exc:  # a plugin fault must not stop the clock for everyone
            self.counters.step_errors += 1
            log.exception("plugin %s step failed", self.plugin.id)
            for slot in live:
                if slot.on_error is not None and not slot.closed:
                    slot.on_error(exc)
            # (the finally below runs after this value is taken)
            return (time.perf_counter() - started) * 1000
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.counters.ticks += 1
            self.counters.last_step_ms = elapsed_ms
            self.counters.total_step_ms += elapsed_ms
            self.counters.max_step_ms = max(self.counters.max_step_ms, elapsed_ms)
        for slot, (_, frame), output in zip(live, batch, outputs, strict=False):
            if slot.closed:
                continue
            try:
                if slot.tap is not None:
                    slot.tap(frame, output.mono_audio())
                slot.on_output(output)
            except Exception:
                log.exception("output handler failed")
        return elapsed_ms
