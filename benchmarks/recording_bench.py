"""What recording a call costs: CPU per second of call and bytes per second, per format.

Feeds a recorder (agent/recording.py) 80 ms ticks of a speech-like caller signal and an agent
answer, as the ticker does, then waits for its writer thread. CPU is the process's own time
(the writer thread included), so run it on a quiet machine.

    python benchmarks/recording_bench.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from agent.recording import RECORD_FORMATS, CallRecorder
from agent.testing.testsignal import make_test_signal

RATE = 24000
FRAME = 1920


async def record(directory: Path, record_format: str, seconds: float) -> tuple[float, float, int]:
    signal = make_test_signal(seconds, RATE).astype(np.float32)
    answer = np.roll(signal, 5 * FRAME) * 0.8
    recorder = CallRecorder(directory, f"bench_{record_format}", RATE, record_format)
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(signal) - FRAME + 1, FRAME):
        recorder.add_tick(signal[start:start + FRAME], answer[start:start + FRAME])
    await recorder.close()
    return time.process_time() - cpu, time.perf_counter() - wall, recorder.audio_path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print("| format | call seconds | CPU ms per call second | % of one core per call | "
          "kB per call second |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for name in RECORD_FORMATS:
            cpu, _, size = asyncio.run(record(Path(scratch), name, args.seconds))
            per_second = cpu / args.seconds * 1000
            print(f"| {name} | {args.seconds:g} | {per_second:.2f} | {per_second / 10:.2f} | "
                  f"{size / args.seconds / 1000:.1f} |")


if __name__ == "__main__":
    main()
