"""Kamailio, the field's SIP proxy, in front of two agent nodes with the shipped config
(deploy/kamailio/kamailio.cfg): sipp's calls through it are spread over both nodes
(dispatcher, round-robin, record-routed so BYE goes through it too); a node that stops is
found out by the OPTIONS probes and new calls go to the other one.

Kamailio runs in the foreground (`-DD -E`) on 127.0.0.1 with the config's settings given as
`-A` defines, bounded by the test and stopped by its PID. Without kamailio (or sipp) these
tests skip (and fail under CI).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from signaling.sip.config import SipConfig
from tests.sip import scenarios
from tests.sip.helpers import (
    HOST,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    free_udp_port,
    missing,
    run_sipp,
    stop_process,
)
from tests.support.agents import wait_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "kamailio" / "kamailio.cfg"
PING_INTERVAL = 1  # seconds between OPTIONS probes of each node
FR_TIMER_MS = 1000  # a probe not answered within this is a failure


def require_kamailio() -> str:
    path = shutil.which("kamailio") or ("/usr/sbin/kamailio"
                                         if Path("/usr/sbin/kamailio").exists() else None)
    if path is not None:
        return path
    missing("kamailio is missing (apt-get install kamailio; scripts/install-test-deps.sh)")


@asynccontextmanager
async def kamailio(workdir: Path, nodes: list[SipServer]) -> AsyncIterator[tuple[str, int]]:
    """Kamailio on a free loopback port dispatching to `nodes`; its address."""
    binary = require_kamailio()
    port = free_udp_port()
    destinations = workdir / "dispatcher.list"
    destinations.write_text("".join(f"1 sip:{HOST}:{node.ua.port}\n" for node in nodes))
    log = (workdir / "kamailio.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        binary, "-DD", "-E", "-f", str(CONFIG), "-m", "32", "-M", "4", "-w", str(workdir),
        "-A", f"LISTEN=udp:{HOST}:{port}", "-A", f'DISPATCHER_LIST="{destinations}"',
        "-A", f"PING_INTERVAL={PING_INTERVAL}", "-A", f"FR_TIMER={FR_TIMER_MS}",
        stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        # Up once it answers an OPTIONS of its own.
        peer = await SipPeer.open()
        try:
            for _ in range(50):
                if process.returncode is not None:
                    break
                peer.send(options(peer.port, port), (HOST, port))
                try:
                    if (await peer.response(200, timeout=0.2)).status == 200:
                        break
                except asyncio.TimeoutError:
                    continue
            else:
                raise AssertionError("kamailio never answered")
        finally:
            peer.close()
        assert process.returncode is None, (workdir / "kamailio.log").read_text()
        yield HOST, port
    finally:
        await stop_process(process)
        log.close()


def options(local_port: int, port: int) -> bytes:
    return (f"OPTIONS sip:{HOST}:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {HOST}:{local_port};branch=z9hG4bK{os.urandom(4).hex()}\r\n"
            f"From: <sip:probe@{HOST}>;tag=p\r\nTo: <sip:{HOST}:{port}>\r\n"
            f"Call-ID: {os.urandom(6).hex()}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
            "Content-Length: 0\r\n\r\n").encode()


def calls_through(media_port: int) -> str:
    return scenarios.scenario("call through the proxy", scenarios.establish(str(media_port))
                              + '  <pause milliseconds="300"/>\n' + scenarios.hang_up())


def answered(node: SipServer) -> int:
    return node.ua.counters["answered"]


async def test_calls_are_spread_over_two_nodes_and_a_stopped_node_is_taken_out(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    nodes = [await start_sip(config=SipConfig(listen_port=0)) for _ in range(2)]
    probe = await RtpProbe.open()
    async with kamailio(tmp_path, nodes) as proxy:
        # Both nodes are probed with OPTIONS.
        await wait_until(lambda: all(node.ua.counters["messages_in"] > 0 for node in nodes))
        run = await run_sipp(proxy, tmp_path, "-m", "4", "-r", "4",
                             scenario=calls_through(probe.port), timeout=30, name="four")
        assert run.returncode == 0, run.explain()
        assert [answered(node) for node in nodes] == [2, 2]  # round-robin
        assert all(node.ua.counters["remote_hangups"] == 2 for node in nodes)  # BYE via proxy
        await wait_until(lambda: all(node.quiet() for node in nodes))
        # One node stops; after a probe or two it is out, and calls go to the other.
        await nodes[1].server.close()
        await asyncio.sleep(2 * PING_INTERVAL + FR_TIMER_MS / 1000 + 0.5)
        started = asyncio.get_running_loop().time()
        run = await run_sipp(proxy, tmp_path, "-m", "4", "-r", "4",
                             scenario=calls_through(probe.port), timeout=30, name="after")
        assert run.returncode == 0, run.explain()
        assert answered(nodes[0]) == 2 + 4
        took = asyncio.get_running_loop().time() - started
        await asyncio.sleep(0.2)  # the log's last lines
        log = (tmp_path / "kamailio.log").read_text(errors="replace")
    stopped = f"sip:{HOST}:{nodes[1].ua.port}"
    print(f"\nfour calls after the stop took {took:.1f} s")
    # The probes took it out: no call had to fail over to find that out.
    assert f"dispatcher: node OPTIONS {stopped} down" in log, log[-3000:]
    assert "failed INVITE" not in log, log[-3000:]
    probe.close()
