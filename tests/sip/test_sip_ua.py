"""The SIP user agent against a hand-made peer on 127.0.0.1: every request and answer is
written out byte by byte, so each rule of RFC 3261 the agent follows is checked on the wire."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiortc.rtp import RtpPacket

from agent.media_agent import AgentSettings
from agent.telephony.address_policy import parse_networks
from agent.telephony.telephone_event import telephone_event_payload
from signaling.sip.config import SipConfig
from signaling.sip.message import SipRequest, SipResponse
from signaling.sip.sdp import SessionDescription, parse_sdp
from signaling.sip.timers import TimerSettings
from tests.sip.helpers import (
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    TcpSipPeer,
    establish,
    hang_up,
    sdp_offer,
)
from tests.support.agents import wait_until

FAST = TimerSettings(t1=0.05, t2=0.2, t4=0.25)


def answer_of(response: SipResponse) -> tuple[int, list[str], str]:
    """(port, formats, direction) of a 200's SDP answer."""
    sdp = parse_sdp(response.body)
    assert isinstance(sdp, SessionDescription), sdp
    media = sdp.media[0]
    return media.port, media.formats, sdp.direction_of(media)


async def test_invite_is_answered_with_pcmu_and_telephone_event_then_bye_frees_it(
    sip_server: SipServer,
) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, sip_server.sip)
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port, "0 101"))
    peer.send(invite, sip_server.sip)
    trying, ringing, ok = (await peer.response(100), await peer.response(180),
                           await peer.response(200))
    assert trying.to_addr.tag is None and ringing.to_addr.tag == ok.to_addr.tag
    assert ok.headers.get("contact") == f"<sip:agent@127.0.0.1:{sip_server.ua.port}>"
    assert "INVITE" in (ok.headers.get("allow") or "") and ok.content_type == "application/sdp"
    port, formats, direction = answer_of(ok)
    assert formats == ["0", "101"] and direction == "sendrecv"
    assert b"a=rtpmap:101 telephone-event/8000" in ok.body
    peer.send(dialogue.ack_for(invite, ok), sip_server.sip)
    assert sip_server.sip_legs() == 1
    async with aiohttp.ClientSession() as http:
        async with http.get(sip_server.url + "/health") as reply:
            assert (await reply.json())["legs"]["sip"] == 1
        async with http.get(sip_server.url + "/metrics/calls") as reply:
            (call,) = (await reply.json())["calls"]
            assert call["sip_call_id"] == dialogue.call_id and call["local"].endswith(f":{port}")
    await wait_until(lambda: len(probe.packets) >= 5)  # the agent sends to the offer's m= port
    assert {p.payload_type for p in probe.packets} == {0}
    # A key press as RFC 4733 telephone-events on the negotiated payload type 101.
    (leg,) = list(sip_server.agent.legs)
    for seq, (end, duration) in enumerate([(False, 160), (False, 320), (True, 480)]):
        probe.send(RtpPacket(payload_type=101, sequence_number=seq, timestamp=8000, ssrc=7,
                             payload=telephone_event_payload("5", end=end, duration=duration)),
                   ("127.0.0.1", port))
    await wait_until(lambda: any(event["type"] == "input_audio_buffer.dtmf_event_received"
                                 for event in leg.events))
    bye_ok = await hang_up(sip_server, peer, dialogue, probe)
    assert bye_ok.to_addr.tag == ok.to_addr.tag
    assert sip_server.ua.counters["remote_hangups"] == 1


async def test_pcma_when_the_caller_prefers_it_and_488_without_a_usable_codec(
    sip_server: SipServer,
) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    _, _, ok = await establish(sip_server, peer, sdp_offer(probe.port, "8 0"))
    assert answer_of(ok)[1] == ["8"]
    refused = Dialogue(peer.port, sip_server.sip)
    peer.send(refused.request("INVITE", body=sdp_offer(probe.port, "18 3")), sip_server.sip)
    answer = await peer.response(488)
    assert (answer.headers.get("warning") or "").startswith("305 ")
    srtp = Dialogue(peer.port, sip_server.sip)
    peer.send(srtp.request("INVITE", body=sdp_offer(probe.port, "0", proto="RTP/SAVP")),
              sip_server.sip)
    await peer.response(488)
    assert sip_server.sip_legs() == 1  # only the first call
    peer.close()
    probe.close()


