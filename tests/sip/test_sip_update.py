"""UPDATE (RFC 3311) and offers the agent makes itself (signaling/sip/update.py): a late
offer (INVITE without SDP: our offer in the 200, the answer in the ACK), an offerless
re-INVITE, UPDATE for hold/resume, a moved address and a target refresh, 491 while an
offer/answer is open, and the BYE that ends a call whose ACK brings no usable answer."""

from __future__ import annotations

import asyncio
import base64

import pylibsrtp
from aiortc.rtp import RtpPacket

from signaling.sip import sdes
from signaling.sip.config import SipConfig
from signaling.sip.message import SipRequest, SipResponse
from signaling.sip.sdp import SessionDescription, parse_sdp
from tests.sip.helpers import (
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    establish,
    hang_up,
    sdp_offer,
)
from tests.sip.test_sip_ua import reply_to
from tests.support.agents import wait_until


def media_of(message: SipResponse | SipRequest) -> tuple[int, str, list[str], str]:
    parsed = parse_sdp(message.body)
    assert isinstance(parsed, SessionDescription)
    media = parsed.media[0]
    return media.port, media.proto, media.formats, parsed.direction_of(media)


async def late_offer_call(server: SipServer, peer: SipPeer, probe: RtpProbe,
                          answer: bytes | None) -> tuple[Dialogue, SipResponse]:
    """INVITE without SDP; the ACK carries `answer` (None: no body)."""
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE")
    peer.send(invite, server.sip)
    ok = await peer.response(200)
    dialogue.to_tag = ok.to_addr.tag
    peer.send(dialogue.request("ACK", cseq=invite.cseq.number, body=answer or b""), server.sip)
    return dialogue, ok


async def test_a_late_offer_is_made_in_the_200_and_its_answer_taken_from_the_ack(
    sip_server: SipServer,
) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue, ok = await late_offer_call(sip_server, peer, probe,
                                         sdp_offer(probe.port, "0 101"))
    port, proto, formats, direction = media_of(ok)
    assert (proto, formats, direction) == ("RTP/AVP", ["0", "101"], "sendrecv")
    assert b"a=rtpmap:101 telephone-event/8000" in ok.body
    assert "UPDATE" in (ok.headers.get("allow") or "")
    await wait_until(lambda: len(probe.packets) >= 10)  # the agent sends to the answer's port
    assert {p.payload_type for p in probe.packets} == {0}
    (leg,) = list(sip_server.agent.legs)
    assert leg.stats()["remote"] == f"127.0.0.1:{probe.port}"
    assert sip_server.ua.counters["late_answers"] == 1
    await hang_up(sip_server, peer, dialogue, probe)


async def test_an_ack_without_a_usable_answer_ends_the_call_with_a_bye(
    sip_server: SipServer,
) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    await late_offer_call(sip_server, peer, probe, None)
    bye = await peer.request("BYE")
    assert 'text="bad_answer"' in (bye.headers.get("reason") or "")
    peer.send(reply_to(bye, 200), sip_server.sip)
    await wait_until(lambda: sip_server.sip_legs() == 0)
    # An answer with another codec than the one offered is no better.
    _, ok = await late_offer_call(sip_server, peer, probe, sdp_offer(probe.port, "8"))
    assert media_of(ok)[2] == ["0", "101"]
    peer.send(reply_to(await peer.request("BYE"), 200), sip_server.sip)
    assert sip_server.ua.counters["bad_answers"] == 2 and not probe.packets
    await wait_until(sip_server.quiet)
    peer.close()
    probe.close()


async def test_a_late_offer_under_require_is_srtp_and_the_answer_key_opens_the_leg(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, srtp="require"))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    caller_key = sdes.new_key()
    line = f"a=crypto:1 {sdes.OFFER_SUITE} inline:{base64.b64encode(caller_key).decode()}"
    answer = sdp_offer(probe.port, "0 101", proto="RTP/SAVP", extra_media=line)
    dialogue, ok = await late_offer_call(server, peer, probe, answer)
    port, proto, _, _ = media_of(ok)
    assert proto == "RTP/SAVP"
    (offered,) = sdes.crypto_lines(ok.body, 0)
    agent_crypto = sdes.parse_crypto(offered)
    assert agent_crypto is not None and agent_crypto.suite == sdes.OFFER_SUITE
    protect = pylibsrtp.Session(pylibsrtp.Policy(
        key=caller_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
        srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80))
    assert probe.transport is not None
    await wait_until(lambda: server.sip_legs() == 1 and server.ua.counters["late_answers"] == 1)
    (leg,) = list(server.agent.legs)
    for index in range(5):
        probe.transport.sendto(protect.protect(RtpPacket(
            payload_type=0, sequence_number=index, timestamp=160 * index, ssrc=3,
            payload=b"\xff" * 160).serialize()), ("127.0.0.1", port))
    await wait_until(lambda: leg.stats()["srtp"]["unprotected"] == 5)
    assert leg.stats()["srtp"]["unprotect_failures"] == 0
    await hang_up(server, peer, dialogue, probe)


