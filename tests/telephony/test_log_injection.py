"""Client strings cannot forge log records: control characters are escaped where logged."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest

from agent.logs.log_safe import printable
from tests.support.agents import RunningAgent, wait_until

from .test_media_stream import connect

FORGED = "x\n2026-01-01 00:00:00 INFO signaling: forged record\r\x1b[2K\u2028"


def test_printable_escapes_controls_and_bounds_length() -> None:
    assert printable("ok-id_1") == "ok-id_1"
    escaped = printable(FORGED)
    assert "\n" not in escaped and "\r" not in escaped and "\x1b" not in escaped
    assert "\u2028" not in escaped and "\\n2026" in escaped and "\\x1b" in escaped
    assert printable("a\\nb") == "a\\\\nb"  # a literal backslash-n is not a newline
    long = printable("y" * 5000)
    assert len(long) < 250 and long.endswith("(4800 more)")
    assert printable(None) == "None"


def _records_with_newlines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if any(c in r.getMessage() for c in "\n\r\x1b\u2028")]


async def test_media_stream_event_names_ids_and_option_keys_are_escaped(
    echo_agent: RunningAgent, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, echo_agent)
        bridge.stream_sid = "MZ" + FORGED
        await bridge.send({"event": FORGED})  # unknown event name: logged with the error
        await bridge.open({"extra_body": json.dumps({FORGED: 1})})  # unknown option key
        await bridge.finished()
        assert [e["error"]["code"] for e in bridge.errors] == ["unknown_event", "unknown_option"]
        started = await connect(http, echo_agent)
        started.stream_sid = "MZ" + FORGED
        await started.open()
        await wait_until(lambda: "start stream=" in caplog.text)
        await started.socket.close()
    await wait_until(lambda: not echo_agent.agent.telephony_legs)
    assert "forged record" in caplog.text  # the strings were logged...
    assert _records_with_newlines(caplog) == []  # ...but as one line each
