"""What the benchmark scripts share: ports, pinning to a core, a server's CPU time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
