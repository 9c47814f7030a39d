"""Small aiortc callers for `/v1/realtime/calls`: each plays its own test signal and records
the agent's answer. In-process (`Caller`) or as a program run inside a network namespace:

    python -m tests.support.rtc_caller URL --calls N --seconds S --out DIR

which writes DIR/report.json (one entry per call: status, connected, the answer's host
candidates) and DIR/call<i>.npy (what call i heard during S seconds that start
SETTLE_SECONDS after the last call connected; mono float32 at 48 kHz). Caller i plays
`signal(i, S)`, its own test signal, so every echo can be told apart; the report's
`signal_offset` says how many samples of it were played before the recording began.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import time
from pathlib import Path
from typing import Any, cast

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpsender import RTCRtpSender

from agent.rtc_tuning.udp_mux import outside_mux
from agent.testing.testsignal import make_test_signal

RATE = 48000
PACKET = 960  # 20 ms at 48 kHz
SEED_BASE = 100
SETTLE_SECONDS = 1.0  # after the last call connected, before recording starts
SIGNAL_SECONDS = 20.0  # beyond the recording: covers set-up and settling
CALLS = "/v1/realtime/calls"


class SignalTrack(MediaStreamTrack):
    """A float signal as 20 ms s16 frames, paced in real time, then silence."""

    kind = "audio"

    def __init__(self, signal: np.ndarray) -> None:
        super().__init__()
        self._pcm = (np.clip(signal, -1, 1) * 32767).astype(np.int16)
        self._sent = 0
        self._start: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self._sent / RATE
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = self._pcm[self._sent:self._sent + PACKET]
        if len(chunk) < PACKET:
            chunk = np.concatenate([chunk, np.zeros(PACKET - len(chunk), np.int16)])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._sent
        frame.time_base = fractions.Fraction(1, RATE)
        self._sent += PACKET
        return frame

    @property
    def sent_samples(self) -> int:
        return self._sent


def signal(index: int, seconds: float) -> np.ndarray:
    """What caller `index` of a run recording `seconds` plays."""
    return make_test_signal(SIGNAL_SECONDS + seconds, seed=SEED_BASE + index)


def host_candidates(sdp: str) -> list[tuple[str, int]]:
    found = []
    for line in sdp.splitlines():
        fields = line.split()
        if line.startswith("a=candidate:") and len(fields) > 7 and fields[7] == "host":
            found.append((fields[4], int(fields[5])))
    return sorted(set(found))


class Caller:
    """One call: the signal out, the agent's audio recorded (mono float32, 48 kHz)."""

    def __init__(self, base_url: str, signal: np.ndarray, codec: str = "PCMU") -> None:
        self.base_url = base_url.rstrip("/")
        self.signal = signal
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.connected = asyncio.Event()
        self.failed = asyncio.Event()
        self.chunks: list[np.ndarray] = []
        self.status = 0
        self.answer = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        self.track = SignalTrack(signal)
        self.signal_offset = 0  # samples of the signal played before the recording began
        transceiver = self.pc.addTransceiver(self.track, direction="sendrecv")
        codecs = [c for c in RTCRtpSender.getCapabilities("audio").codecs
                  if c.mimeType.lower() == f"audio/{codec.lower()}"]
        transceiver.setCodecPreferences(codecs)
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("track", self._on_track)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()
        elif self.pc.connectionState == "failed":
            self.failed.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        async def record() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                for out in self._resampler.resample(cast(av.AudioFrame, frame)):
                    self.chunks.append(out.to_ndarray().reshape(-1).copy())
        self._tasks.append(asyncio.ensure_future(record()))

    def start_recording(self) -> None:
        """Forget what was heard so far; `signal_offset` says where the signal was then."""
        self.chunks.clear()
        self.signal_offset = self.track.sent_samples

    @property
    def heard(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    async def offer(self, http: aiohttp.ClientSession) -> bool:
        """Post the offer and apply the answer; False if refused (status kept)."""
        with outside_mux():  # a caller in the agent's own process binds its own socket
            await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(self.base_url + CALLS, data=self.pc.localDescription.sdp,
                             headers={"Content-Type": "application/sdp"}) as response:
            self.status = response.status
            self.answer = await response.text()
        if self.status != 201:
            return False
        await self.pc.setRemoteDescription(RTCSessionDescription(self.answer, "answer"))
        return True

    async def wait_connected(self, timeout: float) -> bool:
        waits = [asyncio.ensure_future(self.connected.wait()),
                 asyncio.ensure_future(self.failed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return self.connected.is_set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pc.close(), 5)


async def run(url: str, calls: int, seconds: float, out: Path, connect_timeout: float,
              codec: str) -> dict[str, Any]:
    # Each signal outlasts the recording, so no analysis window falls after its echo's end.
    callers = [Caller(url, signal(i, seconds), codec) for i in range(calls)]
    report: dict[str, Any] = {"calls": []}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            offered = await asyncio.gather(*(c.offer(http) for c in callers),
                                           return_exceptions=True)
        connected = await asyncio.gather(*(
            c.wait_connected(connect_timeout) if ok is True else asyncio.sleep(0, False)
            for c, ok in zip(callers, offered, strict=True)))
        if any(connected):
            # Record the steady state: once every call is up and the set-up burst is over.
            await asyncio.sleep(SETTLE_SECONDS)
            for caller in callers:
                caller.start_recording()
            await asyncio.sleep(seconds)
        for i, (caller, ok, up) in enumerate(zip(callers, offered, connected, strict=True)):
            np.save(out / f"call{i}.npy", caller.heard.astype(np.float32))
            report["calls"].append({
                "index": i, "seed": SEED_BASE + i, "status": caller.status,
                "error": None if ok is True else repr(ok), "connected": bool(up),
                "host_candidates": host_candidates(caller.answer),
                "signal_offset": caller.signal_offset,
                "heard_seconds": len(caller.heard) / RATE})
    finally:
        await asyncio.gather(*(c.close() for c in callers))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connect-timeout", type=float, default=15.0)
    parser.add_argument("--codec", default="PCMU")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(args.url, args.calls, args.seconds, args.out,
                             args.connect_timeout, args.codec))
    (args.out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
