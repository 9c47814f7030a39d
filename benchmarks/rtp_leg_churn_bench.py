"""RTP legs opened and closed in rounds: the server's memory, threads and fds must stay flat.

    python benchmarks/rtp_leg_churn_bench.py [--legs 100] [--rounds 3] [--at-once 10]

One server process (echo plugin). Each round opens `--legs` RTP legs, `--at-once` at a time,
each sent two seconds of μ-law from its own UDP socket so its codec, resampler and jitter
buffer all run, then ends them with DELETE. After each round (no leg left), the server's
resident memory, threads and open file descriptors are read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import time

import aiohttp
from aiortc.rtp import RtpPacket
from harness import ROOT, agent_command, free_port, wait_for_port
from soak_bench import proc_figures


async def one_leg(http: aiohttp.ClientSession, url: str, seconds: float) -> None:
    caller = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    caller.bind(("127.0.0.1", 0))
    caller.setblocking(False)
    port = caller.getsockname()[1]
    try:
        async with http.post(f"{url}/v1/telephony/rtp",
                             json={"remote": f"127.0.0.1:{port}"}) as response:
            body = await response.json()
            assert response.status == 201, body
        host, _, leg_port = body["local"].rpartition(":")
        for index in range(int(seconds / 0.02)):
            packet = RtpPacket(payload_type=0, sequence_number=index, timestamp=index * 160,
                               ssrc=1234, payload=b"\xff" * 160)
            caller.sendto(packet.serialize(), (host, int(leg_port)))
            await asyncio.sleep(0.02)
        async with http.delete(f"{url}/v1/telephony/rtp/{body['call_id']}") as response:
            assert response.status == 200
    finally:
        caller.close()


async def run(url: str, pid: int, legs: int, rounds: int, at_once: int) -> None:
    print("| round | legs so far | RSS MiB | threads | fds |")
    print("|---|---|---|---|---|")
    figures = proc_figures(pid)
    print(f"| before | 0 | {figures['rss_mib']:.1f} | {figures['threads']} | {figures['fds']} |")
    async with aiohttp.ClientSession() as http:
        for round_index in range(1, rounds + 1):
            for start in range(0, legs, at_once):
                await asyncio.gather(*(one_leg(http, url, 2.0)
                                       for _ in range(min(at_once, legs - start))))
            while True:
                async with http.get(f"{url}/health") as response:
                    if (await response.json())["active_calls"] == 0:
                        break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            figures = proc_figures(pid)
            print(f"| {round_index} | {round_index * legs} | {figures['rss_mib']:.1f} | "
                  f"{figures['threads']} | {figures['fds']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--at-once", type=int, default=10)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        agent_command(port, "--max-unauthenticated-per-address", "0"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        time.sleep(1.0)
        asyncio.run(run(f"http://127.0.0.1:{port}", server.pid, args.legs, args.rounds,
                        args.at_once))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
