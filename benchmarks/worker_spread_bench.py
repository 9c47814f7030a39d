"""How `--workers 2` spreads new calls over its workers: calls held by each, mid-call.

    python benchmarks/worker_spread_bench.py [--kinds media-stream,rtp,webrtc]
                                             [--counts 20,60,100] [--workers 2]

Each level starts a fresh server (as `workers_bench.py` does), waits for all its workers,
opens `count` calls of one kind from this process, all at once (a bridge's or a test rig's
burst; WebRTC callers are staggered 0.15 s apart, like arrivals), reads `/health` while every
call is live and prints the calls each worker holds. Which worker accepts a connection is the
kernel's (and asyncio's) choice; a worker holding more calls than another then hands a new
call there: one over HTTP (RTP legs, WebRTC offers) is re-posted, a media-stream websocket is
handed as the connection itself (signaling/workers/load.py, signaling/workers/handoff.py).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable
from typing import Any

import aiohttp
from echo_bench import STAGGER_S, run_callers
from telephony_capacity_bench import ClientsRun, run_media_stream_clients, run_rtp_clients
from workers_bench import agent

HOLD_SECONDS = 8.0


async def worker_health(url: str) -> list[dict[str, Any]]:
    """`/health`'s list of workers."""
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as response:
            return list((await response.json()).get("workers", []))


async def held_per_worker(url: str, after_s: float) -> list[int]:
    await asyncio.sleep(after_s)
    return [int(worker.get("active_calls") or 0) for worker in await worker_health(url)]


async def every_worker_up(url: str, workers: int) -> None:
    """Worker 0 listens first: wait until `/health` lists every worker with its pid."""
    for _ in range(600):
        if sum(1 for worker in await worker_health(url) if worker.get("pid")) == workers:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the workers did not all start")


async def sessions(clients: Awaitable[ClientsRun]) -> list[dict[str, Any]]:
    """The bridge clients' per-session summaries (their own figures are not needed here)."""
    summaries, _ = await clients
    return summaries


async def level(url: str, kind: str, count: int) -> tuple[list[int], int]:
    """Calls each worker held mid-call, and how many of the `count` calls connected."""
    if kind == "media-stream":
        calls, ramp_s = sessions(run_media_stream_clients(url, count, HOLD_SECONDS)), 1.0
    elif kind == "rtp":
        calls, ramp_s = sessions(run_rtp_clients(url, count, HOLD_SECONDS)), 1.0
    else:  # staggered arrivals: each call lasts until the last one has been live a while
        ramp_s = count * STAGGER_S + 2
        calls = run_callers(url, count, ramp_s + HOLD_SECONDS, "opus", True)
    held, reports = await asyncio.gather(held_per_worker(url, ramp_s + HOLD_SECONDS / 3), calls)
    return held, sum(1 for report in reports if _connected(report))


def _connected(report: dict[str, Any]) -> bool:
    return bool(report.get("opened", report.get("connected", True))) and not report.get("error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="media-stream,rtp,webrtc")
    parser.add_argument("--counts", default="20,60,100")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"\n### New calls over {args.workers} workers (one client, {HOLD_SECONDS:g} s calls)\n")
    print("| kind | calls | connected | held by each worker |")
    print("|---|---|---|---|")
    for kind in args.kinds.split(","):
        for count in [int(n) for n in args.counts.split(",")]:
            with agent(args.workers) as (url, _):
                asyncio.run(every_worker_up(url, args.workers))
                held, connected = asyncio.run(level(url, kind, count))
            print(f"| {kind} | {count} | {connected} | {' / '.join(map(str, held))} |",
                  flush=True)


if __name__ == "__main__":
    main()
