"""SDES-SRTP on SIP calls (signaling/sip/sdes.py, agent/telephony/srtp.py): crypto lines read
and answered, libsrtp's transform on the RTP leg, and a hand-made caller that speaks SRTP
with its own pylibsrtp sessions: its protected PCMU echoed back, the agent's packets opened
with the answered key; a tampered packet dropped and counted; 488 where no key is usable or
`--sip-srtp` says no."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from pathlib import Path
from typing import cast

import numpy as np
import pylibsrtp
import pytest
from aiortc.rtp import RtpPacket

from agent.telephony.codec import PCMU
from agent.telephony.srtp import SrtpKeys, SrtpTransform
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.sip import sdes
from signaling.sip.config import SipConfig
from signaling.sip.sdp import AudioChoice, SdpError, SessionDescription, choose_audio, parse_sdp
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
from tests.sip.test_sip_baresip import SECONDS, baresip, read_wav, require_baresip, write_wav
from tests.support.agents import wait_until

KEY = bytes(range(30))
SUITE_80 = "AES_CM_128_HMAC_SHA1_80"
SUITE_32 = "AES_CM_128_HMAC_SHA1_32"


def crypto(tag: int = 1, suite: str = SUITE_80, key: bytes = KEY, tail: str = "") -> str:
    return f"a=crypto:{tag} {suite} inline:{base64.b64encode(key).decode()}{tail}"


def savp_offer(port: int, *lines: str) -> bytes:
    return sdp_offer(port, "0 101", proto="RTP/SAVP", extra_media="\r\n".join(lines))


def choice_for(body: bytes, protos: tuple[str, ...] = ("RTP/AVP", "RTP/SAVP")) -> AudioChoice:
    offer = parse_sdp(body)
    assert isinstance(offer, SessionDescription)
    chosen = choose_audio(offer, protos=protos)
    assert isinstance(chosen, AudioChoice)
    return chosen


# -- the crypto attribute ----------------------------------------------------------------------


@pytest.mark.parametrize("value, usable", [
    (crypto()[len("a=crypto:"):], True),
    (crypto(suite=SUITE_32)[len("a=crypto:"):], True),
    (crypto(tail="|2^20")[len("a=crypto:"):], True),  # a lifetime: fine
    (crypto(tail="|2^20|1:4")[len("a=crypto:"):], False),  # an MKI: not served
    (crypto(tail=" UNENCRYPTED_SRTP")[len("a=crypto:"):], False),  # session parameters
    (crypto(suite="AES_256_CM_HMAC_SHA1_80")[len("a=crypto:"):], False),
    (crypto(key=KEY[:16])[len("a=crypto:"):], False),  # a key without its salt
    ("1 AES_CM_128_HMAC_SHA1_80 inline:not*base64", False),
    ("1 AES_CM_128_HMAC_SHA1_80 uri:http://keys", False),
    ("x AES_CM_128_HMAC_SHA1_80", False),
])
def test_crypto_attributes_the_agent_can_serve(value: str, usable: bool) -> None:
    parsed = sdes.parse_crypto(value)
    assert (parsed is not None) == usable
    if parsed is not None:
        assert parsed.key == KEY and parsed.tag == 1


def test_negotiation_answers_the_first_usable_line_with_a_fresh_key_of_our_own() -> None:
    body = savp_offer(4000, crypto(1, tail="|2^20|1:4"), crypto(7, SUITE_32))
    chosen = choice_for(body)
    agreed = sdes.negotiate(body, chosen, "offer")
    assert isinstance(agreed, sdes.SdesAnswer)
    assert agreed.keys.suite == SUITE_32 and agreed.keys.remote_key == KEY
    assert agreed.keys.local_key != KEY and len(agreed.keys.local_key) == 30
    assert agreed.line.startswith(f"a=crypto:7 {SUITE_32} inline:")
    again = sdes.negotiate(body, chosen, "offer")
    assert isinstance(again, sdes.SdesAnswer) and again.keys.local_key != agreed.keys.local_key
    kept = sdes.negotiate(body, chosen, "offer", local_key=agreed.keys.local_key)
    assert isinstance(kept, sdes.SdesAnswer) and kept.line == agreed.line
    # Plain RTP: nothing to agree under offer, refused under require; SAVP refused under off.
    plain = sdp_offer(4000)
    assert sdes.negotiate(plain, choice_for(plain), "offer") is None
    assert isinstance(sdes.negotiate(plain, choice_for(plain), "require"), SdpError)
    assert isinstance(sdes.negotiate(body, chosen, "off"), SdpError)
    bare = savp_offer(4000)
    refused = sdes.negotiate(bare, choice_for(bare), "offer")
    assert isinstance(refused, SdpError) and refused.status == 488


def test_the_transform_seals_and_opens_and_drops_what_does_not_authenticate() -> None:
    ours, theirs = sdes.new_key(), sdes.new_key()
    leg = SrtpTransform(SrtpKeys(SUITE_80, remote_key=theirs, local_key=ours))
    far = SrtpTransform(SrtpKeys(SUITE_80, remote_key=ours, local_key=theirs))
    packet = RtpPacket(payload_type=0, sequence_number=5, timestamp=800, ssrc=9,
                       payload=b"\x7f" * 160).serialize()
    sealed = leg.protect(packet)
    assert sealed != packet and len(sealed) == len(packet) + 10  # the 80-bit tag
    assert far.unprotect(sealed) == packet
    assert far.unprotect(sealed) is None  # a replay
    tampered = bytearray(leg.protect(packet[:2] + b"\x00\x06" + packet[4:]))
    tampered[20] ^= 1
    assert far.unprotect(bytes(tampered)) is None
    assert far.unprotect(packet) is None  # plain RTP is not SRTP
    assert far.unprotect(b"\x80") is None
    assert far.stats() == {"suite": SUITE_80, "protected": 0, "unprotected": 1,
                           "unprotect_failures": 4}
    with pytest.raises(ValueError):
        SrtpKeys("NULL_CIPHER", ours, theirs)


# -- on the wire -------------------------------------------------------------------------------


def session(key: bytes, suite: str, inbound: bool) -> pylibsrtp.Session:
    kind = pylibsrtp.Policy.SSRC_ANY_INBOUND if inbound else pylibsrtp.Policy.SSRC_ANY_OUTBOUND
    profile = {SUITE_80: pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
               SUITE_32: pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32}[suite]
    return pylibsrtp.Session(pylibsrtp.Policy(key=key, ssrc_type=kind, srtp_profile=profile))


def stream_srtp(sender: socket.socket, to: tuple[str, int], protect: pylibsrtp.Session,
                samples: np.ndarray) -> None:
    """PCMU in 20 ms SRTP packets on the wall clock, from a thread of its own."""
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(samples) - 159, 160)):
        packet = RtpPacket(payload_type=0, sequence_number=index, timestamp=index * 160,
                           ssrc=4242, payload=PCMU.encode(samples[offset:offset + 160]))
        sender.sendto(protect.protect(packet.serialize()), to)
        time.sleep(max(0.0, start + (index + 1) * 0.02 - time.monotonic()))


class SrtpProbe(RtpProbe):
    """The caller's RTP port: keeps the raw datagrams the agent sends (SRTP)."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.raw.append(data)


