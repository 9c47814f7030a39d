"""Inbound calls answered by the application (--sip-webhook): realtime.call.incoming posted
to a real aiohttp receiver on 127.0.0.1 that verifies it with `standardwebhooks`, then
/accept or /reject over HTTP, against sipp; and DTMF sent by the agent (RFC 4733), parsed
off the wire by a test UDP socket."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks import Webhook, WebhookVerificationError

from agent.telephony.codec import PCMU
from agent.telephony.dtmf_sender import DtmfSender, check_digits
from agent.telephony.telephone_event import TelephoneEventDetector, parse_telephone_event
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.auth import AuthSettings
from signaling.sip.config import SipConfig
from tests.sip import scenarios
from tests.sip.helpers import (
    HOST,
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    establish,
    hang_up,
    run_sipp,
    sdp_offer,
    write_mulaw_wav,
)
from tests.support.agents import wait_until

SECRET = "whsec_" + base64.b64encode(b"duplex-agent test webhook secret").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"somebody else's secret").decode()
KEY = "sk-test-" + "k" * 24


@dataclass
class Receiver:
    """The application's webhook endpoint: verifies every delivery with the library."""

    secret: str
    status: int = 200
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    failures: list[Exception] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.headers.append(headers)
        try:
            event = Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError as exc:
            self.failures.append(exc)
            return web.Response(status=400)
        self.events.put_nowait(event)
        return web.Response(status=self.status)


@pytest.fixture
async def receiver_factory() -> AsyncIterator[Any]:
    servers: list[TestServer] = []

    async def start(secret: str = SECRET, status: int = 200) -> Receiver:
        receiver = Receiver(secret, status)
        app = web.Application()
        app.router.add_post("/hooks/sip", receiver.handle)
        server = TestServer(app, host=HOST)
        await server.start_server()
        servers.append(server)
        receiver.url = str(server.make_url("/hooks/sip"))
        return receiver

    yield start
    for server in servers:
        await server.close()


async def webhook_server(start_sip: SipServerFactory, receiver: Receiver,
                         accept_timeout: float = 10.0, **options: Any) -> SipServer:
    config = SipConfig(listen_port=0, webhook_url=receiver.url, webhook_secret=SECRET,
                       accept_timeout=accept_timeout)
    return await start_sip(config=config, **options)


async def post(url: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(url, json=body,
                                                          headers=headers) as reply:
        return reply.status, await reply.json()


def header(event: dict[str, Any], name: str) -> str | None:
    for item in event["data"]["sip_headers"]:
        if item["name"].lower() == name.lower():
            return str(item["value"])
    return None


# -- against sipp ----------------------------------------------------------------------------


@pytest.mark.interop
async def test_webhook_then_accept_answers_the_call_and_the_echo_comes_back(
    start_sip: SipServerFactory, receiver_factory: Any, tmp_path: Path,
) -> None:
    receiver = await receiver_factory()
    server = await webhook_server(start_sip, receiver, auth=AuthSettings(api_keys=(KEY,)))
    probe = await RtpProbe.open()
    signal = make_test_signal(3.0, 8000)
    sent = PCMU.decode(write_mulaw_wav(tmp_path / "speech.wav", signal))
    xml = scenarios.call_with_echo("speech.wav", 4000).replace("__MEDIA_PORT__",
                                                               str(probe.port))
    sipp = asyncio.ensure_future(run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml,
                                          timeout=30))
    try:
        event = await asyncio.wait_for(receiver.events.get(), 10)
        assert event["type"] == "realtime.call.incoming"
        call_id = event["data"]["call_id"]
        assert call_id.startswith("sip_")
        assert header(event, "Call-ID") and "sipp" in (header(event, "From") or "")
        hook = receiver.headers[0]
        assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= {
            name.lower() for name in hook}
        url = f"{server.url}/v1/realtime/calls/{call_id}"
        assert (await post(url + "/accept", {"instructions": "hi"}))[0] == 401  # no key
        status, reply = await post(url + "/accept", {"type": "realtime", "instructions": "Be "
                                                     "brief.", "audio": {"output": {}}}, KEY)
        assert status == 200, reply
        assert reply["status"] == "accepted"
        assert server.agent.legs.get(call_id) is not None  # the leg has the call's id
        status, reply = await post(url + "/accept", {}, KEY)
        assert (status, reply["error"]["code"]) == (409, "call_not_pending")
        status, reply = await post(url + "/reject", {}, KEY)
        assert (status, reply["error"]["code"]) == (409, "call_not_pending")
        run = await sipp
    finally:
        sipp.cancel()
    assert run.returncode == 0, run.explain()
    echo = measure_echo(sent.astype(np.float32) / 32768, probe.audio(), 8000)
    assert echo.correlation >= 0.8, echo
    assert server.ua.counters["answered"] == 1 and server.ua.counters["webhooks_sent"] == 1
    await wait_until(server.quiet)
    status, reply = await post(f"{server.url}/v1/realtime/calls/{call_id}/accept", {}, KEY)
    assert (status, reply["error"]["code"]) == (404, "call_not_found")  # ended: forgotten
    assert not receiver.failures
    probe.close()


