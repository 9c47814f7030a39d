"""`GET /v1/realtime?call_id=ID`: a call's sideband websocket, for any transport.

The application that owns a call (WebRTC, a `/v1/realtime/calls` call, a media stream, an
RTP or SIP leg) watches its Realtime server events here — `session.created` at connect,
`session.updated`, transcripts, `input_audio_buffer.dtmf_event_received`, `error`,
`call.ending` — and steers it with `session.update`, `response.cancel` and
`output_audio_buffer.clear`, as over the call's data channel (agent/realtime/sideband.py).

Credentials as for `GET /v1/realtime/calls/{id}` (a key; its own calls only, an admin key
every call): another tenant's call and an unknown id are the same 404 `call_not_found`
before the upgrade, missing credentials 401; an ephemeral secret gets 403 (it is the
browser's, and may only make and manage its call). After `call.ending` the server closes
with 1000. A sideband that does not read its events (`QUEUE_LIMIT` behind) is closed with
`CLOSE_OVERFLOW`; the call and other sidebands go on. With several workers a sideband that
lands on a worker other than the call's is relayed there (signaling/workers/relay.py); in
a cluster, one for another node's call is relayed to that node (signaling/cluster/sockets.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSMsgType, web

from agent.realtime.sideband import CALL_ENDED, OVERFLOWED, Sideband
from agent.worker_tag import ID_TOKEN_CHARS, worker_of
from signaling.auth import principal_of
from signaling.call_route import CallRoute
from signaling.calls import RESOURCES_KEY
from signaling.errors import ApiError
from signaling.keys import AGENT_KEY
from signaling.workers.channel import from_a_worker
from signaling.workers.relay import relay_to_owner
from signaling.workers.routing import WORKERS_KEY

log = logging.getLogger(__name__)

SIDEBAND_PATH = "/v1/realtime"
MAX_MESSAGE_BYTES = 1 << 20  # larger frames close the socket; smaller bad ones get `error`
CLOSE_OVERFLOW = 4001  # the sideband fell too far behind and was dropped
CLOSE_TIMEOUT = 5.0  # seconds a closing handshake may take before the socket is cut
MAX_CALL_ID_CHARS = 128
# It names a call in its query; the handler relays it to the owning worker and node itself.
SIDEBAND = CallRoute(SIDEBAND_PATH, query="call_id", relayed_by_handler=True)
# Set in a cluster: the sideband of another node's call, relayed from that node; None for
# this node's calls (signaling/cluster/sockets.py).
NodeRelay = Callable[[web.Request, str, int], Awaitable["web.StreamResponse | None"]]
NODE_RELAY_KEY = web.AppKey[NodeRelay]("sideband_node_relay")


def call_id_of(request: web.Request) -> str:
    call_id = request.query.get("call_id", "")
    if not call_id:
        raise ApiError("missing_call_id", "name the call: /v1/realtime?call_id=ID",
                       param="call_id")
    if len(call_id) > MAX_CALL_ID_CHARS or not call_id.isprintable():
        raise ApiError("call_not_found", "no such call", param="call_id", status=404)
    return call_id


def owner_elsewhere(request: web.Request, call_id: str) -> int | None:
    """The other worker holding the call, where several serve and this is not it."""
    group = request.app.get(WORKERS_KEY)
    if group is None or from_a_worker(request):
        return None
    owner = worker_of(call_id, ID_TOKEN_CHARS)
    if owner is None or owner == group.index or owner >= group.count:
        return None
    return owner


async def sideband(request: web.Request) -> web.StreamResponse:
    call_id = call_id_of(request)
    socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, compress=False,
                                   timeout=CLOSE_TIMEOUT)
    if not socket.can_prepare(request).ok:
        raise ApiError("websocket_required", "this endpoint speaks WebSocket only",
                       headers={"Upgrade": "websocket"}, status=426)
    to_node = request.app.get(NODE_RELAY_KEY)
    if to_node is not None and (relayed := await to_node(request, call_id,
                                                         MAX_MESSAGE_BYTES)) is not None:
        return relayed
    owner = owner_elsewhere(request, call_id)
    if owner is not None:
        return await relay_to_owner(request, owner, MAX_MESSAGE_BYTES)
    request.app[RESOURCES_KEY].lookup(call_id, principal_of(request))  # 404 if not theirs
    leg = request.app[AGENT_KEY].legs.get(call_id)
    if leg is None or leg.closing:
        raise ApiError("call_not_found", "no such call", param="call_id", status=404)
    watcher = leg.sidebands.attach()
    try:
        await socket.prepare(request)
    except BaseException:
        watcher.close()
        raise
    log.info("call %s: sideband open from %s", call_id, request.remote)
    await serve(socket, watcher)
    return socket


async def serve(socket: web.WebSocketResponse, watcher: Sideband) -> None:
    """Events out from a task of their own, client events in here, until either ends."""
    closing = asyncio.Event()
    writer = asyncio.ensure_future(send_events(socket, watcher, closing))

    def cut_off() -> None:  # a writer stuck behind a client that does not read
        writer.cancel()

    watcher.on_overflow = cut_off
    try:
        async for message in socket:
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                watcher.offer(message.data)
    finally:
        watcher.close()
        if closing.is_set():
            await asyncio.wait({writer}, timeout=CLOSE_TIMEOUT + 1)
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def send_events(socket: web.WebSocketResponse, watcher: Sideband,
                      closing: asyncio.Event) -> None:
    try:
        while (event := await watcher.next_event()) is not None:
            await socket.send_str(json.dumps(event))
    except asyncio.CancelledError:
        if watcher.finished != OVERFLOWED:
            raise
    except (ConnectionError, RuntimeError):
        return  # the client went away: the reader sees it too
    if watcher.finished == CALL_ENDED:
        code, reason = 1000, "call ended"
    elif watcher.finished == OVERFLOWED:
        code, reason = CLOSE_OVERFLOW, OVERFLOWED
    else:
        return  # the client left: nothing to close here
    closing.set()
    try:
        await asyncio.wait_for(socket.close(code=code, message=reason.encode()), CLOSE_TIMEOUT)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):
        pass  # the socket is cut: aiohttp closes the transport on a failed close


def add_routes(app: web.Application) -> None:
    SIDEBAND.add(app.router, "GET", sideband)
