"""Every call sends its answer just after the tick that made it, whatever its start phase.

The ticker's answers land every 80 ms on the ticker's grid; a call's 20 ms sends start on
a grid of their own, wherever the call started. Against an injected clock: a call started at
any of the four 5 ms phases of a packet, before or after the first answers landed, ends up
sending each answer's first samples the guard after it lands (the old pacer kept whatever
phase the call started at: up to a packet more). And the caller's side: at whatever phase
its packets arrive, each frame is complete less than a packet before the tick that steps it.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.audio.pacer import Pacer
from agent.audio.playout import PHASE_FIRST_PUSHES, PHASE_GUARD_SECONDS, PlayoutBuffer
from agent.audio.send_phase import SendPhase
from agent.ticker import PluginSlot
from tests.support.clock import FakeClock

RATE = 24000
PACKET = 480  # 20 ms
FRAME = 4 * PACKET  # 80 ms
PERIOD = 0.08
TICK0 = 10.0  # the shared ticker's grid: TICK0 + k * 80 ms
STEP = 0.0013  # the plugin step: an answer lands this long after its tick
START_PHASES_MS = (0, 5, 10, 15)


async def send_waits(start_phase_ms: int, frames: int, pushes_before_start: int) -> list[float]:
    """Answers land at TICK0 + k*80 ms + STEP; the call connects (its pacer's first send) at
    its start phase after `pushes_before_start` answers landed unheard. Returns, per answer
    landing after that, the seconds until its first sample is sent."""
    clock = FakeClock(start=TICK0 - 0.5)
    pacer = Pacer(clock, 0.02)
    playout = PlayoutBuffer(FRAME * 20)
    playout.follow(pacer, RATE)
    # Sends that start before any answer lands (a test of the windows that follow; a real
    # pacer waits for the first answer a while, see the test below).
    pacer.first_phase_wait = 0.0
    landings = [TICK0 + k * PERIOD + STEP for k in range(frames)]
    for at in landings[:pushes_before_start]:  # before the call connects: nothing is sent
        clock.time = at
        playout.push(np.full(FRAME, 0.3, dtype=np.float32))
        playout.clear()
    landings = landings[pushes_before_start:]
    clock.time = landings[0] - STEP - PERIOD + start_phase_ms / 1000 + 0.0004
    await pacer.wait_next()  # the first send
    playout.pop(PACKET)
    waits: list[float] = []
    starts: list[int] = []  # per answer: how many samples were queued before its first
    queued = sent = 0
    pending = list(landings)
    while pending:
        due = pacer.next_due
        assert due is not None
        if due < pending[0]:
            await pacer.wait_next()
            if playout.pop(PACKET) is not None:
                sent += PACKET
                while starts and starts[0] < sent:  # this send carried an answer's first
                    waits.append(clock.now() - landings[len(waits)])
                    starts.pop(0)
            continue
        clock.time = pending.pop(0)
        starts.append(queued)
        queued += FRAME
        playout.push(np.full(FRAME, 0.3, dtype=np.float32))
    return waits


@pytest.mark.parametrize("start_phase_ms", START_PHASES_MS)
@pytest.mark.parametrize("pushes_before_start", [0, 3])
async def test_every_start_phase_sends_each_answer_just_after_it_lands(
        start_phase_ms: int, pushes_before_start: int) -> None:
    waits = await send_waits(start_phase_ms, 40, pushes_before_start)
    settled = waits[PHASE_FIRST_PUSHES + 1:]
    assert len(settled) > 20
    # Within a millisecond of the guard, on every answer, at every start phase (the old
    # pacer: the start phase's distance to the landing, anywhere up to 20 ms).
    assert all(abs(wait - PHASE_GUARD_SECONDS) < 0.001 for wait in settled), waits


async def test_a_leg_sending_from_its_first_moment_starts_on_the_first_answers_phase() -> None:
    """A media stream starts its sends as its seat is taken: the first send waits (a while)
    for the first answer to land, and the sends start the guard after it."""
    clock = FakeClock(start=TICK0)
    pacer = Pacer(clock, 0.02)
    playout = PlayoutBuffer(FRAME * 20)
    playout.follow(pacer, RATE)
    first_send = asyncio.ensure_future(pacer.wait_next())
    await asyncio.sleep(0)  # the pacer looks, and waits
    assert not first_send.done()
    clock.time = TICK0 + 0.0123  # the first answer lands
    playout.push(np.full(FRAME, 0.3, dtype=np.float32))
    await first_send
    assert clock.now() == pytest.approx(TICK0 + 0.0123 + PHASE_GUARD_SECONDS)


async def test_answers_landing_earlier_move_the_sends_with_them() -> None:
    """After a change of the step time (or a ticker restart) the next window follows it;
    answers landing later than the guard allows are the standing backlog's (a cushion)."""
    phase = SendPhase(granule=PACKET, guard=96, first_window=2, window=4)
    assert phase.observe(300) == 0
    assert phase.observe(250) == 250 - 96  # short windows for the first four answers
    assert [phase.observe(w) for w in (96 + 40, 96 + 30)] == [0, 30]
    assert [phase.observe(w) for w in (96, 96 + 40, 96 + 30, 96 + 50)] == [0, 0, 0, 0]
    # Whole packets of wait are the standing backlog's: only the part of a packet counts.
    assert [phase.observe(w) for w in (PACKET + 100, PACKET + 96, 2 * PACKET + 110, 500)] == [
        0, 0, 0, 0]
    assert [phase.observe(w) for w in (PACKET + 130, 2 * PACKET + 120, 300, 200)] == [
        0, 0, 0, 200 - 96]


@pytest.mark.parametrize("arrival_phase_ms", START_PHASES_MS)
async def test_each_frame_is_complete_less_than_a_packet_before_its_tick(
        arrival_phase_ms: int) -> None:
    """Caller packets arriving at any phase of the tick: after the call's first (partial)
    frame, every frame's last packet came less than a packet before the tick, and nothing
    whole waits beyond it."""
    clock = FakeClock(start=TICK0)
    slot = PluginSlot(None, FRAME, 3, lambda output: None, None,  # type: ignore[arg-type]
                      clock)
    silence = np.zeros(FRAME, dtype=np.float32)
    arrivals = [TICK0 + 0.0123 + arrival_phase_ms / 1000 + 0.02 * n for n in range(60)]
    last_push = 0.0
    for tick in range(1, 14):
        tick_at = TICK0 + tick * PERIOD
        while arrivals and arrivals[0] < tick_at:
            clock.time = last_push = arrivals.pop(0)
            slot.push(np.full(PACKET, 0.1, dtype=np.float32))
        clock.time = tick_at
        slot.take(silence)
        if tick > 1:
            assert 0 < tick_at - last_push < 0.02
            assert slot.inbound.buffered_samples == 0
            assert slot.counters.last_tick_wait_ms == pytest.approx(
                (tick_at - last_push) * 1000, abs=0.01)
    assert slot.counters.padded <= 1
