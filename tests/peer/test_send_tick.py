"""The peer's one tick per event loop: shared by every sender and poll of the loop, sends
every 20 ms and polls every 5 ms on one grid (a send tick is also a poll), one wake-up per
tick, late wake-ups run once, a failing member is dropped, and nothing runs once all left."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME
from agent.testing.peer.transports.send_tick import PeerTick, send_tick
from tests.support.agents import wait_until


def on_grid(gap: float) -> bool:
    """A gap between two send ticks: a whole number (at least one) of 20 ms periods."""
    periods = gap / PTIME
    return round(periods) >= 1 and abs(periods - round(periods)) < 1e-6


async def test_every_sender_of_a_loop_shares_one_tick() -> None:
    clock = send_tick()
    assert send_tick() is clock
    ticks: list[tuple[str, float]] = []
    leave_a = clock.join(lambda tick_at, now: ticks.append(("a", tick_at)))
    leave_b = clock.join(lambda tick_at, now: ticks.append(("b", tick_at)))
    try:
        await wait_until(lambda: len({t for name, t in ticks if name == "a"}) >= 3, timeout=5)
        # Both senders run on the same ticks (one wake-up for both), in the order they joined.
        a_ticks = [t for name, t in ticks if name == "a"]
        b_ticks = [t for name, t in ticks if name == "b"]
        assert a_ticks[: len(b_ticks)] == b_ticks[: len(a_ticks)]
        assert ticks[0][0] == "a" and ticks[1][0] == "b"
        # On the 20 ms grid (a late wake-up on a busy machine skips to the latest tick).
        assert all(on_grid(b - a) for a, b in zip(a_ticks, a_ticks[1:], strict=False))
        leave_a()
        seen = len(ticks)
        await wait_until(lambda: len(ticks) >= seen + 2, timeout=5)
        assert all(name == "b" for name, _ in ticks[seen:])
    finally:
        leave_a()
        leave_b()
        clock.close()


async def test_polls_run_every_5_ms_and_a_send_tick_is_also_a_poll() -> None:
    clock = PeerTick()
    events: list[tuple[str, float]] = []
    leave_send = clock.join(lambda tick_at, now: events.append(("send", tick_at)))
    leave_poll = clock.join_poll(lambda: events.append(("poll", time.monotonic())))
    try:
        await wait_until(lambda: sum(name == "send" for name, _ in events) >= 4, timeout=5)
        sends = [i for i, (name, _) in enumerate(events) if name == "send"]
        polls = [i for i, (name, _) in enumerate(events) if name == "poll"]
        # A poll comes first on every wake-up (the send tick's included); at most four polls
        # per send (a late wake-up runs once, so on a loaded machine fewer).
        assert all(events[i - 1][0] == "poll" for i in sends)
        assert len(sends) <= len(polls) <= 4 * len(sends) + 4
        # One wake-up per step: a poll and the send of the same step share it.
        assert clock.wakeups <= len(polls) + 1
    finally:
        leave_send()
        leave_poll()
        clock.close()


async def test_a_late_wake_up_sends_once_with_every_packet_due() -> None:
    clock = PeerTick()
    pacer = Pacer(MonotonicClock(), PTIME, max_lateness=60.0)  # never restarts its timeline
    counts: list[int] = []
    calls: list[float] = []

    def send_due(tick_at: float, now: float) -> None:
        calls.append(tick_at)
        counts.append(pacer.take_due(tick_at, now))

    leave = clock.join(send_due)
    try:
        await wait_until(lambda: len(calls) >= 2, timeout=5)
        time.sleep(0.07)  # the loop stalls past three send ticks
        before = len(calls)
        await wait_until(lambda: len(calls) >= before + 2, timeout=5)
        # The stall's ticks come as one call (no tick run twice, none out of order), its
        # pacer sending every packet due by then.
        assert max(counts) >= 3
        assert all(on_grid(b - a) for a, b in zip(calls, calls[1:], strict=False))
    finally:
        leave()
        clock.close()


async def test_the_grid_starts_when_the_first_wake_up_runs() -> None:
    # A loop busy when the first sender joins (a call encoding its audio) must not make the
    # first sends catch up: the first packet goes when the tick first runs, the next a whole
    # period later (a burst at the start of a stream upsets receivers such as ffmpeg's).
    clock = PeerTick()
    calls: list[tuple[float, float]] = []
    joined = time.monotonic()
    leave = clock.join(lambda tick_at, now: calls.append((tick_at, now)))
    time.sleep(0.03)  # busy: the first wake-up runs after this
    try:
        await wait_until(lambda: len(calls) >= 2, timeout=5)
        first, second = calls[0][0], calls[1][0]
        assert first >= joined + 0.03  # the grid started after the stall, not at the join
        assert on_grid(second - first)
    finally:
        leave()
        clock.close()


async def test_members_joining_during_a_wake_up_keep_the_grid() -> None:
    # A member that joins from inside a tick (a media-stream read that saw a burst asks for
    # 5 ms reads; a call that starts sending from a callback) must not restart the grid:
    # once, that left the next wake-up scheduled as many steps after a new grid's start as
    # the old one had run, seconds of no sends and no reads into a call.
    clock = PeerTick()
    sends: list[float] = []
    polls: list[float] = []
    leaves = []

    def send_due(tick_at: float, now: float) -> None:
        sends.append(now)
        if len(sends) in (25, 40):
            leaves.append(clock.join_poll(lambda: polls.append(time.monotonic())))
        if len(sends) == 30:
            leaves.append(clock.join(lambda tick_at, now: None))

    leaves.append(clock.join(send_due))
    try:
        await wait_until(lambda: len(sends) >= 50, timeout=10)
        gaps = [b - a for a, b in zip(sends, sends[1:], strict=False)]
        # Late wake-ups on a loaded machine skip whole ticks, but never a second of them.
        assert max(gaps) < 0.3, f"a {max(gaps) * 1000:.0f} ms gap between send ticks"
        assert polls and clock.polls() == 2
    finally:
        for leave in leaves:
            leave()
        clock.close()


async def test_a_failing_sender_is_dropped_and_the_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = PeerTick()
    good: list[float] = []

    def bad(tick_at: float, now: float) -> None:
        raise RuntimeError("broken sender")

    leave_bad = clock.join(bad)
    leave_good = clock.join(lambda tick_at, now: good.append(tick_at))
    try:
        await wait_until(lambda: len(good) >= 3, timeout=5)
        assert clock.failures == 1
        assert "broken sender" in caplog.text
    finally:
        leave_bad()
        leave_good()
        clock.close()


async def test_nothing_runs_once_everyone_left() -> None:
    clock = PeerTick()
    calls: list[float] = []
    leave = clock.join(lambda tick_at, now: calls.append(tick_at))
    await wait_until(lambda: len(calls) >= 2, timeout=5)
    leave()
    leave()  # twice is fine
    await asyncio.sleep(0.05)
    wakeups = clock.wakeups
    await asyncio.sleep(0.1)
    assert clock.wakeups == wakeups and len(clock) == 0
    # It starts again on the next join.
    leave = clock.join(lambda tick_at, now: calls.append(tick_at))
    count = len(calls)
    await wait_until(lambda: len(calls) > count, timeout=5)
    leave()
    clock.close()


def test_each_loop_has_its_own_tick() -> None:
    async def clocks() -> tuple[PeerTick, PeerTick]:
        return send_tick(), send_tick()

    first, again = asyncio.run(clocks())
    other, _ = asyncio.run(clocks())
    assert first is again and other is not first
