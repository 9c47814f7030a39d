"""What an attacker on another loopback address gets from a live call: requests forged into
its dialog (signaling/sip/dialog_guard.py: 403, an ACK dropped, the call untouched, whatever
its Via says) and media aimed at an SDP address that never answers (media.py and
agent/telephony/remote_check.py: a short burst, then the call ends at --sip-media-timeout).

The legitimate peer is a raw SIP peer at 127.0.0.1 with its RTP probe, or sipp for outbound
calls; the attacker is a raw UDP socket (or TCP connection) bound to 127.0.0.2."""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiortc.rtp import RtpPacket

from agent.telephony.remote_check import UNHEARD_BURST
from signaling.sip.config import SipConfig, add_arguments, config_from_args
from signaling.sip.message import Headers, SipRequest, SipResponse
from signaling.sip.service import SIP_SERVICE_KEY
from signaling.sip.timers import TimerSettings
from tests.sip import uas_scenarios
from tests.sip.helpers import (
    HOST,
    Address,
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
from tests.sip.outbound_helpers import (
    answered_call,
    dialing_server,
    get_call,
    place,
    sip_to,
    sipp_uas,
    until_idle,
    wait_status,
)
from tests.support.agents import wait_until

FAST = TimerSettings(t1=0.05, t2=0.2, t4=0.25)
SPOOFER = "127.0.0.2"
SPOOFS_PER_METHOD = 10
SIPFRAG_OK = b"SIP/2.0 200 OK\r\n"


async def udp_peer_at(address: str) -> SipPeer:
    _, peer = await asyncio.get_running_loop().create_datagram_endpoint(
        SipPeer, local_addr=(address, 0))
    return peer


async def rtp_probe_at(address: str) -> RtpProbe:
    _, probe = await asyncio.get_running_loop().create_datagram_endpoint(
        RtpProbe, local_addr=(address, 0))
    return probe


def spoofed(request: SipRequest, port: int, transport: str = "UDP") -> SipRequest:
    """The dialog's own request, sent from the spoofer: its Via names the spoofer's socket
    and claims `received=127.0.0.1` (the real peer's address), with rport so the answer
    comes back to the spoofer."""
    vias = request.headers.get_all("via")
    branch = vias[0].rsplit("branch=", 1)[1]
    request.headers.replace_values("via", [
        f"SIP/2.0/{transport} {SPOOFER}:{port};branch={branch};received={HOST};rport"])
    return request


def in_dialog(dialogue: Dialogue, method: str, cseq: int, port: int, *,
              body: bytes = b"", contact: str | None = None) -> SipRequest:
    """`method` in the dialog of `dialogue`, with the event and body a NOTIFY/REFER/INFO
    would carry; `contact` replaces the Contact (a target refresh to there)."""
    headers: list[tuple[str, str]] = []
    content_type = "application/sdp"
    if method == "NOTIFY":
        headers = [("Event", "refer"), ("Subscription-State", "terminated;reason=noresource")]
        body, content_type = SIPFRAG_OK, "message/sipfrag;version=2.0"
    elif method == "REFER":
        headers = [("Refer-To", f"<sip:attacker@{SPOOFER}>")]
    elif method == "INFO" and not body:
        body, content_type = b"Signal=5\r\nDuration=160\r\n", "application/dtmf-relay"
    elif method == "PRACK":
        headers = [("RAck", "1 1 INVITE")]
    request = dialogue.request(method, cseq=cseq, body=body, headers=headers,
                               content_type=content_type)
    if contact is not None:
        request.headers.replace_values("contact", [contact])
    return request


async def delete_call(server: SipServer, call_id: str) -> None:
    async with aiohttp.ClientSession() as http, http.delete(
            f"{server.url}/v1/realtime/calls/{call_id}") as response:
        assert response.status == 200, await response.text()


async def packets_keep_coming(probe: RtpProbe, more: int = 25) -> None:
    """The agent's RTP still reaches `probe`: `more` packets beyond those it has."""
    count = len(probe.packets)
    await wait_until(lambda: len(probe.packets) >= count + more, timeout=10)


# -- inbound calls -----------------------------------------------------------------------------


async def test_spoofed_requests_of_every_method_in_an_inbound_call_get_403_and_change_nothing(
    start_sip: SipServerFactory,
) -> None:
    """re-INVITE and UPDATE moving the media to 127.0.0.3, an UPDATE moving the remote target
    to the spoofer, BYE, INFO, NOTIFY, REFER, PRACK and OPTIONS, each with a Via claiming
    `received=127.0.0.1`: all 403, an ACK dropped; the agent's RTP still goes to the caller
    only, and its BYE (DELETE) to the caller, not to the spoofer."""
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    spoofer, elsewhere = await udp_peer_at(SPOOFER), await rtp_probe_at("127.0.0.3")
    dialogue, _, _ = await establish(server, peer, sdp_offer(probe.port))
    await wait_until(lambda: len(probe.packets) >= 20)
    (leg,) = list(server.agent.legs)
    call = server.ua.find_call(leg.id)
    assert call is not None
    moved = sdp_offer(elsewhere.port, ip="127.0.0.3")
    requests: dict[str, Callable[[int], SipRequest]] = {
        "INVITE": lambda cseq: in_dialog(dialogue, "INVITE", cseq, spoofer.port, body=moved),
        "UPDATE": lambda cseq: in_dialog(dialogue, "UPDATE", cseq, spoofer.port, body=moved),
        "UPDATE (target refresh)": lambda cseq: in_dialog(
            dialogue, "UPDATE", cseq, spoofer.port,
            contact=f"<sip:attacker@{SPOOFER}:{spoofer.port}>"),
        **{method: functools.partial(in_dialog, dialogue, method, port=spoofer.port)
           for method in ("BYE", "INFO", "NOTIFY", "REFER", "PRACK", "OPTIONS")},
    }
    answers: dict[str, Counter[int]] = {name: Counter() for name in requests}
    cseq = 100
    for name, build in requests.items():
        for _ in range(SPOOFS_PER_METHOD):
            cseq += 1
            request = spoofed(build(cseq), spoofer.port)
            spoofer.send(request, server.sip)
            response = await spoofer.response(method=request.method)
            answers[name][response.status] += 1
    spoofer.send(spoofed(dialogue.request("ACK", cseq=cseq), spoofer.port), server.sip)
    print(f"\nspoofed in-dialog requests, inbound call, answers per method: "
          f"{ {name: dict(counts) for name, counts in answers.items()} }")
    assert answers == {name: Counter({403: SPOOFS_PER_METHOD}) for name in requests}
    expected = len(requests) * SPOOFS_PER_METHOD + 1  # and the ACK, dropped
    await wait_until(lambda: server.ua.counters["spoofed_in_dialog"] == expected)
    # The call goes on as it was: same remote, same target, media to the caller only.
    await packets_keep_coming(probe)
    assert server.sip_legs() == 1 and call.state == "confirmed"
    assert leg.stats()["remote"] == f"{HOST}:{probe.port}"
    assert leg.stats()["direction"] == "sendrecv"
    assert (call.dialog.remote_target.host, call.dialog.remote_target.port) == (HOST, peer.port)
    assert not elsewhere.packets
    await delete_call(server, leg.id)
    bye = await peer.request("BYE")
    peer.send(SipResponse(headers=reply_headers(bye), status=200, reason="OK"), server.sip)
    await wait_until(server.quiet)
    assert not [m for m in spoofer.log if isinstance(m, SipRequest)]  # no BYE went there
    for closing in (peer, probe, spoofer, elsewhere):
        closing.close()


def reply_headers(request: SipRequest) -> Headers:
    """A response's headers to a request the agent sent."""
    headers = Headers()
    for via in request.headers.lines("via"):
        headers.add("Via", via)
    for name in ("From", "To", "Call-ID", "CSeq"):
        headers.add(name, request.headers.get(name) or "")
    return headers


async def test_spoofed_requests_over_tcp_get_403_and_the_caller_still_hangs_up(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    peer, probe, elsewhere = await SipPeer.open(), await RtpProbe.open(), \
        await rtp_probe_at("127.0.0.3")
    dialogue, _, _ = await establish(server, peer, sdp_offer(probe.port))
    reader, writer = await asyncio.open_connection(*server.sip, local_addr=(SPOOFER, 0))
    spoofer = TcpSipPeer(reader, writer)
    moved = sdp_offer(elsewhere.port, ip="127.0.0.3")
    for cseq, (method, body) in enumerate([("BYE", b""), ("UPDATE", moved), ("INVITE", moved),
                                           ("UPDATE", b"")], start=50):
        spoofer.send(spoofed(in_dialog(dialogue, method, cseq, spoofer.port, body=body),
                             spoofer.port, "TCP"))
        statuses, final = await spoofer.until_final()
        assert final.status == 403, (method, statuses)
    await packets_keep_coming(probe)
    assert server.sip_legs() == 1 and not elsewhere.packets
    await spoofer.close()
    await hang_up(server, peer, dialogue, probe, elsewhere)


async def test_a_spoofed_notify_does_not_complete_a_transfer(
    start_sip: SipServerFactory,
) -> None:
    """The agent transfers an inbound call (REFER, 202); a NOTIFY `SIP/2.0 200 OK` from the
    spoofer gets 403 and the call stays; the caller's own NOTIFY then completes it."""
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    peer, probe, spoofer = await SipPeer.open(), await RtpProbe.open(), await udp_peer_at(SPOOFER)
    dialogue, _, _ = await establish(server, peer, sdp_offer(probe.port))
    (leg,) = list(server.agent.legs)

    async def refer() -> int:
        async with aiohttp.ClientSession() as http, http.post(
                f"{server.url}/v1/realtime/calls/{leg.id}/refer",
                json={"target_uri": "sip:desk@pbx.example.com"}) as response:
            return response.status

    asked = asyncio.ensure_future(refer())
    request = await peer.request("REFER")
    peer.send(SipResponse(headers=reply_headers(request), status=202, reason="Accepted"),
              server.sip)
    assert await asked == 202
    for cseq in range(10, 10 + SPOOFS_PER_METHOD):
        spoofer.send(spoofed(in_dialog(dialogue, "NOTIFY", cseq, spoofer.port), spoofer.port),
                     server.sip)
        assert (await spoofer.response(method="NOTIFY")).status == 403
    await packets_keep_coming(probe)
    assert not leg.closing and leg.end_reason is None
    assert [e["type"] for e in leg.events if str(e["type"]).startswith("call.transfer")] == [
        "call.transfer.accepted"]
    dialogue.cseq += 1
    peer.send(in_dialog(dialogue, "NOTIFY", dialogue.cseq, peer.port), server.sip)
    assert (await peer.response(method="NOTIFY")).status == 200
    bye = await peer.request("BYE")
    assert 'text="transferred"' in (bye.headers.get("reason") or "")
    peer.send(SipResponse(headers=reply_headers(bye), status=200, reason="OK"), server.sip)
    await wait_until(server.quiet)
    for closing in (peer, probe, spoofer):
        closing.close()


# -- outbound calls ----------------------------------------------------------------------------


@pytest.fixture
async def dialing(start_sip: SipServerFactory) -> SipServer:
    return await dialing_server(start_sip)


async def test_a_forged_received_gets_403_for_bye_reinvite_and_update_of_an_outbound_call(
    dialing: SipServer, tmp_path: Path,
) -> None:
    """sipp answers at 127.0.0.1 and echoes; BYE, re-INVITE and UPDATE (moving the media to
    127.0.0.3) from 127.0.0.2 whose Via says `received=127.0.0.1` all get 403: the call goes
    on with its media to sipp until the agent hangs up."""
    uas, port, call_id = await answered_call(dialing, tmp_path)
    dialer = dialing.server.app[SIP_SERVICE_KEY].dialer
    assert dialer is not None
    call = dialer.live[call_id]
    dialog, leg = call.dialog, call.leg
    assert dialog is not None and leg is not None
    remote = leg.stats()["remote"]
    spoofer, elsewhere = await udp_peer_at(SPOOFER), await rtp_probe_at("127.0.0.3")
    far_end = Dialogue(port, (HOST, dialing.ua.port), call_id=dialog.call_id,
                       from_tag=dialog.remote_tag, to_tag=dialog.local_tag)
    moved = sdp_offer(elsewhere.port, ip="127.0.0.3")
    answers: Counter[tuple[str, int]] = Counter()
    for index in range(SPOOFS_PER_METHOD):
        for method, body in (("BYE", b""), ("INVITE", moved), ("UPDATE", moved)):
            request = spoofed(far_end.request(method, cseq=20 + index, body=body), spoofer.port)
            spoofer.send(request, dialing.sip)
            answers[(method, (await spoofer.response(method=method)).status)] += 1
    print(f"\nforged received, outbound call: {dict(answers)}")
    assert answers == Counter({("BYE", 403): SPOOFS_PER_METHOD,
                               ("INVITE", 403): SPOOFS_PER_METHOD,
                               ("UPDATE", 403): SPOOFS_PER_METHOD})
    sent, heard = leg.stats()["packets_sent"], leg.stats()["chunks_in"]
    await wait_until(lambda: leg.stats()["packets_sent"] >= sent + 25
                     and leg.stats()["chunks_in"] >= heard + 25, timeout=10)
    assert (await get_call(dialing, call_id))["status"] == "answered"
    assert leg.stats()["remote"] == remote and leg.stats()["direction"] == "sendrecv"
    assert not elsewhere.packets
    async with aiohttp.ClientSession() as http, http.delete(
            f"{dialing.url}/v1/sip/calls/{call_id}") as response:
        assert response.status == 200
    assert (await wait_status(dialing, call_id, "ended"))["reason"] == "hangup"
    assert (await uas).returncode == 0
    spoofer.close()
    elsewhere.close()
    await until_idle(dialing)


# -- media toward an address that never sends ---------------------------------------------------


async def test_an_sdp_address_that_never_sends_gets_a_burst_and_the_call_ends_media_timeout(
    start_sip: SipServerFactory,
) -> None:
    """An INVITE from 127.0.0.1 whose SDP names 127.0.0.5, where nothing ever sends: the
    agent sends it at most a short burst, and the call ends `media_timeout` (BYE)."""
    timeout = 1.0
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST,
                                              media_timeout=timeout))
    peer, victim = await SipPeer.open(), await rtp_probe_at("127.0.0.5")
    started = time.monotonic()
    await establish(server, peer, sdp_offer(victim.port, ip="127.0.0.5"))
    (leg,) = list(server.agent.legs)
    bye = await peer.request("BYE", timeout=timeout + 5)
    elapsed = time.monotonic() - started
    peer.send(SipResponse(headers=reply_headers(bye), status=200, reason="OK"), server.sip)
    await wait_until(server.quiet)
    print(f"\npackets toward a silent SDP address: {len(victim.packets)} in {elapsed:.2f} s "
          f"(--sip-media-timeout {timeout:g})")
    assert 'text="media_timeout"' in (bye.headers.get("reason") or "")
    assert leg.end_reason == "media_timeout"  # as metrics, the sideband and webhooks say it
    assert leg.stats()["packets_withheld"] > 0
    assert timeout <= elapsed < timeout + 3
    assert len(victim.packets) <= UNHEARD_BURST
    peer.close()
    victim.close()


