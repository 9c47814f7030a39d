"""A ringing `--sip-webhook` call belongs to a key (signaling/sip/inbound_owner.py):
`--sip-inbound-key`, or the `inbound_key` of the trunk it arrives from. Only that key or an
`--admin-key` may see, accept, reject or end it; any other key gets the 404 of an unknown
call, and the accepted call stays the owner's. A raw SIP peer on 127.0.0.1 calls."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.auth import AuthSettings, tenant_of
from signaling.call_limit import install_key_limit
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from signaling.sip.trunks import parse_trunks
from signaling.telephony import TelephonyConfig
from tests.sip.helpers import HOST, Dialogue, SipPeer, SipServer, SipServerFactory, sdp_offer
from tests.support.agents import wait_until

SECRET = "whsec_" + base64.b64encode(b"duplex-agent inbound owner secret").decode()
OWNER, OTHER, ADMIN = "key-owner-0001", "key-other-0002", "admin-key-0003"


@pytest.fixture
async def hook_url() -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", ok)
    server = TestServer(app, host=HOST)
    await server.start_server()
    yield str(server.make_url("/hook"))
    await server.close()


async def request(server: SipServer, method: str, path: str, key: str,
                  body: Any = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.request(
            method, f"{server.url}/v1/realtime/calls/{path}", json=body,
            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, await response.json()


async def ringing_call(server: SipServer) -> tuple[SipPeer, str]:
    peer = await SipPeer.open()
    peer.send(Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(40000)),
              server.sip)
    await peer.response(180)
    await wait_until(lambda: any(call.pending for call in server.ua.calls.values()))
    call = next(call for call in server.ua.calls.values() if call.pending)
    return peer, call.api_id


@pytest.mark.parametrize("by_trunk", [False, True])
async def test_only_the_owner_or_an_operator_handles_a_ringing_call(
        start_sip: SipServerFactory, hook_url: str, by_trunk: bool) -> None:
    # the owner by --sip-inbound-key, or by the trunk the call comes from (which overrides
    # --sip-inbound-key, here set to the other key)
    trunks = parse_trunks({"pbx": {"proxy": "sip:127.0.0.1:5999", "inbound_key": OWNER}})
    config = SipConfig(listen_port=0, webhook_url=hook_url, webhook_secret=SECRET,
                       trunks=trunks if by_trunk else {},
                       inbound_tenant=tenant_of(OTHER if by_trunk else OWNER))
    server = await start_sip(config=config, auth=AuthSettings(api_keys=(OWNER, OTHER),
                                                              admin_keys=(ADMIN,)))
    peer, call_id = await ringing_call(server)
    for method, path, body in (("GET", call_id, None), ("POST", f"{call_id}/accept", {}),
                               ("POST", f"{call_id}/reject", {"status_code": 486}),
                               ("DELETE", call_id, None), ("POST", f"{call_id}/hangup", None)):
        status, answer = await request(server, method, path, OTHER, body)
        assert (status, answer["error"]["code"]) == (404, "call_not_found"), (method, path)
    status, answer = await request(server, "GET", call_id, OWNER)
    assert (status, answer["status"]) == (200, "ringing")
    status, answer = await request(server, "GET", call_id, ADMIN)
    assert status == 200
    status, answer = await request(server, "POST", f"{call_id}/accept", OWNER, {})
    assert status == 200, answer
    await peer.response(200)
    status, _ = await request(server, "GET", call_id, OTHER)
    assert status == 404  # answered: still the owner's only
    status, answer = await request(server, "GET", call_id, OWNER)
    assert status == 200 and answer["transport"] == "sip"
    status, _ = await request(server, "DELETE", call_id, OWNER)
    assert status == 200
    peer.close()


async def test_an_operator_accepts_for_the_owner(start_sip: SipServerFactory,
                                                 hook_url: str) -> None:
    config = SipConfig(listen_port=0, webhook_url=hook_url, webhook_secret=SECRET,
                       inbound_tenant=tenant_of(OWNER))
    server = await start_sip(config=config, auth=AuthSettings(api_keys=(OWNER, OTHER),
                                                              admin_keys=(ADMIN,)))
    peer, call_id = await ringing_call(server)
    status, answer = await request(server, "POST", f"{call_id}/accept", ADMIN, {})
    assert status == 200, answer
    await peer.response(200)
    assert (await request(server, "GET", call_id, OWNER))[0] == 200
    assert (await request(server, "GET", call_id, OTHER))[0] == 404
    assert (await request(server, "DELETE", call_id, OWNER))[0] == 200
    peer.close()


def test_the_inbound_key_must_be_one_of_the_servers_keys() -> None:
    from signaling.__main__ import build_parser
    from signaling.sip.config import config_from_args

    parser = build_parser()
    base = ["--sip-listen", "127.0.0.1:0", "--api-key", OWNER]
    config = config_from_args(parser.parse_args([*base, "--sip-inbound-key", OWNER]))
    assert config is not None and config.inbound_tenant == tenant_of(OWNER)
    with pytest.raises(ValueError, match="--sip-inbound-key"):
        config_from_args(parser.parse_args([*base, "--sip-inbound-key", "not-a-key"]))


async def test_a_key_at_its_call_limit_cannot_accept_another_call(hook_url: str) -> None:
    """Outside a cluster, accepting a ringing call is a new call of the key's
    (`--max-calls-per-key`): at its limit, 429 and the call still rings."""
    config = SipConfig(listen_port=0, webhook_url=hook_url, webhook_secret=SECRET,
                       inbound_tenant=tenant_of(OWNER))
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    app = create_app(agent, telephony_config=TelephonyConfig(),
                     auth=AuthSettings(api_keys=(OWNER, OTHER), admin_keys=(ADMIN,)))
    service = install(app, config)
    install_key_limit(app, 1)
    http_server = TestServer(app, host=HOST)
    await http_server.start_server()
    assert service.ua is not None
    server = SipServer(agent, http_server, service.ua)
    try:
        async with aiohttp.ClientSession() as http, http.post(
                f"{server.url}/v1/telephony/rtp",
                json={"remote": "127.0.0.1:9", "codec": "PCMU"},
                headers={"Authorization": f"Bearer {OWNER}"}) as response:
            assert response.status == 201
        peer, call_id = await ringing_call(server)
        status, answer = await request(server, "POST", f"{call_id}/accept", OWNER, {})
        assert (status, answer["error"]["code"]) == (429, "tenant_limit"), answer
        ringing = server.ua.find_call(call_id)
        assert ringing is not None and ringing.pending
        status, _ = await request(server, "POST", f"{call_id}/reject", OWNER, {})
        assert status == 200
        await peer.response(603)
        peer.close()
    finally:
        await http_server.close()
