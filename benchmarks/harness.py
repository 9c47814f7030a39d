"""What the benchmark scripts share: the tests' shared helpers on the path (`tests.support`),
ports, pinning to a core, a server's CPU time, and for capacity levels the steady window's
CPU (agent, callers, foreign), the frame-cost calibration and the echo's correlation with
what was sent."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The helpers the benchmarks share with the tests (tests/support/: the fake clock, the fake
# engines, headless Chromium, the UDP relay) are not installed with the package: importing
# this module puts the repository root on the path so that `tests.support` imports.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent_command(port: int, *flags: str, workers: int = 1) -> list[str]:
    """`python -m signaling` on `port` as a benchmark runs it: one worker process unless told
    otherwise (the server's default is one per core, and a benchmark that pins the server to
    a core or reads one pid's CPU, memory or threads measures one process), and no admission
    limit unless `flags` set one (the default, calls per core, would refuse a capacity level
    before the server itself runs out)."""
    limit = [] if "--max-sessions" in flags else ["--max-sessions", "0"]
    return [sys.executable, "-m", "signaling", "--port", str(port), "--workers", str(workers),
            "--log-level", "WARNING", *limit, *flags]


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not start")


def taskset(core: str) -> list[str]:
    """Prefix that pins a command to `core` (nothing on a one-core machine)."""
    return ["taskset", "-c", core] if (os.cpu_count() or 1) > 1 else []


def placed(core: str | None = None, niceness: int = 0) -> list[str]:
    """Prefix that runs a command pinned to `core` (None: anywhere) at `niceness`."""
    pin = taskset(core) if core is not None else []
    return pin + (["nice", "-n", str(niceness)] if niceness else [])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (a supervisor's workers), from /proc."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and every process below it that is still running."""
    total = 0.0
    for member in [pid, *descendants(pid)]:
        try:
            total += cpu_seconds(member)
        except OSError:
            pass
    return total


@contextmanager
def server_on_core0(command: list[str], port: int) -> Iterator[int]:
    """A server process pinned to core 0, once `port` accepts; its pid. Stopped with SIGINT
    (killed after 10 s) on the way out."""
    process = subprocess.Popen(taskset("0") + command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield process.pid
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# -- capacity levels: the steady window, the echo's content, the machine's state -------------

WINDOW_START, WINDOW_END = "WINDOW start", "WINDOW end"  # what a clients process prints
CORRELATION_MIN = 0.9  # per second, the probe's echo against what it sent


MARKS = {"print": False}  # a clients process run by `run_windowed` turns this on


def mark_window(edge: str) -> None:
    """For a clients process: the steady window (every call up, before hang-up) starts or
    ends now (printed on stdout, read by `run_windowed`; nothing when run in-process)."""
    if MARKS["print"]:
        print(edge, flush=True)


def busy_seconds() -> float:
    """CPU time every core spent busy (user, nice, system, irq, softirq), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def calibration_ms(core: str = "0") -> float | None:
    """The frame-cost calibration on `core` now: `frame_cost_bench.py` at one call (ms per
    80 ms frame; about 0.12 on a fast hour of the development VM, 0.35-0.45 on a slow one)."""
    command = taskset(core) + [sys.executable, str(ROOT / "benchmarks" / "frame_cost_bench.py"),
                               "--calls", "1", "--frames", "500"]
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return float(result.stdout.strip().splitlines()[-1].split("|")[3])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def load_average() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


@dataclass
class Window:
    """CPU over the steady window, in cores: the agent, the callers, and everything else."""

    seconds: float = 0.0
    agent: float = 0.0
    callers: float = 0.0
    foreign: float = 0.0


def run_windowed(command: list[str], agent_pid: int, timeout: float
                 ) -> tuple[Any, Window | None, str]:
    """Run a clients process that marks its steady window (`mark_window`) and prints its
    result as JSON last; the agent's, the callers' and the foreign CPU over that window.
    Returns (result or None, window or None, stderr's tail)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    samples: dict[str, tuple[float, float, float, float]] = {}
    last = ""
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.strip()
            if line in (WINDOW_START, WINDOW_END):
                samples[line] = (time.monotonic(), cpu_seconds(agent_pid),
                                 cpu_seconds(process.pid), busy_seconds())
            elif line:
                last = line
        stderr = process.stderr.read() if process.stderr else ""
        process.wait()
    finally:
        timer.cancel()
    window = None
    if WINDOW_START in samples and WINDOW_END in samples:
        (t0, a0, c0, b0), (t1, a1, c1, b1) = samples[WINDOW_START], samples[WINDOW_END]
        wall = max(1e-9, t1 - t0)
        agent, callers = (a1 - a0) / wall, (c1 - c0) / wall
        window = Window(wall, agent, callers, max(0.0, (b1 - b0) / wall - agent - callers))
    try:
        return json.loads(last), window, stderr[-500:]
    except ValueError:
        return None, window, stderr[-500:] or "the clients printed no result"


def echo_correlations(sent: Any, received: Any, rate: int = 8000, max_lag_s: float = 1.0
                      ) -> list[float]:
    """Per whole second of `sent` (int16 PCM) after the first and before the last: the
    highest normalized correlation of that second with `received` (the echo, on the same
    clock from the first send) at any lag up to `max_lag_s`. Near 1 for an echo that
    carries the signal; near 0 when packets flow but the echo is gone."""
    import numpy as np

    sent = np.asarray(sent, dtype=np.float64)
    received = np.asarray(received, dtype=np.float64)
    lag = int(rate * max_lag_s)
    size = 1 << int(np.ceil(np.log2(rate + rate + lag)))
    values = []
    for second in range(1, len(sent) // rate - 1):
        piece = sent[second * rate:(second + 1) * rate]
        piece = piece - piece.mean()
        window = np.zeros(rate + lag)
        tail = received[second * rate:second * rate + rate + lag]
        window[:len(tail)] = tail
        norm = np.sqrt(np.dot(piece, piece))
        if norm == 0:
            continue
        spectrum = np.fft.rfft(window, size) * np.conj(np.fft.rfft(piece, size))
        products = np.fft.irfft(spectrum, size)[:lag + 1]
        energy = np.concatenate(([0.0], np.cumsum(window * window)))
        sliding = energy[rate:rate + lag + 1] - energy[:lag + 1]
        values.append(float(np.max(products / (norm * np.sqrt(np.maximum(sliding, 1e-9))))))
    return values


GAP_LIMIT_MS = 60.0
RECEIVED_MIN = 0.99


def level_passes(summaries: list[dict[str, Any]]) -> tuple[bool, str]:
    """Every call answered, >= 99 % of its chunks and of its echoed audio back, no gap over
    60 ms after the first second, and its echo correlated with what it sent (>=
    CORRELATION_MIN in every second)."""
    failed = [s for s in summaries if not s.get("opened") or "chunk_ratio" not in s]
    if failed:
        return False, f"{len(failed)} sessions failed: {failed[0].get('error')}"
    chunk_ratio = min(s["chunk_ratio"] for s in summaries)
    echo_ratio = min(s["echo_ratio"] for s in summaries)
    max_gap = max(s["max_gap_ms"] for s in summaries)
    correlation = min(s.get("min_correlation", 0.0) for s in summaries)
    ok = (chunk_ratio >= RECEIVED_MIN and echo_ratio >= RECEIVED_MIN
          and max_gap <= GAP_LIMIT_MS and correlation >= CORRELATION_MIN)
    return ok, (f"min chunks {chunk_ratio:.3f}, min echoed audio {echo_ratio:.3f}, "
                f"max gap {max_gap:.0f} ms, min echo correlation {correlation:.3f}")


LEVEL_HEADER = ("| kind | calls | result | agent, % of a core (steady) | agent % per call | "
                "callers, cores | foreign, cores | detail | calibration ms | load average |\n"
                "|---|---|---|---|---|---|---|---|---|---|")


def capacity_levels(kind: str, levels: list[int], trials: int, seconds: float,
                    start: Any) -> int:
    """Each level in turn until one fails `trials` times (2: a failing level is tried once
    more): `start(count)` is a context manager yielding (the clients' command, the agent's
    pid). Prints one row per try; returns the highest level held in real time."""
    best = 0
    for count in levels:
        ok = False
        for trial in range(1, trials + 1):
            calibration, load = calibration_ms("0"), load_average()
            with start(count) as (command, pid):
                result, window, error = run_windowed(command, pid, seconds * 3 + 120)
            if result is None:
                ok, detail = False, f"clients failed: {error!r}"
            else:
                ok, detail = level_passes(result[0])
                late = result[1].get("late_ms")
                if late is not None:  # a hole may start on the callers' side
                    detail += f", callers' latest send {late:.0f} ms late"
            label = f"{count}" + (f" (try {trial})" if trial > 1 else "")
            agent = (f"{window.agent * 100:.0f} | {window.agent * 100 / count:.2f}"
                     if window else "? | ?")
            others = f"{window.callers:.2f} | {window.foreign:.2f}" if window else "? | ?"
            calib = f"{calibration:.3f}" if calibration is not None else "?"
            print(f"| {kind} | {label} | {'real time' if ok else 'FAILS'} | {agent} | "
                  f"{others} | {detail} | {calib} | {load} |", flush=True)
            if ok:
                break
        if not ok:
            break
        best = count
    print(f"| **{kind}** | **{best}** | **max real time** | | | | | | | |", flush=True)
    return best
