"""TURN end to end: a caller forced to relay-only candidates reaches the agent through a
real coturn server, using the ICE servers the agent advertises."""

from __future__ import annotations

import time

import aiohttp
import pytest
from aiortc import RTCIceServer

from agent.media_agent import AgentSettings
from agent.testing.peer import PEER_RATE
from agent.testing.testsignal import measure_echo
from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.realtime import RealtimeClient
from tests.support.turn import TurnServer

pytestmark = pytest.mark.interop


def nominated_local_types(client: RealtimeClient) -> list[str]:
    """Candidate types of the caller's selected ICE pairs (aioice internals, test only)."""
    types = []
    for transceiver in client.pc.getTransceivers():
        connection = transceiver.sender.transport.transport._connection
        types += [pair.local_candidate.type for pair in connection._nominated.values()]
    return types


def candidate_types(sdp: str) -> set[str]:
    return {
        line.split(" typ ", 1)[1].split()[0]
        for line in sdp.splitlines() if line.startswith("a=candidate:") and " typ " in line
    }


async def test_relay_only_caller_through_coturn(
    start_agent: AgentFactory, turn_server: TurnServer,
    realtime_clients: list[RealtimeClient],
) -> None:
    servers = [RTCIceServer(urls=turn_server.url, username=turn_server.username,
                            credential=turn_server.password)]
    running = await start_agent(settings=AgentSettings(ice_servers=servers))

    # The caller learns the ICE servers the way a browser page does.
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/v1/realtime/config") as response:
            advertised = (await response.json())["ice_servers"]
    learned = [RTCIceServer(urls=s["urls"], username=s.get("username"),
                            credential=s.get("credential")) for s in advertised]
    client = RealtimeClient(running.url, ice_servers=learned, relay_only=True)
    realtime_clients.append(client)
    offered_at = time.monotonic()
    await client.call(connect_timeout=20)
    print(f"relay-only call connected {(time.monotonic() - offered_at) * 1000:.0f} ms after "
          "the offer was made")

    # The caller offered relay candidates only; the agent gathered a relay of its own too.
    assert candidate_types(client.pc.localDescription.sdp) == {"relay"}
    answer_types = candidate_types(client.pc.remoteDescription.sdp)
    assert "relay" in answer_types and "host" in answer_types
    assert client.response_headers.getall("Link") == [
        f'<{turn_server.url}>; rel="ice-server"; username="{turn_server.username}"; '
        f'credential="{turn_server.password}"; credential-type="password"'
    ]

    assert nominated_local_types(client) == ["relay"]

    await client.wait_event("session.created")
    await client.wait_audio(2.0)
    echo = measure_echo(client.signal[: client.source.position], client.recording.samples(),
                        PEER_RATE)
    assert echo.correlation > 0.5, echo
    # coturn really carried it: it logged the allocation for our user.
    assert turn_server.username in turn_server.log()
    async with aiohttp.ClientSession() as http:
        async with http.delete(running.url + client.location) as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))


async def test_relay_only_caller_without_turn_cannot_connect(start_agent: AgentFactory) -> None:
    """The control: relay-only with no TURN server has no candidates at all, so the relay
    test above cannot pass over plain host candidates."""
    running = await start_agent()
    client = RealtimeClient(running.url, relay_only=True)
    try:
        sdp = await client.offer_sdp()
        assert candidate_types(sdp) == set()
    finally:
        await client.close()
    assert all_freed(running)
