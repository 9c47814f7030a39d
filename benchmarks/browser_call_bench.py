"""Headless Chromium calls the agent (echo plugin) on loopback through the web page.

For each call, on a fresh page: the time from pressing Call to the peer connection being
connected and to the first agent audio the page hears (its output meter's analyser crossing
-48 dBFS), and the round trip of a test signal as the browser itself sees it: the page's
two-channel recording holds the microphone (after capture) and the agent's audio (as the
page receives it) on one clock, and cross-correlating them gives the delay. Also Chromium's
own numbers (ICE round trip, receive playout delay) and the ICE pair that connected.

The fake microphone plays band-limited noise (agent/testsignal.py: 300-3400 Hz, never
repeating within the correlation window). Microphone processing is off for this run (noise
suppression would remove a noise test signal); `--mic-processing` keeps the page's defaults
(echo cancellation, noise suppression, auto gain on).

    python benchmarks/browser_call_bench.py [--calls 5] [--record-seconds 4] [--jitter-buffer 1]
                                            [--mic-processing]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness  # noqa: F401 (puts tests.support on the path)
import numpy as np
from aiohttp import web

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from agent.rtc_tuning import limit_host_addresses
from agent.testing.peer import save_wav
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.app import create_app
from tests.support.chromium import launch_chromium, open_page

SIGNAL_SECONDS = 8.0
PAGE_QUERY = "?echo_cancellation=0&noise_suppression=0&auto_gain=0"

SELECTED_PAIR_JS = """async () => {
    const pc = window.voiceApp.call && window.voiceApp.call.pc;
    if (!pc) return null;
    const stats = [...(await pc.getStats()).values()];
    const byId = new Map(stats.map((s) => [s.id, s]));
    const transport = stats.find((s) => s.type === "transport" && s.selectedCandidatePairId);
    const pair = transport && byId.get(transport.selectedCandidatePairId);
    if (!pair) return null;
    const describe = (c) => c ? `${c.candidateType} ${c.protocol} ${c.address}:${c.port}` : "?";
    return {local: describe(byId.get(pair.localCandidateId)),
            remote: describe(byId.get(pair.remoteCandidateId)),
            rttMs: pair.currentRoundTripTime * 1000};
}"""


@dataclass
class CallResult:
    connect_ms: float
    first_audio_ms: float
    echo_ms: float
    correlation: float
    ice_rtt_ms: float | None
    playout_ms: float | None
    pair: str


async def start_server(port: int, jitter_buffer: int) -> tuple[web.AppRunner, MediaAgent, str]:
    agent = MediaAgent(EchoPlugin(), AgentSettings(jitter_prefetch_packets=jitter_buffer))
    runner = web.AppRunner(create_app(agent))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, agent, f"http://127.0.0.1:{bound}"


def read_stereo(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as wav:
        rate, channels = wav.getframerate(), wav.getnchannels()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return rate, samples.reshape(-1, channels).T.astype(np.float32) / 32768


async def one_call(browser: Any, url: str, record_seconds: float, query: str) -> CallResult:
    page, log = await open_page(browser, url + "/" + query)
    await page.wait_for_function(
        "document.getElementById('agent-info').textContent.startsWith('Agent:')"
    )
    await page.click("#call")
    await page.wait_for_function("window.voiceApp.timings.firstAgentAudioAt !== undefined",
                                 timeout=20_000)
    timings = await page.evaluate("window.voiceApp.timings")
    await page.select_option("#record-mode", "stereo")
    await page.click("#record")
    await page.wait_for_timeout(int(record_seconds * 1000))
    await page.click("#record")
    await page.wait_for_selector("#download:not([hidden])")
    async with page.expect_download() as download_info:
        await page.click("#download")
    download = await download_info.value
    rate, (caller, agent) = read_stereo(Path(await download.path()).read_bytes())
    stats = await page.evaluate("window.voiceApp.stats")
    pair = await page.evaluate(SELECTED_PAIR_JS)
    await page.click("#hangup")
    await page.wait_for_function("window.voiceApp.phase === 'idle'")
    await page.context.close()
    if log.page_errors or log.console_errors:
        raise RuntimeError(f"page errors: {log.page_errors + log.console_errors}")
    echo = measure_echo(caller, agent, rate, max_lag_seconds=1.5, skip_seconds=0.5)
    return CallResult(
        connect_ms=timings["connectedAt"] - timings["pressedAt"],
        first_audio_ms=timings["firstAgentAudioAt"] - timings["pressedAt"],
        echo_ms=echo.lag_seconds * 1000,
        correlation=echo.correlation,
        ice_rtt_ms=pair["rttMs"] if pair else None,
        playout_ms=stats.get("playoutDelayMs") if stats else None,
        pair=f"{pair['local']} -> {pair['remote']}" if pair else "?",
    )


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--record-seconds", type=float, default=4.0)
    parser.add_argument("--jitter-buffer", type=int, default=1,
                        help="agent receive jitter buffer in packets (the CLI default is 1)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mic-processing", action="store_true",
                        help="keep echo cancellation / noise suppression / auto gain on")
    args = parser.parse_args()

    limit_host_addresses(["127.0.0.1"])  # aioice offers no loopback candidate by itself
    with tempfile.TemporaryDirectory() as tmp:
        signal_path = Path(tmp) / "test_signal.wav"
        save_wav(str(signal_path), make_test_signal(SIGNAL_SECONDS, 48000, level=0.25), 48000)
        runner, agent, url = await start_server(args.port, args.jitter_buffer)
        results: list[CallResult] = []
        try:
            async with launch_chromium(signal_path) as browser:
                for index in range(args.calls):
                    result = await one_call(browser, url, args.record_seconds,
                                            "" if args.mic_processing else PAGE_QUERY)
                    results.append(result)
                    print(f"call {index + 1}: connect {result.connect_ms:.0f} ms, first audio "
                          f"{result.first_audio_ms:.0f} ms, echo {result.echo_ms:.0f} ms "
                          f"(r={result.correlation:.2f})", flush=True)
                    for _ in range(100):  # the next call starts on an idle agent
                        if not agent.webrtc_legs:
                            break
                        await asyncio.sleep(0.05)
        finally:
            await runner.cleanup()

    print()
    processing = "on" if args.mic_processing else "off"
    print(f"Chromium -> agent (echo plugin, jitter buffer {args.jitter_buffer} packet(s)) on "
          f"loopback, {len(results)} calls, mic processing {processing}")
    header = ("call", "connect ms", "1st audio ms", "echo RTT ms", "corr", "ICE RTT ms",
              "playout ms")
    rows = [
        (str(i + 1), fmt(r.connect_ms), fmt(r.first_audio_ms), fmt(r.echo_ms),
         fmt(r.correlation, 2), fmt(r.ice_rtt_ms, 1), fmt(r.playout_ms))
        for i, r in enumerate(results)
    ]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    rows.append((
        "median",
        fmt(med([r.connect_ms for r in results])),
        fmt(med([r.first_audio_ms for r in results])),
        fmt(med([r.echo_ms for r in results])),
        fmt(med([r.correlation for r in results]), 2),
        fmt(med([r.ice_rtt_ms for r in results if r.ice_rtt_ms is not None]), 1),
        fmt(med([r.playout_ms for r in results if r.playout_ms is not None])),
    ))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("connect: Call pressed -> RTCPeerConnection 'connected' (includes getUserMedia and "
          "ICE gathering)")
    print("1st audio: Call pressed -> the page's output analyser first above -48 dBFS")
    print("echo RTT: mic capture -> agent echo heard by the page (same AudioContext clock)")
    print(f"ICE pair: {results[0].pair if results else '?'}")
    return 0 if results and all(r.correlation > 0.5 for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
