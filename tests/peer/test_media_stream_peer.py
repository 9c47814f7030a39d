"""The peer's media-stream calls in a load test (`defer_decoding`) against this agent: the
`media` messages go out as json.dumps would write them, the agent's are taken off the
websocket without the receive loop (tap and receive poll) and decoded after the call, while
its other messages still arrive as events when they come and the agent closing the call
still ends it."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace

from agent.testing.peer.transports.base import EncodedPlayback, PeerOptions, open_call
from agent.testing.peer.transports.media_stream import (
    SEND_BUFFER_LIMIT,
    MediaStreamCall,
    MediaTemplate,
    aiohttp_frame_writer,
)
from agent.testing.testsignal import make_test_signal
from tests.support.agents import RunningAgent, wait_until

LOAD_TEST = {"defer_decoding": True}


def test_the_template_writes_what_json_dumps_writes() -> None:
    template = MediaTemplate("MZ0123456789abcdef")
    for chunk, payload in [(2, bytes(160)), (12345, bytes(range(160))), (7, b"")]:
        assert template.fill(chunk, base64.b64encode(payload)) == json.dumps({
            "event": "media", "streamSid": "MZ0123456789abcdef",
            "media": {"track": "inbound", "chunk": str(chunk),
                      "payload": base64.b64encode(payload).decode("ascii")}}).encode()


async def test_a_load_test_call_takes_the_audio_off_the_loop_and_events_as_they_come(
        echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "media-stream", PeerOptions(extra=LOAD_TEST))
    assert isinstance(call, MediaStreamCall)
    try:
        await call.connect()
        call.play(make_test_signal(0.6))
        await wait_until(lambda: call._tap is not None and call._tap.taken >= 25)
        # The audio so far went past the receive loop, read on the poll, and the caller's
        # goes out through aiohttp's frame writer (test_transports.py's load-test call checks
        # the echo of it).
        assert call._receiving is None and call._polled is not None and call._polled.reads
        assert call._frames is not None
        label = await call.mark("after-signal")
        mark = await call.wait_event(
            lambda e: e["type"] == "media_stream.mark" and e["mark"]["name"] == label, 5.0)
        assert mark is not None  # live, not after the call: the tap handed over
        assert call._receiving is not None
        await asyncio.sleep(0.3)
        await call.hangup()
    finally:
        await call.close()
    assert call.received.seconds == 0  # kept as text until the recordings are finished
    call.finish_recordings()
    times = call.received.times()
    # 0.5 s before the mark (25 messages taken) and 0.3 s after it.
    assert call.received.seconds > 0.75 and times == sorted(times)
    assert times[0] < mark.t and times[-1] > mark.t + 0.2
    assert [e.t for e in call.events] == sorted(e.t for e in call.events)
    await wait_until(lambda: not echo_agent.agent.legs)


def test_a_websocket_without_aiohttps_frame_writer_sends_through_send_str() -> None:
    assert aiohttp_frame_writer(SimpleNamespace()) is None
    assert aiohttp_frame_writer(SimpleNamespace(_writer=SimpleNamespace(
        _write_websocket_frame=lambda message, opcode: None, compress=0,
        transport=SimpleNamespace(get_write_buffer_size=lambda: 0)))) is None


def test_sends_wait_while_the_connection_holds_more_than_its_limit() -> None:
    call = open_call("http://127.0.0.1:9", "media-stream", PeerOptions(extra=LOAD_TEST))
    assert isinstance(call, MediaStreamCall)
    silence = base64.b64encode(bytes(160))  # the media messages' payloads are base64
    call.preencode(EncodedPlayback(lambda samples: [silence], 960, silence))
    written: list[bytes] = []
    buffered = [SEND_BUFFER_LIMIT + 1]  # the agent stopped reading
    call._socket = SimpleNamespace(closed=False)  # type: ignore[assignment]
    call._frames = (lambda message, opcode, rsv: written.append(message),
                    SimpleNamespace(get_write_buffer_size=lambda: buffered[0]))  # type: ignore
    call._send_due(100.0, 100.0)
    assert written == []
    buffered[0] = 0  # drained: the next tick sends (the pacer starts its timeline there)
    call._send_due(100.02, 100.02)
    assert len(written) == 1 and json.loads(written[0])["media"]["chunk"] == "2"
    call._send_due(100.04, 100.04)
    assert [json.loads(m)["media"]["chunk"] for m in written] == ["2", "3"]


async def test_a_load_test_call_the_agent_closes_ends_as_remote_hangup(
        echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "media-stream", PeerOptions(extra=LOAD_TEST))
    try:
        await call.connect()
        await wait_until(lambda: bool(echo_agent.agent.legs))
        await asyncio.sleep(0.2)
        await next(iter(echo_agent.agent.legs)).close("hangup")
        await asyncio.wait_for(call.ended.wait(), 10)
    finally:
        await call.close()
    assert call.end_reason == "remote_hangup"
    call.finish_recordings()
    assert call.received.seconds > 0.1
