"""`--workers`: real-time echo calls held by 1 worker and by 2, on the same machine.

    python benchmarks/workers_bench.py [--transport webrtc|rtp] [--workers 1,2]
                                       [--levels 8,16,24,...] [--seconds 10]
                                       [--server-cores 0,1 --callers-cores 2]

By default nothing is pinned: the server (its supervisor and workers) and the one caller
process share every core, the same way for each worker count, so the caller's own CPU is part
of both runs. On a machine with more cores than the server is given, `--server-cores` and
`--callers-cores` keep the callers off the server's cores (the check the 2-core machine
these benchmarks were written on cannot make: there the callers always share).
`webrtc` callers are aiortc peers sending pre-encoded Opus (they do not encode); `rtp`
callers are the RTP legs of `telephony_capacity_bench.py` (PCMU, no SRTP or ICE; one socket
and one plain loop for every leg, sends spread over four phases of each 20 ms, drained every
5 ms with the kernel's arrival stamps, what came back judged after the run): about 0.05 % of
a core per leg while sending, a tenth of what the server spends on it, so they leave most of
the machine to the server. A level passes as in `echo_bench.py capacity` /
`telephony_capacity_bench.py` (every call connected, no gap over 60 ms after the first
second, >= 99 % received and echoed); a failing level is tried once more. Each level is run
for every worker count in turn (1 worker, then 2, then the next level), so the counts share
the same minutes of the machine. Each row gives what a second core added just before the
level (two busy processes' work over one's, `core_scaling_bench.py`: 2x on two real cores,
less on a VM whose host is short of CPU), the server's CPU in cores (all its processes) while
every call was live and over the whole level, and the caller process's while sending (and
over the level), with the worst lateness of what the callers sent. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import core_scaling_bench
import telephony_capacity_bench as telephony
from echo_bench import LiveWindowCpu, calibration, callers_subprocess, level_passes
from harness import ROOT, agent_command, free_port, placed, tree_cpu_seconds, wait_for_port

RTP_RAMP_S = 2.0  # the RTP clients' start-up and opening of every leg, before the live window

# (url, calls, seconds, echo delay in s) -> (passed, detail, the callers' own figures while
# sending: "cores" and "late_ms", as `telephony_capacity_bench.ClientsRun`; empty: unknown)
LevelRunner = Callable[[str, int, float, float], tuple[bool, str, dict[str, float | None]]]


@contextmanager
def agent(workers: int, niceness: int = 0, cores: str | None = None
          ) -> Iterator[tuple[str, int]]:
    """The server with `workers` workers, pinned to `cores` (None: anywhere)."""
    port = free_port()
    command = placed(cores) + agent_command(
        port, "--ice-host", "127.0.0.1", "--max-unauthenticated-per-address", "0",
        "--rtp-ports", "42000-45999", "--idle-timeout", "30", "--nice", str(niceness),
        workers=workers)
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


def webrtc_level(url: str, count: int, seconds: float, delay_s: float, niceness: int = 0,
                 cores: str | None = None) -> tuple[bool, str, dict[str, float | None]]:
    return *level_passes(callers_subprocess(url, count, seconds, "opus", True, core=cores,
                                            niceness=niceness), delay_s), {}


def rtp_level(url: str, count: int, seconds: float, delay_s: float, niceness: int = 0,
              cores: str | None = None) -> tuple[bool, str, dict[str, float | None]]:
    summaries, callers = telephony.clients_subprocess("rtp", url, count, seconds,
                                                      core=cores, niceness=niceness)
    return *telephony.level_passes(summaries), callers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=["webrtc", "rtp"], default="webrtc")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--levels", default="8,16,24,32,40,48,56,64")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--callers-nice", type=int, default=0, metavar="N",
                        help="run the caller process at this niceness in every run (negative: "
                        "the measuring callers ahead of the server's workers; needs root)")
    parser.add_argument("--server-nice", type=int, default=0, metavar="N",
                        help="start the server with --nice N in every run (negative: its "
                        "workers ahead of the callers; needs root)")
    parser.add_argument("--server-cores", type=core_list, default=None, metavar="LIST",
                        help="pin the server (supervisor and workers) to these cores, e.g. 0,1 "
                        "(default: anywhere)")
    parser.add_argument("--callers-cores", type=core_list, default=None, metavar="LIST",
                        help="pin the caller process to these cores, e.g. 2 (default: anywhere)")
    args = parser.parse_args()
    print(f"\nCalibration: frame cost {calibration():.3f} ms per frame per call "
          f"(`frame_cost_bench.py`, 1 call). Callers: {args.transport}, nice "
          f"{args.callers_nice}, cores {args.callers_cores or 'any'}; server nice "
          f"{args.server_nice}, cores {args.server_cores or 'any'}.\n")
    print("| workers | calls | result | machine: two cores / one | server cores live (avg) "
          "| caller cores sending (avg) | detail |")
    print("|---|---|---|---|---|---|---|")
    run_level: LevelRunner = partial(webrtc_level if args.transport == "webrtc" else rtp_level,
                                     niceness=args.callers_nice, cores=args.callers_cores)
    worker_counts = [int(n) for n in args.workers.split(",")]
    # What a second core is worth is measured on the server's own cores when it is pinned.
    scaling_cores = ([int(core) for core in args.server_cores.split(",")]
                     if args.server_cores else None)
    delays_s = {workers: 0.3 for workers in worker_counts}
    if args.transport == "webrtc":
        for workers in worker_counts:
            with agent(workers, args.server_nice, args.server_cores) as (url, _):
                report = callers_subprocess(url, 1, 4, "opus", False,
                                            core=args.callers_cores)[0]
                delays_s[workers] = (report["delay_ms"] or 300) / 1000
    # Every level is run for each worker count in turn, so the counts are compared under the
    # same minutes of the machine (on a VM a core's worth moves by the minute).
    best = {workers: 0 for workers in worker_counts}
    still_holding = list(worker_counts)
    for count in [int(n) for n in args.levels.split(",")]:
        for workers in list(still_holding):
            ok = run_with_retry(run_level, workers, count, args, delays_s[workers],
                                scaling_cores)
            if ok:
                best[workers] = count
            else:
                still_holding.remove(workers)
        if not still_holding:
            break
    for workers in worker_counts:
        print(f"| **{workers}** | **{best[workers]}** | **max real time** | | | | |", flush=True)
    if len(worker_counts) > 1 and best[worker_counts[0]]:
        base = best[worker_counts[0]]
        print("\n" + ", ".join(f"{workers} workers / {worker_counts[0]}: "
                               f"{best[workers] / base:.2f}x" for workers in worker_counts[1:])
              + (" (at least: a count that held every level was not taken to its limit)"
                 if still_holding else ""))


def run_with_retry(run_level: LevelRunner, workers: int, count: int,
                   args: argparse.Namespace, delay_s: float,
                   scaling_cores: list[int] | None = None) -> bool:
    """One level, tried once more if it fails; prints a row per try."""
    for attempt in (1, 2):
        # What the second core was worth just before (it moves by the minute on a VM whose
        # host is short of CPU): see core_scaling_bench.py.
        scaling = core_scaling_bench.describe(
            core_scaling_bench.pair_speedup(1.0, cores=scaling_cores))
        ok, row = one_level(run_level, workers, count, args.seconds, delay_s,
                            RTP_RAMP_S if args.transport == "rtp" else None, args.server_nice,
                            args.server_cores)
        if not ok and attempt == 1:
            print(f"| {workers} | {count} | (retry) | {scaling} | {row} |", flush=True)
            continue
        print(f"| {workers} | {count} | {'real time' if ok else 'FAILS'} | {scaling} "
              f"| {row} |", flush=True)
        return ok
    return False


def one_level(run_level: LevelRunner, workers: int, count: int, seconds: float,
              delay_s: float, ramp_s: float | None, server_nice: int = 0,
              server_cores: str | None = None) -> tuple[bool, str]:
    with agent(workers, server_nice, server_cores) as (url, pid):
        before, started = tree_cpu_seconds(pid), time.monotonic()
        caller_before = cpu_of_children()
        live = LiveWindowCpu(lambda: tree_cpu_seconds(pid), count, seconds, ramp_s)
        ok, detail, callers = run_level(url, count, seconds, delay_s)
        wall = time.monotonic() - started
        server_cores = (tree_cpu_seconds(pid) - before) / wall
        caller_cores = (cpu_of_children() - caller_before) / wall
        live_cores = live.result()
    live_text = "-" if live_cores is None else f"{live_cores:.2f}"
    sending = callers.get("cores")
    sending_text = "-" if sending is None else f"{sending:.2f}"
    late = callers.get("late_ms")
    late_text = "" if late is None else f", callers' latest send {late:.0f} ms"
    return ok, (f"{live_text} ({server_cores:.2f}) | {sending_text} ({caller_cores:.2f}) "
                f"| {detail}{late_text}")


def core_list(text: str) -> str:
    """`--server-cores` / `--callers-cores`: comma-separated cores this machine lets us use."""
    try:
        cores = [int(core) for core in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of core numbers: {text!r}") from None
    usable = os.sched_getaffinity(0)
    missing = [core for core in cores if core not in usable]
    if missing:
        raise argparse.ArgumentTypeError(
            f"core {missing[0]} is not one of this machine's usable cores {sorted(usable)}")
    return ",".join(str(core) for core in cores)


def cpu_of_children() -> float:
    """CPU time of this process's finished children (the caller processes)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
