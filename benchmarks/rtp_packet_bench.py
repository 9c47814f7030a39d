"""Holes in an RTP leg's echo per packet duration (10, 20, 23.2, 30, 40, 60 ms).

    python benchmarks/rtp_packet_bench.py [--seconds 30] [--durations 10,20,23.2,30,40,60]

Starts `python -m signaling` (echo plugin) on a free port, and for each packet duration opens
a PCMU leg whose `remote` is a local socket, sends the built-in test signal as μ-law RTP in
packets of that duration (paced on the sender's clock, from a port other than `remote`, as
ffmpeg and many PBXs do), records what comes back and prints a table: packets sent, the
duration the leg detected, jitter-buffer underruns, echo correlation, and holes (250 ms
windows that did not come back) per minute after the first second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
import urllib.request

import numpy as np
from aiortc.rtp import RtpPacket
from harness import agent_command, free_port

from agent.telephony.codec import PCMU
from agent.testing.testsignal import make_test_signal, measure_echo

RATE = 8000


class Receiver(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.payloads.append(RtpPacket.parse(data).payload)


def http_json(method: str, url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


async def run_one(base: str, duration_ms: float, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    receive, receiver = await loop.create_datagram_endpoint(Receiver, local_addr=("127.0.0.1", 0))
    send, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol,
                                                  local_addr=("127.0.0.1", 0))
    remote = f"127.0.0.1:{receive.get_extra_info('sockname')[1]:d}"
    leg = await asyncio.to_thread(http_json, "POST", f"{base}/v1/telephony/rtp",
                                  {"remote": remote, "codec": "PCMU"})
    host, port = leg["local"].rsplit(":", 1)
    signal = make_test_signal(seconds, RATE)
    pcm = (signal * 32767).astype(np.int16)
    started = time.monotonic()
    position, sequence, sent = 0.0, 0, 0
    while position < len(pcm):
        # Fractional durations (23.2 ms = 185.6 samples) alternate sizes as ffmpeg's do.
        end = min(len(pcm), int(round(position + duration_ms * RATE / 1000)))
        chunk = pcm[int(position):end]
        packet = RtpPacket(payload_type=0, sequence_number=sequence & 0xFFFF,
                           timestamp=int(position) & 0xFFFFFFFF, ssrc=0x5EED,
                           payload=PCMU.encode(chunk))
        send.sendto(packet.serialize(), (host, int(port)))
        sent += 1
        sequence += 1
        position = end
        await asyncio.sleep(max(0.0, started + position / RATE - time.monotonic()))
    await asyncio.sleep(1.0)
    stats = await asyncio.to_thread(http_json, "GET", f"{base}/v1/telephony/rtp/{leg['call_id']}")
    await asyncio.to_thread(http_json, "DELETE", f"{base}/v1/telephony/rtp/{leg['call_id']}")
    receive.close()
    send.close()
    heard = PCMU.decode(b"".join(receiver.payloads)).astype(np.float32) / 32768
    lag = measure_echo(signal, heard, RATE, max_lag_seconds=3.0).lag_seconds
    echo = measure_echo(signal, heard[: int((lag + seconds - 0.25) * RATE)], RATE,
                        max_lag_seconds=3.0)
    return {
        "sent": sent, "packet_ms": stats.get("packet_ms"),
        "underruns": stats["jitter"]["underruns"], "correlation": round(echo.correlation, 3),
        "holes_per_min": round(echo.holes * 60 / max(1e-9, seconds - 1), 2),
        "delay_ms": round(lag * 1000, 1),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--durations", default="10,20,23.2,30,40,60")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(agent_command(port))
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                await asyncio.to_thread(http_json, "GET", f"{base}/health")
                break
            except OSError:
                await asyncio.sleep(0.2)
        print(f"RTP leg echo, PCMU, {args.seconds:g} s per row, echo plugin")
        print("| packet ms | sent | detected ms | underruns | correlation | holes/min | delay ms |")
        print("|---|---|---|---|---|---|---|")
        for text in args.durations.split(","):
            row = await run_one(base, float(text), args.seconds)
            print(f"| {text} | {row['sent']} | {row['packet_ms']} | {row['underruns']} | "
                  f"{row['correlation']} | {row['holes_per_min']} | {row['delay_ms']} |",
                  flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