async def test_a_peer_heard_at_its_sdp_address_gets_the_stream_until_it_falls_silent(
    start_sip: SipServerFactory,
) -> None:
    """Symmetric RTP: once 127.0.0.5 sends, the agent streams to it; when it stops, the call
    ends `media_timeout` after that many seconds (not the 15 s idle timeout)."""
    timeout = 1.0
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST,
                                              media_timeout=timeout))
    peer, media = await SipPeer.open(), await rtp_probe_at("127.0.0.5")
    await establish(server, peer, sdp_offer(media.port, ip="127.0.0.5"))
    (leg,) = list(server.agent.legs)
    agent_rtp: Address = (HOST, int(leg.stats()["local"].rsplit(":", 1)[1]))
    for sequence in range(25):  # half a second of silence, in real time
        media.send(RtpPacket(payload_type=0, sequence_number=sequence, timestamp=160 * sequence,
                             ssrc=7, payload=b"\xff" * 160), agent_rtp)
        await asyncio.sleep(0.02)
    await wait_until(lambda: len(media.packets) >= UNHEARD_BURST + 20)
    stopped = time.monotonic()
    bye = await peer.request("BYE", timeout=timeout + 5)
    silent = time.monotonic() - stopped
    assert 'text="media_timeout"' in (bye.headers.get("reason") or "")
    assert silent < timeout + 3
    peer.send(SipResponse(headers=reply_headers(bye), status=200, reason="OK"), server.sip)
    await wait_until(server.quiet)
    peer.close()
    media.close()


async def test_an_outbound_call_whose_far_end_never_sends_ends_media_timeout(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, media_timeout=1.0))
    uas, port = await sipp_uas(tmp_path, uas_scenarios.answer_then_hangup_from_agent())
    _, body, _ = await place(server, {"to": sip_to(port)})
    await wait_status(server, body["id"], "answered")
    call = await wait_status(server, body["id"], "ended", timeout=10)
    assert call["reason"] == "media_timeout"
    assert call["events"][-1]["type"] == "call.ended"
    assert call["events"][-1]["reason"] == "media_timeout"
    run = await uas
    assert run.returncode == 0, run.explain()
    assert 'text="media_timeout"' in run.messages  # the agent's BYE says why
    await until_idle(server)


def test_the_media_timeout_flag() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--sip-listen", "127.0.0.1:0", "--sip-media-timeout", "2.5"])
    config = config_from_args(args)
    assert config is not None and config.media_timeout == 2.5
    default = config_from_args(parser.parse_args(["--sip-listen", "127.0.0.1:0"]))
    assert default is not None and default.media_timeout == 10.0
    for bad in ("0", "-1", "x", "5000"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--sip-listen", "127.0.0.1:0", "--sip-media-timeout", bad])
