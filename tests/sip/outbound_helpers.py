"""What the outbound-call and transfer tests share: sipp as the far end on a free port, and
the HTTP calls that place and watch a call."""

from __future__ import annotations

import asyncio
import errno
import socket
from pathlib import Path
from typing import Any

import aiohttp

from signaling.sip.config import SipConfig
from signaling.sip.service import SIP_SERVICE_KEY
from signaling.sip.trunks import parse_trunks
from tests.sip import uas_scenarios
from tests.sip.helpers import (
    HOST,
    SippRun,
    SipServer,
    SipServerFactory,
    free_udp_port,
    run_sipp,
)

TRUNKS = {"t1": {"proxy": "sip:127.0.0.1:5999", "username": "alice", "password": "s3cret"}}


async def dialing_server(start_sip: SipServerFactory, **options: Any) -> SipServer:
    return await start_sip(config=SipConfig(listen_port=0, trunks=parse_trunks(TRUNKS),
                                            ring_timeout=60.0), **options)


def sip_to(port: int) -> str:
    return f"sip:+15550100@{HOST}:{port}"


async def sipp_uas(tmp_path: Path, scenario: str, *args: str, name: str = "uas",
                   timeout: float = 20.0) -> tuple[asyncio.Task[SippRun], int]:
    """sipp as the far end on a free port, running as a task until its scenario ends."""
    port = free_port()
    task = asyncio.ensure_future(run_sipp((HOST, 5060), tmp_path, "-m", "1", *args,
                                          scenario=scenario, timeout=timeout, name=name,
                                          local_port=port))
    for _ in range(100):  # until sipp has bound its port
        if task.done() or port_taken(port):
            break
        await asyncio.sleep(0.05)
    if task.done():
        raise AssertionError("sipp ended at once:\n" + task.result().explain())
    return task, port


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


async def place(server: SipServer, body: dict[str, Any], key: str | None = None
                ) -> tuple[int, dict[str, Any], str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(
            f"{server.url}/v1/sip/calls", json=body, headers=headers) as response:
        return response.status, await response.json(), response.headers.get("Location", "")


async def get_call(server: SipServer, call_id: str, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.get(
            f"{server.url}/v1/sip/calls/{call_id}", headers=headers) as response:
        assert response.status == 200
        return dict(await response.json())


async def wait_status(server: SipServer, call_id: str, wanted: str, timeout: float = 15.0,
                      key: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {}
    for _ in range(int(timeout / 0.05)):
        call = await get_call(server, call_id, key)
        if call["status"] == wanted or call["status"] == "ended":
            break
        await asyncio.sleep(0.05)
    assert call["status"] == wanted, call
    return call


async def answered_call(dialing: SipServer, tmp_path: Path,
                        ) -> tuple[asyncio.Task[SippRun], int, str]:
    """An outbound call that sipp answers, echoing its RTP until the agent's BYE: sipp's
    task, its port and the call's id, once the call is answered."""
    uas, port = await sipp_uas(tmp_path, uas_scenarios.answer_then_hangup_from_agent(),
                               "-mp", str(free_udp_port()), "-rtp_echo")
    _, body, _ = await place(dialing, {"to": sip_to(port)})
    await wait_status(dialing, body["id"], "answered")
    return uas, port, body["id"]


async def until_idle(server: SipServer) -> None:
    """No leg, live outbound call, outbound task or dialog hook left."""
    dialer = server.server.app[SIP_SERVICE_KEY].dialer
    assert dialer is not None
    for _ in range(200):
        if (not server.agent.legs and not dialer.live and not len(dialer.tasks)
                and not len(server.ua.dialog_hooks)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("a leg, an outbound call or a dialog hook was left behind")
