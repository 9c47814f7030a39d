"""Latency budget of the remote-engine plugins against the test suite's fake engines.

Each call is a real aiortc peer on loopback calling a real agent server whose plugin talks
to an in-process fake engine (tests/support/fake_engines.py: echoes the caller, vllm-omni protocol
with odd-sized pcm16 deltas, or Moshi protocol with Ogg-Opus both ways). For comparison the
echo plugin (no engine) runs the same calls. Per call: the peer's measured round trip of its
test signal, and the plugin's own numbers from /metrics/calls (upstream round trip per frame,
the agent's input hold = ticker → websocket, output hold = engine frame complete → ticker).
Everything shares this machine's cores, so absolute numbers include that contention.

    python benchmarks/remote_latency_bench.py [--calls 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import aiohttp
import harness  # noqa: F401 (puts tests.support on the path)
from aiohttp.test_utils import TestServer

from agent.media_agent import MediaAgent
from agent.plugins.base import Plugin
from agent.plugins.echo import EchoPlugin
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from agent.plugins.remote.vllm_omni import VllmOmniPlugin
from agent.rtc_tuning import limit_host_addresses
from agent.testing.peer import run_call
from signaling.app import create_app
from tests.support.fake_engines import FakeMoshi, FakeVllmOmni


async def plugin_stats(url: str) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/metrics/calls") as response:
            calls = (await response.json())["calls"]
    return calls[0].get("plugin_session") if calls else None


async def measure(plugin: Plugin, calls: int, seconds: float) -> dict[str, Any]:
    agent = MediaAgent(plugin)
    server = TestServer(create_app(agent), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    delays, rtt_p50, rtt_p95, in_hold, out_hold, added = [], [], [], [], [], []
    try:
        for _ in range(calls):
            call = asyncio.ensure_future(run_call(url, seconds=seconds))
            await asyncio.sleep(seconds - 0.5)
            stats = await plugin_stats(url)
            report, _, _ = await call
            while agent.webrtc_legs:  # a moshi server holds one call: wait until it is freed
                await asyncio.sleep(0.1)
            if not report.ok or report.delay_ms is None:
                raise SystemExit(f"call failed: {report.error}")
            delays.append(report.delay_ms)
            if stats:
                latency = stats["latency"]
                rtt_p50.append(latency["upstream_rtt"]["p50_ms"])
                rtt_p95.append(latency["upstream_rtt"]["p95_ms"])
                in_hold.append(latency["agent_input_hold"]["mean_ms"])
                out_hold.append(latency["agent_output_hold"]["mean_ms"])
                added.append(latency["agent_added_mean_ms"])
    finally:
        await server.close()

    def mean(values: list[float]) -> str:
        return f"{statistics.mean(values):.1f}" if values else "-"

    return {"delay": mean(delays), "rtt_p50": mean(rtt_p50), "rtt_p95": mean(rtt_p95),
            "in_hold": mean(in_hold), "out_hold": mean(out_hold), "added": mean(added)}


async def codec_cost() -> None:
    """Ticker-thread time per call per 80 ms frame spent encoding input and decoding output."""
    import base64
    import time

    import numpy as np
    import sphn

    from agent.plugins.remote.link import LinkSettings
    from agent.plugins.remote.moshi_server import MoshiLink
    from agent.plugins.remote.pool import UpstreamPool
    from agent.plugins.remote.vllm_omni import VllmOmniLink

    pool = UpstreamPool(["ws://unused"])
    rng = np.random.default_rng(0)
    frames = [(0.1 * rng.standard_normal(1920)).astype(np.float32) for _ in range(250)]
    writer = sphn.OpusStreamWriter(24000)
    inputs = {
        "vllm-omni": (VllmOmniLink, [base64.b64encode((f * 32767).astype("<i2").tobytes())
                                     .decode() for f in frames]),
        "moshi-server": (MoshiLink, [writer.append_pcm(f) for f in frames]),
    }
    print("\n| plugin | encode + decode per call per 80 ms frame (ticker thread) |")
    print("|---|---|")
    for name, (link_class, payloads) in inputs.items():
        link = link_class(pool.acquire(), LinkSettings(), 24000, 1920)
        started = time.perf_counter()
        for frame, payload in zip(frames, payloads, strict=True):
            link.encode_input(frame)
            link.decode_audio(payload)
        per_frame = (time.perf_counter() - started) / len(frames) * 1000
        print(f"| {name} | {per_frame:.3f} ms |")


async def main_async(calls: int, seconds: float) -> None:
    limit_host_addresses(["127.0.0.1"])
    vllm, moshi = await FakeVllmOmni().start(), await FakeMoshi().start()
    rows = [
        ("echo (no engine)", EchoPlugin()),
        ("vllm-omni → fake", VllmOmniPlugin([vllm.url])),
        ("moshi-server → fake", MoshiServerPlugin([moshi.url])),
    ]
    print(f"{calls} calls x {seconds:g} s each, opus, loopback; means over calls (ms)\n")
    print("| plugin | peer round trip | upstream rtt p50 | upstream rtt p95 | "
          "agent input hold | agent output hold | agent added |")
    print("|---|---|---|---|---|---|---|")
    try:
        for name, plugin in rows:
            r = await measure(plugin, calls, seconds)
            print(f"| {name} | {r['delay']} | {r['rtt_p50']} | {r['rtt_p95']} | "
                  f"{r['in_hold']} | {r['out_hold']} | {r['added']} |", flush=True)
    finally:
        await vllm.close()
        await moshi.close()
    await codec_cost()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(main_async(args.calls, args.seconds))


if __name__ == "__main__":
    main()
