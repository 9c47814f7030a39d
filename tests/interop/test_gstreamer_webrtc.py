"""GStreamer's webrtcbin (Debian's package, nobody here wrote it) calls the agent.

webrtcbin keeps its defaults: its own RSA DTLS certificate, a non-trickle offer. The caller
runs in the system Python, where PyGObject lives (scripts/install-test-deps.sh installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.rtc_tuning import limit_host_addresses
from agent.testing.peer import save_wav
from agent.testing.testsignal import make_test_signal, measure_echo
from tests.support.agents import AgentFactory, all_freed, wait_until

pytestmark = pytest.mark.interop

SYSTEM_PYTHON = "/usr/bin/python3"
CALLER = Path(__file__).with_name("gst_webrtc_caller.py")


def webrtcbin_available() -> bool:
    probe = (
        "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstWebRTC', '1.0');"
        "from gi.repository import Gst; Gst.init(None);"
        "import sys; sys.exit(0 if Gst.ElementFactory.find('webrtcbin') else 1)"
    )
    try:
        probed = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=30)
        return probed.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def gstreamer() -> None:
    if not webrtcbin_available():
        if os.environ.get("CI"):
            pytest.fail("GStreamer webrtcbin missing: scripts/install-test-deps.sh installs it")
        pytest.skip("GStreamer webrtcbin (python3-gi, gstreamer1.0-plugins-bad, "
                    "gstreamer1.0-nice) not installed")


def sent_offset(sent: np.ndarray, received: np.ndarray, rate: int = 48000) -> int:
    """Where in `sent` the recording starts, judged on the recording's last 2 s.

    The caller's first buffer goes out before DTLS completes (its caps make webrtcbin's offer)
    and never comes back, so the recording (from the agent's first packet) begins a little
    later in the signal than the echo delay says; its start is also a transient.
    """
    step = 6  # 8 kHz is plenty to find the offset
    tail = received[-2 * rate :: step].astype(np.float64)
    s = sent[::step].astype(np.float64)
    size = 1 << int(np.ceil(np.log2(len(s) + len(tail))))
    xcorr = np.fft.irfft(np.fft.rfft(s, size) * np.conj(np.fft.rfft(tail, size)), size)
    tail_start = int(np.argmax(xcorr[: len(s)])) * step  # sent[tail_start] ~ the tail's start
    start = tail_start - (len(received) - 2 * rate)
    return max(0, start - rate // 100)  # 10 ms early: measure_echo looks at lags >= 0


@pytest.fixture
def host_interfaces() -> Iterator[None]:
    # libnice never gathers on loopback, and Linux drops replies from 127.0.0.1 to another
    # address, so for this test the agent gathers on the machine's interfaces as it does
    # by default outside the tests (everything still stays on this host).
    limit_host_addresses(None)
    yield
    limit_host_addresses(["127.0.0.1"])


async def webrtcbin_call(url: str, tmp_path: Path, sent: np.ndarray, codec: str,
                         offer_delay: float = 0.0) -> tuple[dict, object, np.ndarray]:
    """One call from the webrtcbin caller: its report, the echo measurement, the recording."""
    process = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON, str(CALLER), url, str(tmp_path / "in.wav"), str(tmp_path / "out.raw"),
        "--codec", codec, "--seconds", "5", "--timeout", "40",
        "--offer-delay", str(offer_delay),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    except asyncio.TimeoutError:
        process.kill()
        stdout, stderr = await process.communicate()
        pytest.fail(f"webrtcbin caller hung: {stdout.decode()} "
                    f"{stderr.decode(errors='replace')[-3000:]}")
    assert stdout, stderr.decode(errors="replace")[-2000:]
    report = json.loads(stdout.decode().strip().splitlines()[-1])
    assert report["connected"], report
    assert report["http_status"] == 201
    assert report["errors"] == []
    assert "session.created" in report["events"]
    assert report["hangup_status"] in (200, 204)
    received = np.fromfile(tmp_path / "out.raw", dtype="<i2").astype(np.float32) / 32768
    assert len(received) / 48000 > 3.5
    echo = measure_echo(sent[sent_offset(sent, received):], received, 48000, skip_seconds=2.0)
    return report, echo, received


@pytest.mark.parametrize("codec,offer_delay", [("opus", 0.0), ("pcmu", 0.0), ("pcmu", 4.0)],
                         ids=["opus", "pcmu", "pcmu-slow-connect"])
@pytest.mark.slow
async def test_webrtcbin_with_default_certificate_gets_its_echo(
    gstreamer: None, host_interfaces: None, start_agent: AgentFactory, tmp_path: Path,
    codec: str, offer_delay: float,
) -> None:
    running = await start_agent()
    sent = make_test_signal(7.0)
    save_wav(str(tmp_path / "in.wav"), sent)
    # The caller plays its WAV from the moment it is connected (gst_webrtc_caller.py). When
    # it played from its pipeline's start, a connect slowed by a busy machine (seconds: here
    # a caller that posts its offer 4 s late) lost the signal's start, and the 5 s recorded
    # after the connect ran past the 7 s signal's end: nothing left to align the recording
    # with (correlation 0.09, every window a hole).
    report, echo, received = await webrtcbin_call(running.url, tmp_path, sent, codec,
                                                  offer_delay)
    # The agent may give a standing backlog of the first packets back by dropping it once (a
    # jump of up to ~150 ms in the caller's audio, scored as at most one window), so one
    # window may miss.
    assert echo.holes <= 1, echo
    assert echo.correlation > 0.6, echo
    tail = received[48000:]
    windows = tail[: len(tail) // 480 * 480].reshape(-1, 480)
    silent = np.sqrt(np.mean(windows**2, axis=1)) < 0.01
    assert not silent.any(), f"silent 10 ms windows after the first second: {int(silent.sum())}"
    await wait_until(lambda: all_freed(running), timeout=5)
    print(json.dumps({"codec": codec, "connect_seconds": report["connect_seconds"],
                      "correlation": round(echo.correlation, 3)}), file=sys.stderr)
