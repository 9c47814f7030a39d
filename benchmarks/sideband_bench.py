"""What a call's sidebands cost: the call side of the fan-out (`Leg.emit` with N sidebands
attached, and each 80 ms answer's transcript/speech tracking that a telephony leg's first
sideband turns on), and how fast events reach N websocket sidebands over loopback.

    python benchmarks/sideband_bench.py [--sidebands 0,1,4,16] [--events 20000]

Prints two markdown tables. The first is the time the call itself spends (on the event loop)
per emitted event, and per 80 ms answer; the second the delivery of a burst of events
to N real websocket clients of an in-process server (events/s received in all, and the
median and 99th percentile from emit to receipt while the burst drains).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import numpy as np
from aiohttp.test_utils import TestServer

from agent.call_settings import CallSettings
from agent.leg import Leg
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import StepOutput
from agent.plugins.echo import EchoPlugin
from agent.realtime.events import server_event
from agent.ticker import Ticker
from signaling.app import create_app


async def emit_cost(counts: list[int], events: int) -> list[tuple[int, float, float]]:
    """(sidebands, µs per emit, µs per 80 ms answer) with sidebands that are drained."""
    rows = []
    plugin = EchoPlugin()
    ticker = Ticker(plugin)
    rate = plugin.capabilities().sample_rate
    audio = (np.random.default_rng(1).standard_normal(int(rate * 0.08)) * 0.1).astype(np.float32)
    for count in counts:
        leg = Leg(f"call_bench{count}", plugin, ticker, CallSettings(), lambda leg: None)
        # Room for every event of both phases (one transcript delta per answer): none dropped.
        sidebands = [leg.sidebands.attach(limit=3 * events) for _ in range(count)]
        event = server_event("input_audio_buffer.dtmf_event_received", event="1")
        per_emit = per_answer = float("inf")
        output = StepOutput(audio=audio, text="word ")
        for _ in range(3):  # the best of three: the least disturbed by the rest of the machine
            started = time.perf_counter()
            for _ in range(events // 3):
                leg.emit(event)
            per_emit = min(per_emit, (time.perf_counter() - started) / (events // 3) * 1e6)
            started = time.perf_counter()
            for _ in range(events // 10):
                leg.sidebands.on_output(output, audio)
            per_answer = min(per_answer,
                             (time.perf_counter() - started) / (events // 10) * 1e6)
        rows.append((count, per_emit, per_answer))
        for sideband in sidebands:
            sideband.close()
        await leg.close("bench")
    await ticker.close()
    return rows


async def read(socket: aiohttp.ClientWebSocketResponse, events: int,
               delays: list[float]) -> None:
    """Receive `events` events, noting how long each took since it was emitted."""
    for _ in range(events):
        message = await socket.receive()
        delays.append(time.perf_counter() - json.loads(message.data)["t"])


async def delivery(counts: list[int], events: int) -> list[tuple[int, float, float, float]]:
    """(sidebands, events/s received in all, p50 ms, p99 ms) for a burst over websockets."""
    rows = []
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    server = TestServer(create_app(agent), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as http:
            bridge = await http.ws_connect(url + "/v1/telephony/media-stream")
            await bridge.send_str(json.dumps({"event": "start", "start": {
                "streamSid": "MZb", "mediaFormat": {"encoding": "audio/x-mulaw",
                                                    "sampleRate": 8000, "channels": 1}}}))
            while not any(leg.slot for leg in agent.legs):
                await asyncio.sleep(0.01)
            (leg,) = list(agent.legs)
            for count in [c for c in counts if c > 0]:
                sockets = [await http.ws_connect(f"{url}/v1/realtime?call_id={leg.id}")
                           for _ in range(count)]
                for socket in sockets:
                    await socket.receive()  # session.created
                delays: list[float] = []

                readers = [asyncio.ensure_future(read(socket, events, delays))
                           for socket in sockets]
                started = time.perf_counter()
                # In slices the queues can hold, yielding between them as a busy call would.
                for index in range(events):
                    leg.emit({"type": "bench", "t": time.perf_counter()})
                    if index % 100 == 99:
                        await asyncio.sleep(0)
                await asyncio.wait_for(asyncio.gather(*readers), 60)
                elapsed = time.perf_counter() - started
                rows.append((count, count * events / elapsed,
                             float(np.percentile(delays, 50)) * 1e3,
                             float(np.percentile(delays, 99)) * 1e3))
                for socket in sockets:
                    await socket.close()
            await bridge.close()
    finally:
        await server.close()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidebands", default="0,1,4,16")
    parser.add_argument("--events", type=int, default=20000)
    args = parser.parse_args()
    counts = [int(n) for n in args.sidebands.split(",")]
    print("| sidebands | µs per emitted event | µs per 80 ms answer (telephony leg) |")
    print("| --- | --- | --- |")
    for count, per_emit, per_answer in await emit_cost(counts, args.events):
        print(f"| {count} | {per_emit:.2f} | {per_answer:.2f} |")
    print()
    burst = min(args.events, 2000)
    print(f"| sidebands | events/s received (burst of {burst} each) | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- |")
    for count, rate, p50, p99 in await delivery(counts, burst):
        print(f"| {count} | {rate:,.0f} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