def answered_crypto(ok_body: bytes) -> sdes.Crypto:
    (line,) = sdes.crypto_lines(ok_body, 0)
    parsed = sdes.parse_crypto(line)
    assert parsed is not None
    return parsed


@pytest.mark.slow
async def test_an_srtp_caller_hears_its_echo_and_a_tampered_packet_is_dropped(
    sip_server: SipServer,
) -> None:
    peer, probe = await SipPeer.open(), cast(SrtpProbe, await SrtpProbe.open())
    caller_key = sdes.new_key()
    dialogue, _, ok = await establish(
        sip_server, peer, savp_offer(probe.port, crypto(3, key=caller_key)))
    assert b"m=audio " in ok.body and b" RTP/SAVP 0 101\r\n" in ok.body
    agent_crypto = answered_crypto(ok.body)
    assert (agent_crypto.tag, agent_crypto.suite) == (3, SUITE_80)
    assert agent_crypto.key != caller_key
    answer = parse_sdp(ok.body)
    assert isinstance(answer, SessionDescription)
    agent_rtp = ("127.0.0.1", answer.media[0].port)
    signal = make_test_signal(3.0, 8000)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:  # the offer's IP
        await asyncio.to_thread(stream_srtp, sender, agent_rtp,
                                session(caller_key, SUITE_80, inbound=False),
                                (signal * 32767).astype(np.int16))
        (leg,) = list(sip_server.agent.legs)
        before = leg.stats()["srtp"]
        assert before["unprotected"] >= 140 and before["unprotect_failures"] == 0
        # A packet changed on the way (one payload bit) and one sent in clear: both dropped.
        forged = bytearray(session(caller_key, SUITE_80, inbound=False).protect(
            RtpPacket(payload_type=0, sequence_number=5000, timestamp=800_000, ssrc=4242,
                      payload=b"\xff" * 160).serialize()))
        forged[30] ^= 0x01
        sender.sendto(bytes(forged), agent_rtp)
        sender.sendto(RtpPacket(payload_type=0, sequence_number=5001, timestamp=800_160,
                                ssrc=4242, payload=b"\x00" * 160).serialize(), agent_rtp)
        await wait_until(lambda: leg.stats()["srtp"]["unprotect_failures"] == 2)
    await asyncio.sleep(0.3)
    stats = leg.stats()
    assert stats["packets_malformed"] == 0
    # What the agent sent opens with the key it answered, and with nothing else.
    opener = session(agent_crypto.key, SUITE_80, inbound=True)
    opened = [RtpPacket.parse(opener.unprotect(data)) for data in probe.raw]
    assert len(opened) >= 100 and all(len(data) == len(p.serialize()) + 10
                                      for data, p in zip(probe.raw, opened, strict=True))
    with pytest.raises(pylibsrtp.Error):
        session(caller_key, SUITE_80, inbound=True).unprotect(probe.raw[-1])
    first = opened[0].sequence_number
    ordered = sorted(opened, key=lambda p: (p.sequence_number - first) & 0xFFFF)
    heard = PCMU.decode(b"".join(p.payload for p in ordered if p.payload_type == 0))
    echo = measure_echo(signal, (heard.astype(np.float32) / 32768)[:len(signal)], 8000)
    print(f"\nSRTP echo over SIP: correlation {echo.correlation:.3f}, "
          f"lag {echo.lag_seconds:.3f} s")
    assert echo.correlation >= 0.9, echo
    await hang_up(sip_server, peer, dialogue, probe)


