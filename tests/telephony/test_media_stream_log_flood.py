"""A media stream that sends nothing but malformed messages costs the log one line a second,
not one per message; every message still gets its `error` answer."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest

from tests.support.agents import RunningAgent, wait_until

from .test_media_stream import connect

FLOOD = 2000
LOGGER = "agent.telephony.media_stream"


async def test_two_thousand_malformed_messages_log_a_few_lines_with_the_count(
    echo_agent: RunningAgent, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, echo_agent)
        await bridge.open()
        for index in range(FLOOD):
            await bridge.socket.send_str(
                "not json" if index % 2 else json.dumps({"event": "bogus"}))
        await wait_until(lambda: len(bridge.errors) == FLOOD, timeout=30)
        await bridge.socket.close()
    await wait_until(lambda: not echo_agent.agent.telephony_legs)
    assert {e["error"]["code"] for e in bridge.errors} == {"invalid_json", "unknown_event"}
    lines = [r.getMessage() for r in caplog.records
             if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert 2 <= len(lines) <= 5, lines[:8]  # was one ERROR line per message
    assert any(f"({FLOOD} malformed in all)" in line for line in lines), lines
