"""The peer's own load during a run (own_load.py): its event loop's CPU, overall and in the
busiest interval, the process's, how late the send tick ran, and a warning only when the
loop was busy enough to limit its calls."""

from __future__ import annotations

import asyncio
import time

from agent.testing.peer.own_load import LoadWatch
from agent.testing.peer.report import BUSY_SHARE, OwnLoad
from agent.testing.peer.transports.send_tick import send_tick
from tests.support.agents import wait_until


def burn(cpu_seconds: float) -> None:
    """Keep this thread busy for `cpu_seconds` of its own CPU (however loaded the machine)."""
    until = time.thread_time() + cpu_seconds
    while time.thread_time() < until:
        pass


async def test_a_busy_loop_shows_in_its_cpu_and_in_a_late_tick() -> None:
    ticks: list[float] = []
    leave = send_tick().join(lambda tick_at, now: ticks.append(now))
    watch = LoadWatch(interval=0.2)
    try:
        await wait_until(lambda: len(ticks) >= 2, timeout=5)
        watch.start()
        await asyncio.sleep(0.3)
        burn(0.5)  # the loop can run nothing else meanwhile: no tick, no sample
        await asyncio.sleep(0.3)
        own = await watch.stop()
    finally:
        leave()
        send_tick().close()
    assert own.seconds >= 1.0
    assert own.loop_cpu_seconds >= 0.5
    assert own.process_cpu_seconds >= own.loop_cpu_seconds - 0.01  # (two clocks, read apart)
    # The interval holding the burn was mostly busy (less than all of it on a loaded
    # machine, where the thread waits for a core too); the whole run less so.
    assert own.busiest_share >= 0.3 and own.busiest_share > own.share
    assert own.tick_late_max_ms >= 450  # the tick waited for the burn to end


async def test_an_idle_run_is_neither_busy_nor_warned_about() -> None:
    watch = LoadWatch(interval=0.1)
    watch.start()
    await asyncio.sleep(0.5)
    own = await watch.stop()
    assert own.seconds >= 0.5 and own.busiest_share < 0.5
    assert own.warning() is None


async def test_a_run_shorter_than_an_interval_is_never_busy() -> None:
    # A call that fails to connect is a few milliseconds of set-up: all CPU, no call held up.
    watch = LoadWatch(interval=1.0)
    watch.start()
    burn(0.05)
    own = await watch.stop()
    assert own.share > 0.5 and own.busiest_share == 0.0 and own.warning() is None


def test_the_warning_comes_at_the_busy_share_and_says_what_to_do() -> None:
    assert OwnLoad(busiest_share=BUSY_SHARE - 0.01).warning() is None
    line = OwnLoad(busiest_share=0.97, tick_late_max_ms=42.0).warning()
    assert line is not None and "97%" in line and "42 ms late" in line
    assert "fewer calls per peer process" in line


def test_figures_per_call_second_and_as_json() -> None:
    own = OwnLoad(seconds=10.0, loop_cpu_seconds=0.5, busiest_share=0.08,
                  process_cpu_seconds=0.8, analysis_cpu_seconds=1.25, call_seconds=400.0,
                  tick_late_max_ms=3.14)
    assert own.share == 0.05 and own.cpu_per_call_second == 0.002
    assert own.to_json() == {
        "seconds": 10.0, "loop_cpu_seconds": 0.5, "share": 0.05, "busiest_share": 0.08,
        "process_cpu_seconds": 0.8, "cpu_per_call_second": 0.002,
        "analysis_cpu_seconds": 1.25, "tick_late_max_ms": 3.1}
    assert OwnLoad().cpu_per_call_second is None  # no call sent anything
