"""Echo benchmarks: the agent (echo plugin) against a plain aiortc echo server, same run.

    python benchmarks/echo_bench.py delay      # round-trip delay of the test signal
    python benchmarks/echo_bench.py cpu        # server CPU per call (load-independent)
    python benchmarks/echo_bench.py capacity   # concurrent real-time calls on one core
    python benchmarks/echo_bench.py all
    python benchmarks/echo_bench.py delay --random-start 40   # calls at random moments

`delay --random-start N` runs one agent server and N overlapping calls, each started at a
random moment within `--window` seconds (so each meets the agent's shared 80 ms tick at its
own phase, some while others run), and prints each call's echo round trip, the median, the
spread and how many lie within 10 ms of the best.

Servers run pinned to core 0 (`taskset -c 0`), callers in another process on core 1. A level
of N concurrent calls passes when every call connected, no received-audio gap after the first
second exceeded 60 ms, each call received >= 99% of what could come back (the seconds it
sent minus the echo delay), and >= 99% of the 20 ms frames of the echo carried the signal
(not silence filled in by a server that fell behind); a failing level is tried once more.
Each capacity level also prints the server's CPU (its core's share while every call was live,
and over the whole level), the callers' process's share of its core (near 100 % the rig
itself, not the server, limits the level), the
agent's event-loop lag from its /metrics, and why a failing level failed; the table starts
with the frame-cost calibration so figures from different days can be compared.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness import ROOT, agent_command, cpu_seconds, free_port, placed, server_on_core0
from prometheus_client.metrics_core import Metric

GAP_LIMIT_MS = 60.0


SERVER_PIDS: list[int] = []


@contextmanager
def server(kind: str, extra: list[str] | None = None, niceness: int = 0) -> Iterator[str]:
    """One of the two servers on core 0; with `niceness`, both run at it (`nice -n`), so a
    comparison beside other work stays fair."""
    port = free_port()
    if kind == "agent":
        command = agent_command(port, "--ice-host", "127.0.0.1",
                                # one address opening a whole level of calls at once: not an attack
                                "--max-unauthenticated-per-address", "0", *(extra or []))
    else:
        command = [sys.executable, "benchmarks/baseline_aiortc_echo_server.py", "--port", str(port)]
    with server_on_core0(placed(niceness=niceness) + command, port) as pid:
        SERVER_PIDS.append(pid)
        yield f"http://127.0.0.1:{port}"


async def run_callers(url: str, count: int, seconds: float, codec: str,
                      preencode: bool, window: float | None = None,
                      seed: int = 0, sequential: bool = False,
                      keep_ticking: bool = False) -> list[dict[str, Any]]:
    from agent.rtc_tuning import limit_host_addresses
    from agent.testing.peer import PreencodedSignalTrack, run_call
    from agent.testing.testsignal import make_test_signal

    limit_host_addresses(["127.0.0.1"])
    signal_samples = make_test_signal(seconds + 1)
    payloads = PreencodedSignalTrack.encode(signal_samples, codec) if preencode else None

    rng = random.Random(seed)
    starts = ([index * STAGGER_S for index in range(count)] if window is None  # like arrivals
              else sorted(rng.uniform(0, window) for _ in range(count)))

    if sequential:  # one call after the other, each after a random pause of up to 1 s
        # `keep_ticking`: a call that runs throughout (not measured) keeps the agent's tick on
        # one timeline, so each measured call joins it at a phase its random start decides
        # (without it the tick starts again at each call's offer).
        ticking = (asyncio.ensure_future(run_call(url, seconds=count * (seconds + 4) + 10,
                                                  codec=codec, data_channel=False))
                   if keep_ticking else None)
        await asyncio.sleep(2 if keep_ticking else 0)
        reports = []
        for _ in range(count):
            await asyncio.sleep(rng.uniform(0, 1))
            report, _, _ = await run_call(url, seconds=seconds, codec=codec, data_channel=False)
            reports.append(report.__dict__)
        if ticking is not None:
            ticking.cancel()
            await asyncio.gather(ticking, return_exceptions=True)
        return reports

    async def one(index: int) -> dict[str, Any]:
        await asyncio.sleep(starts[index])
        report, _, _ = await run_call(url, signal=signal_samples if payloads else None,
                                      seconds=seconds, codec=codec, data_channel=False,
                                      preencoded=payloads)
        return report.__dict__

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def callers_subprocess(url: str, count: int, seconds: float, codec: str,
                       preencode: bool, core: str | None = "1",
                       on_start: Callable[[int], None] | None = None,
                       niceness: int = 0, window: float | None = None,
                       seed: int = 0, sequential: bool = False,
                      keep_ticking: bool = False) -> list[dict[str, Any]]:
    """`count` calls from one caller process (pinned to `core`; None: anywhere; at
    `niceness`); `on_start` gets its pid (to watch its CPU); `window`: each call starts at a
    random moment within it (`seed`) instead of staggered."""
    command = placed(core, niceness) + [sys.executable, __file__, "callers", "--url", url,
                                        "--n", str(count), "--seconds", str(seconds),
                                        "--codec", codec, "--seed", str(seed)]
    if window is not None:
        command += ["--window", str(window)]
    if sequential:
        command.append("--sequential")
    if keep_ticking:
        command.append("--keep-ticking")
    if preencode:
        command.append("--preencode")
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        if on_start is not None:
            on_start(process.pid)  # taskset and nice exec the caller: the same pid
        try:
            out, err = process.communicate(
                timeout=(seconds + 3) * (count if sequential else 3) + (window or 0) + 60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    if process.returncode != 0:
        raise RuntimeError(err[-2000:])
    return json.loads(out)


STAGGER_S = 0.15  # run_callers starts call i at i * STAGGER_S


class LiveWindowCpu:
    """A server's CPU share while every call of a level is live: from the last call's set-up
    (plus a second to connect) until the first one ends. Averaged over the whole level the
    figure also counts the ramp-up and tear-down, and reads far below the core's real load
    (24 calls: 67 % on average, 89 % with every call live)."""

    def __init__(self, cpu: Callable[[], float], count: int, seconds: float,
                 ramp_s: float | None = None) -> None:
        # `ramp_s`: how long the callers take to open every call, where not staggered
        self.start = (count * STAGGER_S if ramp_s is None else ramp_s) + 1.0
        self.end = seconds - 0.5
        self.share: float | None = None
        self._cpu = cpu
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self.end - self.start >= 1.0:
            self._thread.start()

    def _sample(self) -> None:
        time.sleep(self.start)
        try:
            before, began = self._cpu(), time.monotonic()
            time.sleep(self.end - self.start)
            self.share = (self._cpu() - before) / (time.monotonic() - began)
        except OSError:  # the process ended early (a failed level): no figure
            self.share = None

    def result(self) -> float | None:
        if self._thread.ident is not None:  # started: the window fits in the level
            self._thread.join()
        return self.share


def level_passes(reports: list[dict[str, Any]], delay_s: float) -> tuple[bool, str]:
    worst_ratio = 1.0
    worst_gap = 0.0
    worst_loud = 1.0
    for report in reports:
        if not report["connected"] or report["error"]:
            return False, f"call failed: {report['error']}"
        possible = max(0.1, report["seconds_sent"] - delay_s)
        worst_ratio = min(worst_ratio, report["seconds_received"] / possible)
        worst_gap = max(worst_gap, report["max_gap_ms"])
        # Packets arriving on time are not enough (the agent's pacer sends silence when it
        # has nothing): the echoed signal itself must come back without holes.
        worst_loud = min(worst_loud, report["loud_fraction"] or 0.0)
    ok = worst_ratio >= 0.99 and worst_gap <= GAP_LIMIT_MS and worst_loud >= 0.99
    return ok, (f"min received {worst_ratio:.3f}, max gap {worst_gap:.0f} ms, "
                f"min echoed {worst_loud:.3f}")


def measure_delay(kind: str, runs: int, seconds: float,
                  extra: list[str] | None = None) -> list[dict[str, Any]]:
    with server(kind, extra) as url:
        return [callers_subprocess(url, 1, seconds, "opus", False)[0] for _ in range(runs)]


def bench_delay(runs: int, seconds: float) -> None:
    print("\n### Round-trip delay of the test signal (Opus, loopback, one call at a time)\n")
    print("| server | runs | median delay ms | min | max | mean correlation |")
    print("|---|---|---|---|---|---|")
    variants = (
        ("plain aiortc echo", "plain", None),
        ("agent (echo plugin)", "agent", None),
        ("agent, --jitter-buffer 0", "agent", ["--jitter-buffer", "0"]),
    )
    for kind, server_kind, extra in variants:
        reports = measure_delay(server_kind, runs, seconds, extra)
        delays = [r["delay_ms"] for r in reports if r["delay_ms"] is not None]
        correlations = [r["correlation"] for r in reports if r["correlation"] is not None]
        print(f"| {kind} | {len(delays)} | {statistics.median(delays):.0f} | {min(delays):.0f} "
              f"| {max(delays):.0f} | {statistics.mean(correlations):.3f} |", flush=True)


BEST_WITHIN_MS = 10.0  # half a packet: a call this close to the best is at the best phase
CLEAN_ECHO = 0.9  # a lower correlation: the lag found is not the echo's (a starved rig)


def bench_random_start(count: int, seconds: float, window: float, seed: int,
                       niceness: int = 0, sequential: bool = False,
                       keep_ticking: bool = False) -> None:
    """N calls at random moments against one agent: each call's round trip, and how many are
    at the best phase (within half a packet of the fastest call). `niceness` for the server
    and the callers (negative: ahead of other work on a shared machine; needs root)."""
    with server("agent", niceness=niceness) as url:
        reports = callers_subprocess(url, count, seconds, "opus", False, core="1",
                                     window=window, seed=seed, niceness=niceness,
                                     sequential=sequential, keep_ticking=keep_ticking)
    delays = [r["delay_ms"] for r in reports if r["connected"] and r["delay_ms"] is not None
              and (r["correlation"] or 0.0) >= CLEAN_ECHO]
    failed = len(reports) - len(delays)
    when = ("one at a time, each after a random pause of up to 1 s"
            + (", beside a call that runs throughout" if keep_ticking else "") if sequential
            else f"started at random moments within {window:g} s")
    print(f"\n### Echo round trip, {count} calls {when} "
          f"(Opus, loopback, {seconds:g} s each, seed {seed})\n")
    print("| call | round trip ms | correlation |")
    print("|---|---|---|")
    for index, report in enumerate(reports):
        print(f"| {index} | {report['delay_ms']} | {report['correlation']} |")
    if not delays:
        print("\nno call measured")
        return
    best = min(delays)
    near = sum(1 for d in delays if d - best <= BEST_WITHIN_MS)
    print(f"\nmedian {statistics.median(delays):.1f} ms, best {best:.1f}, worst "
          f"{max(delays):.1f}, spread {max(delays) - best:.1f} ms; within "
          f"{BEST_WITHIN_MS:g} ms of the best: {near}/{len(delays)}"
          + (f"; {failed} calls left out (no echo, or correlation < {CLEAN_ECHO})"
             if failed else ""), flush=True)


def bench_cpu(codecs: list[str], calls: int, seconds: float) -> None:
    """Server CPU per call: load-independent, unlike the pass/fail capacity levels."""
    print(f"\n### Server CPU per call ({calls} concurrent calls, {seconds:g} s)\n")
    print("| server | codec | % of one core per call | calls one core could carry |")
    print("|---|---|---|---|")
    for codec in codecs:
        for kind, label in (("plain", "plain aiortc echo"), ("agent", "agent (echo plugin)")):
            with server(kind) as url:
                pid = SERVER_PIDS[-1]
                time.sleep(1.0)
                before = cpu_seconds(pid)
                started = time.monotonic()
                callers_subprocess(url, calls, seconds, codec, True)
                used = cpu_seconds(pid) - before
                wall = time.monotonic() - started
            # Set-up and tear-down are inside the window too; they are part of a call's cost.
            per_call = used / wall / calls * 100
            print(f"| {label} | {codec} | {per_call:.1f} | {100 / per_call:.0f} |", flush=True)


def scrape(url: str) -> list[Metric]:
    """The agent's /metrics, parsed by prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def lag_buckets(families: list[Metric], name: str = "agent_event_loop_lag_seconds",
                **labels: str) -> dict[float, float]:
    """Cumulative bucket counts of one of the agent's histograms (the event-loop lag unless
    told otherwise)."""
    buckets: dict[float, float] = {}
    for family in families:
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket") and all(
                    sample.labels.get(key) == value for key, value in labels.items()):
                buckets[float(sample.labels["le"])] = sample.value
    return buckets


