"""Summarise `stall-PID.log` files written with `sitecustomize.py` in this folder:

    python benchmarks/stall_trace/summary.py DIR [--over-ms 50]

One row per process (its stalls over the limit, the longest, their total), then how many of
those stalls overlapped a stall of another process (a shared cause: the machine, the
callers), then the most frequent samples taken during them. "On a core" and "waiting for a core" are
the kernel's own counts for the stalled thread (schedstat): a stall the guest spent on a core
doing little work points below the guest (a host slowing or pausing the virtual CPU).
"""

from __future__ import annotations

import argparse
import collections
import re
from dataclasses import dataclass, field
from pathlib import Path

HEAD = re.compile(r"^(?P<end>[\d.]+) stall (?P<ms>\d+) ms (?P<program>\S+)"
                  r"(?: on-core (?P<on_core>\d+) ms runqueue (?P<runqueue>\d+) ms)?$")
SAMPLE = re.compile(r"^\s+(?P<count>\d+) (?P<sample>.*)$")


@dataclass
class Stall:
    pid: str
    program: str
    start: float
    end: float
    on_core_ms: float = 0.0  # the main thread's time on a core during the stall (kernel's count)
    runqueue_ms: float = 0.0  # its time runnable but waiting for a core
    samples: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


def read(folder: Path) -> list[Stall]:
    stalls: list[Stall] = []
    for path in sorted(folder.glob("stall-*.log")):
        pid = path.stem.split("-", 1)[1]
        for line in path.read_text().splitlines():
            if head := HEAD.match(line):
                end = float(head["end"])
                stalls.append(Stall(pid, head["program"], end - int(head["ms"]) / 1000, end,
                                    float(head["on_core"] or 0), float(head["runqueue"] or 0)))
            elif (sample := SAMPLE.match(line)) and stalls:
                stalls[-1].samples[sample["sample"]] += int(sample["count"])
    return stalls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--over-ms", type=float, default=50.0)
    args = parser.parse_args()
    stalls = [s for s in read(args.folder) if s.ms > args.over_ms]
    print(f"| process | program | stalls > {args.over_ms:g} ms | longest ms | total ms "
          "| on a core ms | waiting for a core ms |")
    print("|---|---|---|---|---|---|---|")
    by_pid: dict[str, list[Stall]] = collections.defaultdict(list)
    for stall in stalls:
        by_pid[stall.pid].append(stall)
    for pid, own in sorted(by_pid.items()):
        print(f"| {pid} | {own[0].program} | {len(own)} | {max(s.ms for s in own):.0f} "
              f"| {sum(s.ms for s in own):.0f} | {sum(s.on_core_ms for s in own):.0f} "
              f"| {sum(s.runqueue_ms for s in own):.0f} |")
    shared = sum(any(o.pid != s.pid and o.start < s.end and s.start < o.end for o in stalls)
                 for s in stalls)
    print(f"\n{shared} of {len(stalls)} stalls overlapped a stall of another process.\n")
    totals: collections.Counter[str] = collections.Counter()
    for stall in stalls:
        totals.update(stall.samples)
    for sample, count in totals.most_common(12):
        print(f"{count:6d}  {sample}")


if __name__ == "__main__":
    main()
