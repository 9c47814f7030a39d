"""What the benchmark scripts share: ports, pinning to a core, a server's CPU time."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
