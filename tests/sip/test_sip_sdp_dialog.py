"""SDP offer/answer for SIP calls, and dialogs: route sets and in-dialog requests."""

from __future__ import annotations

import pytest

from signaling.sip.dialog import Dialog
from signaling.sip.message import SipRequest, parse_message
from signaling.sip.sdp import (
    AudioChoice,
    SdpError,
    SessionDescription,
    build_answer,
    choose_audio,
    parse_sdp,
)


def offer(*lines: str) -> SessionDescription:
    text = "\r\n".join(["v=0", "o=- 1 1 IN IP4 10.0.0.7", "s=-", "c=IN IP4 10.0.0.7", "t=0 0",
                        *lines]) + "\r\n"
    parsed = parse_sdp(text.encode())
    assert isinstance(parsed, SessionDescription), parsed
    return parsed


def chosen(description: SessionDescription, codecs: tuple[str, ...] = ("PCMU", "PCMA")
           ) -> AudioChoice:
    choice = choose_audio(description, codecs)
    assert isinstance(choice, AudioChoice), choice
    return choice


def test_the_offerers_first_g711_codec_and_its_telephone_event() -> None:
    choice = chosen(offer("m=audio 4000 RTP/AVP 18 8 0 96", "a=rtpmap:96 telephone-event/8000",
                          "a=fmtp:96 0-15", "a=ptime:30"))
    assert (choice.codec.name, choice.payload_type, choice.dtmf_payload_type) == ("PCMA", 8, 96)
    assert choice.remote == ("10.0.0.7", 4000) and choice.ptime == 30
    answer = build_answer(offer("m=audio 4000 RTP/AVP 18 8 0 96",
                                "a=rtpmap:96 telephone-event/8000", "a=fmtp:96 0-15"),
                          choice, "10.0.0.5", 40002, 77, 2).decode()
    assert "m=audio 40002 RTP/AVP 8 96\r\n" in answer and "a=fmtp:96 0-15\r\n" in answer
    assert "o=duplex-agent 77 2 IN IP4 10.0.0.5" in answer and "c=IN IP4 10.0.0.5" in answer
    assert answer.endswith("a=sendrecv\r\n")


def test_other_streams_are_refused_with_port_zero_and_the_audio_one_is_found() -> None:
    description = offer("m=video 5000 RTP/AVP 31", "m=audio 0 RTP/AVP 0",
                        "m=audio 4002 RTP/SAVP 0", "m=audio 4004 RTP/AVP 0",
                        "c=IN IP4 10.0.0.9")
    choice = chosen(description)
    assert choice.index == 3 and choice.remote == ("10.0.0.9", 4004)  # media-level c=
    lines = build_answer(description, choice, "10.0.0.5", 40000, 1, 1).decode().split("\r\n")
    media = [line for line in lines if line.startswith("m=")]
    assert media == ["m=video 0 RTP/AVP 31", "m=audio 0 RTP/AVP 0", "m=audio 0 RTP/SAVP 0",
                     "m=audio 40000 RTP/AVP 0"]


@pytest.mark.parametrize("offered, direction, answered, agent_sends, caller_sends", [
    ("a=sendrecv", "sendrecv", "sendrecv", True, True),
    ("a=sendonly", "sendonly", "recvonly", False, True),
    ("a=recvonly", "recvonly", "sendonly", True, False),
    ("a=inactive", "inactive", "inactive", False, False),
])
def test_directions_are_mirrored(offered: str, direction: str, answered: str,
                                 agent_sends: bool, caller_sends: bool) -> None:
    choice = chosen(offer("m=audio 4000 RTP/AVP 0", offered))
    assert (choice.offer_direction, choice.answer_direction) == (direction, answered)
    assert (choice.agent_sends, choice.caller_sends) == (agent_sends, caller_sends)


def test_session_level_direction_and_old_style_hold() -> None:
    choice = chosen(offer("a=sendonly", "m=audio 4000 RTP/AVP 0"))
    assert choice.answer_direction == "recvonly"
    held = parse_sdp(b"v=0\r\no=- 1 2 IN IP4 0.0.0.0\r\ns=-\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\n"
                     b"m=audio 4000 RTP/AVP 0\r\n")
    assert isinstance(held, SessionDescription)
    choice = chosen(held)
    assert choice.remote is None and not choice.agent_sends
    assert choice.answer_direction == "recvonly"


