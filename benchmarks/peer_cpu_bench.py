"""The headless peer's own CPU per call against the agent's, per transport.

A load test must measure the agent, not its callers: issue 33 asks that the peer spend at
least 4x fewer CPU cycles per call than the agent's echo path. This script starts the agent
(`python -m signaling`, echo plugin, one worker, SIP on loopback) pinned to core 0, pins
itself to core 1, and for each transport places `--calls` concurrent calls of `--seconds`
with the peer's transports (`open_call`: connect, play the test signal, hang up; the
load-test mode of `python -m agent.peer --repeat N --concurrency M`), then
measures and judges each call as `python -m agent.peer --repeat N --concurrency M` does
(`measure_into`: first audio, echo delay, jitter, gaps; `analyse`: both channels' speech
segments, turn latencies and the checks; PESQ is off in that mode). It reads the server's
CPU time (its process tree, /proc) and its own (`time.process_time()`, every thread) around
the calls and around the measuring, and prints CPU seconds per call-second for each and the
ratios, for each number of concurrent calls in `--calls` (a load test runs many; with few,
each call's set-up weighs more). One warm-up call per transport and level first, so imports,
one-off tables and the run's one test signal (made and encoded once for all its calls) are
not counted.

Every transport and level runs `--rounds` times, interleaved (this machine's speed moves
from minute to minute), and the table gives the medians.

    python benchmarks/peer_cpu_bench.py [--calls 8,32] [--seconds 4] [--rounds 3]
        [--transports webrtc,rtp]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass

from harness import agent_command, free_port, server_on_core0, tree_cpu_seconds

from agent.rtc_tuning import limit_host_addresses
from agent.testing.peer.call import test_signal
from agent.testing.peer.measure import measure_into
from agent.testing.peer.report import CallReport
from agent.testing.peer.run import CallPlan, analyse
from agent.testing.peer.transports.base import PeerCall, PeerOptions, open_call

TRANSPORTS = ["webrtc", "realtime", "media-stream", "rtp", "sip"]


@dataclass
class Row:
    transport: str
    calls: int
    passed: int
    peer_live: float  # CPU seconds per call-second while the calls ran
    peer_measure: float  # CPU seconds per call-second measuring them afterwards
    agent: float


async def one_call(url: str, transport: str, seconds: float,
                   hold: float | None = None) -> PeerCall:
    """A call playing the test signal of `seconds`, hung up after `hold` (default: all of
    it)."""
    call = open_call(url, transport, PeerOptions(timeout=20.0, extra={"defer_decoding": True}))
    try:
        await call.connect()
        call.play(test_signal(seconds))
        await asyncio.sleep(seconds if hold is None else hold)
        await call.hangup()
    finally:
        await call.close()
    return call


async def calls(url: str, transport: str, count: int, seconds: float) -> list[PeerCall]:
    return list(await asyncio.gather(*[one_call(url, transport, seconds)
                                       for _ in range(count)]))


def run_level(pid: int, url: str, transport: str, count: int, seconds: float) -> Row:
    # Warm-up: imports, codec tables, and the run's one test signal of `seconds`, made and
    # encoded once for every call of a run (a load run shares them: EncodedPlayback).
    asyncio.run(one_call(url, transport, seconds, hold=0.5))
    time.sleep(0.5)
    agent_before, peer_before = tree_cpu_seconds(pid), time.process_time()
    placed = asyncio.run(calls(url, transport, count, seconds))
    time.sleep(0.5)  # the server finishes closing the calls
    agent_cpu = tree_cpu_seconds(pid) - agent_before
    peer_live = time.process_time() - peer_before
    before_measure = time.process_time()
    plan = CallPlan(url=url, transport=transport, pesq="off")
    reports = [measure_into(CallReport(), call) for call in placed]
    for index, (report, call) in enumerate(zip(reports, placed, strict=True)):
        analyse(plan, report, call, [], index)
    peer_measure = time.process_time() - before_measure
    call_seconds = count * seconds
    passed = sum(r.ok and (r.correlation or 0) > 0.8 for r in reports)
    return Row(transport, count, passed, peer_live / call_seconds, peer_measure / call_seconds,
               agent_cpu / call_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="8,32",
                        help="concurrent calls per level, comma-separated (default 8,32)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--rounds", type=int, default=3,
                        help="times every transport and level is run, interleaved; the "
                        "table gives medians (default 3)")
    args = parser.parse_args()
    port, sip_port = free_port(), free_port()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    limit_host_addresses(["127.0.0.1"])
    command = agent_command(port, "--ice-host", "127.0.0.1", "--sip-listen",
                            f"127.0.0.1:{sip_port}", "--sip-invite-rate", "0")
    transports = [t for t in args.transports.split(",") if t]
    levels = [int(c) for c in args.calls.split(",") if c]
    rows: dict[tuple[str, int], list[Row]] = {(t, c): [] for t in transports for c in levels}
    with server_on_core0(command, port) as pid:
        time.sleep(1.0)  # the server's start-up CPU is not a call's
        for _ in range(max(1, args.rounds)):
            for transport in transports:
                url = (f"sip:agent@127.0.0.1:{sip_port}" if transport == "sip"
                       else f"http://127.0.0.1:{port}")
                for count in levels:
                    rows[transport, count].append(
                        run_level(pid, url, transport, count, args.seconds))
    print(f"\nConcurrent calls of {args.seconds:g} s per transport, echo plugin, "
          f"{max(1, args.rounds)} interleaved rounds: medians (the live ratio's range over "
          "the rounds in brackets). CPU seconds per call-second; agent on core 0, peer on "
          "core 1.\n")
    print("| transport | calls ok | peer, live | peer, measuring after | agent | "
          "agent / peer live | agent / peer all |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (transport, count), runs in rows.items():
        live = statistics.median([r.peer_live for r in runs])
        after = statistics.median([r.peer_measure for r in runs])
        agent = statistics.median([r.agent for r in runs])
        ratios = [r.agent / r.peer_live for r in runs]
        passed = sum(r.passed for r in runs)
        print(f"| {transport} | {passed}/{count * len(runs)} | {live:.4f} | {after:.4f} | "
              f"{agent:.4f} | {agent / live:.1f}x [{min(ratios):.1f}–{max(ratios):.1f}] | "
              f"{agent / (live + after):.1f}x |")


if __name__ == "__main__":
    main()
