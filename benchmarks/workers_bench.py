"""`--workers`: real-time Opus echo calls held by 1 worker and by 2, on the same machine.

    python benchmarks/workers_bench.py [--workers 1,2] [--levels 8,16,24,...] [--seconds 10]

Nothing is pinned: the server (its supervisor and workers) and the one caller process share
every core, the same way for each worker count, so the caller's own CPU is part of both runs.
Callers send pre-encoded Opus (they do not encode). A level passes as in `echo_bench.py
capacity` (every call connected, no gap over 60 ms after the first second, >= 99 % received
and echoed); a failing level is tried once more. Each row gives the server's CPU in cores
(all its processes) while every call was live and over the whole level, and the caller
process's over the level. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from echo_bench import LiveWindowCpu, calibration, callers_subprocess, level_passes
from harness import ROOT, agent_command, free_port, tree_cpu_seconds, wait_for_port


@contextmanager
def agent(workers: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    command = agent_command(port, "--ice-host", "127.0.0.1",
                            "--max-unauthenticated-per-address", "0", workers=workers)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        time.sleep(1.0 + workers)  # every worker listening
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--levels", default="8,16,24,32,40,48,56,64")
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    print(f"\nCalibration: frame cost {calibration():.3f} ms per frame per call "
          "(`frame_cost_bench.py`, 1 call).\n")
    print("| workers | calls | result | server cores live (avg) | caller cores (avg) | detail |")
    print("|---|---|---|---|---|---|")
    for workers in [int(n) for n in args.workers.split(",")]:
        with agent(workers) as (url, _):
            delay = callers_subprocess(url, 1, 4, "opus", False, core=None)[0]["delay_ms"] or 300
        best = 0
        for count in [int(n) for n in args.levels.split(",")]:
            for attempt in (1, 2):
                with agent(workers) as (url, pid):
                    before, started = tree_cpu_seconds(pid), time.monotonic()
                    caller_before = cpu_of_children()
                    live = LiveWindowCpu(lambda: tree_cpu_seconds(pid), count, args.seconds)
                    reports = callers_subprocess(url, count, args.seconds, "opus", True, core=None)
                    wall = time.monotonic() - started
                    server_cores = (tree_cpu_seconds(pid) - before) / wall
                    caller_cores = (cpu_of_children() - caller_before) / wall
                    live_cores = live.result()
                ok, detail = level_passes(reports, delay / 1000)
                live_text = "-" if live_cores is None else f"{live_cores:.2f}"
                row = f"{live_text} ({server_cores:.2f}) | {caller_cores:.2f} | {detail}"
                if ok or attempt == 2:
                    break
                print(f"| {workers} | {count} | (retry) | {row} |", flush=True)
            print(f"| {workers} | {count} | {'real time' if ok else 'FAILS'} | {row} |",
                  flush=True)
            if not ok:
                break
            best = count
        print(f"| **{workers}** | **{best}** | **max real time** | | | |", flush=True)


def cpu_of_children() -> float:
    """CPU time of this process's finished children (the caller processes)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