def counter_total(families: list[Metric], name: str) -> float:
    """One of the agent's counters, summed over its labels."""
    return sum(sample.value for family in families
               for sample in family.samples if sample.name == name + "_total")


def level_quantiles(before: dict[float, float], after: dict[float, float],
                    fractions: tuple[float, ...]) -> tuple[float, list[str]]:
    """How many observations a histogram gained during a level, and the bucket bound (ms)
    under which each fraction of them fell."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0

    def bound(fraction: float) -> str:
        for edge, count in zip(bounds, counts, strict=True):
            if count >= fraction * total:
                return "inf" if edge == float("inf") else f"{edge * 1000:g}"
        return "inf"

    return total, [bound(fraction) for fraction in fractions] if total > 0 else []


def gc_pauses(before: dict[float, float], after: dict[float, float]) -> str:
    """Full (generation 2) collector passes during a level and the longest, as a bound."""
    total, bounds = level_quantiles(before, after, (1.0,))
    return f"{total:.0f} (<={bounds[0]} ms)" if total > 0 else "0"


def lag_quantiles(before: dict[float, float], after: dict[float, float]) -> str:
    """p50 / p99 / max of the loop lag during a level, as histogram bucket bounds (<= x ms)."""
    total, bounds = level_quantiles(before, after, (0.5, 0.99, 1.0))
    return " / ".join(f"<={b}" for b in bounds) if total > 0 else "-"


def agent_figures(before: list[Metric], after: list[Metric]
                  ) -> tuple[str, str, float | None]:
    """Loop lag, full GC passes and holes sent during a level, from the agent's /metrics
    scraped before and after it ("-", "-", None for the plain echo, which has none)."""
    if not after:
        return "-", "-", None
    lag = lag_quantiles(lag_buckets(before), lag_buckets(after))
    full_gc = gc_pauses(lag_buckets(before, "agent_gc_pause_seconds", generation="2"),
                        lag_buckets(after, "agent_gc_pause_seconds", generation="2"))
    holes = (counter_total(after, "agent_outbound_late_packets")
             - counter_total(before, "agent_outbound_late_packets"))
    return lag, full_gc, holes


def failure_cause(busy: float, holes_sent: float | None, detail: str) -> str:
    """Why a level failed: a call was refused or failed to connect, the server ran out of CPU,
    or audio came late; and for the agent, whether the server itself left the holes (its
    pacer's count of packets sent > 60 ms after the one before) or they opened after it (the
    callers' process, the network stack)."""
    if detail.startswith("call failed"):
        return "call failed"
    if busy >= 0.95:
        return "throughput"
    if holes_sent is None:
        return "timing"
    return "timing (server sent late)" if holes_sent > 0 else "timing (after the server)"


def calibration() -> float:
    """The frame-cost calibration (ms per 80 ms frame per call, one call): how fast this
    machine is right now, printed beside every capacity figure."""
    from frame_cost_bench import run as frame_cost

    return min(frame_cost(1, 400) for _ in range(3))


def bench_capacity(codecs: list[str], levels: list[int], seconds: float,
                   niceness: int = 0, agent_flags: list[str] | None = None,
                   busy_loop: int | None = None, busy_loop_on: str = "any") -> None:
    print("\n### Concurrent real-time calls, server pinned to one core\n")
    if agent_flags:
        print(f"Agent flags: `{' '.join(agent_flags)}`.")
    with busy_loop_beside(busy_loop, busy_loop_on):
        capacity_levels(codecs, levels, seconds, niceness, agent_flags or [])


# --busy-loop-on → (core, how the table names it)
BUSY_LOOP_CORES = {"any": (None, "not pinned"), "server": ("0", "on the server's core (0)"),
                   "callers": ("1", "on the callers' core (1)")}


@contextmanager
def busy_loop_beside(niceness: int | None, where: str = "any") -> Iterator[None]:
    """A CPU-bound neighbour for the whole run at `niceness` (None: none), on the server's
    core, the callers' or not pinned (`any`: the kernel puts it where there is room, mostly
    beside the callers)."""
    if niceness is None:
        yield
        return
    core, description = BUSY_LOOP_CORES[where]
    print(f"A busy loop (one process, {description}, nice {niceness}) runs for the whole "
          "table.\n")
    loop = subprocess.Popen(placed(core, niceness) + [sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


def capacity_levels(codecs: list[str], levels: list[int], seconds: float, niceness: int,
                    agent_flags: list[str]) -> None:
    print(f"Calibration: frame cost {calibration():.3f} ms per frame per call "
          "(`frame_cost_bench.py`, 1 call). Loop lag: the agent's event-loop lag histogram "
          "during the level (bucket bounds, ms); full GC passes: the agent's generation-2 "
          "collections during the level (every thread stops for them). Server CPU: its "
          "core's share while every call was live (the whole level's average in brackets). "
          "A failing level is `throughput` when that share was >= 95 %, else `timing`. "
          "Holes sent: the agent's packets released > 60 ms after the one before (its "
          "`agent_outbound_late_packets`); a timing failure with none opened after the "
          "server.\n")
    print("| server | codec | calls | result | server CPU live (avg) | loop lag p50 / p99 / max ms "
          "| full GC passes (longest) | detail |")
    print("|---|---|---|---|---|---|---|---|")
    for codec in codecs:
        for kind in ("plain", "agent"):
            label = "plain aiortc echo" if kind == "plain" else "agent (echo plugin)"
            extra = agent_flags if kind == "agent" else None
            with server(kind, extra, niceness=niceness) as url:
                delay = callers_subprocess(url, 1, 4, codec, False)[0]["delay_ms"] or 300
            best = 0
            for count in levels:
                # A shared 2-core machine stalls now and then; a level gets a second try so
                # one stray 70 ms hiccup does not decide it. Both tries are printed.
                for attempt in (1, 2):
                    with server(kind, extra, niceness=niceness) as url:
                        pid = SERVER_PIDS[-1]
                        before = scrape(url) if kind == "agent" else []
                        cpu_before, started = cpu_seconds(pid), time.monotonic()
                        live = LiveWindowCpu(functools.partial(cpu_seconds, pid), count, seconds)
                        callers_live: list[LiveWindowCpu] = []
                        reports = callers_subprocess(
                            url, count, seconds, codec, True,
                            on_start=lambda caller, into=callers_live, count=count: into.append(
                                LiveWindowCpu(functools.partial(cpu_seconds, caller), count,
                                              seconds)))
                        average = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - started)
                        live_share = live.result()
                        busy = live_share if live_share is not None else average
                        after = scrape(url) if kind == "agent" else []
                    lag, full_gc, holes = agent_figures(before, after)
                    ok, detail = level_passes(reports, delay / 1000)
                    if holes is not None:
                        detail += f", holes sent {holes:.0f}"
                    callers_share = callers_live[0].result() if callers_live else None
                    if callers_share is not None:
                        # one core's worth of callers is this rig's own ceiling
                        detail += f", callers {callers_share * 100:.0f} % of their core"
                    if not ok:
                        detail += "; " + failure_cause(busy, holes, detail)
                    live_text = "-" if live_share is None else f"{live_share * 100:.0f} %"
                    row = f"{live_text} ({average * 100:.0f} %) | {lag} | {full_gc} | {detail}"
                    if ok or attempt == 2:
                        break
                    print(f"| {label} | {codec} | {count} | (retry) | {row} |", flush=True)
                print(f"| {label} | {codec} | {count} | {'real time' if ok else 'FAILS'} "
                      f"| {row} |", flush=True)
                if not ok:
                    break
                best = count
            print(f"| **{label}** | **{codec}** | **{best}** | **max real time** | | | | |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    delay = sub.add_parser("delay")
    delay.add_argument("--runs", type=int, default=5)
    delay.add_argument("--seconds", type=float, default=6)
    delay.add_argument("--random-start", type=int, default=None, metavar="N",
                       help="N calls at random moments against one agent (see above)")
    delay.add_argument("--window", type=float, default=None,
                       help="seconds over which the random starts spread (default N x 0.5)")
    delay.add_argument("--seed", type=int, default=1)
    delay.add_argument("--one-at-a-time", action="store_true",
                       help="with --random-start: the calls one after the other (no two "
                       "overlap: one's set-up cannot disturb another)")
    delay.add_argument("--keep-ticking", action="store_true",
                       help="with --one-at-a-time: beside one long unmeasured call, so the "
                       "measured calls join a running tick")
    delay.add_argument("--nice", type=int, default=0,
                       help="with --random-start: the server's and callers' niceness")
    capacity = sub.add_parser("capacity")
    capacity.add_argument("--codecs", default="opus,pcmu")
    capacity.add_argument("--levels", default="2,4,6,8,10,12,15,18,21,24,28,32")
    capacity.add_argument("--seconds", type=float, default=10)
    capacity.add_argument("--server-nice", type=int, default=0,
                          help="run both servers at this niceness (negative: ahead of other "
                          "work on the machine; needs root)")
    capacity.add_argument("--agent-flags", default="",
                          help="more flags for the agent's server, e.g. '--opus-complexity 5'")
    capacity.add_argument("--busy-loop", type=int, default=None, metavar="NICE",
                          help="run a CPU-bound process beside the servers at this niceness "
                          "(0: the same priority as the servers) for the whole table")
    capacity.add_argument("--busy-loop-on", choices=sorted(BUSY_LOOP_CORES), default="any",
                          help="pin the busy loop to the server's core, the callers' or "
                          "neither (default any)")
    cpu = sub.add_parser("cpu")
    cpu.add_argument("--codecs", default="opus,pcmu")
    cpu.add_argument("--calls", type=int, default=6)
    cpu.add_argument("--seconds", type=float, default=10)
    sub.add_parser("all")
    callers = sub.add_parser("callers")
    callers.add_argument("--url", required=True)
    callers.add_argument("--n", type=int, default=1)
    callers.add_argument("--seconds", type=float, default=10)
    callers.add_argument("--codec", default="opus")
    callers.add_argument("--preencode", action="store_true")
    callers.add_argument("--window", type=float, default=None)
    callers.add_argument("--seed", type=int, default=0)
    callers.add_argument("--sequential", action="store_true")
    callers.add_argument("--keep-ticking", action="store_true")
    args = parser.parse_args()
    if args.command == "callers":
        reports = asyncio.run(run_callers(args.url, args.n, args.seconds, args.codec,
                                          args.preencode, args.window, args.seed,
                                          args.sequential, args.keep_ticking))
        print(json.dumps(reports))
    elif args.command == "delay" and args.random_start:
        bench_random_start(args.random_start, args.seconds,
                           args.window if args.window is not None else args.random_start * 0.5,
                           args.seed, args.nice, args.one_at_a_time, args.keep_ticking)
    elif args.command == "delay":
        bench_delay(args.runs, args.seconds)
    elif args.command == "cpu":
        bench_cpu(args.codecs.split(","), args.calls, args.seconds)
    elif args.command == "capacity":
        bench_capacity(args.codecs.split(","), [int(n) for n in args.levels.split(",")],
                       args.seconds, args.server_nice, shlex.split(args.agent_flags),
                       args.busy_loop, args.busy_loop_on)
    else:
        bench_delay(5, 6)
        bench_cpu(["opus", "pcmu"], 6, 10)
        bench_capacity(["opus", "pcmu"], [2, 4, 6, 8, 10, 12, 15, 18, 21, 24, 28, 32], 10)


if __name__ == "__main__":
    main()
