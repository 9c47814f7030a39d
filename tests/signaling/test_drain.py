"""Graceful drain with a real `python -m signaling` process and real peers over loopback."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from agent.media_agent import AgentSettings
from agent.testing.peer import run_call
from signaling.auth import AuthSettings
from signaling.drain import DRAIN_KEY
from tests.support.agents import AgentFactory, wait_until
from tests.support.server_process import running_server, start_peer


async def wait_for_calls(url: str, count: int) -> None:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            async with http.get(url + "/metrics/calls") as response:
                calls = (await response.json())["calls"]
            if sum(1 for c in calls if c["connection_state"] == "connected") >= count:
                return
            await asyncio.sleep(0.2)
    raise AssertionError(f"{count} calls never connected")


@pytest.mark.slow
async def test_sigterm_drains_live_calls_then_exits_0() -> None:
    async with running_server("--drain-seconds", "6") as (server, url, _):
        short = await start_peer(url, "--seconds", "4")   # ends by itself during the drain
        long = await start_peer(url, "--seconds", "30")   # outlives the drain: told, then ended
        await wait_for_calls(url, 2)
        server.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        async with aiohttp.ClientSession() as http:
            # Not ready at once, yet alive; new offers refused with a retry hint.
            await asyncio.sleep(0.3)
            async with http.get(url + "/health/ready") as response:
                assert response.status == 503
                assert "draining" in (await response.json())["reasons"]
            async with http.get(url + "/health/live") as response:
                assert response.status == 200
        refused, _, _ = await run_call(url, seconds=1.0)
        assert not refused.ok and "draining" in (refused.error or "")

        out, _ = await asyncio.wait_for(short.communicate(), 60)
        report = json.loads(out)
        assert short.returncode == 0 and report["ok"], report  # no audio lost to the drain
        out, _ = await asyncio.wait_for(long.communicate(), 60)
        report = json.loads(out)
        assert report["events"].get("call.ending", 0) >= 1, report["events"]

        assert await asyncio.wait_for(server.wait(), 60) == 0
        elapsed = time.monotonic() - signalled
        assert 5.0 <= elapsed < 40, elapsed  # waited for the deadline, not forever
        rest = (await server.stderr.read()).decode()  # type: ignore[union-attr]
        assert "reason=server_draining" in rest


async def test_idle_server_exits_at_once_on_sigterm_and_second_sigterm_cuts_a_drain() -> None:
    async with running_server("--drain-seconds", "60") as (server, url, _):
        peer = await start_peer(url, "--seconds", "60")
        await wait_for_calls(url, 1)
        server.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert server.returncode is None  # draining: the call goes on
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 30) == 0
        rest = (await server.stderr.read()).decode()  # type: ignore[union-attr]
        assert "reason=shutdown" in rest
        await asyncio.wait_for(peer.communicate(), 60)
    # No call: SIGTERM exits straight away.
    async with running_server("--drain-seconds", "60") as (server, url, _):
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 30) == 0


async def test_admin_drain_needs_the_operator_key_and_refuses_new_calls(
        start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("tenant-key",),
                                                  admin_keys=("operator-key",)))
    key = {"Authorization": "Bearer operator-key"}
    tenant = {"Authorization": "Bearer tenant-key"}
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/health/ready") as response:
            assert response.status == 200
        async with http.post(running.url + "/admin/drain") as response:
            assert response.status == 401
        async with http.post(running.url + "/admin/drain", headers=tenant) as response:
            assert response.status == 403  # a tenant's key is not the operator's
            assert (await response.json())["error"]["code"] == "operator_only"
        async with http.post(running.url + "/v1/realtime/client_secrets",
                             headers=key) as response:
            secret = (await response.json())["value"]
        async with http.post(running.url + "/admin/drain",
                             headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status == 403
        assert not running.agent.draining
        async with http.post(running.url + "/admin/drain", headers=key) as response:
            assert response.status == 202
            assert (await response.json())["draining"] is True
        async with http.get(running.url + "/health/ready") as response:
            assert response.status == 503
        async with http.post(running.url + "/v1/realtime/calls", data=b"v=0\r\n",
                             headers={**key, "Content-Type": "application/sdp"}) as response:
            assert response.status == 503
            assert response.headers.get("Retry-After")
            assert (await response.json())["error"]["code"] == "draining"
        async with http.get(running.url + "/metrics", headers=key) as response:
            assert 'agent_admission_refusals_total{code="draining"} 1.0' in await response.text()


async def test_with_keys_but_no_admin_key_only_a_signal_drains(
        start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("tenant-key",)))
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + "/admin/drain",
                             headers={"Authorization": "Bearer tenant-key"}) as response:
            assert response.status == 403
            assert "SIGTERM" in (await response.json())["error"]["message"]
    assert not running.agent.draining


async def test_health_ready_fails_while_full_and_recovers(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(max_calls=1))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/health/ready") as response:
            assert response.status == 200
        call = asyncio.ensure_future(run_call(running.url, seconds=2.0))
        await wait_until(lambda: bool(running.agent.webrtc_legs), 20)
        async with http.get(running.url + "/health/ready") as response:
            assert response.status == 503
            assert (await response.json())["reasons"] == ["full"]
        assert (await call)[0].ok
        await wait_until(lambda: not running.agent.webrtc_legs, 20)
        async with http.get(running.url + "/health/ready") as response:
            assert response.status == 200


async def test_drain_deadline_stops_a_telephony_leg_cleanly(start_agent: AgentFactory) -> None:
    running = await start_agent(drain_seconds=0.5)
    loop = asyncio.get_running_loop()
    caller, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol,
                                                    local_addr=("127.0.0.1", 0))
    remote = f"127.0.0.1:{caller.get_extra_info('sockname')[1]:d}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(running.url + "/v1/telephony/rtp",
                                 json={"remote": remote}) as response:
                assert response.status == 201, await response.text()
            leg = next(iter(running.agent.telephony_legs.values()))
            async with http.post(running.url + "/admin/drain") as response:
                assert response.status == 202
                assert (await response.json())["active_calls"] == 1
            async with http.post(running.url + "/v1/telephony/rtp",
                                 json={"remote": remote}) as response:
                assert response.status == 503
                assert (await response.json())["error"]["code"] == "draining"
        await wait_until(lambda: not running.agent.telephony_legs, 20)
        assert leg.end_reason == "server_draining"
        controller = running.server.app[DRAIN_KEY]
        await asyncio.wait_for(controller.done.wait(), 20)
    finally:
        caller.close()
