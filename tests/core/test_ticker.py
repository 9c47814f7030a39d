from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from agent.plugins.base import (
    Capabilities,
    Plugin,
    PluginSession,
    RuntimeConfig,
    SessionConfig,
    StepOutput,
)
from agent.ticker import TRIM_WINDOW_TICKS, PluginSlot, Ticker
from tests.support.clock import FakeClock

FRAME = 4  # tiny frames keep the arithmetic readable: 4 samples at 50 Hz = 80 ms


class RecordingPlugin(Plugin):
    """Records every batch it is stepped with, and the clock time of each step."""

    id = "recording"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.batches: list[list[tuple[str, float]]] = []
        self.step_times: list[float] = []
        self.created: list[str] = []
        self.closed: list[str] = []
        self.restarted: list[str] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(sample_rate=50, frame_size=FRAME)

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        return RuntimeConfig(voice=session_config.voice)

    def create_session(self, config: RuntimeConfig) -> PluginSession:
        self.created.append(str(config.voice))
        return PluginSession(config)

    def close_session(self, session: PluginSession) -> None:
        self.closed.append(str(session.config.voice))

    def restart_session(self, session: PluginSession) -> None:
        self.restarted.append(str(session.config.voice))

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        self.step_times.append(self.clock.now())
        self.batches.append([(str(s.config.voice), float(frame[0])) for s, frame in batch])
        return [StepOutput(audio=frame.copy()) for _, frame in batch]


def frame(value: float) -> np.ndarray:
    return np.full(FRAME, value, dtype=np.float32)


async def wait_for_ticks(plugin: RecordingPlugin, count: int, timeout: float = 20.0) -> None:
    # Steps run on the ticker's worker thread: wait in real time, not in loop iterations.
    deadline = asyncio.get_running_loop().time() + timeout
    while len(plugin.batches) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"only {len(plugin.batches)} ticks")
        await asyncio.sleep(0.001)


async def stopped_seat() -> tuple[PluginSlot, np.ndarray]:
    """A session's seat on a stopped ticker (room for 10 frames): tests call `take` by hand."""
    clock = FakeClock()
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock, inbound_capacity=10)
    slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    await ticker.close()
    return slot, plugin.silence_frame()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=100.0)


async def test_all_live_sessions_share_one_batched_step(clock: FakeClock) -> None:
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock)
    outputs: dict[str, list[float]] = {"a": [], "b": []}
    a = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: outputs["a"].append(o.audio[0]))
    b = await ticker.open_slot(RuntimeConfig(voice="b"), lambda o: outputs["b"].append(o.audio[0]))
    joined = len(plugin.batches)
    a.push(frame(1.0))
    b.push(frame(2.0))
    await wait_for_ticks(plugin, joined + 4)  # at most one stale single-session step, see below
    await ticker.close()
    # A step snapshotted before b joined may still land after open_session returned (the
    # worker runs it after b's create_session): judge from the first step that saw b.
    first_with_b = next(i for i, batch in enumerate(plugin.batches)
                        if ("b" in [v for v, _ in batch]))
    after_join = plugin.batches[first_with_b:]
    assert len(after_join) >= 3
    assert all([v for v, _ in batch] == ["a", "b"] for batch in after_join)
    # Both caller frames went through the same step and back to their own session.
    assert [("a", 1.0), ("b", 2.0)] in after_join
    assert 1.0 in outputs["a"] and 2.0 in outputs["b"]
    assert 2.0 not in outputs["a"] and 1.0 not in outputs["b"]
    assert sorted(plugin.closed) == ["a", "b"]


async def test_join_and_leave_keep_the_tick_timeline(clock: FakeClock) -> None:
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock)
    a = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    await wait_for_ticks(plugin, 5)
    b = await ticker.open_slot(RuntimeConfig(voice="b"), lambda o: None)
    joined = len(plugin.batches)
    await wait_for_ticks(plugin, joined + 5)
    await ticker.close_slot(a)
    left = len(plugin.batches)
    await wait_for_ticks(plugin, left + 5)
    await ticker.close()
    # Every tick lands exactly on anchor + n * period, before and after the join and leave.
    np.testing.assert_allclose(np.diff(np.array(plugin.step_times)), 0.08, atol=1e-9)
    voices = [tuple(v for v, _ in batch) for batch in plugin.batches]
    assert set(voices[:5]) == {("a",)}
    assert ("a", "b") in voices[joined - 1 : left + 1]
    assert voices[-1] == ("b",)
    assert b.closed


async def test_quiet_caller_is_clocked_with_silence(clock: FakeClock) -> None:
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock)
    slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    slot.push(frame(5.0))
    await wait_for_ticks(plugin, 6)
    await ticker.close()
    values = [batch[0][1] for batch in plugin.batches[:6]]
    assert values == [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert slot.counters.silence_filled >= 5


async def test_inbound_queue_is_bounded_and_drops_oldest() -> None:
    clock = FakeClock()
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock, inbound_capacity=3)
    slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    await ticker.close()  # stop the clock so the queue is only filled
    for value in range(10):
        slot.push(frame(float(value)))
    assert slot.inbound.buffered_samples == 3 * FRAME
    assert slot.counters.dropped_overflow_samples == 7 * FRAME
    assert slot.take(plugin.silence_frame())[0] == 7.0