async def test_the_32_bit_tag_suite_is_answered_in_kind(sip_server: SipServer) -> None:
    peer, probe = await SipPeer.open(), cast(SrtpProbe, await SrtpProbe.open())
    caller_key = sdes.new_key()
    dialogue, _, ok = await establish(sip_server, peer, savp_offer(
        probe.port, crypto(1, "AES_256_CM_HMAC_SHA1_80"), crypto(2, SUITE_32, caller_key)))
    agent_crypto = answered_crypto(ok.body)
    assert (agent_crypto.tag, agent_crypto.suite) == (2, SUITE_32)
    answer = parse_sdp(ok.body)
    assert isinstance(answer, SessionDescription)
    protect = session(caller_key, SUITE_32, inbound=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for index in range(10):  # the agent latches its remote's port from these
            sender.sendto(protect.protect(RtpPacket(
                payload_type=0, sequence_number=index, timestamp=160 * index, ssrc=7,
                payload=b"\xff" * 160).serialize()), ("127.0.0.1", answer.media[0].port))
        await wait_until(lambda: len(probe.raw) >= 5)
    opener = session(agent_crypto.key, SUITE_32, inbound=True)
    packet = probe.raw[0]
    assert len(opener.unprotect(packet)) == len(packet) - 4  # the 32-bit tag
    (leg,) = list(sip_server.agent.legs)
    assert leg.stats()["srtp"]["suite"] == SUITE_32
    await hang_up(sip_server, peer, dialogue, probe)


@pytest.mark.parametrize("mode, proto, lines, expected", [
    ("offer", "RTP/SAVP", [], 488),  # SAVP without a crypto line
    ("offer", "RTP/SAVP", [crypto(tail="|2^20|1:4")], 488),  # only an MKI'd key
    ("off", "RTP/SAVP", [crypto()], 488),
    ("require", "RTP/AVP", [], 488),
    ("require", "RTP/SAVP", [crypto()], 200),
    ("offer", "RTP/AVP", [], 200),
])
async def test_what_each_srtp_mode_takes(start_sip: SipServerFactory, mode: str, proto: str,
                                         lines: list[str], expected: int) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, srtp=mode))
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    dialogue = Dialogue(peer.port, server.sip)
    body = sdp_offer(probe.port, "0 101", proto=proto, extra_media="\r\n".join(lines))
    invite = dialogue.request("INVITE", body=body)
    peer.send(invite, server.sip)
    final = await peer.response()
    while final.status < 200:
        final = await peer.response()
    assert final.status == expected
    if expected == 488:
        assert (final.headers.get("warning") or "").startswith(("305 ", "399 "))
        assert server.sip_legs() == 0
    else:
        peer.send(dialogue.ack_for(invite, final), server.sip)
        assert (b"a=crypto:" in final.body) == (proto == "RTP/SAVP")
        dialogue.cseq += 1
        peer.send(dialogue.request("BYE"), server.sip)
        await peer.response(200, method="BYE")
    await wait_until(server.quiet)
    peer.close()
    probe.close()


