"""Outbound SIP calls are calls: a key's `--max-calls-per-key` counts them (outside a cluster
too, from the INVITE on, together with its RTP legs), `/health` and `/metrics` show them
while they ring, and a leaked key cannot become toll fraud: `--sip-outbound-rate` per key, a
trunk's `allow` list and `keys`, and every user-supplied field of `POST /v1/sip/calls` and
`/refer` checked for header injection. The far end is a UDP socket that rings (180) and
takes a CANCEL, and a raw SIP peer calling in for the transfer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.auth import AuthSettings
from signaling.call_limit import install_key_limit
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from signaling.sip.trunks import parse_trunks
from signaling.telephony import TelephonyConfig
from tests.sip.helpers import HOST, SipPeer, SipServer, establish, sdp_offer
from tests.support.agents import wait_until

KEYS = ("key-a-000001", "key-b-000002")
ADMIN = "admin-key-003"


class SilentPeer(asyncio.DatagramProtocol):
    """A far end that takes every datagram and answers none: its calls ring on."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.received.append(data)


class RingingPeer(SilentPeer):
    """A far end that rings (180) and takes a CANCEL (200, then 487 to the INVITE)."""

    transport: asyncio.DatagramTransport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        super().datagram_received(data, addr)
        head = data.split(b"\r\n\r\n", 1)[0].decode()
        method = head.split(" ", 1)[0]
        copied = [line for line in head.split("\r\n")[1:]
                  if line.split(":", 1)[0].lower() in ("via", "from", "to", "call-id", "cseq")]
        copied = [f"{line};tag=far" if line.lower().startswith("to:") else line
                  for line in copied]

        def answer(status: str, lines: list[str]) -> None:
            text = "\r\n".join([f"SIP/2.0 {status}", *lines, "Content-Length: 0", "", ""])
            self.transport.sendto(text.encode(), addr)

        if method == "INVITE":
            answer("180 Ringing", copied)
        elif method == "CANCEL":
            answer("200 OK", copied)
            answer("487 Request Terminated",
                   [line.replace("CANCEL", "INVITE") if line.lower().startswith("cseq:")
                    else line for line in copied])


@pytest.fixture
async def ringing() -> AsyncIterator[tuple[RingingPeer, int]]:
    transport, peer = await asyncio.get_running_loop().create_datagram_endpoint(
        RingingPeer, local_addr=(HOST, 0))
    yield peer, transport.get_extra_info("sockname")[1]
    transport.close()


@pytest.fixture
async def start() -> AsyncIterator[Any]:
    running: list[TestServer] = []

    async def make(config: SipConfig, per_key: int = 0, max_calls: int = 0) -> SipServer:
        agent = MediaAgent(EchoPlugin(), AgentSettings(max_calls=max_calls))
        app = create_app(agent, telephony_config=TelephonyConfig(),
                         auth=AuthSettings(api_keys=KEYS, admin_keys=(ADMIN,)))
        service = install(app, config)
        install_key_limit(app, per_key)
        server = TestServer(app, host=HOST)
        await server.start_server()
        running.append(server)
        assert service.ua is not None
        return SipServer(agent, server, service.ua)

    yield make
    for server in running:
        await server.close()


