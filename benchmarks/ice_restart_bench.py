"""Time from an ICE restart offer to audio again, over repeated network changes of one call.

A real `python -m signaling` (echo plugin, `--ice-host 127.0.0.1`, core 0) and one aiortc
caller in this process (core 1) sending the built-in test signal. The caller's path to the
agent is a userspace UDP relay (tests/support/udp_path.py); each round cuts the current path
(a dead network), opens a new one (new addresses on both sides) and restarts ICE over it with
a `PATCH` of the call resource (RFC 9725) or a re-offer (`POST` of a new SDP offer on the
call). Per restart it measures, from the moment the restart offer is sent: the HTTP answer,
the first agent audio packet over the new path, and the first loud echo of the caller's own
signal (the round trip restored). Prints a table of p50/p95/max (ms) over the restarts.

    python benchmarks/ice_restart_bench.py [--restarts 20] [--mode patch|reoffer]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time

import aiohttp
import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from harness import agent_command, free_port, taskset, wait_for_port

from agent.rtc_tuning import limit_host_addresses
from agent.rtc_tuning.ice_restart import (
    IceCredentials,
    RestartableIce,
    answer_with_ice,
    read_offered_ice,
    restart_sdpfrag,
)
from agent.testing.peer import SignalTrack
from agent.testing.testsignal import make_test_signal
from agent.webrtc.trickle import parse_sdpfrag
from tests.support.udp_path import UdpPath

LOUD_RMS = 0.02  # the test signal is 0.25 RMS; silence from the echo is 0


class Caller:
    def __init__(self, base: str, seconds: float) -> None:
        self.base = base
        self.pc = RTCPeerConnection()
        self.pc.addTrack(SignalTrack(make_test_signal(seconds)))
        self.pc.createDataChannel("oai-events")
        self.frames: list[tuple[float, float]] = []  # (arrival, rms)
        self.connected = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        self.location = ""
        self.etag = ""
        self.offer = ""
        self.ice: RestartableIce | None = None

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        async def read() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                assert isinstance(frame, av.AudioFrame)
                pcm = frame.to_ndarray().astype(np.float32) / 32768
                self.frames.append((time.monotonic(), float(np.sqrt(np.mean(pcm * pcm)))))
        self.tasks.append(asyncio.ensure_future(read()))

    async def call(self, http: aiohttp.ClientSession, path: UdpPath) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.offer = self.pc.localDescription.sdp
        async with http.post(self.base + "/v1/realtime/calls", data=path.from_caller(self.offer),
                             headers={"Content-Type": "application/sdp"}) as response:
            answer = await response.text()
            assert response.status == 201, answer
            self.location, self.etag = response.headers["Location"], response.headers["ETag"]
        await self.pc.setRemoteDescription(RTCSessionDescription(path.from_agent(answer),
                                                                 "answer"))
        self.ice = RestartableIce.install(self.pc)
        assert self.ice is not None, "aiortc internals changed: no ICE restart"
        await asyncio.wait_for(self.connected.wait(), 15)

    async def restart(self, http: aiohttp.ClientSession, path: UdpPath, mode: str) -> None:
        assert self.ice is not None
        local = await self.ice.begin()
        url = self.base + self.location
        if mode == "patch":
            async with http.patch(url, data=path.from_caller(restart_sdpfrag(local, "0")),
                                  headers={"Content-Type": "application/trickle-ice-sdpfrag",
                                           "If-Match": self.etag}) as response:
                body = await response.text()
                assert response.status == 200, body
                self.etag = response.headers["ETag"]
            frag = parse_sdpfrag(path.from_agent(body))
            assert frag.ice_ufrag and frag.ice_pwd
            credentials, candidates = IceCredentials(frag.ice_ufrag, frag.ice_pwd), frag.candidates
        else:
            offer = path.from_caller(answer_with_ice(self.offer, local))
            async with http.post(url, data=offer,
                                 headers={"Content-Type": "application/sdp"}) as response:
                body = await response.text()
                assert response.status == 200, body
            read = read_offered_ice(path.from_agent(body))
            assert read.credentials is not None
            credentials, candidates = read.credentials, read.candidates
        await self.ice.connect(credentials, candidates, ended=True)

    async def first_frame_after(self, t0: float, loud: bool, timeout: float = 15.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for arrival, rms in self.frames:
                if arrival > t0 and (not loud or rms > LOUD_RMS):
                    return arrival - t0
            await asyncio.sleep(0.005)
        raise TimeoutError("no audio after the restart")

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pc.close()


def summary(values: list[float]) -> tuple[float, float, float]:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return statistics.median(ms), p95, ms[-1]


async def run(base: str, restarts: int, mode: str) -> dict[str, list[float]]:
    limit_host_addresses(["127.0.0.1"])
    results: dict[str, list[float]] = {"answer": [], "first packet": [], "loud echo": []}
    paths: list[UdpPath] = []
    caller = Caller(base, seconds=restarts * 3.0 + 30)
    try:
        async with aiohttp.ClientSession() as http:
            paths.append(await UdpPath.open())
            await caller.call(http, paths[-1])
            await asyncio.sleep(1.5)
            for _ in range(restarts):
                paths[-1].drop = True
                await asyncio.sleep(0.3)  # the old network is dead
                paths.append(await UdpPath.open())
                t0 = time.monotonic()
                await caller.restart(http, paths[-1], mode)
                results["answer"].append(time.monotonic() - t0)
                results["first packet"].append(await caller.first_frame_after(t0, loud=False))
                results["loud echo"].append(await caller.first_frame_after(t0, loud=True))
                await asyncio.sleep(0.7)
    finally:
        await caller.close()
        for path in paths:
            path.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--mode", choices=("patch", "reoffer"), default="patch")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        taskset("0") + agent_command(port, "--plugin", "echo", "--ice-host", "127.0.0.1"))
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})  # the caller on core 1, the server on core 0
    try:
        wait_for_port(port)
        results = asyncio.run(run(f"http://127.0.0.1:{port}", args.restarts, args.mode))
    finally:
        server.terminate()
        server.wait(10)
    print(f"\nICE restart ({args.mode}), {args.restarts} restarts of one call, "
          "times from the restart offer (ms):\n")
    print("| measure | p50 | p95 | max |")
    print("| --- | --- | --- | --- |")
    for name, values in results.items():
        p50, p95, worst = summary(values)
        print(f"| {name} | {p50:.0f} | {p95:.0f} | {worst:.0f} |")


if __name__ == "__main__":
    main()