async def test_a_retransmitted_invite_is_one_call_and_gets_the_last_answer_again(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, ring_seconds=0.5))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    peer.send(invite, server.sip)
    await peer.response(180)
    peer.send(invite, server.sip)  # the same bytes again: a retransmission
    again = await peer.response()
    assert again.status == 180  # the last response, resent
    ok = await peer.response(200)
    peer.send(invite, server.sip)  # after the 2xx: absorbed, the 2xx resent
    assert (await peer.response()).status == 200
    peer.send(dialogue.ack_for(invite, ok), server.sip)
    assert server.agent.metrics.calls_started.labels("sip", "echo")._value.get() == 1
    assert server.sip_legs() == 1 and server.ua.counters["retransmissions_absorbed"] == 2
    # The same INVITE by another path (new branch): 482, still one call.
    peer.send(dialogue.request("INVITE", body=sdp_offer(probe.port), to_tag=""), server.sip)
    assert (await peer.response(482)).status == 482
    assert server.sip_legs() == 1
    peer.close()
    probe.close()


async def test_the_2xx_is_retransmitted_until_the_ack_doubling_to_t2(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    peer.send(invite, server.sip)
    ok = await peer.response(200)
    loop = asyncio.get_running_loop()
    first = loop.time()
    times = []
    for _ in range(5):
        await peer.response(200)
        times.append(loop.time() - first)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    # T1 = 50 ms doubling to T2 = 200 ms: 50, 100, 200, 200, 200 (with scheduling slack).
    assert 0.03 < gaps[0] < 0.1 and 0.07 < gaps[1] < 0.17, gaps
    assert all(0.15 < gap < 0.3 for gap in gaps[2:]), gaps
    peer.send(dialogue.ack_for(invite, ok), server.sip)
    late = [m for m in await peer.drain(0.5) if isinstance(m, SipResponse)]
    assert len(late) <= 1  # at most one already on its way when the ACK came
    assert server.sip_legs() == 1
    peer.close()
    probe.close()


async def test_no_ack_within_64_t1_ends_the_call_with_a_bye(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    peer.send(dialogue.request("INVITE", body=sdp_offer(probe.port)), server.sip)
    await peer.response(200)
    bye = await peer.request("BYE", timeout=64 * FAST.t1 + 2)
    assert bye.uri == f"sip:caller@127.0.0.1:{peer.port}"  # the caller's Contact
    assert 'text="no_ack"' in (bye.headers.get("reason") or "")
    peer.send(reply_to(bye, 200), server.sip)
    await wait_until(server.idle, timeout=5)
    peer.close()
    probe.close()


def reply_to(request: SipRequest, status: int) -> bytes:
    """A minimal response to a request the agent sent."""
    lines = [f"SIP/2.0 {status} OK"]
    lines += [f"Via: {via}" for via in request.headers.lines("via")]
    for name in ("From", "To", "Call-ID", "CSeq"):
        lines.append(f"{name}: {request.headers.get(name)}")
    lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_cancel_before_the_answer_gets_200_and_487_and_frees_the_call(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, ring_seconds=2.0))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    branch = "z9hG4bK-cancel-me"
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port), branch=branch)
    peer.send(invite, server.sip)
    ringing = await peer.response(180)
    peer.send(dialogue.request("CANCEL", branch=branch), server.sip)
    cancel_ok = await peer.response(200, method="CANCEL")
    terminated = await peer.response(487, method="INVITE")
    assert cancel_ok.to_addr.tag == terminated.to_addr.tag == ringing.to_addr.tag
    # The ACK of the 487 goes to the INVITE's transaction (same branch), which stops resending.
    ack = dialogue.request("ACK", branch=branch, to_tag=terminated.to_addr.tag)
    peer.send(ack, server.sip)
    await asyncio.sleep(2.5)  # past the ring time: no 200 ever comes
    assert not [m for m in await peer.drain(0.2) if isinstance(m, SipResponse)
                and m.status == 200]
    assert server.quiet() and server.ua.counters["cancelled"] == 1
    # A CANCEL for nothing: 481.
    peer.send(dialogue.request("CANCEL", branch="z9hG4bK-unknown"), server.sip)
    await peer.response(481, method="CANCEL")
    peer.close()
    probe.close()