async def call(server: SipServer, method: str, path: str, key: str,
               body: Any = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with aiohttp.ClientSession() as http, http.request(
            method, server.url + path, json=body,
            headers={"Authorization": f"Bearer {key}"}) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else {}, dict(response.headers)


def to(port: int, user: str = "+15550100") -> str:
    return f"sip:{user}@{HOST}:{port}"


async def rtp_leg(server: SipServer, key: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    return await call(server, "POST", "/v1/telephony/rtp", key,
                      {"remote": "127.0.0.1:9", "codec": "PCMU"})


async def test_max_calls_per_key_counts_ringing_outbound_calls_without_a_cluster(
        start: Any, ringing: tuple[RingingPeer, int]) -> None:
    peer, port = ringing
    server = await start(SipConfig(listen_port=0), per_key=2)
    a, b = KEYS
    status, leg, _ = await rtp_leg(server, a)
    assert status == 201, leg
    # one slot left, six at once: exactly one is placed
    burst = await asyncio.gather(*(call(server, "POST", "/v1/sip/calls", a, {"to": to(port)})
                                   for _ in range(6)))
    assert sorted(s for s, _, _ in burst) == [201] + [429] * 5, burst
    placed = next(body for s, body, _ in burst if s == 201)
    # at its limit: refused for every kind of call, SIP ones included
    refused = [await call(server, "POST", "/v1/sip/calls", a, {"to": to(port)})
               for _ in range(4)] + [await rtp_leg(server, a)]
    assert [s for s, _, _ in refused + burst].count(429) == 10, refused
    await wait_until(lambda: any(d.startswith(b"INVITE ") for d in peer.received))
    assert sum(d.startswith(b"INVITE ") for d in peer.received) == 1  # none for the refused
    assert all(body["error"]["code"] == "tenant_limit" and "Retry-After" in headers
               for _, body, headers in refused)
    # another key still has room
    status, other, _ = await call(server, "POST", "/v1/sip/calls", b, {"to": to(port)})
    assert status == 201, other
    # the ringing calls are counted in /health and /metrics
    status, health, _ = await call(server, "GET", "/health", a)
    assert health["pending_calls"] == 2 and health["sip"]["outbound_dialogs"] == 2
    async with aiohttp.ClientSession() as http, http.get(
            server.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}) as response:
        assert "agent_pending_calls 2.0" in await response.text()
    # one ended: the key may place one again
    status, _, _ = await call(server, "DELETE", f"/v1/sip/calls/{placed['id']}", a)
    assert status == 200
    await wait_until(lambda: placed["id"] not in dialer(server).live)
    status, again, _ = await call(server, "POST", "/v1/sip/calls", a, {"to": to(port)})
    assert status == 201, again
    for ended in (again["id"], other["id"]):
        await call(server, "DELETE", f"/v1/sip/calls/{ended}", ADMIN)
    await call(server, "DELETE", f"/v1/telephony/rtp/{leg['call_id']}", a)


def dialer(server: SipServer) -> Any:
    from signaling.sip.service import SIP_SERVICE_KEY

    return server.server.app[SIP_SERVICE_KEY].dialer


async def hang_up_all(server: SipServer) -> None:
    for live in list(dialer(server).live.values()):
        await dialer(server).hang_up(live)


async def test_sip_outbound_rate_per_key(start: Any, ringing: tuple[RingingPeer, int]) -> None:
    _, port = ringing
    server = await start(SipConfig(listen_port=0, outbound_rate=0.5, outbound_burst=3))
    a, b = KEYS
    answers = [await call(server, "POST", "/v1/sip/calls", a, {"to": to(port)})
               for _ in range(5)]
    assert [s for s, _, _ in answers] == [201, 201, 201, 429, 429], answers
    for _, body, headers in answers[3:]:
        assert body["error"]["code"] == "sip_outbound_rate"
        assert 1 <= int(headers["Retry-After"]) <= 2
    # over the limit: nothing was sent for them
    assert len(dialer(server).live) == 3
    status, _, _ = await call(server, "POST", "/v1/sip/calls", b, {"to": to(port)})
    assert status == 201  # another key has its own bucket
    await hang_up_all(server)


TRUNKS = {"t1": {"proxy": "sip:127.0.0.1:{port}", "allow": ["+1555*", "sip:desk@*"],
                 "keys": [KEYS[0]]}}


@pytest.mark.parametrize(("key", "target", "status", "code"), [
    (KEYS[0], "sip:+15550100@carrier.example", 201, None),
    (KEYS[0], "sip:desk@pbx.example", 201, None),
    (KEYS[0], "sip:+19005550100@carrier.example", 403, "destination_not_allowed"),
    (KEYS[0], "sip:%2B19005550100@carrier.example", 403, "destination_not_allowed"),
    (KEYS[0], "sip:011447700900123@carrier.example", 403, "destination_not_allowed"),
    (KEYS[0], "sip:%FF%2B1555@carrier.example", 403, "destination_not_allowed"),
    (KEYS[1], "sip:+15550100@carrier.example", 403, "trunk_not_allowed"),
    (ADMIN, "sip:+15550100@carrier.example", 201, None),
])
async def test_a_trunks_allow_list_and_keys(start: Any, ringing: tuple[RingingPeer, int],
                                            key: str, target: str, status: int,
                                            code: str | None) -> None:
    peer, port = ringing
    trunks = json.loads(json.dumps(TRUNKS).replace("{port}", str(port)))
    server = await start(SipConfig(listen_port=0, trunks=parse_trunks(trunks)))
    answer, body, _ = await call(server, "POST", "/v1/sip/calls", key,
                                 {"to": target, "trunk": "t1"})
    assert answer == status, body
    if code is not None:
        assert body["error"]["code"] == code
        assert not dialer(server).live and not peer.received  # nothing was dialled
    await hang_up_all(server)


# -- header injection -------------------------------------------------------------------------

GOOD = {"to": "sip:+15550100@127.0.0.1:9"}
INJECTIONS: list[tuple[str, dict[str, Any]]] = [
    ("to CRLF", {"to": "sip:+1555@127.0.0.1\r\nX-Evil: 1"}),
    ("to LF", {"to": "sip:+1555@127.0.0.1\nX-Evil: 1"}),
    ("to NUL", {"to": "sip:+1555\x00@127.0.0.1"}),
    ("to U+2028", {"to": "sip:+1555\u2028X-Evil: 1@127.0.0.1"}),
    ("to U+0085", {"to": "sip:+1555\x85@127.0.0.1"}),
    ("to ?headers", {"to": "sip:+1555@127.0.0.1?X-Evil=1"}),
    ("to closing >", {"to": "sip:+1555@127.0.0.1>;tag=forged"}),
    ("to too long", {"to": "sip:" + "1" * 600 + "@127.0.0.1"}),
    ("from CRLF", {**GOOD, "from": '"Agent\r\nX-Evil: 1" <sip:agent@example.com>'}),
    ("from LF in URI", {**GOOD, "from": "sip:agent@example.com\nX-Evil: 1"}),
    ("from NUL", {**GOOD, "from": '"Agent\x00" <sip:agent@example.com>'}),
    ("from U+2028 name", {**GOOD, "from": '"Agent\u2028X-Evil: 1" <sip:agent@example.com>'}),
    ("from C1 name", {**GOOD, "from": '"Agent\x85" <sip:agent@example.com>'}),
    ("from ?headers", {**GOOD, "from": "<sip:agent@example.com?X-Evil=1>"}),
    ("from tag", {**GOOD, "from": "<sip:agent@example.com>;tag=forged"}),
    ("from long name", {**GOOD, "from": '"' + "A" * 200 + '" <sip:agent@example.com>'}),
    ("from too long", {**GOOD, "from": "sip:" + "a" * 600 + "@example.com"}),
    ("header value CRLF", {**GOOD, "headers": {"X-A": "1\r\nVia: SIP/2.0/UDP evil"}}),
    ("header value LF", {**GOOD, "headers": {"X-A": "1\nX-Evil: 1"}}),
    ("header value NUL", {**GOOD, "headers": {"X-A": "1\x00"}}),
    ("header value U+2028", {**GOOD, "headers": {"X-A": "1\u2028X-Evil: 1"}}),
    ("header value C1", {**GOOD, "headers": {"X-A": "1\x85"}}),
    ("header value too long", {**GOOD, "headers": {"X-A": "1" * 2000}}),
    ("header name CRLF", {**GOOD, "headers": {"X-A: 1\r\nX-Evil": "1"}}),
    ("header name colon", {**GOOD, "headers": {"X-A:": "1"}}),
    ("header Via", {**GOOD, "headers": {"Via": "SIP/2.0/UDP evil"}}),
    ("header Route", {**GOOD, "headers": {"Route": "<sip:evil>"}}),
    ("header compact v", {**GOOD, "headers": {"v": "SIP/2.0/UDP evil"}}),
    ("trunk CRLF", {**GOOD, "trunk": "t1\r\nX-Evil: 1"}),
]
REFER_INJECTIONS = [
    "sip:desk@127.0.0.1?Replaces=abc%3Bto-tag%3Dx",
    "sip:desk@127.0.0.1?X-Evil=1",
    "sip:desk@127.0.0.1?",
    "sip:desk@127.0.0.1\r\nX-Evil: 1",
    "sip:desk@127.0.0.1\nX-Evil: 1",
    "sip:desk\x00@127.0.0.1",
    "sip:desk\u2028X-Evil: 1@127.0.0.1",
    "tel:+1555\r\nX-Evil: 1",
    "<sip:desk@127.0.0.1>",
    "sip:" + "1" * 600 + "@127.0.0.1",
]


async def test_header_injection_through_every_field_is_refused(
        start: Any, ringing: tuple[RingingPeer, int]) -> None:
    """Each attempt is a coded 400 and nothing is sent; the same fields, clean, place a call
    and transfer one (so the refusals are not of something else)."""
    peer, port = ringing
    trunks = parse_trunks({"t1": {"proxy": f"sip:127.0.0.1:{port}"}})
    server = await start(SipConfig(listen_port=0, trunks=trunks))
    refused = []
    for name, body in INJECTIONS:
        status, answer, _ = await call(server, "POST", "/v1/sip/calls", KEYS[0], body)
        if status == 400 and answer["error"]["code"] in (
                "invalid_uri", "invalid_header", "forbidden_header", "unknown_trunk"):
            refused.append(name)
    assert refused == [name for name, _ in INJECTIONS]
    assert not peer.received and not dialer(server).live
    status, placed, _ = await call(server, "POST", "/v1/sip/calls", KEYS[0], {
        "to": f"sip:+15550100@127.0.0.1:{port}", "trunk": "t1",
        "from": '"Agent Ünïcode" <sip:agent@example.com>', "headers": {"X-Campaign": "a\tb"}})
    assert status == 201, placed
    await wait_until(lambda: any(d.startswith(b"INVITE ") for d in peer.received))
    invite = next(d for d in peer.received if d.startswith(b"INVITE "))
    assert b"X-Campaign: a\tb\r\n" in invite and b"Evil" not in invite
    await hang_up_all(server)
    # /refer on an established inbound call: every bad target is a 400, no REFER is sent
    caller = await SipPeer.open()
    await establish(server, caller, sdp_offer(40000))
    call_id = next(leg.id for leg in server.agent.legs if leg.transport == "sip")
    for target in REFER_INJECTIONS:
        status, answer, _ = await call(server, "POST", f"/v1/realtime/calls/{call_id}/refer",
                                       ADMIN, {"target_uri": target})
        assert (status, answer["error"]["code"]) == (400, "invalid_target"), (target, answer)
    assert not [m for m in await caller.drain(0.2) if getattr(m, "method", "") == "REFER"]
    caller.close()
