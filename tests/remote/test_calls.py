"""Real WebRTC calls (aiortc peers over 127.0.0.1) through the agent to fake engines."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.media_agent import AgentSettings
from agent.plugins.remote.link import LinkSettings
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from agent.plugins.remote.vllm_omni import VllmOmniPlugin
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.fake_engines import Behaviour

from .conftest import StartFake
from .driver import upstream_tasks

SETTINGS = LinkSettings(connect_timeout=3.0, handshake_timeout=5.0, stall_timeout=5.0)


async def call_stats(running: RunningAgent) -> list[dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/metrics/calls") as response:
            assert response.status == 200
            return (await response.json())["calls"]


async def all_gone(running: RunningAgent) -> None:
    await wait_until(lambda: all_freed(running) and not upstream_tasks(), timeout=10)


async def test_call_through_vllm_omni_gets_audio_text_and_latency(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    running = await start_agent(VllmOmniPlugin([fake.url], settings=SETTINGS))
    call = asyncio.ensure_future(run_call(running.url, seconds=3.5,
                                          session={"instructions": "Be brief."}))
    await wait_until(lambda: fake.sessions and fake.sessions[0].frames_in >= 20, timeout=15)
    stats = (await call_stats(running))[0]["plugin_session"]
    report, _, _ = await call
    assert report.ok, report.error
    assert report.correlation is not None and report.correlation >= 0.8, report
    assert report.transcript.startswith("word1 word2")
    assert "response.output_audio_transcript.done" in report.events
    assert report.errors == []
    assert stats["protocol"] == "vllm-omni" and stats["upstream"] == fake.url
    latency = stats["latency"]
    assert latency["upstream_rtt"]["count"] > 5 and latency["agent_added_mean_ms"] is not None
    assert fake.sessions[0].config["instructions"] == "Be brief."
    await all_gone(running)
    assert fake.sessions[0].closed_by_client  # session.close was sent on hangup
    assert fake.violations == []


async def test_call_through_moshi_server_gets_audio_and_text(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    fake = await start_fake("moshi", Behaviour(handshake_delay=0.5))
    running = await start_agent(MoshiServerPlugin([fake.url], voice="NATF2.pt",
                                                  settings=SETTINGS))
    report, _, _ = await run_call(running.url, seconds=3.5)
    assert report.ok, report.error
    assert report.correlation is not None and report.correlation >= 0.6, report
    assert report.transcript.startswith(" word1 word2")
    assert fake.sessions[0].query["voice_prompt"] == "NATF2.pt"
    await all_gone(running)
    assert fake.active == 0 and fake.violations == []


@pytest.mark.slow
async def test_calls_spread_and_a_dying_upstream_ends_only_its_calls(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    doomed, survivor = await start_fake("vllm"), await start_fake("vllm")
    plugin = VllmOmniPlugin([doomed.url, survivor.url], settings=SETTINGS)
    running = await start_agent(plugin)
    calls = [asyncio.ensure_future(run_call(running.url, seconds=5.0)) for _ in range(4)]
    await wait_until(
        lambda: sum(s.frames_in for s in doomed.sessions + survivor.sessions) >= 4 * 10,
        timeout=20,
    )
    placement = {s["call_id"]: s["plugin_session"]["upstream"]
                 for s in await call_stats(running)}
    assert Counter(placement.values()) == {doomed.url: 2, survivor.url: 2}
    await doomed.kill()
    # Its two calls end at once; the other two are still running.
    await wait_until(lambda: len(running.agent.webrtc_legs) == 2, timeout=5)
    reports = [report for report, _, _ in await asyncio.gather(*calls)]
    for report in reports:
        if placement[report.call_id] == doomed.url:
            assert [e["code"] for e in report.errors] == ["upstream_closed"]
        else:
            assert report.ok and report.errors == [], report
            assert report.seconds_received > 4.0
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/health") as response:
            upstreams = (await response.json())["plugin_health"]["upstreams"]
    assert [u["url"] for u in upstreams] == [doomed.url, survivor.url]
    health = upstreams[0]
    assert health["failures"] >= 1 and health["last_error"] == "upstream_closed"
    # The next call still gets through: the dead server is skipped or fails over.
    sessions_before = len(survivor.sessions)
    after, _, _ = await run_call(running.url, seconds=1.0)
    assert after.ok and after.errors == []
    assert len(survivor.sessions) == sessions_before + 1
    await all_gone(running)
    assert survivor.violations == []


async def test_a_full_pool_refuses_the_offer_with_503(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    first, second = await start_fake("vllm"), await start_fake("vllm")
    running = await start_agent(
        VllmOmniPlugin([first.url, second.url], capacity=1, settings=SETTINGS)
    )
    assert running.agent.capacity == 2
    calls = [asyncio.ensure_future(run_call(running.url, seconds=3.0)) for _ in range(2)]
    await wait_until(lambda: first.active == 1 and second.active == 1, timeout=15)
    refused, _, _ = await run_call(running.url, seconds=0.5)
    assert refused.error is not None and "HTTP 503" in refused.error
    assert "server_full" in refused.error
    reports = [report for report, _, _ in await asyncio.gather(*calls)]
    assert all(report.ok for report in reports)
    await all_gone(running)


async def test_an_engine_that_says_it_is_full_gives_503_with_its_code(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm", Behaviour(capacity=1))
    running = await start_agent(VllmOmniPlugin([fake.url], settings=SETTINGS),
                                AgentSettings())
    call = asyncio.ensure_future(run_call(running.url, seconds=2.5))
    await wait_until(lambda: fake.active == 1, timeout=15)
    async with aiohttp.ClientSession() as http:
        offer = {"type": "offer", "sdp": await offer_sdp()}
        async with http.post(f"{running.url}/offer", json=offer) as response:
            body = await response.json()
            assert response.status == 503
            assert response.headers.get("Retry-After")
    assert body["error"]["code"] == "resource_exhausted"
    report, _, _ = await call
    assert report.ok
    await all_gone(running)


async def offer_sdp() -> str:
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    try:
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


async def test_a_failed_offer_gives_its_engine_seat_back_at_once(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    plugin = VllmOmniPlugin([fake.url], settings=SETTINGS, claim_timeout=60.0)
    running = await start_agent(plugin)
    # Passes the agent's cheap SDP checks, opens an engine session, then fails negotiation.
    garbled = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP 111\r\nnonsense\r\n"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{running.url}/offer",
                             json={"type": "offer", "sdp": garbled}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_sdp"
    assert len(fake.sessions) == 1  # the engine session was opened for the offer...
    # ...and is released long before the 60 s claim timeout.
    await wait_until(lambda: fake.active == 0 and plugin.pool.upstreams[0].active == 0,
                     timeout=5)
    await all_gone(running)


async def test_metrics_show_each_upstream_with_its_round_trips(
    start_agent: AgentFactory, start_fake: StartFake,
) -> None:
    fake = await start_fake("vllm")
    url = fake.url.replace("ws://", "ws://user:pw@") + "&api_key=sk-secret"
    running = await start_agent(VllmOmniPlugin([url], settings=SETTINGS))
    report, _, _ = await run_call(running.url, seconds=3.0)
    assert report.ok, report.error
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/metrics") as response:
            text = await response.text()
    assert "sk-secret" not in text and "user:pw" not in text  # redacted labels
    samples = {(s.name, s.labels.get("le")): s.value
               for family in text_string_to_metric_families(text)
               if family.name.startswith("agent_upstream")
               for s in family.samples}
    assert samples[("agent_upstream_rtt_seconds_count", None)] > 5
    assert samples[("agent_upstream_rtt_seconds_bucket", "+Inf")] == samples[
        ("agent_upstream_rtt_seconds_count", None)]
    assert samples[("agent_upstream_healthy", None)] == 1
    assert samples[("agent_upstream_failures_total", None)] == 0
    await all_gone(running)