async def test_update_holds_resumes_moves_and_refreshes(sip_server: SipServer) -> None:
    peer, probe, moved = await SipPeer.open(), await RtpProbe.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, sip_server.sip)
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    peer.send(invite, sip_server.sip)
    ok = await peer.response(200)
    # Before the ACK an UPDATE is fine too: the INVITE's offer/answer is complete.
    dialogue.to_tag = ok.to_addr.tag
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE", body=sdp_offer(probe.port, direction="sendonly")),
              sip_server.sip)
    held = await peer.response(200, method="UPDATE")
    assert media_of(held)[3] == "recvonly"
    peer.send(dialogue.request("ACK", cseq=invite.cseq.number), sip_server.sip)
    await asyncio.sleep(0.2)
    count = len(probe.packets)
    await asyncio.sleep(0.3)
    assert len(probe.packets) == count  # on hold: the agent sends nothing
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE", body=sdp_offer(moved.port, direction="sendrecv")),
              sip_server.sip)
    resumed = await peer.response(200, method="UPDATE")
    assert media_of(resumed)[3] == "sendrecv" and media_of(resumed)[0] == media_of(ok)[0]
    await wait_until(lambda: len(moved.packets) >= 5)  # resumed, to the new address
    assert len(probe.packets) == count
    # Without SDP: a target refresh, answered 200 with our Contact.
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE"), sip_server.sip)
    refreshed = await peer.response(200, method="UPDATE")
    assert not refreshed.body and refreshed.headers.get("contact")
    # A codec the call does not use: 488, the call goes on.
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE", body=sdp_offer(moved.port, "8")), sip_server.sip)
    await peer.response(488, method="UPDATE")
    assert sip_server.sip_legs() == 1
    assert (sip_server.ua.counters["updates"], sip_server.ua.counters["update_refused"]) == (2, 1)
    # An UPDATE for no dialog: 481.
    stranger = Dialogue(peer.port, sip_server.sip, to_tag="nosuch")
    peer.send(stranger.request("UPDATE", body=sdp_offer(moved.port)), sip_server.sip)
    await peer.response(481, method="UPDATE")
    await hang_up(sip_server, peer, dialogue, probe, moved)


async def test_update_while_ringing_or_awaiting_an_answer_is_491(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, ring_seconds=1.0))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE")  # a late offer, ringing for a second
    peer.send(invite, server.sip)
    ringing = await peer.response(180)
    dialogue.to_tag = ringing.to_addr.tag
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE", body=sdp_offer(probe.port)), server.sip)
    await peer.response(491, method="UPDATE")
    ok = await peer.response(200, method="INVITE")
    dialogue.cseq += 1
    peer.send(dialogue.request("UPDATE", body=sdp_offer(probe.port)), server.sip)
    await peer.response(491, method="UPDATE")  # our offer is still unanswered
    peer.send(dialogue.request("ACK", cseq=invite.cseq.number, body=sdp_offer(probe.port)),
              server.sip)
    await wait_until(lambda: server.ua.counters["late_answers"] == 1)
    assert media_of(ok)[3] == "sendrecv"
    await hang_up(server, peer, dialogue, probe)


async def test_an_offerless_reinvite_gets_our_offer_and_the_ack_moves_the_media(
    sip_server: SipServer,
) -> None:
    peer, probe, moved = await SipPeer.open(), await RtpProbe.open(), await RtpProbe.open()
    dialogue, _, _ = await establish(sip_server, peer, sdp_offer(probe.port))
    dialogue.cseq += 1
    reinvite = dialogue.request("INVITE")
    peer.send(reinvite, sip_server.sip)
    offer = await peer.response(200, method="INVITE")
    assert media_of(offer)[1:] == ("RTP/AVP", ["0", "101"], "sendrecv")
    peer.send(dialogue.request("ACK", cseq=reinvite.cseq.number, body=sdp_offer(moved.port)),
              sip_server.sip)
    await wait_until(lambda: len(moved.packets) >= 5)
    assert sip_server.ua.counters["late_answers"] == 1
    await hang_up(sip_server, peer, dialogue, probe, moved)


async def test_options_lists_update(sip_server: SipServer) -> None:
    peer = await SipPeer.open()
    peer.send(Dialogue(peer.port, sip_server.sip).request("OPTIONS"), sip_server.sip)
    options = await peer.response(200)
    assert "UPDATE" in (options.headers.get("allow") or "").split(", ")
    peer.close()
