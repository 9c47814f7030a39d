"""Agent-side CPU cost per 80 ms frame per call, codecs excluded.

Replays what one call's media path does for each 80 ms of audio, in one thread, with the
echo plugin: 4 decoded Opus packets (s16 stereo 48 kHz) → FrameAssembler (resample to
24 kHz mono) → PluginSlot FIFO → one batched plugin step for all calls → on_output
(playout push + speech tracking) → 4 paced 20 ms chunks taken from the playout buffer and
converted to s16. Target: under 0.5 ms per frame per call.

    python benchmarks/frame_cost_bench.py [--calls 1,8,32] [--frames 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import av
import harness  # noqa: F401 (puts tests.support on the path)
import numpy as np

from agent.audio.framing import FrameAssembler
from agent.audio.pacer import Pacer
from agent.audio.playout import PlayoutBuffer
from agent.plugins.base import RuntimeConfig
from agent.plugins.echo import EchoPlugin
from agent.testing.testsignal import make_test_signal
from agent.ticker import PluginSlot
from agent.webrtc.outbound import float_to_s16
from tests.support.clock import FakeClock


def decoded_packets(seconds: float) -> list[av.AudioFrame]:
    signal = float_to_s16(make_test_signal(seconds))
    frames = []
    for start in range(0, len(signal) - 960 + 1, 960):
        stereo = np.repeat(signal[start : start + 960], 2).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
        frame.sample_rate = 48000
        frames.append(frame)
    return frames


def run(calls: int, frames: int) -> float:
    plugin = EchoPlugin()
    silence = plugin.silence_frame()
    packets = decoded_packets(frames * 0.08 + 1)
    seats = []
    for _ in range(calls):
        session = plugin.create_session(RuntimeConfig())
        seat = PluginSlot(session, 1920, 3, lambda output: None, None)
        playout = PlayoutBuffer(48000)
        pacer = Pacer(FakeClock(), 0.02)
        asyncio.run(pacer.wait_next())  # a started timeline, so pushes run the trim check
        playout.follow(pacer, 24000)
        seats.append((seat, FrameAssembler(24000, None), playout))
    started = time.perf_counter()
    for index in range(frames):
        for seat, assembler, _ in seats:
            for packet in packets[index * 4 : index * 4 + 4]:
                packet.pts = None
                for chunk in assembler.push(packet):
                    seat.push(chunk)
        batch = [(seat.plugin_session, seat.take(silence)) for seat, _, _ in seats]
        outputs = plugin.step(batch)
        for (_seat, _, playout), output in zip(seats, outputs, strict=False):
            audio = output.audio
            playout.push(audio)
            float(np.sqrt(np.mean(np.square(audio))))  # the call's speech tracking
            for _ in range(4):
                chunk = playout.pop(480)
                float_to_s16(chunk if chunk is not None else silence[:480])
    elapsed = time.perf_counter() - started
    return elapsed / (frames * calls) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="1,8,32")
    parser.add_argument("--frames", type=int, default=1000)
    args = parser.parse_args()
    print("| calls | frames per call | ms per 80 ms frame per call |")
    print("|---|---|---|")
    for calls in [int(n) for n in args.calls.split(",")]:
        cost = min(run(calls, args.frames) for _ in range(3))
        print(f"| {calls} | {args.frames} | {cost:.3f} |", flush=True)


if __name__ == "__main__":
    main()
