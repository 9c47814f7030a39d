"""`GET /metrics`: Prometheus text from a real server, moving during a real aiortc call."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from agent.media_agent import AgentSettings
from agent.testing.peer import run_call
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics", headers=headers) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/plain"
            text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_move_during_a_real_call(echo_agent: RunningAgent) -> None:
    before = await scrape(echo_agent.url)
    assert value(before, "agent_active_calls", transport="webrtc", plugin="echo") == 0
    assert value(before, "agent_active_calls", transport="rtp", plugin="echo") == 0
    assert value(before, "agent_calls_started_total", transport="webrtc", plugin="echo") == 0

    call = asyncio.ensure_future(run_call(echo_agent.url, seconds=4.0))
    await wait_until(lambda: any(c.connected_at for c in echo_agent.agent.webrtc_legs.values()), 20)
    await asyncio.sleep(1.5)
    during = await scrape(echo_agent.url)
    assert value(during, "agent_active_calls", transport="webrtc", plugin="echo") == 1
    assert value(during, "agent_calls_started_total", transport="webrtc", plugin="echo") == 1
    assert value(during, "agent_outbound_packets_total", transport="webrtc") > 10
    assert value(during, "agent_outbound_bytes_total", transport="webrtc") > 100
    # Holes the sender left (a packet > 60 ms after the one before) are counted; that there
    # are none is not asserted (a loaded test machine may stall).
    assert ("agent_outbound_late_packets_total", (("transport", "webrtc"),)) in during
    assert value(during, "agent_ticker_step_seconds_count", plugin="echo") > 5
    assert value(during, "agent_ticker_lateness_seconds_count", plugin="echo") > 5

    report, _, _ = await call
    assert report.ok, report.error
    await wait_until(lambda: all_freed(echo_agent))
    after = await scrape(echo_agent.url)
    assert value(after, "agent_active_calls", transport="webrtc", plugin="echo") == 0
    ended = sum(v for (name, _), v in after.items() if name == "agent_calls_ended_total")
    assert ended == 1
    # Counters of an ended call are kept, never go back.
    assert (value(after, "agent_outbound_packets_total", transport="webrtc")
            >= value(during, "agent_outbound_packets_total", transport="webrtc"))
    assert ("agent_event_loop_lag_seconds_count", ()) in after


async def test_refusals_are_counted_by_code(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(max_calls=1))
    call = asyncio.ensure_future(run_call(running.url, seconds=3.0))
    await wait_until(lambda: bool(running.agent.webrtc_legs), 20)
    refused, _, _ = await run_call(running.url, seconds=1.0)
    assert not refused.ok and "server_full" in (refused.error or "")
    samples = await scrape(running.url)
    assert value(samples, "agent_admission_refusals_total", code="server_full") == 1
    assert (await call)[0].ok


async def test_metrics_need_the_api_key_when_keys_are_set(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("operator-key",)))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/metrics") as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "missing_api_key"
        async with http.post(running.url + "/v1/realtime/client_secrets",
                             headers={"Authorization": "Bearer operator-key"}) as response:
            secret = (await response.json())["value"]
        async with http.get(running.url + "/metrics",
                            headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status == 403
    samples = await scrape(running.url, {"Authorization": "Bearer operator-key"})
    assert ("agent_ticker_late_ticks_total", (("plugin", "echo"),)) in samples


async def test_two_apps_in_one_process_keep_separate_registries(
        start_agent: AgentFactory) -> None:
    first, second = await start_agent(), await start_agent()
    report, _, _ = await run_call(first.url, seconds=1.5)
    assert report.ok
    await wait_until(lambda: all_freed(first))
    assert value(await scrape(first.url), "agent_calls_started_total",
                 transport="webrtc", plugin="echo") == 1
    assert value(await scrape(second.url), "agent_calls_started_total",
                 transport="webrtc", plugin="echo") == 0


async def test_an_rtp_leg_is_counted_under_its_transport(echo_agent: RunningAgent) -> None:
    from aiortc.rtp import RtpPacket

    from agent.telephony.codec import PCMU

    loop = asyncio.get_running_loop()
    caller, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol,
                                                    local_addr=("127.0.0.1", 0))
    remote = f"127.0.0.1:{caller.get_extra_info('sockname')[1]:d}"
    async with aiohttp.ClientSession() as http:
        async with http.post(echo_agent.url + "/v1/telephony/rtp",
                             json={"remote": remote}) as response:
            assert response.status == 201, await response.text()
            body = await response.json()
        host, port = body["local"].rsplit(":", 1)
        silence = PCMU.encode(np.zeros(160, dtype=np.int16))
        for index in range(50):  # one second of 20 ms packets, paced
            caller.sendto(RtpPacket(payload_type=0, sequence_number=index,
                                    timestamp=index * 160, ssrc=7,
                                    payload=silence).serialize(), (host, int(port)))
            await asyncio.sleep(0.02)
        during = await scrape(echo_agent.url)
        assert value(during, "agent_active_calls", transport="rtp", plugin="echo") == 1
        assert value(during, "agent_calls_started_total", transport="rtp", plugin="echo") == 1
        assert value(during, "agent_outbound_packets_total", transport="rtp") > 5
        assert value(during, "agent_outbound_bytes_total", transport="rtp") > 5 * 160
        async with http.delete(f"{echo_agent.url}/v1/telephony/rtp/{body['call_id']}"):
            pass
    await wait_until(lambda: not echo_agent.agent.telephony_legs)
    after = await scrape(echo_agent.url)
    assert value(after, "agent_active_calls", transport="rtp", plugin="echo") == 0
    assert value(after, "agent_calls_ended_total", transport="rtp", reason="hangup") == 1
    caller.close()


async def test_metrics_can_be_switched_off(start_agent: AgentFactory) -> None:
    running = await start_agent(metrics_enabled=False)
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/metrics") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
        async with http.get(running.url + "/health") as response:
            assert response.status == 200  # everything else is served as before
    assert running.agent.ticker.on_tick is None
    report, _, _ = await run_call(running.url, seconds=1.0)
    assert report.ok
    assert not any(task.get_name() == "loop-lag" for task in asyncio.all_tasks())


async def test_garbage_collector_pauses_are_timed_by_generation(echo_agent: RunningAgent) -> None:
    import gc

    gc.collect(2)
    async with aiohttp.ClientSession() as http:
        async with http.get(echo_agent.url + "/metrics") as response:
            text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    counts = {s.labels["generation"]: s.value for s in families["agent_gc_pause_seconds"].samples
              if s.name.endswith("_count")}
    assert counts["2"] >= 1


async def test_outbound_bytes_are_counted_when_aiortc_encodes(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(inline_encoding=False))
    call = asyncio.ensure_future(run_call(running.url, seconds=3.0))
    await wait_until(lambda: any(c.connected_at for c in running.agent.webrtc_legs.values()), 20)
    await asyncio.sleep(1.0)
    leg = next(iter(running.agent.webrtc_legs.values()))
    assert not leg.track.encodes_inline
    during = await scrape(running.url)
    assert value(during, "agent_outbound_bytes_total", transport="webrtc") > 100
    # The count is what the sender's own stats report (payload bytes, no RTP headers).
    stats = await leg.sender.getStats()
    sent = next(s.bytesSent for s in stats.values() if s.type == "outbound-rtp")
    _, counted = leg.outbound_counts()
    assert 100 < sent <= counted <= sent + 2000  # read a moment later
    report, _, _ = await call
    assert report.ok, report.error
    await wait_until(lambda: all_freed(running))
