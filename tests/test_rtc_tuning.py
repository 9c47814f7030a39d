"""The aiortc adjustments in agent/rtc_tuning.py, each against the installed aiortc."""

from __future__ import annotations

import asyncio

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdtlstransport import SRTP_AES128_CM_SHA1_80, RTCCertificate, generate_certificate
from cryptography.hazmat.primitives.asymmetric import rsa
from OpenSSL import SSL

from agent.peer import SignalTrack, post_offer
from agent.rtc_tuning import accept_rsa_dtls_peers
from agent.testsignal import make_test_signal
from support import AgentFactory, all_freed, wait_until


def rsa_certificate() -> RTCCertificate:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return RTCCertificate(key=key, cert=generate_certificate(key))  # type: ignore[arg-type]


def offered_ciphers(certificate: RTCCertificate) -> list[str]:
    context = certificate._create_ssl_context(srtp_profiles=[SRTP_AES128_CM_SHA1_80])
    return SSL.Connection(context).get_cipher_list()


def test_dtls_offers_rsa_and_ecdsa_suites() -> None:
    assert accept_rsa_dtls_peers()
    assert accept_rsa_dtls_peers()  # idempotent: wrapping twice would still be one list
    ciphers = offered_ciphers(RTCCertificate.generateCertificate())
    assert "ECDHE-ECDSA-AES128-GCM-SHA256" in ciphers
    assert "ECDHE-RSA-AES128-GCM-SHA256" in ciphers
    assert offered_ciphers(rsa_certificate()) == ciphers


async def test_caller_with_rsa_certificate_connects(start_agent: AgentFactory) -> None:
    # The agent answers `a=setup:active`, so it is the DTLS client and the caller, holding an
    # RSA certificate as GStreamer does by default, is the DTLS server.
    running = await start_agent()
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    caller._RTCPeerConnection__certificates = [rsa_certificate()]  # type: ignore[attr-defined]
    connected = asyncio.Event()
    failed = asyncio.Event()

    @caller.on("connectionstatechange")
    def on_state() -> None:
        if caller.connectionState == "connected":
            connected.set()
        elif caller.connectionState == "failed":
            failed.set()

    caller.addTrack(SignalTrack(make_test_signal(3.0)))
    try:
        await caller.setLocalDescription(await caller.createOffer())
        async with aiohttp.ClientSession() as http:
            answer, _ = await post_offer(http, running.url, caller.localDescription.sdp, None, {})
        assert "a=setup:active" in answer
        await caller.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        done, _ = await asyncio.wait(
            [asyncio.ensure_future(connected.wait()), asyncio.ensure_future(failed.wait())],
            timeout=20, return_when=asyncio.FIRST_COMPLETED,
        )
        for task in done:
            task.result()
        assert connected.is_set(), f"DTLS with an RSA peer did not connect: {caller.connectionState}"
    finally:
        await caller.close()
    await wait_until(lambda: all_freed(running), timeout=15)
