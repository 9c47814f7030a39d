"""A pytest plugin (entry point `pytest11`: `duplex_agent`) for testing a voice agent with the
headless peer, so a test is three lines:

    def test_agent_answers(agent_server, agent_call):
        report = agent_call(agent_server, script="greeting.yaml")
        assert report.ok, report.checks

- `agent_server`: `python -m signaling` on a free loopback port with the flags of the test's
  `@pytest.mark.agent_server(...)` marker (after those of the `agent_server_flags` fixture,
  which a conftest may override); ready once `GET /health` answers; stopped by its PID.
- `agent_call`: places one call (any transport; a script file or data, a WAV, or the built-in
  test signal) and returns its `CallReport`, checks included: `agent_call(server, ...)` in a
  plain test, `await agent_call.call(server, ...)` in an async one.

Imports stay light here: pytest loads this module in every project that installs the
package, so the peer itself is imported only when a fixture is used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest

if TYPE_CHECKING:
    from agent.testing.peer.report import CallReport

START_SECONDS = 60.0
STOP_SECONDS = 10.0
CALL_SECONDS = 300.0  # bound on one agent_call, a hung call fails the test instead of hanging


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "agent_server(*flags): command-line flags of the `agent_server` fixture's "
        "`python -m signaling` (e.g. '--plugin', 'echo', '--max-sessions', '4')")


@dataclass
class AgentServer:
    """A running `python -m signaling`."""

    url: str
    port: int
    pid: int
    flags: list[str] = field(default_factory=list)
    log_path: str = ""

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if self.log_path else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID (the server drains and exits), SIGKILL if it does not in time."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(STOP_SECONDS)


@contextlib.contextmanager
def running_agent(flags: list[str], log_path: str) -> Iterator[AgentServer]:
    """`python -m signaling FLAGS` on a free loopback port until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "signaling", "--host", "127.0.0.1", "--port", str(port),
             "--ice-host", "127.0.0.1", *flags],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _healthy(url):
            if process.poll() is not None:
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                pytest.fail(f"python -m signaling {' '.join(flags)} exited with status "
                            f"{process.returncode}:\n{tail}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"python -m signaling did not answer /health within "
                            f"{START_SECONDS:g} s", pytrace=False)
            time.sleep(0.1)
        yield AgentServer(url, port, process.pid, list(flags), log_path)
    finally:
        stop_process(process)


@pytest.fixture
def agent_server_flags() -> list[str]:
    """Flags every `agent_server` of the tests in scope gets (override in a conftest)."""
    return []


@pytest.fixture
def agent_server(request: pytest.FixtureRequest, agent_server_flags: list[str],
                 tmp_path: Path) -> Iterator[AgentServer]:
    marker = request.node.get_closest_marker("agent_server")
    flags = [*agent_server_flags, *(str(arg) for arg in (marker.args if marker else ()))]
    with running_agent(flags, str(tmp_path / "agent_server.log")) as server:
        yield server


def _loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def _plan(target: AgentServer | str, *, transport: str = "webrtc",
          script: str | os.PathLike[str] | dict[str, Any] | list[Any] | None = None,
          play: str | os.PathLike[str] | None = None, seconds: float | None = None,
          session: dict[str, Any] | None = None, token: str | None = None,
          codec: str | None = None, ice_host: list[str] | None = None,
          timeout: float = 10.0, pesq: str = "auto", record_dir: str | None = None,
          timeline_dir: str | None = None) -> Any:
    """The `CallPlan` of one call; a bad script or WAV fails the test in one line."""
    from agent.cli_errors import CliError
    from agent.testing.peer import script as scripts
    from agent.testing.peer.run import CallPlan
    from agent.testing.peer.transports.base import PeerOptions

    url = target.url if isinstance(target, AgentServer) else str(target)
    refused: CliError | None = None
    try:
        loaded = None
        if isinstance(script, (dict, list)):
            loaded = scripts.build(script, "script", os.getcwd())
        elif script is not None:
            loaded = scripts.load(os.fspath(script))
        signal_samples = scripts.read_audio(os.fspath(play), "play") if play else None
    except CliError as exc:
        refused = exc
    if refused is not None:  # failed outside the except block: one line, no exception chain
        pytest.fail(f"error [{refused.code}]: {refused.message}", pytrace=False)
    if seconds is None:
        seconds = 5.0 if signal_samples is None else len(signal_samples) / 48000 + 1.0
    options = PeerOptions(token=token, session=session or (loaded.session if loaded else None),
                          codec=codec, timeout=timeout,
                          ice_host=ice_host or (["127.0.0.1"] if _loopback(url) else None))
    return CallPlan(url=url, transport=(loaded.transport if loaded and loaded.transport
                                        else transport),
                    options=options, script=loaded, signal=signal_samples, seconds=seconds,
                    pesq=pesq, record_dir=record_dir, timeline_dir=timeline_dir)


class AgentCaller:
    """What `agent_call` gives a test: call it (plain tests) or await `.call(...)` (async
    tests, whose loop must keep running, e.g. for an in-process server). Arguments: the
    server or a URL, then `transport`, `script` (a file or its data), `play` (a WAV),
    `seconds`, `session`, `token`, `codec`, `ice_host`, `timeout`, `pesq`, `record_dir`,
    `timeline_dir`, as `python -m agent.peer` takes them."""

    def __call__(self, target: AgentServer | str, **options: Any) -> CallReport:
        from agent.testing.peer.run import one_call

        plan = _plan(target, **options)
        # A loop of its own on a thread: usable from any plain test.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, one_call(plan)).result(CALL_SECONDS)

    async def call(self, target: AgentServer | str, **options: Any) -> CallReport:
        from agent.testing.peer.run import one_call

        return await asyncio.wait_for(one_call(_plan(target, **options)), CALL_SECONDS)


@pytest.fixture
def agent_call() -> AgentCaller:
    return AgentCaller()
