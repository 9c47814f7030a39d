"""The aiortc adjustments in agent/rtc_tuning/, each against the installed aiortc."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.rtcdtlstransport import SRTP_AES128_CM_SHA1_80, RTCCertificate, generate_certificate
from aiortc.rtp import RtpPacket
from cryptography.hazmat.primitives.asymmetric import rsa
from OpenSSL import SSL

from agent.rtc_tuning import (
    ImmediateAudioJitterBuffer,
    accept_rsa_dtls_peers,
    decode_audio_inline,
    is_no_common_codec,
    missing_internals,
    negotiated_codecs,
    restrict_codecs,
)
from agent.testing.peer import SignalTrack, post_offer
from agent.testing.testsignal import make_test_signal
from tests.support.agents import AgentFactory, all_freed, wait_until


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
        assert connected.is_set(), (
            f"DTLS with an RSA peer did not connect: {caller.connectionState}")
    finally:
        await caller.close()
    await wait_until(lambda: all_freed(running), timeout=15)


async def test_the_installed_aiortc_has_every_internal_this_agent_tunes() -> None:
    assert await missing_internals() == []


def _packet(sequence: int) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=sequence * 960,
                       payload=bytes([sequence & 0xFF]))
    packet._data = packet.payload  # type: ignore[attr-defined]  # aiortc's depayloaded data
    return packet


def test_immediate_jitter_buffer_releases_in_order_and_drops_late_packets() -> None:
    buffer = ImmediateAudioJitterBuffer()
    released = []
    # a duplicate and a late one, across the wrap
    for sequence in (65534, 65535, 0, 65535, 2, 1, 3):
        _, frame = buffer.add(_packet(sequence))
        if frame is not None:
            released.append(frame.timestamp // 960)
    assert released == [65534, 65535, 0, 2, 3]


async def _connected_pair(offer_codecs: list[str]) -> tuple[RTCPeerConnection, RTCPeerConnection]:
    caller, answerer = RTCPeerConnection(), RTCPeerConnection()
    caller.addTrack(SignalTrack(make_test_signal(2.0)))
    capabilities = RTCRtpSender.getCapabilities("audio").codecs
    caller.getTransceivers()[0].setCodecPreferences(
        [c for c in capabilities if c.mimeType.split("/")[1].lower() in offer_codecs])
    await caller.setLocalDescription(await caller.createOffer())
    return caller, answerer


async def test_an_offer_without_a_common_codec_is_recognised() -> None:
    caller, answerer = await _connected_pair(["opus"])
    sdp = caller.localDescription.sdp.replace("opus/48000/2", "iLBC/8000")
    try:
        with pytest.raises(Exception) as failure:
            await answerer.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        assert is_no_common_codec(failure.value)
        assert not is_no_common_codec(ValueError("something else"))
    finally:
        await caller.close()
        await answerer.close()


async def test_inline_decoding_and_codec_restriction_on_a_real_call() -> None:
    caller, answerer = await _connected_pair(["opus", "pcmu"])
    received = asyncio.Event()

    @answerer.on("track")
    def on_track(track: Any) -> None:
        async def read() -> None:
            frame = await track.recv()
            assert frame.sample_rate == 8000  # PCMU, decoded on this loop
            received.set()
        asyncio.ensure_future(read())

    try:
        await answerer.setRemoteDescription(caller.localDescription)
        transceiver = answerer.getTransceivers()[0]
        assert ([c.mimeType for c in negotiated_codecs(transceiver)][:2]
                == ["audio/opus", "audio/PCMU"])
        assert restrict_codecs(transceiver, ["PCMU", "opus"]) == ["PCMU"]
        assert decode_audio_inline(transceiver.receiver) is not None

        transceiver.direction = "recvonly"
        await answerer.setLocalDescription(await answerer.createAnswer())
        await caller.setRemoteDescription(answerer.localDescription)
        await asyncio.wait_for(received.wait(), 20)
    finally:
        await caller.close()
        await answerer.close()


def test_codec_restriction_falls_back_to_aiortc_when_its_codec_list_is_gone() -> None:
    class Renamed:  # a transceiver from an aiortc that renamed `_codecs`
        pass

    assert restrict_codecs(Renamed(), ["opus"]) == ["opus"]  # type: ignore[arg-type]
    assert negotiated_codecs(Renamed()) == []  # type: ignore[arg-type]


def test_mono_opus_decoding_is_the_mean_of_aiortcs_stereo_decoding() -> None:
    """A mono plugin gets Opus decoded to one channel by libopus: the same samples as the
    mean of the two channels aiortc's decoder gives (a voice in stereo keeps its level)."""
    from fractions import Fraction

    import av
    import numpy as np
    from aiortc.codecs import get_decoder
    from aiortc.codecs.opus import OpusEncoder
    from aiortc.jitterbuffer import JitterFrame
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters

    from agent.rtc_tuning import MonoOpusDecoder

    rate = 48000
    t = np.arange(rate) / rate
    left = np.sin(2 * np.pi * 300 * t) * 8000
    right = np.sin(2 * np.pi * 700 * t) * 4000  # the channels differ: a real downmix
    interleaved = np.stack([left, right], 1).astype(np.int16).reshape(1, -1)
    encoder = OpusEncoder()
    payloads: list[bytes] = []
    for start in range(0, rate - 960, 960):
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(interleaved[:, 2 * start:2 * (start + 960)]),
            format="s16", layout="stereo")
        frame.sample_rate = rate
        frame.pts = start
        frame.time_base = Fraction(1, rate)
        payloads += encoder.encode(frame)[0]
    stereo = get_decoder(RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000,
                                               channels=2))
    mono = MonoOpusDecoder()
    averaged, downmixed = [], []
    for index, payload in enumerate(payloads):
        for frame in stereo.decode(JitterFrame(payload, index * 960)):
            averaged.append(frame.to_ndarray().reshape(-1, 2).astype(np.float64).mean(axis=1))
        for frame in mono.decode(JitterFrame(payload, index * 960)):
            assert frame.layout.name == "mono" and frame.sample_rate == rate
            downmixed.append(frame.to_ndarray().reshape(-1).astype(np.float64))
    a, b = np.concatenate(averaged), np.concatenate(downmixed)
    assert len(a) == len(b) > rate // 2
    assert np.sqrt(np.mean(a ** 2)) > 2000
    assert np.max(np.abs(a - b)) <= 1.0  # rounding of the mean only
