"""Delay after a model stall: does a call's round trip come back to where it was?

    python benchmarks/stall_recovery_bench.py                  # one 250 ms stall at 5 s
    python benchmarks/stall_recovery_bench.py --stall-ms 150 --seconds 40

An in-process agent runs the echo plugin with one step that takes `--stall-ms` longer at
`--stall-at` seconds (a GC pause, a GPU hiccup). A real aiortc caller on 127.0.0.1 sends
speech-like bursts (0.7 s of band-limited noise, 0.5 s of silence) for `--seconds` and
records the echo. The echo's lag is measured per burst by cross-correlation; the table shows
how much later than before the stall the echo comes back, early and late in the call.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

import numpy as np
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import PluginSession, StepOutput
from agent.plugins.echo import EchoPlugin
from agent.rtc_tuning import limit_host_addresses
from agent.testing.peer import PEER_RATE, run_call
from agent.testing.testsignal import decimate, make_test_signal
from signaling.app import create_app

BURST_SECONDS = 0.7
PAUSE_SECONDS = 0.5
RATE = 8000


class StallingEcho(EchoPlugin):
    """Echo whose step at one tick takes `stall_seconds` longer."""

    id = "stalling-echo"

    def __init__(self, stall_tick: int, stall_seconds: float) -> None:
        super().__init__()
        self.stall_tick = stall_tick
        self.stall_seconds = stall_seconds
        self.ticks = 0

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        self.ticks += 1
        if self.ticks == self.stall_tick:
            time.sleep(self.stall_seconds)
        return super().step(batch)


def bursts(seconds: float) -> np.ndarray:
    signal = make_test_signal(seconds, PEER_RATE)
    period = BURST_SECONDS + PAUSE_SECONDS
    t = np.arange(len(signal)) / PEER_RATE
    return (signal * ((t % period) < BURST_SECONDS)).astype(np.float32)


def burst_lags(sent: np.ndarray, received: np.ndarray, max_lag: float = 1.5
               ) -> list[tuple[float, float]]:
    """(burst start in seconds, lag in ms) for every burst that came back."""
    s, r = decimate(sent, PEER_RATE, RATE), decimate(received, PEER_RATE, RATE)
    period = BURST_SECONDS + PAUSE_SECONDS
    out = []
    start = 0.0
    while (start + BURST_SECONDS) * RATE + max_lag * RATE < len(r):
        lo, hi = int((start + 0.1) * RATE), int((start + BURST_SECONDS - 0.1) * RATE)
        piece = s[lo:hi]
        region = r[lo: hi + int(max_lag * RATE)]
        scores = np.correlate(region, piece, mode="valid")
        lag = int(np.argmax(scores))
        norm = np.sqrt(np.sum(piece**2) * np.sum(region[lag: lag + len(piece)] ** 2))
        if norm > 0 and scores[lag] / norm > 0.5:
            out.append((start, lag / RATE * 1000))
        start += period
    return out


async def run(seconds: float, stall_at: float, stall_ms: float) -> list[tuple[float, float]]:
    limit_host_addresses(["127.0.0.1"])
    plugin = StallingEcho(stall_tick=int(stall_at / 0.08), stall_seconds=stall_ms / 1000)
    agent = MediaAgent(plugin, AgentSettings())
    server = TestServer(create_app(agent), host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        report, sent, received = await run_call(url, signal=bursts(seconds), seconds=seconds)
        if not report.connected:
            raise RuntimeError(report.error)
        return burst_lags(sent, received)
    finally:
        await server.close()
        await agent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--stall-at", type=float, default=5.0)
    parser.add_argument("--stall-ms", type=float, default=250.0)
    args = parser.parse_args()
    lags = asyncio.run(run(args.seconds, args.stall_at, args.stall_ms))
    before = [lag for start, lag in lags if start + BURST_SECONDS < args.stall_at - 0.5]
    baseline = float(np.median(before)) if before else float("nan")
    print(f"\n### Echo lag per burst, one {args.stall_ms:g} ms stall at {args.stall_at:g} s "
          f"(lag of the recorded stream; change vs before the stall)\n")
    print("| burst at s | lag ms | vs before the stall ms |")
    print("|---|---|---|")
    for start, lag in lags:
        print(f"| {start:.1f} | {lag:.1f} | {lag - baseline:+.1f} |")
    tail = [lag for start, lag in lags if start > args.seconds - 6]
    if tail:
        print(f"\nlast 6 s vs before the stall: {float(np.median(tail)) - baseline:+.1f} ms")


if __name__ == "__main__":
    main()
