"""A leg's sideband hub (agent/realtime/sideband.py) on a real leg with the echo plugin: events
fan out in order to every sideband, one that falls behind is dropped alone, `call.ending` is
sent once and finishes every sideband, and a bad client event is answered on its own
sideband only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.call_settings import CallSettings
from agent.leg import Leg
from agent.plugins.echo import EchoPlugin
from agent.realtime.events import server_event
from agent.realtime.sideband import CALL_ENDED, OVERFLOWED, Sideband
from agent.ticker import Ticker


@pytest.fixture
async def leg() -> AsyncIterator[Leg]:
    plugin = EchoPlugin()
    ticker = Ticker(plugin)
    leg = Leg("call_test", plugin, ticker, CallSettings(), lambda leg: None)
    yield leg
    await leg.close("test_over")
    await ticker.close()


async def drain(sideband: Sideband) -> list[dict[str, Any]]:
    """Everything a finished sideband still had to send."""
    events = []
    while (event := await asyncio.wait_for(sideband.next_event(), 5)) is not None:
        events.append(event)
    return events


async def test_events_reach_every_sideband_in_order(leg: Leg) -> None:
    first, second = leg.sidebands.attach(), leg.sidebands.attach()
    for digit in "123":
        leg.emit(server_event("input_audio_buffer.dtmf_event_received", event=digit))
    await leg.close("hangup")
    for sideband in (first, second):
        events = await drain(sideband)
        assert [e["type"] for e in events] == (
            ["session.created"] + ["input_audio_buffer.dtmf_event_received"] * 3
            + ["call.ending"])
        assert events[0]["session"]["id"] == "call_test"
        assert [e["event"] for e in events[1:4]] == ["1", "2", "3"]
        assert events[-1]["reason"] == "hangup"
        assert sideband.finished == CALL_ENDED
    assert leg.sidebands.sidebands == []


async def test_a_sideband_that_falls_behind_is_dropped_alone(leg: Leg) -> None:
    slow, fast = leg.sidebands.attach(limit=3), leg.sidebands.attach()
    told: list[str] = []
    slow.on_overflow = lambda: told.append("cut")
    assert (await fast.next_event() or {})["type"] == "session.created"
    for n in range(5):
        leg.emit(server_event("error", error={"code": f"e{n}"}))
        assert await fast.next_event() is not None  # the fast one keeps up
    assert slow.finished == OVERFLOWED and told == ["cut"]
    assert await slow.next_event() is None  # its queue went with it
    assert leg.sidebands.sidebands == [fast] and leg.sidebands.overflows == 1
    leg.emit(server_event("error", error={"code": "after"}))
    assert (await fast.next_event() or {})["error"]["code"] == "after"


async def test_call_ending_is_sent_once_and_late_sidebands_are_told(leg: Leg) -> None:
    sideband = leg.sidebands.attach()
    # A transport that says goodbye itself (WebRTC's notify_ending) emits call.ending first.
    leg.emit(server_event("call.ending", reason="max_call_seconds", message="limit"))
    await leg.close("max_call_seconds")
    events = await drain(sideband)
    assert [e["type"] for e in events].count("call.ending") == 1
    late = leg.sidebands.attach()
    assert [e["type"] for e in await drain(late)] == ["session.created", "call.ending"]
    assert late.finished == CALL_ENDED


async def test_bad_client_events_are_answered_on_their_own_sideband(leg: Leg) -> None:
    sender, watcher = leg.sidebands.attach(), leg.sidebands.attach()
    for sideband in (sender, watcher):
        assert (await sideband.next_event() or {})["type"] == "session.created"
    sender.offer("not json")
    sender.offer('{"type": "session.update", "event_id": "e1", "session": {}}')
    first = await asyncio.wait_for(sender.next_event(), 5)
    second = await asyncio.wait_for(sender.next_event(), 5)
    assert first is not None and first["error"]["code"] == "invalid_json"
    # No plugin seat yet: refused with a code, as on the data channel.
    assert second is not None and second["error"]["code"] == "session_not_ready"
    assert second["error"]["event_id"] == "e1"
    sender.close()
    assert leg.sidebands.sidebands == [watcher]
    assert not leg.closing
    await leg.close("hangup")
    assert [e["type"] for e in await drain(watcher)] == ["call.ending"]
