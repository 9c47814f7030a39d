"""How accurately the test peer measures response latency: against the echo plugin's known,
fixed delay (`delay_frames` × 80 ms), on a real WebRTC call.

Each call plays one burst of band-limited noise with sharp 5 ms edges (`--burst` seconds) and
runs `expect_speech`; the peer's response latency comes from webrtcvad's speech edges on both
channels, each refined to the sample where the short-term energy crosses 30 dB below the
segment's mean (agent/testing/peer/vad.py). The reference for the same call is sample-accurate:
where the burst's first 50 ms came back (cross-correlation on the agent channel; it carries
the echo's delay_frames plus the path's own delay) minus where the burst ended in what was
sent (its start found the same way, plus its exact length). The error is the difference; the
issue's target is |error| ≤ 5 ms.

    python benchmarks/peer_accuracy_bench.py [--delays 6,10,14] [--calls 3] [--burst 0.4]

Prints a markdown table (one row per call) and a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile

import numpy as np
from harness import agent_command, free_port, server_on_core0

from agent.testing.peer import script as scripts
from agent.testing.peer.aligned import CallAudio
from agent.testing.peer.run import CallPlan, analyse, run_script
from agent.testing.peer.transports.base import PeerOptions
from agent.testing.peer.wav import save_wav
from agent.testing.testsignal import band_limited_noise

RATE = 48000
FRAME_MS = 80


def burst(seconds: float) -> np.ndarray:
    """Noise at speech level with 5 ms raised-cosine edges, padded with 0.1 s of silence."""
    count = int(seconds * RATE)
    noise = band_limited_noise(count, RATE, 300, 3400, seed=11)
    noise *= 0.25 / np.sqrt(np.mean(noise**2))
    ramp = int(0.005 * RATE)
    edge = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, ramp))
    noise[:ramp] *= edge
    noise[-ramp:] *= edge[::-1]
    pad = np.zeros(int(0.1 * RATE))
    return np.concatenate([pad, noise, pad]).astype(np.float32)


def find(head: np.ndarray, audio: np.ndarray) -> int:
    """Where `head` best matches in `audio` (sample index), by FFT cross-correlation."""
    size = 1 << int(np.ceil(np.log2(len(audio) + len(head))))
    xcorr = np.fft.irfft(np.fft.rfft(audio, size) * np.conj(np.fft.rfft(head, size)), size)
    return int(np.argmax(xcorr[: len(audio) - len(head) + 1]))


async def one(url: str, folder: str, frames: int, signal: np.ndarray,
              length: float) -> dict[str, float]:
    script = scripts.build({"name": "accuracy", "steps": [
        {"play": "burst.wav"}, {"expect_speech": {"within": 5.0}}, "hangup"]}, "bench", folder)
    plan = CallPlan(url=url, script=script, pesq="off", options=PeerOptions(
        session={"extra_body": {"delay_frames": frames}}, ice_host=["127.0.0.1"]))
    report, call, traces = await run_script(plan)
    if call is None or report.error:
        raise RuntimeError(f"call failed: {report.error}")
    analyse(plan, report, call, traces, 0)
    check = next(c for c in report.checks if c.name == "02_expect_speech")
    if not isinstance(check.value, float):
        raise RuntimeError(f"nothing measured: {check.message}")
    # The reference, sample-accurate on the same t0 timeline: where the burst starts in what
    # was sent (it ends `length` later) and where its first 50 ms came back.
    audio = CallAudio.of(call.sent, call.received)
    head = signal[int(0.1 * RATE) : int(0.15 * RATE)]
    caller_on = find(head, audio.caller) / RATE
    agent_on = find(head, audio.agent) / RATE
    expected = (agent_on - (caller_on + length)) * 1000
    measured = check.value * 1000
    echo = (agent_on - caller_on) * 1000
    return {"frames": frames, "echo": echo, "expected": expected, "measured": measured,
            "error": measured - expected, "path": echo - frames * FRAME_MS}


async def bench(delays: list[int], calls: int, length: float) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory() as folder, \
            server_on_core0(agent_command(port, "--ice-host", "127.0.0.1"), port):
        signal = burst(length)
        save_wav(os.path.join(folder, "burst.wav"), signal)
        url = f"http://127.0.0.1:{port}"
        rows = []
        for frames in delays:
            for _ in range(calls):
                rows.append(await one(url, folder, frames, signal, length))
    print("| delay_frames | echo of the onset (xcorr) ms | path delay ms | expected latency ms | "
          "measured latency ms | error ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['frames']:.0f} | {row['echo']:.1f} | {row['path']:.1f} | "
              f"{row['expected']:.1f} | {row['measured']:.1f} | {row['error']:+.1f} |")
    errors = [row["error"] for row in rows]
    worst = max(abs(e) for e in errors)
    print(f"\n{len(rows)} calls: error mean {statistics.mean(errors):+.1f} ms, "
          f"spread (max-min) {max(errors) - min(errors):.1f} ms, worst |error| {worst:.1f} ms "
          f"-> {'within' if worst <= 5 else 'OVER'} the 5 ms target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays", default="6,10,14", help="delay_frames values (80 ms each)")
    parser.add_argument("--calls", type=int, default=3, help="calls per delay")
    parser.add_argument("--burst", type=float, default=0.4, help="burst length (s)")
    args = parser.parse_args()
    asyncio.run(bench([int(d) for d in args.delays.split(",")], args.calls, args.burst))


if __name__ == "__main__":
    main()
