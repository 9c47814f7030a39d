"""`python -m signaling` as a real process in tests: a free port, its log read line by line,
and a stop that always happens."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator

Process = asyncio.subprocess.Process


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def read_until(stream: asyncio.StreamReader, marker: str, lines: list[str]) -> None:
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("process ended early:\n" + "".join(lines))
        lines.append(line)
        if marker in line:
            return


@contextlib.asynccontextmanager
async def running_server(*flags: str, scheme: str = "http",
                         ready: str = "serving plugin echo",
                         ) -> AsyncIterator[tuple[Process, str, list[str]]]:
    """The server on loopback, once it logs `ready`: (process, base URL, log lines so far).
    Killed on the way out unless the test already stopped it."""
    port = free_tcp_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--port", str(port), "--ice-host", "127.0.0.1",
        *flags, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )
    lines: list[str] = []
    try:
        assert server.stderr is not None
        await asyncio.wait_for(read_until(server.stderr, ready, lines), 60)
        yield server, f"{scheme}://127.0.0.1:{port}", lines
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()


async def start_peer(url: str, *flags: str) -> Process:
    """The headless peer CLI calling `url`, its JSON report on stdout."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", url, *flags, "--json", "--ice-host", "127.0.0.1",
        stdout=asyncio.subprocess.PIPE,
    )
