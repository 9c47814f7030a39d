"""A real coturn TURN server on 127.0.0.1 for one test (Debian's `turnserver`)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TURNSERVER = shutil.which("turnserver") or "/usr/sbin/turnserver"
STUN_MAGIC = 0x2112A442


@dataclass
class TurnServer:
    port: int
    username: str
    password: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"turn:127.0.0.1:{self.port}?transport=udp"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stun_binding_answered(port: int, timeout: float = 0.2) -> bool:
    """Send a STUN Binding request; True when the server answers it."""
    transaction = secrets.token_bytes(12)
    request = struct.pack("!HHI", 0x0001, 0, STUN_MAGIC) + transaction
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(request, ("127.0.0.1", port))
            reply, _ = sock.recvfrom(2048)
        except OSError:
            return False
    return len(reply) >= 20 and reply[8:20] == transaction


@pytest.fixture
async def turn_server(tmp_path: Path) -> AsyncIterator[TurnServer]:
    if not os.path.exists(TURNSERVER):
        pytest.fail("coturn is not installed (apt-get install coturn)")
    port = free_udp_port()
    relay_base = 40000 + (port % 200) * 100  # a range unlikely to collide across runs
    server = TurnServer(port, "agent", secrets.token_hex(8), tmp_path / "turn.log")
    process = subprocess.Popen(
        [
            TURNSERVER, "-n", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
            f"--listening-port={port}", f"--min-port={relay_base}",
            f"--max-port={relay_base + 99}", "--lt-cred-mech", "--realm=agent.test",
            f"--user={server.username}:{server.password}", "--no-tls", "--no-dtls",
            "--no-cli", "--allow-loopback-peers", "--simple-log",
            f"--log-file={server.log_path}", f"--pidfile={tmp_path / 'turn.pid'}",
            f"--userdb={tmp_path / 'turndb'}",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if process.poll() is not None:
                pytest.fail(f"turnserver exited with {process.returncode}: {server.log()}")
            if await asyncio.to_thread(stun_binding_answered, port):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("turnserver did not answer STUN within 5 s")
        yield server
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 5)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)