@pytest.mark.interop
async def test_reject_486_reaches_sipp(
    start_sip: SipServerFactory, receiver_factory: Any, tmp_path: Path,
) -> None:
    receiver = await receiver_factory()
    server = await webhook_server(start_sip, receiver)
    probe = await RtpProbe.open()
    xml = scenarios.rejected(486).replace("__MEDIA_PORT__", str(probe.port))
    sipp = asyncio.ensure_future(run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml,
                                          timeout=20))
    try:
        event = await asyncio.wait_for(receiver.events.get(), 10)
        url = f"{server.url}/v1/realtime/calls/{event['data']['call_id']}/reject"
        for wrong in (200, 399, 700, "486", True):
            status, reply = await post(url, {"status_code": wrong})
            assert (status, reply["error"]["code"]) == (400, "invalid_value"), wrong
        status, reply = await post(url, {"status_code": 486})
        assert status == 200 and reply["status_code"] == 486, reply
        run = await sipp
    finally:
        sipp.cancel()
    assert run.returncode == 0, run.explain()
    assert run.count("SIP/2.0 486", "received") >= 1
    assert run.count("SIP/2.0 200", "received") == 0
    assert server.ua.counters["rejected_by_application"] == 1
    await wait_until(server.quiet)
    assert server.agent.metrics.calls_started.labels("sip", "echo")._value.get() == 0
    probe.close()


@pytest.mark.interop
async def test_no_answer_within_the_accept_timeout_is_480(
    start_sip: SipServerFactory, receiver_factory: Any, tmp_path: Path,
) -> None:
    receiver = await receiver_factory()
    server = await webhook_server(start_sip, receiver, accept_timeout=1.0)
    probe = await RtpProbe.open()
    xml = scenarios.rejected(480, timeout_ms=5000).replace("__MEDIA_PORT__", str(probe.port))
    loop = asyncio.get_running_loop()
    started = loop.time()
    run = await run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml, timeout=20)
    assert run.returncode == 0, run.explain()
    assert run.count("SIP/2.0 480", "received") >= 1
    assert loop.time() - started < 4.0  # 1 s of ringing, not sipp's own timeouts
    assert server.ua.counters["accept_timeouts"] == 1
    assert receiver.events.qsize() == 1  # the application was told, and said nothing
    await wait_until(server.quiet)
    probe.close()


# -- over a hand-made UAC (no sipp needed) --------------------------------------------------


async def invite_and_ring(server: SipServer) -> tuple[SipPeer, Dialogue]:
    peer = await SipPeer.open()
    dialogue = Dialogue(peer.port, server.sip)
    peer.send(dialogue.request("INVITE", body=sdp_offer(40000)), server.sip)
    await peer.response(180)
    return peer, dialogue


