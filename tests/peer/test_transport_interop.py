"""The peer against other implementations of each protocol, so it is shown to speak the
protocols and not only this agent's dialect of them: a plain aiortc echo server (WebRTC, its
own `/offer` route written here), ffmpeg echoing RTP (Debian's package: it receives through
an SDP file and sends what it decoded back), and sipp's built-in UAS with `-rtp_echo` (SIP).
Third-party programs skip where missing, and fail under CI."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from agent.testing.peer.call import place_call
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports.base import PeerOptions

SECONDS = 2.5


def require_program(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is missing (apt-get install {package}; scripts/install-test-deps.sh)"
    if os.environ.get("CI"):
        pytest.fail(message + " under CI", pytrace=False)
    pytest.skip(message)


def free_udp_port(pair: bool = False) -> int:
    """A free UDP port (with `pair`: an even one whose odd neighbour, RTCP's, is free too)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not pair:
            return port
        port &= ~1
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free UDP port")


def assert_echoed(report: CallReport, max_delay_ms: float) -> None:
    assert report.ok, report
    assert report.correlation is not None and report.correlation > 0.8, report
    assert report.delay_ms is not None and 0 <= report.delay_ms < max_delay_ms, report


async def stop(process: asyncio.subprocess.Process) -> bytes:
    if process.returncode is None:
        process.kill()
    _, errors = await process.communicate()
    return errors or b""


# -- WebRTC: a plain aiortc echo --------------------------------------------------------------


@pytest.fixture
async def aiortc_echo() -> AsyncIterator[str]:
    """An aiohttp `/offer` route whose aiortc peer connection sends each caller's own track
    back to it (the JSON shape `{"sdp", "type"}` both ways)."""
    connections: list[RTCPeerConnection] = []

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        connections.append(pc)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            pc.addTrack(track)  # the caller's own audio, re-encoded by aiortc

        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return web.json_response({"sdp": pc.localDescription.sdp, "type": "answer"})

    app = web.Application()
    app.router.add_post("/offer", offer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/offer"))
    finally:
        await server.close()
        for pc in connections:
            await pc.close()


@pytest.mark.interop
async def test_webrtc_against_a_plain_aiortc_echo(aiortc_echo: str) -> None:
    report, _ = await place_call(aiortc_echo, "webrtc", PeerOptions(), seconds=SECONDS)
    assert_echoed(report, 1000)
    assert report.codec == "opus"


# -- RTP: ffmpeg ----------------------------------------------------------------------------


@pytest.mark.interop
async def test_rtp_against_an_ffmpeg_echo(tmp_path: Path) -> None:
    ffmpeg = require_program("ffmpeg", "ffmpeg")
    listen, peer = free_udp_port(pair=True), free_udp_port(pair=True)
    sdp = tmp_path / "in.sdp"
    sdp.write_text("v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=echo\r\nc=IN IP4 127.0.0.1\r\n"
                   f"t=0 0\r\nm=audio {listen} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")
    echo = await asyncio.create_subprocess_exec(
        ffmpeg, "-hide_banner", "-loglevel", "error", "-protocol_whitelist", "file,udp,rtp",
        "-fflags", "nobuffer", "-probesize", "32", "-analyzeduration", "0", "-i", str(sdp),
        "-t", str(SECONDS + 5), "-c:a", "pcm_mulaw", "-ar", "8000", "-ac", "1", "-f", "rtp",
        f"rtp://127.0.0.1:{peer}", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.sleep(0.5)  # ffmpeg opens its input port
        report, _ = await place_call(f"rtp://127.0.0.1:{listen}", "rtp",
                                     PeerOptions(extra={"rtp_port": peer}), seconds=SECONDS)
    finally:
        errors = await stop(echo)
    assert_echoed(report, 500)
    assert report.packets_received and report.packets_lost == 0, errors.decode()


# -- SIP: sipp's UAS ------------------------------------------------------------------------


@pytest.mark.interop
async def test_sip_against_sipps_uas_with_rtp_echo(tmp_path: Path) -> None:
    sipp = require_program("sipp", "sip-tester")
    port, media = free_udp_port(), free_udp_port(pair=True)
    uas = await asyncio.create_subprocess_exec(
        sipp, "-sn", "uas", "-i", "127.0.0.1", "-p", str(port), "-mp", str(media),
        "-rtp_echo", "-m", "1", "-nostdin", "-timeout", "30", "-trace_msg", "-message_file",
        str(tmp_path / "sipp.msg.log"), cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.sleep(0.5)  # sipp binds its port
        report, _ = await place_call(f"sip:service@127.0.0.1:{port}", "sip", PeerOptions(),
                                     seconds=SECONDS)
        log_file = tmp_path / "sipp.msg.log"
        for _ in range(50):  # sipp logs the BYE it received and its 200 (then lingers 4 s)
            log = log_file.read_text(errors="replace") if log_file.exists() else ""
            if "BYE sip:" in log and log.count("SIP/2.0 200 OK") >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        await stop(uas)
    assert_echoed(report, 500)
    assert "ACK sip:" in log and "BYE sip:" in log, log[-3000:]
    assert log.count("SIP/2.0 200 OK") >= 2, log[-3000:]  # the INVITE's and the BYE's
