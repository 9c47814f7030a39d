"""Tenants kept apart: calls and telephony legs belong to the credential that opened them."""

from __future__ import annotations

import asyncio

import aiohttp

from agent.testing.peer import run_call
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, all_freed, wait_until

RTP_PATH = "/v1/telephony/rtp"
ALICE, BOB, OPERATOR = "key-alice", "key-bob", "key-operator"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_rtp_legs_and_call_lists_are_per_tenant(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(ALICE, BOB), admin_keys=(OPERATOR,)))
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + RTP_PATH, headers=bearer(ALICE),
                             json={"remote": "127.0.0.1:5004", "codec": "PCMU"}) as response:
            leg = await response.json()
            assert response.status == 201, leg
        url = f"{running.url}{RTP_PATH}/{leg['call_id']}"
        # Bob can neither read nor end Alice's leg: it does not exist for him.
        async with http.get(url, headers=bearer(BOB)) as response:
            assert response.status == 404
        async with http.delete(url, headers=bearer(BOB)) as response:
            assert response.status == 404
        listed = {}
        for who in (ALICE, BOB, OPERATOR):
            async with http.get(running.url + "/metrics/calls", headers=bearer(who)) as response:
                listed[who] = [c["call_id"] for c in (await response.json())["calls"]]
        assert listed == {ALICE: [leg["call_id"]], BOB: [], OPERATOR: [leg["call_id"]]}
        async with http.get(url, headers=bearer(ALICE)) as response:
            assert response.status == 200
        # The operator key manages every tenant's legs.
        async with http.delete(url, headers=bearer(OPERATOR)) as response:
            assert response.status == 200
    await wait_until(lambda: not running.agent.telephony_legs)


async def test_an_operator_sees_webrtc_calls_a_tenant_sees_its_own(
        start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(ALICE, BOB), admin_keys=(OPERATOR,)))
    seen: dict[str, int] = {}

    async def count_during_call() -> None:
        await wait_until(lambda: len(running.agent.webrtc_legs) == 1)
        async with aiohttp.ClientSession() as http:
            for who in (ALICE, BOB, OPERATOR):
                async with http.get(running.url + "/metrics/calls",
                                    headers=bearer(who)) as response:
                    seen[who] = len((await response.json())["calls"])

    checker = asyncio.ensure_future(count_during_call())
    report, _, _ = await run_call(running.url + "/v1/realtime/calls", seconds=2.0,
                                  headers=bearer(ALICE))
    await checker
    assert report.ok
    assert seen == {ALICE: 1, BOB: 0, OPERATOR: 1}
    await wait_until(lambda: all_freed(running))
