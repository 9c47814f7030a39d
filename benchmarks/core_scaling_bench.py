"""How much more work a second core really adds on this machine, round by round.

    python benchmarks/core_scaling_bench.py [--rounds 5] [--seconds 2]
    python benchmarks/core_scaling_bench.py --speed-trace 30

Each round runs one busy process (pure Python, pinned to the first core) for a while, then
two at once pinned to different cores, and prints the work they did. On a machine with two
real cores the pair does twice the work of one. On a virtual machine whose host is short of
CPU the second core is worth less, and how much less changes by the minute: on the 2-vCPU
machine these benchmarks were written on, six rounds in a row gave 1.28x-1.89x, and one
process alone did 24,900-38,300 units a second. Every capacity figure on such a machine moves
with it; a `--workers 2` figure moves most, since it needs both cores while one worker
leaves the second to the callers. `workers_bench.py` measures this before every level.

`--speed-trace S` shows the other half of it: one process alone does the same fixed work
every 20 ms (60 % of a period at first) for S seconds and prints how fast it went, second
by second, relative to its median. On that machine one such run swung between 0.65x and
1.24x of its start within 30 s, on a machine otherwise idle: a server that keeps 85 % of a
core busy in a fast second needs 130 % of it in a slow one, and falls behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

UNIT_ITERATIONS = 10_000  # one unit of work: about 0.15-0.2 ms of pure Python here
PERIOD_S = 0.02

_BUSY = """
import os, time
os.sched_setaffinity(0, {{{core}}})
end, units = time.monotonic() + {seconds}, 0
while time.monotonic() < end:
    for _ in range({iterations}):
        pass
    units += 1
print(units)
"""


def _busy(core: int, seconds: float) -> subprocess.Popen[str]:
    code = _BUSY.format(core=core, seconds=seconds, iterations=UNIT_ITERATIONS)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _units_per_s(processes: list[subprocess.Popen[str]], seconds: float) -> list[float]:
    return [int(process.communicate()[0]) / seconds for process in processes]


def pair_speedup(seconds: float = 1.0, rounds: int = 2, cores: Sequence[int] | None = None
                 ) -> tuple[float, list[float]] | None:
    """(units/s of one busy process alone, units/s of each of two at once), each summed over
    `rounds` alternations (the machine's speed drifts within seconds), or None with fewer
    than two cores to run on. `cores`: the two to measure (default: the first two this
    process may run on)."""
    cores = list(cores) if cores is not None else sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    part = seconds / rounds
    alone, pair = 0.0, [0.0, 0.0]
    for _ in range(rounds):
        alone += _units_per_s([_busy(cores[0], part)], part)[0] / rounds
        both = _units_per_s([_busy(cores[0], part), _busy(cores[1], part)], part)
        pair = [total + share / rounds for total, share in zip(pair, both, strict=True)]
    return alone, pair


def speed_trace(seconds: float, duty: float = 0.6) -> list[float]:
    """Per second: the work one process got through per unit of time, relative to the run's
    median (1.0: as usual; 0.7: the core ran 30 % slow that second)."""
    iterations = UNIT_ITERATIONS // 10

    def unit() -> None:
        for _ in range(iterations):
            pass

    began = time.perf_counter()
    for _ in range(200):
        unit()
    unit_s = (time.perf_counter() - began) / 200
    units = max(1, int(PERIOD_S * duty / unit_s))
    speeds: list[float] = []
    start = time.monotonic()
    period = 0
    while time.monotonic() - start < seconds:
        delay = start + period * PERIOD_S - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        began = time.perf_counter()
        for _ in range(units):
            unit()
        speeds.append(1 / (time.perf_counter() - began))
        period += 1
    per_second = round(1 / PERIOD_S)
    seconds_speeds = [sum(speeds[i:i + per_second]) / per_second
                      for i in range(0, len(speeds) - per_second + 1, per_second)]
    median = sorted(seconds_speeds)[len(seconds_speeds) // 2]
    return [speed / median for speed in seconds_speeds]


def describe(measured: tuple[float, list[float]] | None) -> str:
    if measured is None:
        return "-"
    alone, pair = measured
    return f"{sum(pair) / alone:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--speed-trace", type=float, metavar="S")
    args = parser.parse_args()
    if args.speed_trace:
        speeds = speed_trace(args.speed_trace)
        print("speed by second (x median): " + " ".join(f"{s:.2f}" for s in speeds))
        print(f"slowest {min(speeds):.2f}x, fastest {max(speeds):.2f}x, "
              f"{sum(s < 0.85 for s in speeds)} of {len(speeds)} seconds under 0.85x")
        return
    print("| round | one process, units/s | two processes, units/s each | two / one |")
    print("|---|---|---|---|")
    for round_index in range(1, args.rounds + 1):
        measured = pair_speedup(args.seconds)
        if measured is None:
            sys.exit("one core only: nothing to compare")
        alone, pair = measured
        print(f"| {round_index} | {alone:.0f} | {pair[0]:.0f} + {pair[1]:.0f} "
              f"| {describe(measured)} |", flush=True)


if __name__ == "__main__":
    main()
