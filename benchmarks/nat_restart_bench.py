"""What a network change costs a browser call through real NATs: headless Chromium in the
"home" namespace calls the agent behind its 1:1 NAT (tests/support/netns.py: one
`--rtc-udp-port`, `--rtc-advertise`, no STUN), and the network under the call changes
`--switches` times, each kind in turn:

- `nat`: the home NAT's public address moves (198.51.100.20 <-> .21, conntrack flushed): a
  NAT rebinding the browser cannot see;
- `network`: the caller's own address moves too (10.231.2.2 <-> .3: Wi-Fi to cellular), so
  only an ICE restart brings the call back; the page does it by itself (web/restart.js).

The same changes for an aiortc caller (`--callers chromium,aiortc`): this script run with
`--caller URL` inside the home namespace, the built-in test signal out, which restarts ICE
itself by a `PATCH` of the call resource (RFC 9725) after a second without the agent's audio
(as the page does) and reports the arrival of every frame it decoded.

Per change, measured by the caller (the page's clock and getStats every 20 ms; the aiortc
caller's monotonic clock, shared with this process): when it asked for an ICE restart (if it
did), when the agent's audio arrived again ("-": it never really stopped, no gap over
100 ms), and the longest gap in it. Prints a row per change and p50/p95/max per caller and
kind (ms). Needs root (namespaces), nftables, conntrack and Chromium; about 5 s per change.

    python benchmarks/nat_restart_bench.py [--switches 5] [--kinds nat,network]
                                           [--callers chromium,aiortc]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import harness  # noqa: F401 (puts tests.support on the path)
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent.rtc_tuning.ice_restart import (
    IceCredentials,
    IceRestartError,
    RestartableIce,
    restart_sdpfrag,
)
from agent.testing.peer import SignalTrack
from agent.testing.testsignal import make_test_signal
from agent.webrtc.trickle import parse_sdpfrag
from tests.support import SPEECH_WAV
from tests.support.netns import AGENT_PUBLIC, NatLab, nat_lab, netns_problem
from tests.support.netns_browser import (
    MUX_PORT,
    Recovery,
    agent_calls,
    chromium_in_namespace,
    packets_now,
    probe,
    recovery,
    start_call,
    wait_for_audio,
)

SETTLE_SECONDS = 2.0  # of steady audio between changes
SILENCE_RESTART_SECONDS = 1.0  # the aiortc caller restarts ICE after this long without audio
RECOVER_SECONDS = 6.0  # the aiortc caller's share of a change: recovery and settling


def switch(lab: NatLab, kind: str) -> None:
    if kind == "nat":
        lab.switch_home_address()
    else:
        lab.switch_home_network()


def optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):7.0f} {p95:7.0f} {ordered[-1]:7.0f}"


async def run_chromium(switches: int, kinds: list[str]) -> dict[str, list[Recovery]]:
    results: dict[str, list[Recovery]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as folder:
        async with nat_lab([MUX_PORT]) as lab, chromium_in_namespace(
                lab.home, SPEECH_WAV, lab.public_url, Path(folder)) as browser:
            page, _, call_id = await start_call(lab, browser)
            print(f"call {call_id} connected through both NATs")
            print(f"{'kind':8} {'#':>3} {'restart':>8} {'->audio':>8} {'change->audio':>14} "
                  f"{'gap':>7}")
            for kind in kinds:
                for index in range(switches):
                    changed = await page.evaluate("performance.now()")
                    switch(lab, kind)
                    await wait_for_audio(page, await packets_now(page), timeout=40.0)
                    measured = recovery(await probe(page), changed)
                    results[kind].append(measured)
                    print_row(kind, index, measured)
                    await asyncio.sleep(SETTLE_SECONDS)
            restarts = await page.evaluate("window.voiceApp.iceRestarts")
            calls = [call["call_id"] for call in await agent_calls(page)]
            same = ("the same call throughout" if calls == [call_id]
                    else f"the agent's calls now: {calls}")
            print(f"{same}; the page restarted ICE {restarts} times")
            await page.click("#hangup")
    return results


def print_row(kind: str, index: int, measured: Recovery) -> None:
    request, again = measured.restart_request_ms, measured.audio_again_ms or None
    after = None if request is None or again is None else again - request
    print(f"{kind:8} {index + 1:3} {optional(request):>8} {optional(after):>8} "
          f"{optional(again):>14} {measured.gap_ms:7.0f}")


class RestartingCaller:
    """An aiortc caller that restarts ICE by PATCH after a second without the agent's audio
    (run inside the home namespace by `--caller`)."""

    def __init__(self, base: str, seconds: float) -> None:
        self.base = base
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTrack(SignalTrack(make_test_signal(seconds + 30)))
        self.pc.createDataChannel("oai-events")
        self.arrivals: list[float] = []  # monotonic s of each decoded frame of agent audio
        self.restarts: list[float] = []  # when each restart was asked for
        self.tasks: list[asyncio.Task[None]] = []
        self.location = self.etag = ""
        self.ice: RestartableIce | None = None
        self.pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        async def read() -> None:
            while True:
                try:
                    await track.recv()
                except MediaStreamError:
                    return
                self.arrivals.append(time.monotonic())
        self.tasks.append(asyncio.ensure_future(read()))

    async def call(self, http: aiohttp.ClientSession) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(self.base + "/v1/realtime/calls", data=self.pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            answer = await response.text()
            if response.status != 201:
                raise RuntimeError(f"offer refused: {response.status} {answer}")
            self.location, self.etag = response.headers["Location"], response.headers["ETag"]
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        self.ice = RestartableIce.install(self.pc)
        if self.ice is None:
            raise RuntimeError("aiortc internals changed: no ICE restart")
        deadline = time.monotonic() + 20
        while len(self.arrivals) < 50:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no audio from the agent ({self.pc.connectionState})")
            await asyncio.sleep(0.05)
        return self.location.rsplit("/", 1)[-1]

    async def restart(self, http: aiohttp.ClientSession) -> None:
        assert self.ice is not None
        self.restarts.append(time.monotonic())
        local = await self.ice.begin()
        async with http.patch(self.base + self.location, data=restart_sdpfrag(local, "0"),
                              headers={"Content-Type": "application/trickle-ice-sdpfrag",
                                       "If-Match": self.etag}) as response:
            body = await response.text()
            if response.status != 200:
                raise RuntimeError(f"restart refused: {response.status} {body}")
            self.etag = response.headers["ETag"]
        frag = parse_sdpfrag(body)
        if not (frag.ice_ufrag and frag.ice_pwd):
            raise RuntimeError(f"restart answer without credentials: {body}")
        await self.ice.connect(IceCredentials(frag.ice_ufrag, frag.ice_pwd), frag.candidates,
                               ended=True)

    async def watch(self, http: aiohttp.ClientSession, seconds: float) -> None:
        """For `seconds`: one restart per stall of the agent's audio."""
        end = time.monotonic() + seconds
        handled = 0.0  # the last frame time whose stall got its restart
        while time.monotonic() < end:
            await asyncio.sleep(0.05)
            last = self.arrivals[-1]
            if time.monotonic() - last >= SILENCE_RESTART_SECONDS and last != handled:
                handled = last
                try:
                    await asyncio.wait_for(self.restart(http), 10)
                except (RuntimeError, TimeoutError, aiohttp.ClientError, IceRestartError) as exc:
                    print(f"restart failed, trying again: {exc!r}", file=sys.stderr)
                    handled = 0.0

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pc.close()