async def test_unknown_dialogs_methods_and_requirements(sip_server: SipServer) -> None:
    peer = await SipPeer.open()
    stranger = Dialogue(peer.port, sip_server.sip, to_tag="nosuchtag")
    peer.send(stranger.request("BYE"), sip_server.sip)
    assert (await peer.response()).status == 481
    peer.send(stranger.request("INVITE", body=sdp_offer(4000)), sip_server.sip)
    assert (await peer.response(481)).status == 481
    fresh = Dialogue(peer.port, sip_server.sip)
    peer.send(fresh.request("REGISTER"), sip_server.sip)
    not_allowed = await peer.response()
    assert not_allowed.status == 405 and "INVITE" in (not_allowed.headers.get("allow") or "")
    peer.send(fresh.request("FROBNICATE"), sip_server.sip)
    assert (await peer.response()).status == 501
    peer.send(fresh.request("OPTIONS", headers=[("Require", "100rel, foo")]), sip_server.sip)
    bad_extension = await peer.response()
    assert bad_extension.status == 420
    assert bad_extension.headers.get("unsupported") == "100rel, foo"
    peer.send(fresh.request("INVITE", body=sdp_offer(4000, ip="8.8.8.8")), sip_server.sip)
    assert "not allowed" in ((await peer.response(488)).headers.get("warning") or "")
    # (no offer at all is a late offer, served: test_sip_update.py)
    peer.send(fresh.request("INVITE", body=b"hello", content_type="text/plain"),
              sip_server.sip)
    assert (await peer.response(415)).headers.get("accept") == "application/sdp"
    assert sip_server.sip_legs() == 0
    peer.close()


async def test_options_is_200_while_serving_and_503_when_draining_or_full(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(settings=AgentSettings(max_calls=1), drain_seconds=30.0)
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    probe_dialogue = Dialogue(peer.port, server.sip)
    peer.send(probe_dialogue.request("OPTIONS"), server.sip)
    options = await peer.response(200)
    assert options.headers.get("accept") == "application/sdp"
    assert "BYE" in (options.headers.get("allow") or "")
    await establish(server, peer, sdp_offer(probe.port))
    peer.send(Dialogue(peer.port, server.sip).request("OPTIONS"), server.sip)
    full = await peer.response()
    assert (full.status, full.reason) == (503, "Server Full")
    peer.send(Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(probe.port)),
              server.sip)
    assert (await peer.response(503)).headers.get("retry-after") == "5"
    async with aiohttp.ClientSession() as http, http.post(server.url + "/admin/drain") as reply:
        assert reply.status == 202
    peer.send(Dialogue(peer.port, server.sip).request("OPTIONS"), server.sip)
    draining = await peer.response()
    assert (draining.status, draining.reason) == (503, "Draining")
    peer.close()
    probe.close()


async def test_reinvite_holds_and_resumes_and_moves_the_media(sip_server: SipServer) -> None:
    peer, probe, moved = await SipPeer.open(), await RtpProbe.open(), await RtpProbe.open()
    dialogue, _, ok = await establish(sip_server, peer, sdp_offer(probe.port))
    await wait_until(lambda: len(probe.packets) >= 3)

    async def reinvite(port: int, direction: str | None) -> SipResponse:
        dialogue.cseq += 1
        request = dialogue.request("INVITE", body=sdp_offer(port, "0 101", direction))
        peer.send(request, sip_server.sip)
        answer = await peer.response(200, method="INVITE")
        peer.send(dialogue.ack_for(request, answer), sip_server.sip)
        return answer

    held = await reinvite(probe.port, "sendonly")
    assert answer_of(held)[2] == "recvonly" and answer_of(held)[0] == answer_of(ok)[0]
    assert b"o=duplex-agent" in held.body and held.body != ok.body  # a new version
    await asyncio.sleep(0.1)
    count = len(probe.packets)
    await asyncio.sleep(0.4)
    assert len(probe.packets) <= count + 1  # on hold: the agent sends nothing
    assert answer_of(await reinvite(probe.port, "inactive"))[2] == "inactive"
    resumed = await reinvite(moved.port, None)  # resume, and the caller's port moved
    assert answer_of(resumed)[2] == "sendrecv"
    await wait_until(lambda: len(moved.packets) >= 5)
    # An offer without the call's codec: 488, and the call goes on as it was.
    dialogue.cseq += 1
    peer.send(dialogue.request("INVITE", body=sdp_offer(moved.port, "8")), sip_server.sip)
    await peer.response(488, method="INVITE")
    before = len(moved.packets)
    await wait_until(lambda: len(moved.packets) >= before + 5)
    assert sip_server.sip_legs() == 1 and sip_server.ua.counters["reinvites"] == 3
    peer.close()
    probe.close()
    moved.close()