@pytest.mark.parametrize("lines, code", [
    (("m=audio 4000 RTP/AVP 18 3",), "no_common_codec"),
    (("m=audio 4000 RTP/AVP 96", "a=rtpmap:96 PCMU/8000"), "no_common_codec"),  # dynamic PCMU
    (("m=audio 4000 RTP/AVP 0", "a=rtpmap:0 PCMU/16000"), "no_common_codec"),
    (("m=video 4000 RTP/AVP 31",), "no_audio_stream"),
    (("m=audio 4000 RTP/AVP 0", "c=IN IP4 pbx.example.com"), "sdp_address_not_ip"),
])
def test_offers_the_agent_cannot_serve(lines: tuple[str, ...], code: str) -> None:
    error = choose_audio(offer(*lines))
    assert isinstance(error, SdpError) and error.code == code and error.status == 488


def test_telephone_event_needs_8000_hz_and_codecs_can_be_pinned() -> None:
    choice = chosen(offer("m=audio 4000 RTP/AVP 0 101", "a=rtpmap:101 telephone-event/16000"))
    assert choice.dtmf_payload_type is None
    pinned = choose_audio(offer("m=audio 4000 RTP/AVP 0"), ("PCMA",))
    assert isinstance(pinned, SdpError)


@pytest.mark.parametrize("body", [b"", b"not sdp at all", b"v=0\r\n", b"\xff\xfe",
                                  b"v=0\r\nm=audio x RTP/AVP 0\r\n"])
def test_broken_sdp_is_a_400(body: bytes) -> None:
    error = parse_sdp(body)
    assert isinstance(error, SdpError) and error.status == 400


def invite(*extra: str) -> SipRequest:
    text = "\r\n".join([
        "INVITE sip:agent@10.0.0.5 SIP/2.0",
        "Via: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bKp2;received=10.0.0.1",
        "Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKc1",
        "From: \"Caller\" <sip:caller@10.0.0.7>;tag=ct",
        "To: <sip:agent@10.0.0.5>",
        "Call-ID: dlg-1", "CSeq: 10 INVITE",
        "Contact: <sip:caller@10.0.0.7:5062;transport=udp>",
        *extra, "Content-Length: 0", "", ""])
    parsed = parse_message(text.encode())
    assert isinstance(parsed, SipRequest), parsed
    return parsed


def test_a_uas_dialog_and_its_requests_through_loose_routers() -> None:
    dialog = Dialog.from_invite(invite("Record-Route: <sip:p2.example.com;lr>",
                                       "Record-Route: <sip:10.0.0.1;lr>"), "at", "UDP")
    assert dialog is not None and dialog.id == ("dlg-1", "at", "ct")
    assert dialog.remote_seq == 10 and str(dialog.remote_target).startswith("sip:caller@")
    seq = dialog.local_seq
    bye, hop = dialog.request("BYE", "10.0.0.5", 5060, "UDP")
    assert bye.uri == "sip:caller@10.0.0.7:5062;transport=udp"
    assert bye.headers.get_all("route") == ["<sip:p2.example.com;lr>", "<sip:10.0.0.1;lr>"]
    assert str(hop) == "sip:p2.example.com;lr"  # the first route is the next hop
    assert bye.cseq.number == seq + 1 and bye.to_addr.tag == "ct" and bye.from_addr.tag == "at"
    assert bye.top_via is not None and (bye.top_via.branch or "").startswith("z9hG4bK")
    again, _ = dialog.request("BYE", "10.0.0.5", 5060, "UDP")
    assert again.cseq.number == seq + 2 and again.top_via is not None
    assert again.top_via.branch != bye.top_via.branch


def test_strict_routing_and_target_refresh() -> None:
    dialog = Dialog.from_invite(invite("Record-Route: <sip:strict.example.com:5070;maddr=x>"),
                                "at", "UDP")
    assert dialog is not None
    bye, hop = dialog.request("BYE", "10.0.0.5", 5060, "UDP")
    assert bye.uri == "sip:strict.example.com:5070"  # the strict router, its maddr dropped
    assert bye.headers.get_all("route") == ["<sip:caller@10.0.0.7:5062;transport=udp>"]
    assert str(hop) == "sip:strict.example.com:5070"
    refresh = invite("Contact: <sip:caller@10.0.0.8:5070>")
    refresh.headers.replace_values("contact", ["<sip:caller@10.0.0.8:5070>"])
    dialog.refresh_target(refresh)
    assert str(dialog.remote_target) == "sip:caller@10.0.0.8:5070"


def test_no_contact_no_dialog() -> None:
    request = invite()
    request.headers.remove("contact")
    assert Dialog.from_invite(request, "at", "UDP") is None
