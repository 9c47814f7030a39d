"""Data-channel messages over 64 KiB: advertised in the answer, dropped while they arrive (the
server never holds more than one message's worth of them), answered with an error event, and
the call and its channel go on. Real aiortc peers over loopback."""

from __future__ import annotations

import json

import pytest
from aiortc.rtcsctptransport import DataChunk, RTCSctpTransport

from agent.plugins.echo import EchoPlugin
from agent.rtc_tuning.sctp_limit import MAX_MESSAGE_BYTES
from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.realtime import RealtimeClient

CHUNK_SLACK = 1500  # one more fragment may arrive before the limit is seen to be passed


class ReassemblyHighWater:
    """The most bytes any SCTP stream held in reassembly, watched around aiortc's handler."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        self.chunks = 0
        handler = RTCSctpTransport._receive_data_chunk
        watcher = self

        async def watched(transport: RTCSctpTransport, chunk: DataChunk) -> None:
            await handler(transport, chunk)
            for stream in transport._inbound_streams.values():
                held = sum(len(c.user_data) for c in stream.reassembly)
                watcher.bytes = max(watcher.bytes, held)
                watcher.chunks = max(watcher.chunks, len(stream.reassembly))

        monkeypatch.setattr(RTCSctpTransport, "_receive_data_chunk", watched)


def oversized_update(size: int) -> str:
    return json.dumps({"type": "session.update", "session": {"instructions": "x" * size}})


@pytest.mark.parametrize("ordered", [True, False])
async def test_an_oversized_message_is_dropped_as_it_arrives(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient],
    monkeypatch: pytest.MonkeyPatch, ordered: bool,
) -> None:
    running = await start_agent(plugin=EchoPlugin())
    client = RealtimeClient(running.url, ordered=ordered)
    realtime_clients.append(client)
    await client.call()
    await client.wait_event("session.created")
    assert f"a=max-message-size:{MAX_MESSAGE_BYTES}" in client.pc.remoteDescription.sdp
    high_water = ReassemblyHighWater(monkeypatch)
    client.ignore_max_message_size()
    for size in (2 * 1024 * 1024, 200_000):  # a second one: the limit holds per message
        mark = await client.send_event(oversized_update(size))
        error = (await client.wait_event("error", after=mark, timeout=30))["error"]
        assert error["code"] == "message_too_large"
    assert high_water.bytes <= MAX_MESSAGE_BYTES + CHUNK_SLACK
    print("reassembly high water:", high_water.bytes, "bytes,", high_water.chunks, "chunks")
    # A message just under the limit still arrives whole. (Its reply, which echoes the
    # instructions, is over this client's own 64 KiB limit: the server says so in its place.)
    near_limit = oversized_update(MAX_MESSAGE_BYTES - 100)
    assert len(near_limit) < MAX_MESSAGE_BYTES
    mark = await client.send_event(near_limit)
    error = (await client.wait_event("error", after=mark))["error"]
    assert error["code"] == "event_too_large" and "session.updated" in error["message"]
    assert running.agent.webrtc_legs[client.call_id].slot.config.instructions == "x" * (
        MAX_MESSAGE_BYTES - 100)
    mark = await client.send_event({"type": "session.update",
                                    "session": {"instructions": "still here"}})
    updated = await client.wait_event("session.updated", after=mark)
    assert updated["session"]["instructions"] == "still here"  # the channel went on
    await client.wait_audio(0.5)
    assert client.call_id in running.agent.webrtc_legs
    await client.close()
    await wait_until(lambda: all_freed(running))
