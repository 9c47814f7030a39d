"""Ephemeral secrets under load: minting never forgets a secret bound to a live call, and one
key cannot fill the store for everyone (per-key limit, coded 429)."""

from __future__ import annotations

import asyncio

import aiohttp

from signaling.__main__ import build_parser
from signaling.auth import AuthSettings, settings_from_args
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.realtime import CALLS, offer_sdp_once

KEY, OTHER = "sk-limits-1", "sk-limits-2"
SECRETS = "/v1/realtime/client_secrets"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def mint(http: aiohttp.ClientSession, running: RunningAgent, key: str,
               seconds: int | None = None) -> tuple[int, dict]:
    body = {"expires_after": {"anchor": "created_at", "seconds": seconds}} if seconds else {}
    async with http.post(running.url + SECRETS, json=body, headers=bearer(key)) as response:
        return response.status, {**await response.json(), "_retry": response.headers.get(
            "Retry-After")}


async def call_with(http: aiohttp.ClientSession, running: RunningAgent, secret: str) -> str:
    async with http.post(running.url + CALLS, data=await offer_sdp_once(), headers={
            "Content-Type": "application/sdp", **bearer(secret)}) as response:
        assert response.status == 201, await response.text()
        return response.headers["Location"]


async def test_minting_keeps_a_secret_bound_to_a_live_call(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(KEY, OTHER)))
    async with aiohttp.ClientSession() as http:
        _, first = await mint(http, running, KEY)
        location = await call_with(http, running, first["value"])
        for key in (KEY, OTHER, OTHER):  # other users mint meanwhile
            status, _ = await mint(http, running, key)
            assert status == 200
        # The page hangs up with the secret it called with.
        async with http.delete(running.url + location, headers=bearer(first["value"])) as r:
            assert r.status == 200, await r.text()
        await wait_until(lambda: all_freed(running))
        # Once its call is over the secret is worthless.
        async with http.get(running.url + "/v1/models", headers=bearer(first["value"])) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (401, "invalid_secret")


async def test_per_key_limit_on_unused_secrets(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(KEY, OTHER), max_secrets_per_key=3))
    async with aiohttp.ClientSession() as http:
        minted = [await mint(http, running, KEY, seconds=1) for _ in range(3)]
        assert all(status == 200 for status, _ in minted)
        status, body = await mint(http, running, KEY)
        assert (status, body["error"]["code"]) == (429, "too_many_secrets")
        assert body["_retry"] is not None
        status, _ = await mint(http, running, OTHER)  # other keys are unaffected
        assert status == 200
        # A secret spent on a call no longer counts against the key.
        location = await call_with(http, running, minted[0][1]["value"])
        status, _ = await mint(http, running, KEY, seconds=1)
        assert status == 200
        async with http.delete(running.url + location, headers=bearer(KEY)) as response:
            assert response.status == 200
        # Expired ones do not count either.
        await asyncio.sleep(1.2)
        for _ in range(3):
            status, _ = await mint(http, running, KEY)
            assert status == 200
    await wait_until(lambda: all_freed(running))


def test_max_secrets_per_key_flag() -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args([])).max_secrets_per_key == 1000
    assert settings_from_args(
        parser.parse_args(["--max-secrets-per-key", "5"])).max_secrets_per_key == 5
    assert "--max-secrets-per-key" in parser.format_help()