async def test_a_failing_webhook_is_logged_and_the_call_gets_480(
    start_sip: SipServerFactory, receiver_factory: Any,
) -> None:
    receiver = await receiver_factory(status=500)  # the application is down
    server = await webhook_server(start_sip, receiver, accept_timeout=0.5)
    peer, _ = await invite_and_ring(server)
    final = await peer.response(480, timeout=3)
    assert final.status == 480
    assert server.ua.counters["webhook_failures"] == 1
    await wait_until(server.quiet)
    peer.close()


async def test_a_receiver_with_another_secret_refuses_the_signature(
    start_sip: SipServerFactory, receiver_factory: Any,
) -> None:
    """Negative control: the signature is checked for real, not merely present."""
    receiver = await receiver_factory(secret=OTHER_SECRET)
    server = await webhook_server(start_sip, receiver, accept_timeout=0.5)
    peer, _ = await invite_and_ring(server)
    await peer.response(480, timeout=3)
    assert len(receiver.failures) == 1 and receiver.events.empty()
    assert isinstance(receiver.failures[0], WebhookVerificationError)
    peer.close()


async def test_unknown_ids_secrets_and_bodies(
    start_sip: SipServerFactory, receiver_factory: Any,
) -> None:
    receiver = await receiver_factory()
    server = await webhook_server(start_sip, receiver, accept_timeout=5.0)
    status, reply = await post(f"{server.url}/v1/realtime/calls/sip_nope/accept", {})
    assert (status, reply["error"]["code"]) == (404, "call_not_found")
    peer, _ = await invite_and_ring(server)
    event = await asyncio.wait_for(receiver.events.get(), 5)
    url = f"{server.url}/v1/realtime/calls/{event['data']['call_id']}"
    status, reply = await post(url + "/accept", {"voice": 7})
    assert status == 400, reply
    status, reply = await post(url + "/reject")  # no body: 603
    assert status == 200 and reply["status_code"] == 603
    assert (await peer.response(603)).status == 603
    peer.close()
    await wait_until(server.quiet)


# -- DTMF sent ---------------------------------------------------------------------------------


def test_the_sender_schedule_follows_rfc_4733() -> None:
    sender = DtmfSender(160)
    sender.add(check_digits("1#"))
    packets = []
    timestamp = 1000
    while sender.busy:
        packets.append((timestamp, sender.next_packet(timestamp)))
        timestamp += 160
    events = [(ts, p) for ts, p in packets if p is not None]
    first = [p for _, p in events[:7]]
    assert {p.timestamp for p in first} == {1000} and first[0].marker
    assert not any(p.marker for p in first[1:])
    parsed = [parse_telephone_event(p.payload) for p in first]
    assert [e.duration for e in parsed if e] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in parsed if e] == [False] * 4 + [True] * 3
    assert sum(1 for _, p in packets if p is None) >= 2  # the gap between the digits
    second = [p for _, p in events[7:]]
    assert len(second) == 7 and second[0].timestamp > 1000 + 6 * 160
    assert sender.sent == 2
    for wrong in ("", "12x", "1" * 33, 5, None):
        with pytest.raises(ValueError):
            check_digits(wrong)