async def test_agent_hangup_over_http_sends_bye_through_the_route_set(
    start_sip: SipServerFactory,
) -> None:
    sip_server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    caller, proxy, probe = await SipPeer.open(), await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(caller.port, sip_server.sip)
    record_route = [("Record-Route", f"<sip:127.0.0.1:{proxy.port};lr;ftag=x>")]
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port), headers=record_route)
    caller.send(invite, sip_server.sip)
    ok = await caller.response(200)
    assert ok.headers.get("record-route") == f"<sip:127.0.0.1:{proxy.port};lr;ftag=x>"
    caller.send(dialogue.ack_for(invite, ok), sip_server.sip)
    (leg,) = list(sip_server.agent.legs)
    async with (aiohttp.ClientSession() as http,
                http.delete(f"{sip_server.url}/v1/realtime/calls/{leg.id}") as reply):
        assert reply.status == 200
    bye = await proxy.request("BYE")  # loose routing: to the proxy, for the caller's Contact
    assert bye.uri == f"sip:caller@127.0.0.1:{caller.port}"
    assert bye.headers.get("route") == f"<sip:127.0.0.1:{proxy.port};lr;ftag=x>"
    assert bye.to_addr.tag == dialogue.from_tag and bye.from_addr.tag == ok.to_addr.tag
    assert 'text="hangup"' in (bye.headers.get("reason") or "")
    proxy.send(reply_to(bye, 200), sip_server.sip)
    await wait_until(sip_server.idle, timeout=10)
    caller.close()
    proxy.close()
    probe.close()


async def test_strict_router_and_media_timeout_bye(start_sip: SipServerFactory) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST, media_timeout=1.0))
    caller, router, probe = await SipPeer.open(), await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(caller.port, server.sip)
    strict = [("Record-Route", f"<sip:router@127.0.0.1:{router.port}>")]
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port), headers=strict)
    caller.send(invite, server.sip)
    ok = await caller.response(200)
    caller.send(dialogue.ack_for(invite, ok), server.sip)
    # No RTP ever comes: the leg ends (--sip-media-timeout) and the agent says BYE.
    bye = await router.request("BYE", timeout=5)
    assert bye.uri == f"sip:router@127.0.0.1:{router.port}"  # a strict router: the R-URI
    assert bye.headers.get("route") == f"<sip:caller@127.0.0.1:{caller.port}>"
    assert 'text="media_timeout"' in (bye.headers.get("reason") or "")
    router.send(reply_to(bye, 200), server.sip)
    await wait_until(server.idle, timeout=10)
    caller.close()
    router.close()
    probe.close()


def raw(start: str, *headers: str, body: str = "") -> bytes:
    """A request written by hand, `{port}` left for the peer's port."""
    return ("\r\n".join([start, *headers, "", body])).encode()


BASE = ("From: <sip:b@x>;tag=1", "To: <sip:a@x>")


