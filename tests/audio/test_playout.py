"""The playout buffer gives back, in silence, the delay that a late model output cost."""

from __future__ import annotations

import numpy as np

from agent.audio.pacer import Pacer
from agent.audio.playout import TRIM_HOLD_PUSHES, TRIM_WINDOW_PUSHES, PlayoutBuffer
from tests.support.clock import FakeClock

RATE = 1000  # 20 samples per 20 ms chunk, 80 per 80 ms output
CHUNK, FRAME = 20, 80


async def play(outputs: int, stall: tuple[int, float] | None, level: float
               ) -> tuple[PlayoutBuffer, list[int]]:
    """Push one 80 ms output per period, 1 ms after a send slot, and pop a chunk at every
    pacer slot. `stall` = (k, seconds): output k and those due during the stall arrive
    together when it ends, as from a ticker catching up. Returns the buffer and, per
    output, how many samples were queued ahead of it when it arrived."""
    clock = FakeClock(start=0.0)
    pacer = Pacer(clock, 0.02, max_lateness=10.0)
    playout = PlayoutBuffer(FRAME * 100)
    playout.follow(pacer, RATE)
    pacer.first_phase_wait = 0.0  # the first send at t = 0, before any output (see below)
    times = [0.081 + 0.08 * k for k in range(outputs)]
    if stall is not None:
        ends = times[stall[0]] + stall[1]
        times = [max(t, ends) if t < ends and k >= stall[0] else t for k, t in enumerate(times)]
    pushes = list(times)
    ahead: list[int] = []
    await pacer.wait_next()  # the first send slot, at t = 0
    playout.pop(CHUNK)
    while pushes:
        due = pacer.next_due
        assert due is not None
        if pushes[0] <= due:
            clock.time = pushes.pop(0)
            ahead.append(playout.buffered_samples)
            playout.push(np.full(FRAME, level, dtype=np.float32))
        else:
            await pacer.wait_next()
            playout.pop(CHUNK)
    return playout, ahead


async def test_on_time_outputs_are_never_trimmed() -> None:
    playout, ahead = await play(400, None, level=0.0)
    assert playout.trimmed_samples == 0
    assert playout.underrun_chunks == 5  # the slots before the first output only
    assert set(ahead[1:]) == {0}


async def test_delay_of_a_late_output_is_given_back_in_silence_after_the_hold() -> None:
    late = 10
    playout, ahead = await play(late + TRIM_HOLD_PUSHES + 3 * TRIM_WINDOW_PUSHES,
                                (late, 0.05), level=0.0)
    # 50 ms late (the sends keep only the 4 ms guard after each landing, see send_phase.py):
    # three chunks went out as silence, and everything after queues 60 ms more ...
    assert ahead[late + 1] == 3 * CHUNK
    # ... which is kept through the hold (less than the 80 ms cushion), then dropped.
    assert ahead[late + TRIM_HOLD_PUSHES - TRIM_WINDOW_PUSHES] == 3 * CHUNK
    assert playout.trimmed_samples == 3 * CHUNK
    assert ahead[-1] == 0


async def test_a_long_stall_keeps_only_one_frame_of_cushion_during_the_hold() -> None:
    late = 10
    playout, ahead = await play(late + 3 * TRIM_WINDOW_PUSHES, (late, 0.25), level=0.0)
    # A 250 ms stall: thirteen chunks of silence; within two windows all but 80 ms is given
    # back: dropped, or (a chunk, in parts of one) sent earlier as the sends moved to the
    # outputs' phase again (beyond the 15 ms of the first alignment, 1 ms after each slot).
    assert ahead[late + 4] == 13 * CHUNK
    assert ahead[-1] == FRAME
    assert playout.trimmed_samples == 12 * CHUNK - FRAME
    assert playout.phase_moved_samples == 15 + CHUNK


async def test_speech_is_never_dropped() -> None:
    playout, ahead = await play(10 + TRIM_HOLD_PUSHES + 3 * TRIM_WINDOW_PUSHES, (10, 0.05),
                                level=0.5)
    assert playout.trimmed_samples == 0
    assert ahead[-1] == 3 * CHUNK


async def test_clear_forgets_the_window_and_underruns_after_it_earn_no_hold() -> None:
    playout = PlayoutBuffer(FRAME * 10)
    playout.follow(Pacer(FakeClock(), 0.02), RATE)
    playout.push(np.zeros(FRAME, dtype=np.float32))
    assert playout.clear() == FRAME
    assert playout.pop(CHUNK) is None  # nothing to play after a barge-in: not lateness
    assert not playout.holding_cushion
    playout.push(np.zeros(FRAME, dtype=np.float32))
    playout.pop(FRAME)
    assert playout.pop(CHUNK) is None  # an output was late: that is lateness
    assert playout.holding_cushion


async def test_silence_answered_before_the_first_send_does_not_queue() -> None:
    """The seat is taken at the offer, the sends begin at connect: the silent answers of the
    set-up are not sent ahead of the call's audio; an answer with sound in it is."""
    clock = FakeClock(start=0.0)
    pacer = Pacer(clock, 0.02)
    playout = PlayoutBuffer(FRAME * 100)
    playout.follow(pacer, RATE)
    for _ in range(10):
        playout.push(np.zeros(FRAME, dtype=np.float32))
    assert playout.buffered_samples == FRAME
    playout.push(np.full(FRAME, 0.5, dtype=np.float32))
    playout.push(np.zeros(FRAME, dtype=np.float32))
    assert playout.buffered_samples == 2 * FRAME  # a greeting waits for the call
    await pacer.wait_next()
    playout.pop(CHUNK)
    playout.push(np.zeros(FRAME, dtype=np.float32))  # once sending, the windows decide
    assert playout.buffered_samples == 3 * FRAME - CHUNK


async def test_the_set_ups_silence_left_at_the_first_send_is_dropped() -> None:
    """What the last answer before the call connected left queued would otherwise sit ahead
    of every later answer (0 to 4 packets, by the moment the call connected)."""
    clock = FakeClock(start=0.0)
    pacer = Pacer(clock, 0.02)
    playout = PlayoutBuffer(FRAME * 100)
    playout.follow(pacer, RATE)
    playout.push(np.zeros(FRAME, dtype=np.float32))
    clock.advance(0.03)
    await pacer.wait_next()  # the call connects: its first send
    assert playout.pop(CHUNK) is None and playout.buffered_samples == 0
    assert playout.trimmed_samples == FRAME
    assert not playout.holding_cushion  # nothing was late
