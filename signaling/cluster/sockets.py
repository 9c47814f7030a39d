"""Websockets across nodes: a call's sideband (`GET /v1/realtime?call_id=ID`) that reaches a
node other than the call's owner, and a media stream that reaches a node with no room.

A websocket cannot be forwarded like a request (forwarding.py): this node opens the same
websocket on the other node, signed as any node-to-node request (signing.py, over `GET`,
the raw path with its query, and an empty body), and relays every message both ways until
either side closes, passing the close code on (signaling/workers/relay.py
`relay_both_ways`, the same relay the workers use between themselves). One hop: a socket
that came from another node is never carried on to a third. The client's credential is
checked here first by this node's own auth (API keys are the same on every node) and again
at the owner, which alone knows whose call it is.

- a sideband for another node's call: carried to the owner named by the call id's node
  tag; an owner that is gone (not in the table, or not answering) means the call is gone:
  404 `call_not_found`, as for any control of its calls;
- a media stream on a full node (after its other workers, where there are several, were
  full too): carried to the least loaded serving node with room in the node table; None
  (the caller then gets this node's 503 `server_full`) when there is none.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from agent.worker_tag import ID_TOKEN_CHARS, node_of
from signaling.cluster.forwarding import NOT_RELAYED
from signaling.cluster.node import CLUSTER_KEY, ClusterNode
from signaling.cluster.registry import NodeInfo, NodeTable
from signaling.errors import ApiError
from signaling.sideband import NODE_RELAY_KEY
from signaling.telephony import OVERFLOW_KEY, Overflow
from signaling.workers.channel import from_a_worker
from signaling.workers.relay import relay_both_ways

log = logging.getLogger(__name__)

# No total: the socket lives as long as the call; the other node answers a handshake fast.
SOCKET_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=1, connect=5)
FROM_NODE_KEY = "cluster_from_node"  # request key: the node that sent it here (checked)


def upgrade_headers(node: ClusterNode, request: web.Request, to: str) -> CIMultiDict[str]:
    """The client's end-to-end headers (not its own handshake keys, which belong to its
    socket with this node) and this node's signature, for node `to`."""
    headers = CIMultiDict((name, value) for name, value in request.headers.items()
                          if name.lower() not in NOT_RELAYED
                          and not name.lower().startswith("sec-websocket"))
    headers.update(node.forwarder.signer.sign(request.method, request.raw_path, b"", to=to))
    return headers


async def address_of(node: ClusterNode, tag: str) -> str | None:
    address = node.table.address_of(tag)
    if address is None and node.store.usable:
        await node.heartbeat.beat(full=False)  # a node that joined since the last heartbeat
        address = node.table.address_of(tag)
    return address


async def carry(node: ClusterNode, request: web.Request, to: str, address: str, kind: str,
                max_msg_size: int) -> web.WebSocketResponse:
    """The websocket opened at node `to`'s `address` (https: checked as forwards are) and
    relayed until either side closes. Before the
    upgrade: aiohttp.WSServerHandshakeError where the node refused it, ClientError, OSError
    or TimeoutError where it could not be reached."""
    session = aiohttp.ClientSession(timeout=SOCKET_TIMEOUT)
    try:
        started = time.perf_counter()
        upstream = await session.ws_connect(
            URL(address + request.raw_path, encoded=True),
            headers=upgrade_headers(node, request, to), max_msg_size=max_msg_size,
            autoping=True, compress=0, ssl=node.forwarder.tls)
        node.metrics.forwarded.labels(kind).inc()
        node.metrics.forward_seconds.observe(time.perf_counter() - started)
        try:
            return await relay_both_ways(request, upstream, max_msg_size)
        finally:
            await upstream.close()
    finally:
        await session.close()


async def relay_sideband(request: web.Request, call_id: str, max_msg_size: int
                         ) -> web.StreamResponse | None:
    """The sideband of another node's call, relayed from its owner; None for this node's."""
    node = request.app[CLUSTER_KEY]
    tag = node_of(call_id, ID_TOKEN_CHARS)
    if tag is None or tag == node.tag:
        return None
    if request.get(FROM_NODE_KEY) is not None:
        raise ApiError("call_not_found", "no such call", param="call_id", status=404)
    address = await address_of(node, tag)
    if address is None:
        raise ApiError("call_not_found", "no such call (its node is gone)", param="call_id",
                       status=404)
    try:
        return await carry(node, request, tag, address, "sideband", max_msg_size)
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 404:
            raise ApiError("call_not_found", "no such call", param="call_id",
                           status=404) from None
        raise ApiError("node_relay_failed", f"the node holding the call refused the "
                       f"websocket ({exc.status})", status=502) from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        log.info("sideband for a call on node %s: %s; answering call_not_found", tag,
                 exc or type(exc).__name__)
        raise ApiError("call_not_found", "no such call (its node is gone)", param="call_id",
                       status=404) from None


def with_room(table: NodeTable, here: str) -> list[NodeInfo]:
    """The serving nodes other than `here` with room, least loaded (by share of capacity)
    first."""
    others = [info for info in table.nodes.values()
              if info.tag != here and info.state == "serving"
              and (info.capacity == 0 or info.calls < info.capacity)]
    return sorted(others, key=lambda info: (info.calls / info.capacity if info.capacity
                                            else 0.0, info.calls))


def overflow_to_nodes(workers: Overflow | None) -> Overflow:
    """A full node's media stream: to another of its workers first (where several serve),
    then to the least loaded node with room."""

    async def overflow(request: web.Request, max_msg_size: int
                       ) -> web.WebSocketResponse | None:
        if workers is not None:
            relayed = await workers(request, max_msg_size)
            if relayed is not None:
                return relayed
        if request.get(FROM_NODE_KEY) is not None or from_a_worker(request):
            return None  # carried here already: never passed on again
        node = request.app[CLUSTER_KEY]
        for info in with_room(node.table, node.tag):
            try:
                socket = await carry(node, request, info.tag, info.address, "media_stream",
                                     max_msg_size)
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 503:
                    continue  # it filled up since the table was read
                raise ApiError("node_relay_failed", f"the node with room refused the "
                               f"stream ({exc.status})", status=502) from None
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                continue
            log.info("media stream from %s relayed to node %s (this one is full)",
                     request.remote, info.tag)
            return socket
        return None

    return overflow


def install(app: web.Application) -> None:
    app[NODE_RELAY_KEY] = relay_sideband
    app[OVERFLOW_KEY] = overflow_to_nodes(app.get(OVERFLOW_KEY))
