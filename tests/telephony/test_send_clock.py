"""The shared send clock of RTP legs, on a fake clock: phases, cadence, isolation, ending."""

from __future__ import annotations

import asyncio

from agent.audio.pacer import Pacer
from agent.audio.send_clock import SendClock
from tests.support.clock import FakeClock


async def run_for(clock: FakeClock, seconds: float) -> None:
    until = clock.now() + seconds
    while clock.now() < until:
        await asyncio.sleep(0)


async def test_senders_spread_over_the_phases_and_tick_every_20_ms() -> None:
    clock = FakeClock()
    send_clock = SendClock(clock)
    calls: list[list[float]] = [[] for _ in range(8)]
    leaves = [send_clock.join(lambda tick_at, now, log=log: log.append(tick_at)) for log in calls]
    await run_for(clock, 1.0)
    for log in calls:
        assert 49 <= len(log) <= 51
        gaps = {round(b - a, 9) for a, b in zip(log, log[1:], strict=False)}
        assert gaps == {0.02}
    # two senders per 5 ms phase: their first ticks are 0, 5, 10 and 15 ms after the start
    firsts = sorted(round(log[0] - clock.time, 9) % 0.02 for log in calls)
    assert len({round(first, 6) for first in firsts}) == 4
    for leave in leaves:
        leave()
    assert send_clock._running is not None
    await asyncio.wait_for(send_clock._running, 5)  # with no sender left, the task ends


async def test_a_raising_sender_is_dropped_and_the_others_go_on() -> None:
    clock = FakeClock()
    send_clock = SendClock(clock)
    good: list[float] = []

    def broken(tick_at: float, now: float) -> None:
        raise ValueError("boom")

    send_clock.join(broken)
    leave = send_clock.join(lambda tick_at, now: good.append(tick_at))
    await run_for(clock, 0.5)
    assert send_clock.failures == 1
    assert len(send_clock) == 1
    assert len(good) >= 24
    leave()
    send_clock.close()


async def test_a_sender_can_join_again_after_the_clock_went_idle() -> None:
    clock = FakeClock()
    send_clock = SendClock(clock)
    first: list[float] = []
    send_clock.join(lambda tick_at, now: first.append(tick_at))()  # joins and leaves at once
    assert send_clock._running is not None
    await asyncio.wait_for(send_clock._running, 5)
    second: list[float] = []
    leave = send_clock.join(lambda tick_at, now: second.append(tick_at))
    await run_for(clock, 0.2)
    assert first == [] and len(second) >= 9
    leave()
    send_clock.close()


def test_pacer_take_due_counts_catches_up_and_restarts() -> None:
    pacer = Pacer(FakeClock(), 0.02, max_lateness=0.1)
    assert pacer.take_due(10.0, 10.0) == 1  # the first tick starts the timeline
    assert pacer.take_due(10.0, 10.001) == 0  # nothing more due on the same tick
    assert pacer.take_due(10.02, 10.021) == 1
    assert pacer.take_due(10.06, 10.062) == 2  # a tick was missed: both due packets go
    assert pacer.next_due is not None and abs(pacer.next_due - 10.08) < 1e-9
    assert pacer.take_due(10.5, 10.5) == 1  # far behind: a new timeline from this tick
    assert pacer.reanchors == 1
    assert pacer.late_sends == 1  # the 438 ms hole before that packet
