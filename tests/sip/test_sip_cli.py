"""`python -m signaling --sip-listen ...` as a real process: SIP served (by one worker when
there are several), stopped cleanly by SIGTERM, and start-up mistakes as one coded line."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

import pytest

from tests.sip.helpers import HOST, Dialogue, SipPeer, free_udp_port
from tests.support.server_process import free_tcp_port, running_server


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_the_server_answers_sip_and_stops_on_sigterm(workers: str) -> None:
    port = free_udp_port()
    ready = "serving plugin echo" if workers == "1" else "serving plugin echo on"
    async with running_server("--workers", workers, "--sip-listen", f"{HOST}:{port}",
                              ready=ready) as (server, _, lines):
        peer = await SipPeer.open()
        for _ in range(40):  # a worker may come up a moment after the first one logs
            peer.send(Dialogue(peer.port, (HOST, port)).request("OPTIONS"), (HOST, port))
            try:
                answer = await peer.response(timeout=0.5)
                break
            except asyncio.TimeoutError:
                continue
        else:
            raise AssertionError("no answer to OPTIONS:\n" + "".join(lines))
        assert answer.status == 200 and "INVITE" in (answer.headers.get("allow") or "")
        peer.close()
        server.send_signal(signal.SIGTERM)
        assert server.stderr is not None
        rest = (await asyncio.wait_for(server.stderr.read(), 30)).decode()
        assert await server.wait() == 0
        log = "".join(lines) + rest
        assert log.count("sip: listening on udp+tcp") == 1  # one worker serves SIP
        assert "sip: stopped" in log and "Traceback" not in log


async def run(*flags: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--workers", "1", "--port", str(free_tcp_port()),
        *flags, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_start_up_mistakes_are_one_coded_line() -> None:
    code, err = await run("--sip-listen", "0.0.0.0:5099")
    assert code == 2 and "error [sip_config_invalid]" in err and "--sip-advertise" in err
    code, err = await run("--sip-listen", "pbx.example.com:5060")
    assert code == 2 and "--sip-listen" in err
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((HOST, 0))
        code, err = await run("--sip-listen", f"{HOST}:{taken.getsockname()[1]}")
    assert code == 2 and "error [sip_listen_failed]" in err and "Traceback" not in err
