"""Soak: many rounds of calls, abandoned offers and bad requests against one server process;
the server's memory, file descriptors, threads and event-loop tasks must stay flat.

    python benchmarks/soak_bench.py                       # 12 rounds, 8 calls per round
    python benchmarks/soak_bench.py --rounds 30 --calls 16 --seconds 3

The agent (echo plugin, `--connect-timeout 3` so abandoned offers expire within a round) runs
pinned to core 0; this process makes the calls from core 1. Each round: `--calls` real aiortc
calls at once (half on `/offer`, half on `/v1/realtime/calls`, each with a data channel), two
offers whose caller never connects, and 20 malformed requests. After the round the script
waits until the server reports no active call, then reads the server's resident memory, open
file descriptors and threads from /proc and its event-loop task count from `/health`.
Prints a markdown table: one row per round, and the growth from round 2 to the last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from harness import ROOT, agent_command, free_port, taskset, wait_for_port

BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/offer", {"data": "{not json", "headers": {"Content-Type": "application/json"}}),
    ("POST", "/offer", {"json": {"sdp": "v=0\r\n", "type": "offer"}}),
    ("POST", "/offer", {"json": {"type": "offer"}}),
    ("POST", "/offer", {"json": {"sdp": "x", "type": "answer"}}),
    ("POST", "/offer", {"data": b"x" * 300_000, "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/realtime/calls",
     {"data": "garbage", "headers": {"Content-Type": "application/sdp"}}),
    ("POST", "/v1/realtime/calls", {"data": "{}", "headers": {"Content-Type": "text/plain"}}),
    ("DELETE", "/v1/realtime/calls/call_nope", {}),
    ("PATCH", "/v1/realtime/calls/call_nope", {"data": "a=x", "headers": {
        "Content-Type": "application/trickle-ice-sdpfrag"}}),
    ("POST", "/v1/telephony/rtp", {"json": {"remote": "nowhere"}}),
]


def proc_figures(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
    }


async def abandoned_offer(http: aiohttp.ClientSession, url: str) -> None:
    """An offer whose caller never answers ICE: the server must expire it by itself."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("audio")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(url + "/v1/realtime/calls", data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as response:
        await response.read()
    await pc.close()


async def one_round(url: str, calls: int, seconds: float) -> dict[str, Any]:
    from agent.testing.peer import run_call

    async with aiohttp.ClientSession() as http:
        async def call(index: int) -> Any:
            await asyncio.sleep(index * 0.05)
            endpoint = url + ("/offer" if index % 2 else "/v1/realtime/calls")
            report, _, _ = await run_call(endpoint, seconds=seconds)
            return report

        async def bad() -> int:
            refused = 0
            for method, path, kwargs in BAD_REQUESTS * 2:
                async with http.request(method, url + path, **kwargs) as response:
                    await response.read()
                    refused += 400 <= response.status < 500
            return refused

        results = await asyncio.gather(
            *(call(i) for i in range(calls)), abandoned_offer(http, url),
            abandoned_offer(http, url), bad())
    reports, refused = results[:calls], results[-1]
    ok = [r for r in reports if r.connected and not r.error]
    correlation = min((r.correlation or 0.0 for r in ok), default=0.0)
    return {"calls_ok": len(ok), "refused_4xx": refused, "min_correlation": correlation}


async def wait_idle(url: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(url + "/health") as response:
                health = await response.json()
            if health["active_calls"] == 0 or time.monotonic() > deadline:
                return health
            await asyncio.sleep(0.2)


async def soak(url: str, pid: int, rounds: int, calls: int, seconds: float) -> list[dict[str, Any]]:
    from agent.rtc_tuning import limit_host_addresses

    limit_host_addresses(["127.0.0.1"])
    rows = []
    for index in range(1, rounds + 1):
        result = await one_round(url, calls, seconds)
        health = await wait_idle(url)
        await asyncio.sleep(0.5)  # let closed sockets and threads wind down
        rows.append({"round": index, **result, "active_after": health["active_calls"],
                     "loop_tasks": health["event_loop_tasks"], **proc_figures(pid)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    port = free_port()
    command = taskset("0") + agent_command(port, "--ice-host", "127.0.0.1", "--connect-timeout",
                                           "3", "--max-unauthenticated-per-address", "0")
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {1})
    try:
        wait_for_port(port)
        rows = asyncio.run(soak(f"http://127.0.0.1:{port}", server.pid, args.rounds, args.calls,
                                args.seconds))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(15)
    print(f"\n### Soak: {args.rounds} rounds of {args.calls} calls ({args.seconds:g} s), 2 "
          f"abandoned offers and {2 * len(BAD_REQUESTS)} bad requests each (echo, server on "
          "one core)\n")
    print("| round | calls ok | 4xx | min echo correlation | active after | loop tasks | RSS MiB "
          "| fds | threads |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['round']} | {row['calls_ok']}/{args.calls} | {row['refused_4xx']} | "
              f"{row['min_correlation']:.3f} | {row['active_after']} | {row['loop_tasks']} | "
              f"{row['rss_mib']:.1f} | {row['fds']} | {row['threads']} |")
    if len(rows) >= 3:
        first, last = rows[1], rows[-1]
        print(f"\nround 2 → {len(rows)}: RSS {last['rss_mib'] - first['rss_mib']:+.1f} MiB, "
              f"fds {last['fds'] - first['fds']:+d}, "
              f"threads {last['threads'] - first['threads']:+d}, "
              f"loop tasks {last['loop_tasks'] - first['loop_tasks']:+d}")


if __name__ == "__main__":
    main()
