"""`--max-calls-per-key` without a cluster, with `--workers 2`: the limit is the server's,
not each worker's (the workers count each key's calls in their shared tally), and an
outbound SIP call (placed by worker 0, which serves SIP) counts from its INVITE on. Requests
go to each worker over its own socket; the far end is a UDP socket that rings (180)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.test_workers import Workers, two_workers

KEY = "key-limit-0001"


class RingingPeer(asyncio.DatagramProtocol):
    """Rings (180) every INVITE, and answers nothing else."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.invites = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        head = data.split(b"\r\n\r\n", 1)[0].decode()
        if not head.startswith("INVITE ") or self.transport is None:
            return
        self.invites += 1
        copied = [f"{line};tag=far" if line.lower().startswith("to:") else line
                  for line in head.split("\r\n")[1:]
                  if line.split(":", 1)[0].lower() in ("via", "from", "to", "call-id", "cseq")]
        text = "\r\n".join(["SIP/2.0 180 Ringing", *copied, "Content-Length: 0", "", ""])
        self.transport.sendto(text.encode(), addr)


@pytest.fixture
async def far_end() -> AsyncIterator[tuple[RingingPeer, int]]:
    transport, peer = await asyncio.get_running_loop().create_datagram_endpoint(
        RingingPeer, local_addr=("127.0.0.1", 0))
    yield peer, transport.get_extra_info("sockname")[1]
    transport.close()


async def post(group: Workers, worker: int, path: str, body: dict[str, Any]
               ) -> tuple[int, dict[str, Any]]:
    async with group.via(worker).post("http://worker" + path, json=body,
                                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        return response.status, await response.json()


async def test_max_calls_per_key_is_the_servers_across_workers(
        tmp_path: Path, far_end: tuple[RingingPeer, int]) -> None:
    peer, port = far_end
    rtp = {"remote": "127.0.0.1:9", "codec": "PCMU"}
    async with two_workers(tmp_path / "workers", "--api-key", KEY, "--max-calls-per-key", "3",
                           "--sip-listen", "127.0.0.1:0") as group:
        assert (await post(group, 1, "/v1/telephony/rtp", rtp))[0] == 201
        assert (await post(group, 0, "/v1/telephony/rtp", rtp))[0] == 201
        status, placed = await post(group, 1, "/v1/sip/calls",
                                    {"to": f"sip:+15550100@127.0.0.1:{port}"})
        assert status == 201, placed
        refused = [await post(group, worker, "/v1/telephony/rtp", rtp) for worker in (0, 1)]
        refused += [await post(group, worker, "/v1/sip/calls",
                               {"to": f"sip:+15550100@127.0.0.1:{port}"}) for worker in (0, 1)]
        assert [(s, b["error"]["code"]) for s, b in refused] == [(429, "tenant_limit")] * 4
        assert peer.invites == 1
        health = await group.health()
        assert health["active_calls"] == 2 and health["pending_calls"] == 1
