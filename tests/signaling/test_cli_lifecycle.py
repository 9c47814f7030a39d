"""The server and the headless peer as real processes: a call, a graceful stop, exit codes."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest

from tests.support.server_process import free_tcp_port, read_until, running_server, start_peer


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
async def test_peer_cli_call_then_graceful_stop_mid_call(stop_signal: signal.Signals) -> None:
    async with running_server("--drain-seconds", "1") as (server, url, lines):
        assert server.stderr is not None
        # A complete call through the CLI peer: JSON report, exit 0.
        peer = await start_peer(url, "--seconds", "3")
        out, _ = await asyncio.wait_for(peer.communicate(), 60)
        report = json.loads(out)
        assert peer.returncode == 0 and report["ok"] and report["connected"]
        assert report["seconds_received"] > 2 and report["correlation"] >= 0.8
        await asyncio.wait_for(read_until(server.stderr, " end reason=", lines), 20)
        # A second call is cut by the server stopping: every call closed, exit status 0.
        peer = await start_peer(url, "--seconds", "30")
        await asyncio.wait_for(read_until(server.stderr, " start plugin=echo", lines), 60)
        await asyncio.sleep(1.0)
        server.send_signal(stop_signal)
        rest = (await asyncio.wait_for(server.stderr.read(), 30)).decode()
        assert await asyncio.wait_for(server.wait(), 30) == 0
        # SIGINT stops at once; SIGTERM drains (--drain-seconds 1), then ends the call.
        ended = "shutdown" if stop_signal == signal.SIGINT else "server_draining"
        assert f"reason={ended}" in rest
        out, _ = await asyncio.wait_for(peer.communicate(), 60)
        # The peer saw its call end early: it says so and exits non-zero.
        report = json.loads(out)
        assert peer.returncode != 0 and report["error"]


async def test_peer_cli_fails_with_nonzero_exit_when_nobody_answers() -> None:
    port = free_tcp_port()  # nothing listens here
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", f"http://127.0.0.1:{port}", "--seconds", "1",
        "--json", stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(peer.communicate(), 60)
    report = json.loads(out)
    assert peer.returncode == 1
    assert not report["connected"] and report["error"]
