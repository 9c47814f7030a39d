"""CORS: an open server (no --api-key) grants no foreign origin unless --cors-origin names it,
and refuses changes a foreign page asks for; keyed servers and same-origin pages work."""

from __future__ import annotations

import aiohttp

from signaling.__main__ import build_parser
from signaling.auth import AuthSettings
from signaling.cors import origins_from_args
from tests.support.agents import AgentFactory, RunningAgent, all_freed

EVIL = "https://evil.example"
APP = "https://app.example"
RTP = "/v1/telephony/rtp"


async def _post_leg(http: aiohttp.ClientSession, running: RunningAgent,
                    origin: str | None) -> tuple[int, dict, str | None]:
    headers = {"Origin": origin} if origin else {}
    async with http.post(running.url + RTP, json={}, headers=headers) as response:
        return (response.status, await response.json(),
                response.headers.get("Access-Control-Allow-Origin"))


async def _end_all(running: RunningAgent) -> None:
    for session in list(running.agent.telephony_legs.values()):
        await session.close("hangup")


async def test_open_server_grants_and_obeys_no_foreign_origin(start_agent: AgentFactory) -> None:
    running = await start_agent()
    own_origin = running.url  # what a browser on the agent's own page sends
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/v1/models", headers={"Origin": EVIL}) as response:
            assert response.status == 200  # a GET changes nothing, but the page cannot read it
            assert "Access-Control-Allow-Origin" not in response.headers
        async with http.options(running.url + RTP, headers={
                "Origin": EVIL, "Access-Control-Request-Method": "POST"}) as response:
            assert "Access-Control-Allow-Origin" not in response.headers  # preflight fails
        status, body, allow = await _post_leg(http, running, EVIL)
        assert (status, body["error"]["code"], allow) == (403, "origin_not_allowed", None)
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("sdp", "v=0\r\n")
        async with http.post(running.url + "/v1/realtime/calls", data=form,
                             headers={"Origin": "null"}) as response:
            assert response.status == 403  # sandboxed frames and file:// send "null"
        async with http.get(running.url + "/v1/telephony/media-stream", headers={
                "Origin": EVIL, "Upgrade": "websocket", "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13"}) as response:
            assert response.status == 403  # browsers do not apply CORS to websockets
        assert not running.agent.telephony_legs and all_freed(running)
        # The agent's own page, and clients that are not browsers, still work.
        status, body, _ = await _post_leg(http, running, own_origin)
        assert status == 201, body
        status, body, _ = await _post_leg(http, running, None)
        assert status == 201, body
    await _end_all(running)


async def test_named_origins_and_wildcard(start_agent: AgentFactory) -> None:
    named = await start_agent(cors_origins=(APP,))
    anyone = await start_agent(cors_origins=("*",))
    async with aiohttp.ClientSession() as http:
        status, _, allow = await _post_leg(http, named, APP)
        assert (status, allow) == (201, APP)
        async with http.get(named.url + "/v1/models", headers={"Origin": APP}) as response:
            assert response.headers["Vary"] == "Origin"
        status, body, allow = await _post_leg(http, named, EVIL)
        assert (status, body["error"]["code"], allow) == (403, "origin_not_allowed", None)
        status, _, allow = await _post_leg(http, anyone, EVIL)
        assert (status, allow) == (201, "*")
    await _end_all(named)
    await _end_all(anyone)


async def test_keyed_server_grants_any_origin_by_default(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("sk-cors",)))
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + RTP, json={}, headers={"Origin": EVIL}) as response:
            # Bearer tokens, not cookies: the foreign page still needs a key.
            assert response.status == 401
            assert response.headers["Access-Control-Allow-Origin"] == "*"
        async with http.post(running.url + RTP, json={}, headers={
                "Origin": EVIL, "Authorization": "Bearer sk-cors"}) as response:
            assert response.status == 201
    await _end_all(running)


def test_cors_origin_flag() -> None:
    parser = build_parser()
    assert origins_from_args(parser.parse_args([])) == ()
    assert origins_from_args(parser.parse_args(
        ["--cors-origin", APP, "--cors-origin", "*"])) == (APP, "*")
    assert "--cors-origin" in parser.format_help()
