"""The OpenAI-Realtime / WHIP-style call flow with a real aiortc client over loopback."""

from __future__ import annotations

import aiohttp

from agent.testsignal import measure_echo
from agent.peer import PEER_RATE

from realtime_fixtures import CALLS, RealtimeClient, realtime_clients  # noqa: F401
from support import AgentFactory, all_freed, wait_until


async def test_sdp_call_full_flow(start_agent: AgentFactory,
                                  realtime_clients: list[RealtimeClient]) -> None:
    running = await start_agent()
    client = RealtimeClient(running.url, seconds=30)
    realtime_clients.append(client)
    await client.call()

    headers = client.response_headers
    assert headers["Content-Type"].startswith("application/sdp")
    assert client.location == f"{CALLS}/{client.call_id}"
    assert client.call_id.startswith("call_") and len(client.call_id) >= 25
    assert client.etag and client.etag.startswith('"')
    assert client.call_id in running.agent.calls

    created = await client.wait_event("session.created")
    assert created["session"]["id"] == client.call_id
    assert created["session"]["plugin"] == "echo"
    assert created["session"]["capabilities"]["sample_rate"] == 24000

    mark = await client.send_event({"type": "session.update", "event_id": "evt_1",
                                    "session": {"instructions": "be brief",
                                                "audio": {"output": {"voice": "alloy"}}}})
    updated = await client.wait_event("session.updated", after=mark)
    assert updated["session"]["instructions"] == "be brief"
    assert updated["session"]["voice"] == "alloy"

    await client.wait_audio(2.5)
    sent = client.signal[: client.source.position]
    echo = measure_echo(sent, client.recording.samples(), PEER_RATE)
    assert echo.correlation > 0.5, echo

    async with aiohttp.ClientSession() as http:
        async with http.delete(running.url + client.location) as response:
            assert response.status == 200
            assert (await response.json())["id"] == client.call_id
        async with http.delete(running.url + client.location) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "call_not_found"
    assert client.call_id not in running.agent.calls
    await wait_until(lambda: all_freed(running))
