"""G.711 WebRTC legs: PCMU-only and PCMA-only callers, codec preference and `--codecs`."""

from __future__ import annotations

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack

from agent.media_agent import AgentSettings
from agent.rtc_tuning import parse_codec_list
from agent.testing.peer import run_call
from signaling.__main__ import build_parser, settings_from_args
from tests.support.agents import AgentFactory, RunningAgent


@pytest.mark.parametrize("codec", ["pcmu", "pcma"])
async def test_g711_only_caller_gets_its_signal_back(echo_agent: RunningAgent, codec: str) -> None:
    report, _, _ = await run_call(echo_agent.url, codec=codec, seconds=3.0)
    assert report.ok, report.error
    assert report.codec == codec.upper()
    assert report.correlation is not None and report.correlation >= 0.7, report


async def _answer_codecs(url: str, offered: list[str]) -> list[str]:
    """Offer `offered` (in that preference order) and return the answer's audio codecs."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        transceiver = pc.addTransceiver(AudioStreamTrack(), direction="sendrecv")
        available = RTCRtpSender.getCapabilities("audio").codecs
        transceiver.setCodecPreferences([
            codec for name in offered for codec in available
            if codec.mimeType.lower() == f"audio/{name.lower()}"
        ])
        await pc.setLocalDescription(await pc.createOffer())
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/offer", json={
                "sdp": pc.localDescription.sdp, "type": "offer",
            }) as response:
                body = await response.json()
                if response.status != 200:
                    return [f"HTTP {response.status} {body['error']['code']}"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
        return [codec.mimeType.split("/")[-1] for codec in transceiver._codecs]
    finally:
        await pc.close()


async def test_opus_wins_when_offered_with_g711(echo_agent: RunningAgent) -> None:
    # The caller prefers PCMU, but the agent's own order (opus first by default) decides,
    # and the answer names only the chosen codec, so the caller sends it too.
    assert await _answer_codecs(echo_agent.url, ["PCMU", "PCMA", "opus"]) == ["opus"]
    assert [call.codec for call in echo_agent.agent.webrtc_legs.values()] == ["opus"]


async def test_codecs_setting_reorders(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(codecs=("PCMA", "PCMU")))
    assert await _answer_codecs(running.url, ["opus", "PCMU", "PCMA"]) == ["PCMA"]
    assert await _answer_codecs(running.url, ["PCMU", "opus"]) == ["PCMU"]


async def test_codecs_setting_restricts(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(codecs=("PCMU",)))
    assert await _answer_codecs(running.url, ["opus"]) == ["HTTP 400 no_common_codec"]
    assert await _answer_codecs(running.url, ["opus", "PCMA", "PCMU"]) == ["PCMU"]


def test_codecs_flag_is_parsed_and_checked() -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args([])).codecs == ("opus", "PCMU", "PCMA")
    args = parser.parse_args(["--codecs", "pcma, PCMU,pcma"])
    assert settings_from_args(args).codecs == ("PCMA", "PCMU")
    with pytest.raises(ValueError, match="unknown audio codec 'g722'"):
        parse_codec_list("opus,g722")
    with pytest.raises(ValueError):
        parse_codec_list(" , ")
    with pytest.raises(SystemExit):
        parser.parse_args(["--codecs", "g729"])