@pytest.mark.interop
@pytest.mark.slow
async def test_baresip_calls_over_srtp_and_hears_its_echo(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    """baresip's srtp module (`mediaenc=srtp-mand`: RTP/SAVP with SDES keys, libre's own
    SRTP code, not libsrtp) calls, plays the test signal and records the echo."""
    require_baresip()
    if not Path("/usr/lib/baresip/modules/srtp.so").exists():
        pytest.skip("baresip's srtp module is missing")
    signal = make_test_signal(SECONDS, 8000)
    wav = tmp_path / "speech.wav"
    write_wav(wav, signal, 8000)
    async with baresip(tmp_path, wav, 8000, "PCMU/8000/1", extra_modules=("srtp",),
                       account_params=";mediaenc=srtp-mand") as phone:
        await phone.command("dial", f"sip:agent@127.0.0.1:{sip_server.ua.port}")
        await phone.event("CALL_ESTABLISHED")
        (leg,) = list(sip_server.agent.legs)
        await phone.event("CALL_CLOSED", timeout=SECONDS + 15)
        stats = leg.stats()
        await wait_until(sip_server.quiet)
        heard, _ = read_wav(phone.recording("dec"))
    assert stats["srtp"]["unprotected"] >= 100 and stats["srtp"]["protected"] >= 100, stats
    assert stats["srtp"]["unprotect_failures"] == 0 and stats["packets_malformed"] == 0
    echo = measure_echo(signal, heard, 8000)
    print(f"\nbaresip over SRTP ({stats['srtp']['suite']}): echo correlation "
          f"{echo.correlation:.3f}, lag {echo.lag_seconds:.3f} s")
    assert echo.correlation >= 0.9, echo