@pytest.mark.parametrize("data, status", [
    (raw("INVITE sip:a@127.0.0.1 SIP/3.0",
         "Via: SIP/3.0/UDP 127.0.0.1:{port};branch=z9hG4bKv", *BASE, "Call-ID: v",
         "CSeq: 1 INVITE", "Content-Length: 0", ""), 505),
    (raw("OPTIONS isbn:2983792873 SIP/2.0",
         "Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKs", *BASE, "Call-ID: s",
         "CSeq: 1 OPTIONS", "Content-Length: 0", ""), 416),
    (raw("OPTIONS sip:a@127.0.0.1 SIP/2.0",
         "Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKl", *BASE, "Call-ID: l",
         "CSeq: 1 OPTIONS", "Content-Length: 50", "", body="short"), 400),
    (raw("OPTIONS sip:a@127.0.0.1 SIP/2.0",
         "Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKm", *BASE, "CSeq: 1 OPTIONS", ""),
     400),
])
async def test_malformed_requests_are_answered_when_they_can_be(
    sip_server: SipServer, data: bytes, status: int,
) -> None:
    peer = await SipPeer.open()
    peer.send(b"\x00\xffgarbage\r\n\r\n", sip_server.sip)  # dropped, no answer
    peer.send(data.replace(b"{port}", str(peer.port).encode()), sip_server.sip)
    await wait_until(lambda: bool(peer.datagrams), timeout=5)
    await asyncio.sleep(0.2)
    (answer,) = peer.datagrams  # an answer our own parser may refuse: it copies what it got
    assert answer.startswith(f"SIP/2.0 {status} ".encode()), answer
    counters = sip_server.ua.counters
    assert counters["malformed"] == 2 and counters["internal_errors"] == 0
    peer.close()


async def test_requests_from_outside_sip_allow_get_403(start_sip: SipServerFactory) -> None:
    config = SipConfig(listen_port=0, allowed_networks=parse_networks(["10.0.0.0/8"]))
    server = await start_sip(config=config)
    peer = await SipPeer.open()
    peer.send(Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(4000)),
              server.sip)
    assert (await peer.response()).status == 403
    assert server.sip_legs() == 0 and server.ua.counters["forbidden"] == 1
    tcp_refused = False
    try:
        connection = await TcpSipPeer.connect(server.sip)
        tcp_refused = await connection.next(timeout=2) is None
        await connection.close()
    except (ConnectionError, OSError):
        tcp_refused = True
    assert tcp_refused
    peer.close()


async def test_a_call_over_tcp_and_oversized_messages(sip_server: SipServer) -> None:
    probe = await RtpProbe.open()
    connection = await TcpSipPeer.connect(sip_server.sip)
    dialogue = Dialogue(connection.port, sip_server.sip, transport="TCP")
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    connection.send(b"\r\n\r\n")  # an RFC 5626 keep-alive first
    connection.send(invite)
    statuses, message = await connection.until_final()
    assert statuses == [100, 180, 200]
    assert (message.headers.get("contact") or "").endswith(";transport=tcp>")
    connection.send(dialogue.ack_for(invite, message))
    await wait_until(lambda: sip_server.sip_legs() == 1)
    dialogue.cseq += 1
    connection.send(dialogue.request("BYE"))
    bye_ok = await connection.next()
    assert isinstance(bye_ok, SipResponse) and bye_ok.status == 200
    await wait_until(sip_server.quiet)
    # Over 64 KiB: 413, and the connection is closed.
    huge = dialogue.request("MESSAGE", body=b"x" * 70_000, content_type="text/plain")
    connection.send(huge)
    too_large = await connection.next()
    assert isinstance(too_large, SipResponse) and too_large.status == 413
    assert await connection.next() is None
    await connection.close()
    probe.close()


async def test_drain_ends_sip_calls_with_a_bye(start_sip: SipServerFactory) -> None:
    server = await start_sip(drain_seconds=0.3)
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue, _, _ = await establish(server, peer, sdp_offer(probe.port))
    async with aiohttp.ClientSession() as http, http.post(server.url + "/admin/drain") as reply:
        assert reply.status == 202
    peer.send(Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(probe.port)),
              server.sip)
    assert (await peer.response(503)).reason == "Draining"
    bye = await peer.request("BYE", timeout=5)
    assert 'text="server_draining"' in (bye.headers.get("reason") or "")
    assert bye.headers.get("call-id") == dialogue.call_id
    peer.send(reply_to(bye, 200), server.sip)
    await wait_until(server.quiet)
    peer.close()
    probe.close()