async def test_dtmf_sent_on_a_plain_rtp_leg(sip_server: SipServer) -> None:
    probe = await RtpProbe.open()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sip_server.url}/v1/telephony/rtp",
                             json={"remote": f"{HOST}:{probe.port}", "codec": "PCMU"}) as reply:
            assert reply.status == 201, await reply.text()
            leg_id = (await reply.json())["call_id"]
    url = f"{sip_server.url}/v1/realtime/calls/{leg_id}/dtmf"
    for wrong in ({"digits": "12x"}, {"digits": ""}, {"digits": "1" * 33}, {}):
        status, reply = await post(url, wrong)
        assert (status, reply["error"]["code"]) == (400, "invalid_value"), wrong
    status, reply = await post(url, {"digits": "12#a"})
    assert status == 200, reply
    await wait_until(lambda: sip_server.agent.legs.get(leg_id).dtmf_out.sent == 4,  # type: ignore[union-attr]
                     timeout=5)
    await asyncio.sleep(0.1)
    events = [p for p in probe.packets if p.payload_type == 101]
    audio = [p for p in probe.packets if p.payload_type == 0]
    assert audio and {p.ssrc for p in events} == {audio[0].ssrc}  # the leg's own stream
    detector = TelephoneEventDetector()
    digits = [d for p in events if (d := detector.feed(p.timestamp, p.payload))]
    assert digits == list("12#A")
    by_event: dict[int, list[Any]] = {}
    for packet in events:
        by_event.setdefault(packet.timestamp, []).append(packet)
    assert len(by_event) == 4
    for packets in by_event.values():
        parsed = [parse_telephone_event(p.payload) for p in packets]
        ends = [e for e in parsed if e and e.end]
        assert len(ends) == 3 and {e.duration for e in ends} == {800}  # 100 ms, E bit x3
        assert packets[0].marker and not any(p.marker for p in packets[1:])
    sequences = sorted(p.sequence_number for p in probe.packets)
    assert len(set(sequences)) == len(sequences)  # one sequence space for audio and events
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{sip_server.url}/v1/telephony/rtp/{leg_id}") as reply:
            assert reply.status in (200, 204)
    probe.close()


async def test_dtmf_needs_a_negotiated_payload_type(sip_server: SipServer) -> None:
    probe = await RtpProbe.open()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{sip_server.url}/v1/telephony/rtp",
                             json={"remote": f"{HOST}:{probe.port}", "codec": "PCMU",
                                   "dtmf_payload_type": None}) as reply:
            assert reply.status == 201, await reply.text()
            leg_id = (await reply.json())["call_id"]
    status, reply = await post(f"{sip_server.url}/v1/realtime/calls/{leg_id}/dtmf",
                               {"digits": "1"})
    assert (status, reply["error"]["code"]) == (409, "dtmf_not_negotiated")
    status, reply = await post(f"{sip_server.url}/v1/realtime/calls/rtp_nope/dtmf",
                               {"digits": "1"})
    assert status == 404
    await sip_server.agent.hangup(leg_id)
    probe.close()


async def test_dtmf_on_a_sip_call(sip_server: SipServer) -> None:
    """Auto-accepted call from a hand-made UAC; the digits go out on the SDP's 101."""
    probe = await RtpProbe.open()
    peer = await SipPeer.open()
    dialogue, _, _ = await establish(sip_server, peer, sdp_offer(probe.port))
    (leg,) = list(sip_server.agent.legs)
    status, reply = await post(f"{sip_server.url}/v1/realtime/calls/{leg.id}/dtmf",
                               {"digits": "9"})
    assert status == 200, reply
    await wait_until(lambda: leg.dtmf_out.sent == 1, timeout=5)  # type: ignore[attr-defined]
    await asyncio.sleep(0.1)
    events = [p for p in probe.packets if p.payload_type == 101]
    assert [parse_telephone_event(p.payload).digit for p in events[:1]] == ["9"]  # type: ignore[union-attr]
    await hang_up(sip_server, peer, dialogue, probe)


def test_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from signaling.sip.config import add_arguments, config_from_args
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--sip-listen", "127.0.0.1:0", "--sip-webhook",
                              "http://127.0.0.1:9/hook"])
    monkeypatch.delenv("AGENT_WEBHOOK_SECRET", raising=False)
    with pytest.raises(ValueError, match="AGENT_WEBHOOK_SECRET"):
        config_from_args(args)
    monkeypatch.setenv("AGENT_WEBHOOK_SECRET", SECRET)
    config = config_from_args(args)
    assert config is not None and config.webhook_secret == SECRET
    assert SECRET not in repr(config)
    monkeypatch.setenv("AGENT_WEBHOOK_SECRET", "whsec_")
    with pytest.raises(ValueError, match="whsec_"):
        config_from_args(args)
