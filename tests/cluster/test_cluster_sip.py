"""Outbound SIP calls in a cluster: redis-server and three nodes on 127.0.0.2-4, only the
first serving SIP (`--sip-listen`). `POST /v1/sip/calls` at a node without SIP is placed on
the SIP node (its registry record says it serves SIP), the call is controlled from any
node, counts against the key's `--max-calls-per-key` with its other calls while it rings
(the heartbeat keeps it in Redis), and frees its slot when it ends. The far end is a UDP
socket on 127.0.0.1 that rings (180) and takes the CANCEL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.cluster.support import Cluster, free_port, running_cluster, wait_for

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEYS = ("key-one-0001", "key-two-0002")
ADMIN = "admin-key-0000"
PER_KEY = 2
COMMON = ("--max-sessions", "4", "--max-calls-per-key", str(PER_KEY), "--admin-key", ADMIN,
          *[flag for key in KEYS for flag in ("--api-key", key)])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("cluster-sip")
    sip = ("--sip-listen", f"127.0.0.2:{free_port('127.0.0.2')}")
    with running_cluster(folder, ((*COMMON, *sip), COMMON, COMMON)) as running:
        yield running


class RingingPeer(asyncio.DatagramProtocol):
    """Rings (180) every INVITE; a CANCEL gets 200 and the INVITE 487."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.invites = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        head = data.split(b"\r\n\r\n", 1)[0].decode()
        method = head.split(" ", 1)[0]
        copied = [f"{line};tag=far" if line.lower().startswith("to:") else line
                  for line in head.split("\r\n")[1:]
                  if line.split(":", 1)[0].lower() in ("via", "from", "to", "call-id", "cseq")]

        def answer(status: str, lines: list[str]) -> None:
            assert self.transport is not None
            text = "\r\n".join([f"SIP/2.0 {status}", *lines, "Content-Length: 0", "", ""])
            self.transport.sendto(text.encode(), addr)

        if method == "INVITE":
            self.invites += 1
            answer("180 Ringing", copied)
        elif method == "CANCEL":
            answer("200 OK", copied)
            answer("487 Request Terminated", [
                line.replace("CANCEL", "INVITE") if line.lower().startswith("cseq:") else line
                for line in copied])


@pytest.fixture
async def far_end() -> AsyncIterator[tuple[RingingPeer, int]]:
    transport, peer = await asyncio.get_running_loop().create_datagram_endpoint(
        RingingPeer, local_addr=("127.0.0.1", 0))
    yield peer, transport.get_extra_info("sockname")[1]
    transport.close()


async def send(http: aiohttp.ClientSession, method: str, url: str, key: str,
               body: Any = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with http.request(method, url, json=body,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else {}, dict(response.headers)


def score(cluster: Cluster, tag: str, call: str) -> float:
    value = cluster.redis.command("ZSCORE", f"agent:calls:{tag}", call)
    return float(value) if value is not None else 0.0


async def test_outbound_sip_calls_are_placed_counted_and_controlled_across_nodes(
        cluster: Cluster, far_end: tuple[RingingPeer, int]) -> None:
    peer, port = far_end
    sip_node, plain, other = cluster.nodes
    target = {"to": f"sip:+15550100@127.0.0.1:{port}"}
    one = KEYS[0]
    async with aiohttp.ClientSession() as http:
        # the registry says which node serves SIP (each node's table catches up within a
        # heartbeat of the others' first records)
        def registry_says() -> bool:
            nodes = {n["node"]: n for n in other.health()["cluster"]["nodes"]}
            return bool(nodes[sip_node.tag]["sip"]) and not nodes[plain.tag]["sip"]

        await asyncio.to_thread(wait_for, registry_says, 10, "the registry's sip flags")
        # placed at a node without SIP: made on the SIP node
        status, placed, headers = await send(http, "POST", other.url + "/v1/sip/calls", one,
                                             target)
        assert status == 201, placed
        call = placed["id"]
        assert call[-24] == sip_node.tag and headers["Location"] == f"/v1/sip/calls/{call}"
        # controlled from any node
        for node in (plain, other):
            status, seen, _ = await send(http, "GET", f"{node.url}/v1/sip/calls/{call}", one)
            assert status == 200 and seen["id"] == call, seen
            status, seen, _ = await send(http, "GET",
                                         f"{node.url}/v1/realtime/calls/{call}", one)
            assert status == 200 and seen["transport"] == "sip", seen
        status, _, _ = await send(http, "GET", f"{plain.url}/v1/sip/calls/{call}", KEYS[1])
        assert status == 404  # another key's
        await asyncio.to_thread(wait_for, lambda: peer.invites >= 1, 10, "the INVITE")
        assert sip_node.health()["pending_calls"] == 1
        # with an RTP leg the key is at its limit: every new call is refused, SIP ones too
        status, leg, _ = await send(http, "POST", plain.url + "/v1/telephony/rtp", one,
                                    {"remote": "127.0.0.1:9", "codec": "PCMU"})
        assert status == 201, leg
        refused = [await send(http, "POST", node.url + "/v1/sip/calls", one, target)
                   for node in (other, plain, sip_node, other)]
        refused.append(await send(http, "POST", other.url + "/v1/telephony/rtp", one,
                                  {"remote": "127.0.0.1:9", "codec": "PCMU"}))
        assert [s for s, _, _ in refused] == [429] * 5, refused
        assert all(b["error"]["code"] == "tenant_limit" and "Retry-After" in h
                   for _, b, h in refused)
        assert peer.invites == 1  # nothing was dialled for them
        # the ringing call outlives its first TTL in Redis: the heartbeat refreshes it
        first = score(cluster, sip_node.tag, call)
        assert first > 0
        await asyncio.to_thread(wait_for, lambda: score(cluster, sip_node.tag, call) > first,
                                10, "the heartbeat to refresh the ringing call")
        # ended from another node (CANCEL, then the far end's 487): its slot is free again
        # within the heartbeat's watch
        status, ended, _ = await send(http, "DELETE", f"{other.url}/v1/sip/calls/{call}", one)
        assert status == 200, ended
        deadline = asyncio.get_running_loop().time() + 5
        while True:
            status, again, _ = await send(http, "POST", plain.url + "/v1/sip/calls", one,
                                          target)
            if status != 429 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert status == 201, again
        assert (await send(http, "GET", f"{plain.url}/v1/sip/calls/{call}", one))[1][
            "status"] == "ended"
        for done in (again["id"],):
            await send(http, "DELETE", f"{plain.url}/v1/sip/calls/{done}", ADMIN)
        await send(http, "DELETE", f"{other.url}/v1/telephony/rtp/{leg['call_id']}", ADMIN)