async def caller_main(base: str, seconds: float) -> None:
    """`--caller`: call, say so on stdout, restart when needed for `seconds`, then print what
    was heard when (one JSON line)."""
    caller = RestartingCaller(base, seconds)
    try:
        # A connection per request: a kept-alive one dies with the network it was opened on.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            call_id = await caller.call(http)
            print(json.dumps({"connected": call_id}), flush=True)
            await caller.watch(http, seconds)
            async with http.get(base + "/metrics/calls") as response:
                calls = [call["call_id"] for call in (await response.json())["calls"]]
            print(json.dumps({"arrivals": caller.arrivals, "restarts": caller.restarts,
                              "calls": calls}), flush=True)
    finally:
        await caller.close()


def caller_recovery(report: dict[str, Any], changed: float) -> Recovery:
    """The aiortc caller's report as PAGE_PROBE's (ms), measured from `changed`."""
    samples = [[at * 1000, index + 1] for index, at in enumerate(report["arrivals"])]
    restarts = [at * 1000 for at in report["restarts"]]
    return recovery({"samples": samples, "restarts": restarts, "states": []}, changed * 1000)


async def run_aiortc(switches: int, kinds: list[str]) -> dict[str, list[Recovery]]:
    seconds = switches * len(kinds) * RECOVER_SECONDS + 1.0
    changes: list[tuple[str, float]] = []
    async with nat_lab([MUX_PORT]) as lab:
        await lab.start_agent("--rtc-udp-port", str(MUX_PORT), "--rtc-advertise", AGENT_PUBLIC,
                              "--max-sessions", "2", "--reconnect-seconds", "30")
        caller = await lab.start(lab.home, sys.executable, str(Path(__file__).resolve()),
                                 "--caller", lab.public_url, "--seconds", str(seconds),
                                 stdout=asyncio.subprocess.PIPE)
        assert caller.stdout is not None
        line = await asyncio.wait_for(caller.stdout.readline(), 30)
        if not line:
            _, stderr = await caller.communicate()
            raise RuntimeError("the aiortc caller ended early:\n" + stderr.decode()[-2000:])
        call_id = json.loads(line)["connected"]
        print(f"aiortc call {call_id} connected through both NATs")
        await asyncio.sleep(SETTLE_SECONDS / 2)
        for kind in kinds:
            for _ in range(switches):
                changes.append((kind, time.monotonic()))
                switch(lab, kind)
                await asyncio.sleep(RECOVER_SECONDS)
        output, stderr = await asyncio.wait_for(caller.communicate(), seconds + 30)
        if caller.returncode != 0:
            raise RuntimeError("the aiortc caller failed:\n" + stderr.decode()[-2000:])
    report = json.loads(output.decode().splitlines()[-1])
    results: dict[str, list[Recovery]] = {kind: [] for kind in kinds}
    print(f"{'kind':8} {'#':>3} {'restart':>8} {'->audio':>8} {'change->audio':>14} {'gap':>7}")
    for number, (kind, changed) in enumerate(changes):
        following = changes[number + 1][1] if number + 1 < len(changes) else float("inf")
        window = {"arrivals": [at for at in report["arrivals"] if at < following],
                  "restarts": [at for at in report["restarts"] if at < following]}
        if not any(at > changed + 0.1 for at in window["arrivals"]):
            print(f"{kind:8} {len(results[kind]) + 1:3}  no audio again before the next change")
            continue
        measured = caller_recovery(window, changed)
        results[kind].append(measured)
        print_row(kind, len(results[kind]) - 1, measured)
    same = "the same call throughout" if report["calls"] == [call_id] else (
        f"the agent's calls now: {report['calls']}")
    print(f"{same}; the caller restarted ICE {len(report['restarts'])} times")
    return results


