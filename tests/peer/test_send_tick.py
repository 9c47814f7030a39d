"""The peer's one 20 ms send clock per event loop: shared by every sender of the loop, one
phase, a sender that leaves is no longer called."""

from __future__ import annotations

import asyncio

from agent.audio.pcm import PTIME
from agent.audio.send_clock import SendClock
from agent.testing.peer.transports.send_tick import send_tick


async def test_every_sender_of_a_loop_shares_one_clock_of_one_phase() -> None:
    clock = send_tick()
    assert send_tick() is clock
    assert clock.phase_seconds == PTIME  # one phase: a tick is the whole 20 ms
    ticks: list[tuple[str, float]] = []
    leave_a = clock.join(lambda tick_at, now: ticks.append(("a", tick_at)))
    leave_b = clock.join(lambda tick_at, now: ticks.append(("b", tick_at)))
    try:
        while len({t for name, t in ticks if name == "a"}) < 3:
            await asyncio.sleep(0.01)
        # Both senders run on the same ticks (one wake-up for both).
        a_ticks = [t for name, t in ticks if name == "a"]
        b_ticks = [t for name, t in ticks if name == "b"]
        assert a_ticks[: len(b_ticks)] == b_ticks[: len(a_ticks)]
        leave_a()
        seen = len(ticks)
        while len(ticks) < seen + 2:
            await asyncio.sleep(0.01)
        assert all(name == "b" for name, _ in ticks[seen:])
    finally:
        leave_a()
        leave_b()
        clock.close()


def test_each_loop_has_its_own_clock() -> None:
    async def clocks() -> tuple[SendClock, SendClock]:
        return send_tick(), send_tick()

    first, again = asyncio.run(clocks())
    other, _ = asyncio.run(clocks())
    assert first is again and other is not first
