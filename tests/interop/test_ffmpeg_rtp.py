"""ffmpeg (Debian's package) as a PBX stand-in: it sends and receives a plain RTP leg.

ffmpeg sends from a port of its own choosing (no symmetric RTP), so the leg must take the
remote's audio from its IP on any port; its default μ-law packets from a 48 kHz source carry
341-342 samples (42.7 ms), and a second case sends 30 ms packets. ffmpeg also receives the
agent's RTP through an SDP file and writes what it heard, so both directions are checked by
software nobody here wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.testing.peer import save_wav
from agent.testing.testsignal import decimate, make_test_signal, measure_echo
from tests.support.agents import AgentFactory, wait_until

pytestmark = pytest.mark.interop

RTP_PATH = "/v1/telephony/rtp"
SECONDS = 6.0


@pytest.fixture(scope="module")
def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg missing: scripts/install-test-deps.sh installs it")
        pytest.skip("ffmpeg not installed")
    return path


def free_even_udp_port() -> int:
    """An even port whose odd neighbour (ffmpeg's RTCP) is free too, at the time of asking."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1] & ~1
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free UDP port pair")


@pytest.mark.parametrize("packet_filter,expected_ms", [
    (None, (42.625, 42.75)),  # ffmpeg's default: whole 48 kHz input packets, 341 or 342 samples
    ("asetnsamples=n=1440", (30.0, 30.0)),  # 30 ms at the 48 kHz input rate
])
@pytest.mark.slow
async def test_ffmpeg_sends_and_receives_an_rtp_leg(
    ffmpeg: str, start_agent: AgentFactory, tmp_path: Path,
    packet_filter: str | None, expected_ms: tuple[float, float],
) -> None:
    running = await start_agent()
    sent = make_test_signal(SECONDS)
    save_wav(str(tmp_path / "in.wav"), sent)
    receive_port = free_even_udp_port()
    (tmp_path / "receive.sdp").write_text(
        "v=0\no=- 0 0 IN IP4 127.0.0.1\ns=agent\nc=IN IP4 127.0.0.1\nt=0 0\n"
        f"m=audio {receive_port} RTP/AVP 0\na=rtpmap:0 PCMU/8000\n"
    )
    receiver = await asyncio.create_subprocess_exec(
        ffmpeg, "-hide_banner", "-loglevel", "error", "-protocol_whitelist", "file,udp,rtp",
        "-i", str(tmp_path / "receive.sdp"), "-t", str(SECONDS + 3), "-ac", "1", "-ar", "8000",
        "-f", "s16le", "-y", str(tmp_path / "heard.raw"),
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{running.url}{RTP_PATH}",
                             json={"remote": f"127.0.0.1:{receive_port}",
                                   "codec": "PCMU"}) as response:
            body = await response.json()
            assert response.status == 201, body
        local_port = int(body["local"].rsplit(":", 1)[1])
        filters = "aresample=8000" if packet_filter is None else f"{packet_filter},aresample=8000"
        sender = await asyncio.create_subprocess_exec(
            ffmpeg, "-hide_banner", "-loglevel", "error", "-re", "-i", str(tmp_path / "in.wav"),
            "-af", filters, "-ac", "1", "-c:a", "pcm_mulaw", "-f", "rtp",
            f"rtp://127.0.0.1:{local_port}",
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        _, sender_errors = await asyncio.wait_for(sender.communicate(), timeout=SECONDS + 30)
        assert sender.returncode == 0, sender_errors.decode(errors="replace")
        await asyncio.sleep(0.5)
        async with http.get(f"{running.url}{RTP_PATH}/{body['call_id']}") as response:
            stats = await response.json()
        async with http.delete(f"{running.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 200
    _, receiver_errors = await asyncio.wait_for(receiver.communicate(), timeout=30)

    assert stats["remote_source"] != stats["remote"]  # ffmpeg sent from a port of its own
    assert stats["packets_foreign"] == 0
    assert expected_ms[0] <= stats["packet_ms"] <= expected_ms[1], stats
    heard = np.fromfile(tmp_path / "heard.raw", dtype="<i2").astype(np.float32) / 32768
    assert len(heard) > 8000 * (SECONDS - 1), receiver_errors.decode(errors="replace")
    reference = decimate(sent, 48000)
    lag = measure_echo(reference, heard, 8000, max_lag_seconds=4.0).lag_seconds
    # Score only while the echo lasts: ffmpeg keeps recording the agent's silence after it.
    echo = measure_echo(reference, heard[: int((lag + SECONDS - 0.25) * 8000)], 8000,
                        max_lag_seconds=4.0)
    assert echo.correlation > 0.6, (echo, stats["jitter"])
    assert echo.holes == 0, (echo, json.dumps(stats))
    await wait_until(lambda: not running.agent.telephony_legs and not running.agent.ticker.slots)
    print(json.dumps({"packet_ms": stats["packet_ms"], "underruns": stats["jitter"]["underruns"],
                      "correlation": round(echo.correlation, 3),
                      "lag_s": round(echo.lag_seconds, 3),
                      "lag_spread_s": echo.lag_spread_seconds}), file=sys.stderr)
