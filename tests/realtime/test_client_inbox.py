from __future__ import annotations

import asyncio

from agent.realtime.client_inbox import ClientEventInbox, RawEvent
from tests.support.clock import FakeClock


async def test_events_are_handled_in_order_and_floods_reported_once_a_second() -> None:
    clock = FakeClock()
    handled: list[RawEvent] = []
    reports: list[tuple[RawEvent, int]] = []
    release = asyncio.Event()

    async def handle(raw: RawEvent) -> None:
        await release.wait()  # a slow handler: the flood arrives while it works
        handled.append(raw)

    inbox = ClientEventInbox(handle, lambda raw, n: reports.append((raw, n)), rate=10.0,
                             burst=3, clock=clock)
    serving = asyncio.ensure_future(inbox.serve())
    for index in range(10):  # the burst of 3 is taken, 7 refused
        inbox.offer(f"e{index}")
    await asyncio.sleep(0)  # the handler takes e0 and works on it
    clock.advance(0.5)  # 5 tokens back (3 at most), but the queue has room for one
    for index in range(10, 20):
        inbox.offer(f"e{index}")
    clock.advance(1.0)
    inbox.offer("late")  # a token, but still no room
    release.set()
    await asyncio.sleep(0.01)
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    assert handled == ["e0", "e1", "e2", "e10"]
    assert inbox.refused == 17
    # The first refusal is reported at once; the others are counted and told with the next
    # report, no sooner than a second later.
    assert reports == [("e3", 1), ("late", 16)]
