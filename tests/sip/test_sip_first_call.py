"""The first SIP call after start-up is as clean as the later ones.

With several workers the supervisor starts the others once the first one answers, and each
spends seconds of CPU starting (imports, the plugin, a full GC pass before freezing its
heap). A call the first worker admitted meanwhile shared a 2-core machine with that start-up:
the first call after start-up came back with 2 gaps (the longest 95.8 ms), correlation 0.928
and PESQ 2.17, the next ones clean. The first worker now serves its public sockets, and says
it serves, only once every other worker does, and an INVITE that comes earlier (its SIP
listens from its start) rings until then; the first call must echo as a later call does (the
thresholds of the other SIP echo tests).
"""

from __future__ import annotations

import pytest

from agent.testing.peer.call import place_call
from agent.testing.peer.measure import echo_delay
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports.base import PeerCall, PeerOptions
from tests.sip.helpers import HOST, free_udp_port
from tests.support.server_process import read_until, running_server

SECONDS = 5.0


@pytest.mark.slow
async def test_the_first_sip_call_after_start_up_echoes_cleanly() -> None:
    port = free_udp_port()
    async with running_server("--workers", "2", "--sip-listen", f"{HOST}:{port}",
                              ready="(worker 0 of 2)") as (_, _, lines):
        # Worker 0 said it serves only after worker 1 did: no worker was still starting.
        serving = [line for line in lines if "serving plugin echo" in line]
        assert len(serving) == 2 and "(worker 1 of 2)" in serving[0], "".join(lines)
        report, call = await place_call(f"sip:agent@{HOST}:{port}", "sip", PeerOptions(),
                                        seconds=SECONDS)
    assert_echoed(report, call)


def assert_echoed(report: CallReport, call: PeerCall | None) -> None:
    assert report.ok, report
    assert call is not None
    echo = echo_delay(call.sent, call.received)
    assert echo is not None and echo.holes <= 2 and echo.matched > 0.8, (echo, report)
    assert report.correlation is not None and report.correlation >= 0.8, report


@pytest.mark.slow
async def test_a_sip_call_during_start_up_rings_until_every_worker_serves() -> None:
    port = free_udp_port()
    async with running_server("--workers", "2", "--sip-listen", f"{HOST}:{port}",
                              ready="sip: listening") as (server, _, lines):
        report, call = await place_call(f"sip:agent@{HOST}:{port}", "sip",
                                        PeerOptions(timeout=60), seconds=SECONDS)
        assert server.stderr is not None
        await read_until(server.stderr, "transport=sip", lines)
    log = "".join(lines)
    # The call's leg opened (its media began) only once worker 1 served.
    assert log.index("(worker 1 of 2)") < log.index("transport=sip"), log
    assert_echoed(report, call)
