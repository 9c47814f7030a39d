"""Offers the agent makes itself, and the answers it takes back (RFC 3261 §13.2.1, RFC 3264).

A late offer is an INVITE without SDP (RFC 3261 §13.2.1): the agent's offer goes in the 200
and the caller's answer comes in the ACK. An offerless re-INVITE works the same within a
call. UPDATE (RFC 3311) carries an offer the other way, answered in its 200 like a
re-INVITE's (ua.py serves it; nothing here).

The agent offers one codec, PCMU, with telephone-event: the RTP leg is opened with its codec
before the answer can say which one the caller picked, and PCMU is the codec every SIP
endpoint has (RFC 3551). Under `--sip-srtp require` the offer is `RTP/SAVP` with a crypto
line of a fresh key (sdes.py). Until the answer comes the leg sends nothing (it has no
remote), and under SRTP it takes nothing either: its inbound key is a placeholder no
packet authenticates with, replaced by the answer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.telephony.address_policy import IPNetwork, refusal_for
from agent.telephony.codec import PCMU
from agent.telephony.srtp import SrtpKeys
from signaling.sip import sdes
from signaling.sip.sdp import (
    TELEPHONE_EVENT,
    AudioChoice,
    MediaDescription,
    SdpError,
    SessionDescription,
    choose_audio,
    parse_sdp,
)

OFFER_DTMF_PAYLOAD_TYPE = 101


@dataclass(frozen=True)
class OwnOffer:
    """The offer the agent makes: as an `offer` + `choice` pair `build_answer` writes out
    (one stream, direction given), and the SRTP agreement it proposes, if any."""

    offer: SessionDescription
    choice: AudioChoice
    srtp: sdes.SdesAnswer | None


def own_offer(mode: str) -> OwnOffer:
    proto = sdes.SECURE if mode == "require" else sdes.PLAIN
    media = MediaDescription("audio", 0, proto, [str(PCMU.payload_type),
                                                 str(OFFER_DTMF_PAYLOAD_TYPE)])
    media.rtpmap[OFFER_DTMF_PAYLOAD_TYPE] = (TELEPHONE_EVENT.upper(), PCMU.rtp_clock)
    offer = SessionDescription("", None, "sendrecv", [media])
    assert PCMU.payload_type is not None
    choice = AudioChoice(0, PCMU, PCMU.payload_type, OFFER_DTMF_PAYLOAD_TYPE, "0-16",
                         None, "sendrecv", None, proto)
    srtp = None
    if proto == sdes.SECURE:
        local_key = sdes.new_key()
        placeholder = sdes.new_key()  # no packet opens with it until the answer's key
        srtp = sdes.SdesAnswer(SrtpKeys(sdes.OFFER_SUITE, placeholder, local_key),
                               sdes.offer_line(local_key))
    return OwnOffer(offer, choice, srtp)


@dataclass(frozen=True)
class TakenAnswer:
    answer: SessionDescription
    choice: AudioChoice
    srtp: SrtpKeys | None


def take_answer(body: bytes, content_type: str | None, ours: AudioChoice,
                local_key: bytes | None, allowed: tuple[IPNetwork, ...]
                ) -> TakenAnswer | SdpError:
    """The caller's answer to our offer (in an ACK): our codec, on our protocol, an
    address RTP may go to, and under SRTP a usable key. Anything else: SdpError (the call
    then ends with a BYE, RFC 3261 §13.3.1.4)."""
    if not body or content_type != "application/sdp":
        return SdpError("no_answer", "the ACK carries no SDP answer to the agent's offer")
    answer = parse_sdp(body)
    if isinstance(answer, SdpError):
        return answer
    choice = choose_audio(answer, (ours.codec.name,), protos=(ours.proto,))
    if isinstance(choice, SdpError):
        return choice
    if choice.remote is not None and refusal_for(choice.remote[0], allowed) is not None:
        return SdpError("address_not_allowed", "the answer's media address is outside "
                        "--rtp-allow")
    keys = None
    if ours.proto == sdes.SECURE:
        assert local_key is not None
        keys = sdes.accept_answer(body, choice.index, local_key)
        if keys is None:
            return SdpError("no_usable_crypto", "the answer has no usable a=crypto line")
    return TakenAnswer(answer, choice, keys)