async def test_frames_are_cut_from_any_chunking_and_padded_when_late() -> None:
    clock = FakeClock()
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock)
    slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    await ticker.close()
    silence = plugin.silence_frame()
    slot.push(np.arange(3, dtype=np.float32))
    slot.push(np.arange(3, 6, dtype=np.float32))
    np.testing.assert_array_equal(slot.take(silence), [0, 1, 2, 3])
    # Only two samples are there at the next tick: the frame is completed with silence.
    np.testing.assert_array_equal(slot.take(silence), [4, 5, 0, 0])
    assert slot.counters.padded == 1
    np.testing.assert_array_equal(slot.take(silence), [0, 0, 0, 0])
    assert slot.counters.silence_filled == 1


async def test_standing_backlog_is_trimmed() -> None:
    slot, silence = await stopped_seat()
    # A burst left two extra frames queued; the caller keeps sending one frame per tick.
    slot.push(frame(0.0))
    slot.push(frame(0.0))
    for _ in range(TRIM_WINDOW_TICKS * 2):
        slot.push(frame(1.0))
        slot.take(silence)
    # Two frames waited a whole window for nothing: they are dropped once, not more.
    assert slot.counters.dropped_backlog_samples == 2 * FRAME
    assert slot.inbound.buffered_samples == 0


async def test_jitter_cushion_is_kept_after_a_late_frame() -> None:
    slot, silence = await stopped_seat()
    for _ in range(3):  # the stream flows ...
        slot.push(frame(1.0))
        slot.take(silence)
    slot.push(frame(1.0)[:2])  # ... then half a frame, and the rest arrives late
    slot.take(silence)
    for _ in range(TRIM_WINDOW_TICKS * 3):
        slot.push(frame(1.0))
        slot.take(silence)
    assert slot.counters.padded == 1
    assert slot.counters.dropped_backlog_samples == 0


@pytest.mark.parametrize("late_frame, frames_dropped", [(False, 4), (True, 3)])
async def test_a_stall_backlog_is_dropped_but_for_a_cushion_earned_by_jitter(
    late_frame: bool, frames_dropped: int,
) -> None:
    slot, silence = await stopped_seat()
    slot.push(frame(1.0)[:1])  # a stream's first frame is partial: no jitter shown yet
    slot.take(silence)
    slot.push(frame(1.0))
    slot.take(silence)
    if late_frame:
        slot.push(frame(1.0)[:2])  # a late frame while flowing earns a cushion
        slot.take(silence)
    for _ in range(4):  # a stall of ours: 4 frames queue up, nothing is padded
        slot.push(frame(2.0))
    for _ in range(TRIM_WINDOW_TICKS * 2):
        slot.push(frame(1.0))
        slot.take(silence)
    assert slot.counters.padded == 1 + late_frame
    # At the first whole window the backlog is dropped, but for at most one frame of cushion.
    assert slot.counters.dropped_backlog_samples == frames_dropped * FRAME
    assert slot.inbound.buffered_samples == (4 - frames_dropped) * FRAME


async def test_restart_clears_queue_and_restarts_plugin_session(clock: FakeClock) -> None:
    plugin = RecordingPlugin(clock)
    ticker = Ticker(plugin, clock=clock)
    slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None)
    await ticker.restart_slot(slot)
    await ticker.close()
    assert plugin.restarted == ["a"]


async def test_a_failing_step_reports_errors_and_the_clock_goes_on(clock: FakeClock) -> None:
    plugin = RecordingPlugin(clock)
    calls = {"n": 0}
    original = plugin.step

    def flaky(batch):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return original(batch)

    plugin.step = flaky  # type: ignore[method-assign]
    errors: list[Exception] = []
    ticker = Ticker(plugin, clock=clock)
    await ticker.open_slot(RuntimeConfig(voice="a"), lambda o: None, errors.append)
    await wait_for_ticks(plugin, 4)
    await ticker.close()
    assert len(errors) == 1 and ticker.counters.step_errors == 1


class ThreadNotingSession(PluginSession):
    """Notes the thread that sets its config."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "config":
            object.__setattr__(self, "config_set_on", threading.current_thread().name)
        object.__setattr__(self, name, value)


async def test_a_config_update_is_applied_on_the_worker_thread() -> None:
    class Plugin(RecordingPlugin):
        def create_session(self, config: RuntimeConfig) -> PluginSession:
            return ThreadNotingSession(config)

    plugin = Plugin(FakeClock())
    ticker = Ticker(plugin, clock=plugin.clock)
    try:
        slot = await ticker.open_slot(RuntimeConfig(voice="a"), lambda output: None)
        await ticker.update_slot(slot, RuntimeConfig(voice="b"))
        assert slot.config.voice == "b"
        assert slot.plugin_session.config_set_on.startswith("ticker-")  # type: ignore[attr-defined]
    finally:
        await ticker.close()
