"""Bearer auth: API keys, single-use ephemeral secrets, call ownership."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from signaling.__main__ import build_parser
from signaling.auth import AuthSettings, settings_from_args
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.realtime import CALLS, RealtimeClient, offer_sdp_once

KEY = "sk-test-0123456789"
OTHER_KEY = "sk-other-9876543210"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def secured(start_agent: AgentFactory, *keys: str) -> RunningAgent:
    return await start_agent(auth=AuthSettings(api_keys=keys or (KEY,)))


async def mint(http: aiohttp.ClientSession, running: RunningAgent, token: str = KEY,
               body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with http.post(running.url + "/v1/realtime/client_secrets", json=body or {},
                         headers=bearer(token)) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def post_sdp(http: aiohttp.ClientSession, running: RunningAgent, sdp: str,
                   token: str | None) -> tuple[int, dict[str, Any] | None, str | None]:
    headers = {"Content-Type": "application/sdp", **(bearer(token) if token else {})}
    async with http.post(running.url + CALLS, data=sdp, headers=headers) as response:
        if response.status == 201:
            return 201, None, response.headers["Location"]
        return response.status, (await response.json())["error"], None


async def test_routes_need_the_key(start_agent: AgentFactory) -> None:
    running = await secured(start_agent)
    sdp = await offer_sdp_once()
    async with aiohttp.ClientSession() as http:
        for method, path in [("POST", CALLS), ("GET", "/v1/models"),
                             ("GET", "/v1/realtime/config"), ("GET", "/metrics/calls"),
                             ("POST", "/v1/realtime/client_secrets"), ("POST", "/offer"),
                             ("DELETE", CALLS + "/call_x")]:
            async with http.request(method, running.url + path) as response:
                assert response.status == 401, (method, path)
                assert (await response.json())["error"]["code"] == "missing_api_key"
                assert response.headers["WWW-Authenticate"] == "Bearer"
        status, error, _ = await post_sdp(http, running, sdp, "sk-wrong")
        assert (status, error["code"]) == (401, "invalid_api_key")
        status, error, _ = await post_sdp(http, running, sdp, KEY + "x")
        assert (status, error["code"]) == (401, "invalid_api_key")
        async with http.get(running.url + "/v1/models",
                            headers={"Authorization": f"Basic {KEY}"}) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "invalid_authorization"
        # Public: liveness, the page, CORS preflight.
        async with http.get(running.url + "/health") as response:
            assert response.status == 200
        async with http.options(running.url + CALLS) as response:
            assert response.status == 204
        async with http.get(running.url + "/v1/models", headers=bearer(KEY)) as response:
            assert response.status == 200
    assert all_freed(running)


async def test_call_with_the_key(start_agent: AgentFactory,
                                 realtime_clients: list[RealtimeClient]) -> None:
    running = await secured(start_agent)
    client = RealtimeClient(running.url, token=KEY)
    realtime_clients.append(client)
    await client.call()
    await client.wait_event("session.created")
    async with aiohttp.ClientSession() as http:
        async with http.delete(running.url + client.location) as response:
            assert response.status == 401
        async with http.delete(running.url + client.location, headers=bearer(KEY)) as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))


async def test_ephemeral_secret_creates_one_call_with_its_bound_session(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running = await secured(start_agent)
    async with aiohttp.ClientSession() as http:
        minted = await mint(http, running, body={
            "session": {"type": "realtime", "instructions": "bound persona",
                        "audio": {"output": {"voice": "cedar"}}},
        })
        assert minted["value"].startswith("ek_") and len(minted["value"]) > 30
        assert 50 <= minted["expires_at"] - time.time() <= 61
        assert minted["session"]["instructions"] == "bound persona"

        secret = minted["value"]
        client = RealtimeClient(running.url, token=secret)
        realtime_clients.append(client)
        await client.call()
        created = await client.wait_event("session.created")
        assert created["session"]["instructions"] == "bound persona"
        assert created["session"]["voice"] == "cedar"

        sdp = await offer_sdp_once()
        status, error, _ = await post_sdp(http, running, sdp, secret)
        assert (status, error["code"]) == (401, "secret_used")
        # A secret reads discovery, but mints nothing and sees no other route.
        async with http.get(running.url + "/v1/models", headers=bearer(secret)) as response:
            assert response.status == 200
        async with http.post(running.url + "/v1/realtime/client_secrets", json={},
                             headers=bearer(secret)) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "secret_not_allowed"
        async with http.get(running.url + "/metrics/calls", headers=bearer(secret)) as response:
            assert response.status == 403
        # It still manages its own call.
        async with http.delete(running.url + client.location, headers=bearer(secret)) as response:
            assert response.status == 200
        await wait_until(lambda: all_freed(running))
        # The call is gone: the spent secret is now worth nothing.
        async with http.get(running.url + "/v1/models", headers=bearer(secret)) as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "invalid_secret"


async def test_expired_secret_is_refused(start_agent: AgentFactory) -> None:
    running = await secured(start_agent)
    sdp = await offer_sdp_once()
    async with aiohttp.ClientSession() as http:
        minted = await mint(http, running, body={"expires_after": {"anchor": "created_at",
                                                                   "seconds": 1}})
        await asyncio.sleep(max(0.0, minted["expires_at"] - time.time()) + 1.1)
        status, error, _ = await post_sdp(http, running, sdp, minted["value"])
        assert status == 401 and error["code"] in ("secret_expired", "invalid_secret")
        status, error, _ = await post_sdp(http, running, sdp, "ek_never_minted")
        assert (status, error["code"]) == (401, "invalid_secret")
    assert all_freed(running)


@pytest.mark.parametrize("body, code", [
    ({"expires_after": {"seconds": 0}}, "invalid_value"),
    ({"expires_after": {"seconds": 10**9}}, "invalid_value"),
    ({"expires_after": {"seconds": "60"}}, "invalid_type"),
    ({"expires_after": {"anchor": "now", "seconds": 5}}, "invalid_value"),
    ({"expires_after": 5}, "invalid_type"),
    ({"session": {"extra_body": {"delay_frames": 999}}}, "invalid_option"),
    ({"session": {"extra_body": {"model_path": "/etc/passwd"}}}, "unknown_option"),
    ({"session": {"instructions": 7}}, "invalid_type"),
    ({"session": []}, "invalid_type"),
])
async def test_bad_secret_requests(start_agent: AgentFactory, body: dict[str, Any],
                                   code: str) -> None:
    running = await secured(start_agent)
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + "/v1/realtime/client_secrets", json=body,
                             headers=bearer(KEY)) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == code


async def test_calls_belong_to_their_credential(start_agent: AgentFactory) -> None:
    running = await secured(start_agent, KEY, OTHER_KEY)
    sdp = await offer_sdp_once()
    async with aiohttp.ClientSession() as http:
        first, second = (await mint(http, running))["value"], (await mint(http, running))["value"]
        _, _, by_key = await post_sdp(http, running, sdp, KEY)
        _, _, by_first = await post_sdp(http, running, sdp, first)
        _, _, by_second = await post_sdp(http, running, sdp, second)
        assert by_key and by_first and by_second
        refusals = [
            (OTHER_KEY, by_key), (OTHER_KEY, by_first),  # another tenant's calls
            (first, by_key), (first, by_second),  # a secret sees only its own call
        ]
        for token, location in refusals:
            async with http.get(running.url + location, headers=bearer(token)) as response:
                assert response.status == 404, (token, location)
            async with http.delete(running.url + location, headers=bearer(token)) as response:
                assert response.status == 404, (token, location)
                assert (await response.json())["error"]["code"] == "call_not_found"
            async with http.post(running.url + location + "/hangup",
                                 headers=bearer(token)) as response:
                assert response.status == 404
        assert len(running.agent.webrtc_legs) == 3
        # The key that minted a secret manages the secret's call; the secret manages its own.
        for token, location in [(KEY, by_first), (second, by_second), (KEY, by_key)]:
            async with http.get(running.url + location, headers=bearer(token)) as response:
                assert response.status == 200
            async with http.delete(running.url + location, headers=bearer(token)) as response:
                assert response.status == 200
    await wait_until(lambda: all_freed(running))


async def test_open_server_ignores_keys_but_checks_secrets(start_agent: AgentFactory) -> None:
    running = await start_agent()
    sdp = await offer_sdp_once()
    async with aiohttp.ClientSession() as http:
        status, _, location = await post_sdp(http, running, sdp, "sk-anything")
        assert status == 201
        status, error, _ = await post_sdp(http, running, sdp, "ek_unknown")
        assert (status, error["code"]) == (401, "invalid_secret")
        minted = await mint(http, running, token="ignored")
        status, _, _ = await post_sdp(http, running, sdp, minted["value"])
        assert status == 201
        status, error, _ = await post_sdp(http, running, sdp, minted["value"])
        assert (status, error["code"]) == (401, "secret_used")
        async with http.delete(running.url + location) as response:
            assert response.status == 200


def test_api_key_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_API_KEY", raising=False)
    parser = build_parser()
    assert settings_from_args(parser.parse_args([])).open
    assert settings_from_args(parser.parse_args(["--api-key", "k1", "--api-key", "k2"])
                              ).api_keys == ("k1", "k2")
    monkeypatch.setenv("AGENT_API_KEY", "from-env")
    assert settings_from_args(parser.parse_args([])).api_keys == ("from-env",)
    assert settings_from_args(parser.parse_args(["--secret-ttl", "30"])).secret_ttl_seconds == 30