def print_summary(caller: str, results: dict[str, list[Recovery]]) -> None:
    print(f"\n{caller}: {'kind':8} {'n':>3} {'restarts':>8}  {'p50':>7} {'p95':>7} "
          f"{'max':>7}  (ms)")
    for kind, rounds in results.items():
        requested = [r for r in rounds if r.restart_request_ms is not None]
        rows = {
            "change -> restart request": [r.restart_request_ms for r in requested
                                          if r.restart_request_ms is not None],
            "restart request -> audio": [r.audio_again_ms - (r.restart_request_ms or 0.0)
                                         for r in requested if r.audio_again_ms],
            "change -> audio again": [r.audio_again_ms for r in rounds if r.audio_again_ms],
            "longest audio gap": [r.gap_ms for r in rounds],
        }
        print(f"{kind:8} {len(rounds):3} {len(requested):8}")
        for name, values in rows.items():
            print(f"  {name:28} {percentiles(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switches", type=int, default=5, help="changes of each kind")
    parser.add_argument("--kinds", default="nat,network",
                        help="comma list of nat (NAT rebinding) and network (caller moves)")
    parser.add_argument("--callers", default="chromium,aiortc",
                        help="comma list of chromium and aiortc")
    parser.add_argument("--caller", metavar="URL", help=argparse.SUPPRESS)  # the aiortc side
    parser.add_argument("--seconds", type=float, default=30.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.caller:
        asyncio.run(caller_main(args.caller, args.seconds))
        return
    kinds = [kind for kind in args.kinds.split(",") if kind]
    callers = [caller for caller in args.callers.split(",") if caller]
    if unknown := set(kinds) - {"nat", "network"}:
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    if unknown := set(callers) - {"chromium", "aiortc"}:
        parser.error(f"unknown callers: {', '.join(sorted(unknown))}")
    if problem := netns_problem():
        sys.exit(f"cannot run: {problem}")
    if shutil.which("conntrack") is None:
        sys.exit("cannot run: conntrack is not installed (scripts/install-test-deps.sh)")
    runs = {"chromium": run_chromium, "aiortc": run_aiortc}
    results = {caller: asyncio.run(runs[caller](args.switches, kinds)) for caller in callers}
    for caller, by_kind in results.items():
        print_summary(caller, by_kind)


if __name__ == "__main__":
    main()
