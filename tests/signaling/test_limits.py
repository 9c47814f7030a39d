"""Admission and lifetime: N+1th call refused with 503 + Retry-After while N calls run;
max-call-seconds ends a call with an event before it closes; freed slots are reusable."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings
from agent.testing.peer import PEER_RATE
from agent.testing.testsignal import measure_echo
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.realtime import CALLS, RealtimeClient, offer_sdp_once

KEY = "sk-limits"


async def one_call(start_agent: AgentFactory, realtime_clients: list[RealtimeClient],
                   call: CallSettings) -> tuple[RunningAgent, RealtimeClient]:
    """A one-slot agent with these call settings, and a caller connected to it."""
    running = await start_agent(settings=AgentSettings(max_calls=1, call=call))
    client = RealtimeClient(running.url)
    realtime_clients.append(client)
    await client.call()
    return running, client


async def test_full_server_refuses_with_retry_after_while_calls_keep_real_time(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running = await start_agent(settings=AgentSettings(max_calls=2),
                                auth=AuthSettings(api_keys=(KEY,)))
    admitted = [RealtimeClient(running.url, token=KEY, seconds=30) for _ in range(2)]
    realtime_clients.extend(admitted)
    for client in admitted:
        await client.call()
    await asyncio.gather(*(client.wait_audio(0.5) for client in admitted))

    sdp = await offer_sdp_once()
    auth = {"Authorization": f"Bearer {KEY}"}
    window_start = time.monotonic()
    before = [client.received_seconds for client in admitted]
    async with aiohttp.ClientSession() as http:
        secret = (await (await http.post(running.url + "/v1/realtime/client_secrets",
                                         json={}, headers=auth)).json())["value"]
        for token in (KEY, secret, KEY):
            async with http.post(running.url + CALLS, data=sdp, headers={
                "Content-Type": "application/sdp", "Authorization": f"Bearer {token}",
            }) as response:
                assert response.status == 503
                assert int(response.headers["Retry-After"]) > 0
                assert (await response.json())["error"]["code"] == "server_full"
        assert len(running.agent.webrtc_legs) == 2
        await asyncio.sleep(2.0)
        window = time.monotonic() - window_start
        for client, start in zip(admitted, before, strict=True):
            # Real time: audio kept arriving at the rate it was sent, and it is the echo.
            assert client.received_seconds - start > 0.7 * window
            echo = measure_echo(client.signal[: client.source.position],
                                client.recording.samples(), PEER_RATE)
            assert echo.correlation > 0.5
            assert client.pc.connectionState == "connected"

        # Hanging up frees the slot; the refused secret was not spent and now gets in.
        hung_up_at = time.monotonic()
        async with http.delete(running.url + admitted[0].location, headers=auth) as response:
            assert response.status == 200
        await wait_until(lambda: len(running.agent.webrtc_legs) < 2, timeout=5)
        freed_ms = (time.monotonic() - hung_up_at) * 1000
        print(f"slot freed {freed_ms:.0f} ms after DELETE was sent")
        newcomer = RealtimeClient(running.url, token=secret)
        realtime_clients.append(newcomer)
        await newcomer.call()
        await newcomer.wait_event("session.created")


async def test_max_call_seconds_ends_the_call_with_an_event(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running, client = await one_call(start_agent, realtime_clients,
                                     CallSettings(max_call_seconds=1.0))
    await client.wait_event("session.created")
    expired = await client.wait_event("error", timeout=10)
    assert expired["error"]["code"] == "session_expired"
    ending = await client.wait_event("call.ending", timeout=5)
    assert ending["reason"] == "max_call_seconds"
    await wait_until(lambda: all_freed(running), timeout=10)
    assert client.received_seconds > 0.5
    # The slot is free again for the next caller.
    second = RealtimeClient(running.url)
    realtime_clients.append(second)
    await second.call()
    await second.wait_event("session.created")


async def test_unconnected_call_times_out_and_frees_its_slot(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(
        max_calls=1, call=CallSettings(connect_timeout=1.0)))
    sdp = await offer_sdp_once()  # its peer is gone: ICE can never connect
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + CALLS, data=sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 201
        async with http.post(running.url + CALLS, data=sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 503
        await wait_until(lambda: all_freed(running), timeout=10)
        async with http.post(running.url + CALLS, data=sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 201


async def test_caller_closing_its_peer_frees_the_slot(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running, client = await one_call(start_agent, realtime_clients, CallSettings())
    await client.wait_audio(0.3)
    closed_at = time.monotonic()
    await client.close()  # a browser tab closing: DTLS close, no HTTP request
    await wait_until(lambda: all_freed(running), timeout=10)
    print(f"slot freed {(time.monotonic() - closed_at) * 1000:.0f} ms after the caller closed")
    assert running.agent.webrtc_legs == {}


async def test_caller_whose_audio_stops_is_ended_by_the_idle_timeout(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running, client = await one_call(start_agent, realtime_clients,
                                     CallSettings(idle_timeout=1.0))
    await client.wait_audio(0.3)
    call = running.agent.webrtc_legs[client.call_id]
    # A vanished caller: its connection stays up but no more audio arrives.
    sender = next(s for s in client.pc.getSenders() if s.track is not None)
    sender.replaceTrack(None)
    await wait_until(lambda: all_freed(running), timeout=10)
    assert call.end_reason == "idle_timeout"
