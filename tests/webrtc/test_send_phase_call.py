"""Real aiortc calls started at different moments all send the agent's answer just after it
lands (agent/audio/send_phase.py), instead of keeping the phase their start gave them."""

from __future__ import annotations

import asyncio
import statistics

from agent.audio.playout import PHASE_GUARD_SECONDS
from agent.testing.peer import run_call
from tests.support.agents import RunningAgent, all_freed, wait_until

CALLS = 4
SECONDS = 3.0
SETTLED_S = 1.8  # from a call's set-up: connected, and four answers in


async def test_calls_started_at_different_phases_send_just_after_the_tick(
        echo_agent: RunningAgent) -> None:
    rate = echo_agent.agent.ticker.plugin.capabilities().sample_rate
    packet = round(0.02 * rate)
    waits: dict[str, list[float]] = {}
    first_seen: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def call(index: int) -> None:
        await asyncio.sleep(index * 0.105)  # 105 ms apart: each meets the 80 ms tick elsewhere
        report, _, _ = await run_call(echo_agent.url, seconds=SECONDS, data_channel=False)
        assert report.ok, report.error

    async def watch() -> None:
        while True:
            now = loop.time()
            for leg_id, leg in list(echo_agent.agent.webrtc_legs.items()):
                first_seen.setdefault(leg_id, now)
                wait = leg.playout.last_wait_samples
                if wait is not None and now - first_seen[leg_id] > SETTLED_S:
                    # The part of a packet the answer waits (whole packets of cushion a
                    # loaded runner may have earned are the standing backlog's).
                    waits.setdefault(leg_id, []).append((wait % packet) / rate)
            await asyncio.sleep(0.04)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(call(i) for i in range(CALLS)))
    finally:
        watcher.cancel()
    assert len(waits) == CALLS
    medians = {leg_id: statistics.median(seen) for leg_id, seen in waits.items()}
    # Every call within a few ms of the guard (left to their start phase: spread over 0-20 ms).
    assert all(m < PHASE_GUARD_SECONDS + 0.004 for m in medians.values()), medians
    await wait_until(lambda: all_freed(echo_agent))
