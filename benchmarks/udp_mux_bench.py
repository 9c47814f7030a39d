"""What `--rtc-udp-port` costs: server CPU per call with every call on one UDP port against a
socket per call, the mux's own work per datagram, and the memory of its table entries.

    python benchmarks/udp_mux_bench.py [all|cpu|dispatch|memory] [--calls 8] [--seconds 6]
                                       [--rounds 1]

`cpu`: the server (echo plugin, one worker, pinned to core 0) answers `--calls` aiortc
callers (this process, pinned to core 1; PCMU, a test signal each) on loopback, once with
separate ports and once with `--rtc-udp-port`, alternating for `--rounds`; the server's CPU
time is read from /proc over `--seconds` of steady calls. Prints % of one core per call, the
calls one core could carry, and the mux's cost relative to separate ports (target <= 10 %).
`dispatch`: the mux's per-datagram routing (a media packet from a validated address, and an
ICE check that validates one) in µs. `memory`: bytes per call registration, per validated
route, per pending (unknown-username) entry and per awaited transaction (tracemalloc).
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import aiohttp
import av
import numpy as np
from aioice import stun
from aioice.utils import random_transaction_id
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpsender import RTCRtpSender
from harness import agent_command, cpu_seconds, free_port, server_on_core0

from agent.rtc_tuning.udp_mux import MuxedTransport, MuxLimits, MuxSocket
from agent.testing.testsignal import make_test_signal

RATE = 48000
PACKET = 960


class SignalTrack(MediaStreamTrack):
    """A test signal as paced 20 ms frames."""

    kind = "audio"

    def __init__(self, seed: int, seconds: float) -> None:
        super().__init__()
        self._pcm = (make_test_signal(seconds, seed=seed) * 32767).astype(np.int16)
        self._sent = 0
        self._start: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._sent / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = self._pcm[self._sent % len(self._pcm):][:PACKET]
        if len(chunk) < PACKET:
            chunk = np.zeros(PACKET, np.int16)
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = RATE, self._sent
        frame.time_base = fractions.Fraction(1, RATE)
        self._sent += PACKET
        return frame


async def open_call(http: aiohttp.ClientSession, url: str, seed: int,
                    seconds: float) -> tuple[RTCPeerConnection, asyncio.Event]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    connected = asyncio.Event()
    transceiver = pc.addTransceiver(SignalTrack(seed, seconds), direction="sendrecv")
    transceiver.setCodecPreferences([c for c in RTCRtpSender.getCapabilities("audio").codecs
                                     if c.mimeType == "audio/PCMU"])

    @pc.on("connectionstatechange")
    def _state() -> None:
        if pc.connectionState == "connected":
            connected.set()

    @pc.on("track")
    def _track(track: MediaStreamTrack) -> None:
        async def drain() -> None:
            while True:
                try:
                    await track.recv()
                except MediaStreamError:
                    return
        asyncio.ensure_future(drain())

    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(url + "/v1/realtime/calls", data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as response:
        answer = await response.text()
        if response.status != 201:
            raise RuntimeError(f"call refused: {response.status} {answer}")
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return pc, connected


async def server_cpu_per_call(mux: bool, calls: int, seconds: float) -> float:
    """% of one core per call the server spent over `seconds` of `calls` steady calls."""
    port = free_port()
    flags = ["--ice-host", "127.0.0.1", "--max-sessions", str(calls)]
    if mux:
        flags += ["--rtc-udp-port", str(free_port())]  # (a TCP-free port; UDP checked at start)
    with server_on_core0(agent_command(port, *flags), port) as pid:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            opened = [await open_call(http, url, seed, seconds + 10) for seed in range(calls)]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.wait() for _, c in opened)), 30)
            await asyncio.sleep(2.0)  # past the set-up
            before, start = cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(seconds)
            used = cpu_seconds(pid) - before
            elapsed = time.monotonic() - start
        finally:
            await asyncio.gather(*(pc.close() for pc, _ in opened))
    return 100.0 * used / elapsed / calls


async def cpu_table(calls: int, seconds: float, rounds: int) -> None:
    results: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for mux in (False, True):
            results[mux].append(await server_cpu_per_call(mux, calls, seconds))
    separate, muxed = statistics.median(results[False]), statistics.median(results[True])
    print(f"\n### Server CPU per call ({calls} PCMU echo calls, {seconds:g} s, "
          f"{rounds} round(s), server on core 0)\n")
    print("| ICE sockets | % of a core per call (each round) | median "
          "| calls per core (100 % / median) |")
    print("| --- | --- | --- | --- |")
    for mux, label in ((False, "a socket per call"), (True, "--rtc-udp-port (one socket)")):
        median = statistics.median(results[mux])
        rounds_text = ", ".join(f"{value:.2f}" for value in results[mux])
        print(f"| {label} | {rounds_text} | {median:.2f} | {100.0 / median:.0f} |")
    print(f"\nmux cost per call: {100.0 * (muxed - separate) / separate:+.1f} % "
          "(target <= +10 %)")


class Sink(asyncio.DatagramProtocol):
    def __init__(self, connection: object) -> None:
        self.receiver = connection
        self.count = 0

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.count += 1


class Credentials:
    def __init__(self, ufrag: str) -> None:
        self.local_username, self.local_password = ufrag, "p" * 22
        self.remote_password = "r" * 22


def per_call_us(action: Callable[[], Any], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        action()
    return (time.perf_counter() - start) / repeats * 1e6


async def dispatch_table(repeats: int = 200_000) -> None:
    loop = asyncio.get_running_loop()
    mux = MuxSocket("127.0.0.1", 0, MuxLimits(slow_rate=1e9, slow_burst=1e9))
    try:
        sinks = []
        for i in range(100):
            sink = Sink(Credentials(f"u{i:03d}"))
            transport = MuxedTransport(mux, sink, loop)
            mux.register(transport)
            mux._route(("127.0.0.2", 10000 + i), transport)
            sinks.append(sink)
        media = b"\x80\x00" + bytes(170)  # a PCMU RTP packet's size
        direct = per_call_us(lambda: sinks[50].datagram_received(media, ("127.0.0.2", 10050)),
                             repeats)
        routed = per_call_us(lambda: mux.datagram_received(media, ("127.0.0.2", 10050)),
                             repeats)
        request = stun.Message(message_method=stun.Method.BINDING,
                               message_class=stun.Class.REQUEST,
                               transaction_id=random_transaction_id())
        request.attributes["USERNAME"] = "u050:x"
        request.attributes["PRIORITY"] = 1
        request.add_message_integrity(b"p" * 22)
        check = bytes(request)
        known = per_call_us(lambda: mux.datagram_received(check, ("127.0.0.2", 10050)),
                            repeats // 20)
        sources = iter([("127.0.0.4", port) for port in range(1, repeats)])
        validating = per_call_us(lambda: mux.datagram_received(check, next(sources)),
                                 repeats // 20)
    finally:
        mux.close()
    print("\n### The mux's work per received datagram (100 calls registered)\n")
    print("| datagram | µs |")
    print("| --- | --- |")
    print(f"| media, delivered straight to the call's protocol (no mux) | {direct:.3f} |")
    print(f"| media through the mux (validated address) | {routed:.3f} |")
    print(f"| ICE check from the call's validated address (parsed, then to aioice) | "
          f"{known:.1f} |")
    print(f"| ICE check from a new address (parsed, HMAC verified, route added) | "
          f"{validating:.1f} |")
    print(f"\nadded per media packet: {routed - direct:.3f} µs; at 50 packets/s each way "
          f"that is {(routed - direct) * 50 / 1e4:.4f} % of a core per call")


def measured_bytes(build: Callable[[int], None], count: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    build(count)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / count


async def memory_table(count: int = 2000) -> None:
    loop = asyncio.get_running_loop()
    mux = MuxSocket("127.0.0.1", 0, MuxLimits(pending_entries=count + 1,
                                              transactions=count + 1))
    transports: list[MuxedTransport] = []
    kept: list[Any] = []
    try:
        def calls(n: int) -> None:
            for i in range(n):
                sink = Sink(Credentials(f"c{i:05d}"))
                transport = MuxedTransport(mux, sink, loop)
                mux.register(transport)
                transports.append(transport)

        def routes(n: int) -> None:
            for i in range(n):
                mux._route((f"10.1.{i // 250}.{i % 250}", 40000 + i), transports[i])

        def pending(n: int) -> None:
            for i in range(n):
                request = stun.Message(message_method=stun.Method.BINDING,
                                       message_class=stun.Class.REQUEST,
                                       transaction_id=random_transaction_id())
                request.attributes["USERNAME"] = f"x{i:05d}:y"
                request.add_message_integrity(b"k" * 22)
                data = bytes(request)
                kept.append(data)
                mux._hold(f"x{i:05d}", data, (f"10.2.{i // 250}.{i % 250}", 50000))

        def transactions(n: int) -> None:
            for i in range(n):
                mux._remember_request(os.urandom(12), transports[i],
                                      (f"10.3.{i // 250}.{i % 250}", 3478))

        call_bytes = measured_bytes(calls, count)
        route_bytes = measured_bytes(routes, count)
        pending_bytes = measured_bytes(pending, count)
        datagram = len(kept[0]) if kept else 0
        transaction_bytes = measured_bytes(transactions, count)
    finally:
        mux.close()
    print(f"\n### Memory per mux entry ({count} of each, tracemalloc)\n")
    print("| entry | bytes |")
    print("| --- | --- |")
    print(f"| a call on the mux (its MuxedTransport and ufrag entry; the protocol object "
          f"aioice makes anyway included) | {call_bytes:.0f} |")
    print(f"| a validated remote address (route) | {route_bytes:.0f} |")
    print(f"| a pending check with an unknown username (including the held datagram of "
          f"{datagram} bytes) | {pending_bytes:.0f} |")
    print(f"| an awaited outgoing STUN transaction | {transaction_bytes:.0f} |")
    print(f"\nbound of the pending table at the default limits: "
          f"{MuxLimits().pending_entries} entries, about "
          f"{MuxLimits().pending_entries * pending_bytes / 1024:.0f} KiB")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="all",
                        choices=("all", "cpu", "dispatch", "memory"))
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.what in ("all", "dispatch"):
        await dispatch_table()
    if args.what in ("all", "memory"):
        await memory_table()
    if args.what in ("all", "cpu"):
        if (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})  # the callers on core 1, the server on core 0
        await cpu_table(args.calls, args.seconds, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
